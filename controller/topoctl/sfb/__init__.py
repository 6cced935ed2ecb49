"""Sufficient-factor broadcasting (Xie et al., UAI'16; as an op-level 0/1 program in TAG,
Zhang et al., TPDS'23): `program.choose_layers` picks the fully connected layers to
synchronise by broadcasting their gradients' factors (HiGHS). Pure functions, no I/O.

The post-pass (`topoctl.strategies.sfb`) builds the candidates from a plan context; the runtime's
side is `topotrain.sfb`.
"""
