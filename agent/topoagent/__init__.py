"""topo-agent: enforces one host's part of a topoctl plan (HostState) with pyroute2."""

__version__ = "0.1.0"
