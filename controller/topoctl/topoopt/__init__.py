"""TopoOpt (Wang et al., "TopoOpt: Co-optimizing Network Topology and Parallelization Strategy
for Distributed Training Jobs", NSDI'23): the direct-connect cabling of a job's servers.

Pure functions over plain data, no I/O:
- `totient`: TotientPerms, AllReduce rings over Z_n and the search for their strides;
- `matching`: model-parallel links by repeated maximum-weight matching;
- `topology`: TopologyFinder, the degree split, the rings, the matching and the port map.

Routing over the cabled fabric is general (`topoctl.fabric.routes`); the strategy
(`topoctl.strategies.topoopt`) builds the inputs from a plan context and renders the result.
"""
