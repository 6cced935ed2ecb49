"""The fused-region cost model fitted by `bench/fusion_costmodel.py` on all the catalog's
measured regions (`data/regions.json`); written by that program, do not edit."""

from topoctl.fusion.model import LaunchModel

MODEL = LaunchModel(r=1.0, a=0.0, b=0.0)  # placeholder until the bench is run
