"""Reading cluster files: YAML -> validated `Cluster`, or `ClusterError` with YAML paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from topoagent.state.host import StateError, load_yaml_file
from topoctl.spec.cluster import API_VERSION, KIND, Cluster, ClusterError, cluster_problems

# `cluster_problems` lives in spec.cluster (Cluster.with_fabric needs it); found here too
__all__ = ["cluster_problems", "load_cluster", "parse_cluster"]


def parse_cluster(data: Any, source: str = "<input>") -> Cluster:
    """Validate plain data (as loaded from YAML) into a Cluster, or raise ClusterError."""
    if not isinstance(data, dict):
        raise ClusterError([("", f"expected a mapping with apiVersion: {API_VERSION}, "
                                 f"kind: {KIND}, got {type(data).__name__}")], source=source)
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        raise ClusterError(cluster_problems(e), source=source) from None


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a cluster file; ClusterError (one line per problem) when it is bad."""
    try:
        data = load_yaml_file(path)
    except StateError as e:
        raise ClusterError(e.problems, source=e.source or str(path)) from None
    return parse_cluster(data, str(path))
