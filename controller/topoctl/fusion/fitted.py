"""The fused-region cost model fitted by `bench/fusion_costmodel.py` on all the catalog's measured
regions (`data/regions.json`); written by that program, do not edit."""

from topoctl.fusion.model import LaunchModel

MODEL = LaunchModel(r=1.4058, a=0, b=7.35437e-10)
