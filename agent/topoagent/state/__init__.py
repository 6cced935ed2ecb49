"""The state model: the HostState schema (`host`, `ovs`), its pydantic base (`schema`) and the
documents that cross the wire to the agent (`wire`)."""
