"""Operator fusion on the planner's side (DisCo's operator-fusion half): which regions of a
model to compile as one (`regions`), what a fused region costs (`costs.fused_costs`, learned
from regions of the catalog models measured on this CPU: `model`, `measure`)."""
