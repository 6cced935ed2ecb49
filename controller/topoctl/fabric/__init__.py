"""The fabric as data: the cluster's hosts, ports and links (`graph`), its capacity graph
(`capgraph`) and routing over its cables (`routes`). Topology search is TopoOpt's
(`topoctl.topoopt`)."""
