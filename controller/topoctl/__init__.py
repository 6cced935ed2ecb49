"""topoctl: plans the network per DNN training job and drives the agents that enforce it."""

__version__ = "0.1.0"
