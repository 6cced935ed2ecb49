"""Drivers execute typed operations on a host. `netlink` is the kernel (pyroute2); the OVS
driver (QoS queues, select groups) plugs in behind the same `topoagent.apply.kernel_ops.Driver`
interface."""
