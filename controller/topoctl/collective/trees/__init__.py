"""Packed spanning trees for AllReduce (INFOCOM'21; Blink, MLSys'20): packing (`pack`: MW,
column generation, pruning), its LP and MST oracle (`lp`, `oracle`), exact edge-disjoint trees
(`disjoint`), independent bounds (`bounds`), the runtime schedule (`schedule`) and the simulator
collective (`simulate`). Pure functions over plain data; no I/O."""
