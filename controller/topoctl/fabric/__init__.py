"""Fabric-level graph code: the capacity graph of a cluster; direct-connect topology search."""
