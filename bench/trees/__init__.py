"""Benchmarks of the packed-tree AllReduce: the planner's trees against the LP optimum at scale
(`scale`), measured in labs (`allreduce_lab`, `figures`), the runtime's CPU cost (`cpu`, against
`runtime_legacy`), and on generated clusters (`own_clusters` of `clusters`)."""
