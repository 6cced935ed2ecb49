"""The fused-region cost model fitted by `bench/sync/fusion_costmodel.py` on all the catalog's
measured regions (`data/regions.json`); written by that program, do not edit."""

from topoctl.disco.fusion.model import LaunchModel

MODEL = LaunchModel(r=1.40256, a=2.83652e-06, b=7.3183e-10)
