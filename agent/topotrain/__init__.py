"""The training runtime: what runs inside the ranks `topo-agent launch` starts (the trainer,
pipeline stages, collectives, model checkpoints). Uses torch and the agent's public API; the
network agent never imports it. The controller uses only `topotrain.timing`."""
