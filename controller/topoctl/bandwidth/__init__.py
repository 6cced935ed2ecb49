"""Per-destination bandwidth allocation (the bandwidth half of the placement/bandwidth thesis):
an LP over an iteration's traffic matrix gives each source host a rate per destination on each
outgoing path (`lp.allocate`); `classes.class_rows` and `classes.multipath` turn it into per-NIC
QoS classes and multipath weights. Pure functions over plain data."""
