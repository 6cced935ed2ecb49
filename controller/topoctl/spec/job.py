"""job.yaml: what to train and how the planner may parallelise it.

    apiVersion: topoctl/v1
    kind: Job
    name: bert-base
    model:
      catalog: bert                      # a built-in model (topoctl.catalog) ...
      params: {layers: 12, hidden: 768}  # ... with its size parameters
      # factory: mypkg.models:build      # ... or a Python import path returning an nn.Module
      # kwargs: {width: 2}               #     called with these keyword arguments
      # inputs: [{shape: [3, 224, 224]}, {shape: [128], dtype: int64, high: 30522}]  # per sample
    batch: {global: 256}                 # samples per iteration over all ranks
    dtype: float32                       # training precision (float16/bfloat16: mixed)
    parallelism: {data: true, model: false, pipeline: false}
    strategies: [baseline]               # planner strategies to run; the fastest is rendered
    sync: {algorithm: ring, bucket: 25MB}   # gradient AllReduce and bucket (tensor fusion) size
    cost: {method: auto}                 # auto | measured (timed on this CPU) | roofline
                                         # device: A100 (plan as if every GPU were one)
                                         # scale: 4 (compute slowdown, e.g. ranks per core)
    hosts: [h0, h1]                      # optional subset; default: every host with GPUs
    forwarding: kernel                   # or tc-offload (RoCE NICs; strategy topoopt)
    bandwidth: {objective: minmax, multipath: false}   # the +bandwidth post-pass (strategies
                                         # `bandwidth`, `trees+bandwidth`; docs/bandwidth.md)
    launch: {backend: gloo, port: 29500, threads: 1, iterations: 10,
             command: [python3, -m, topotrain.train]}

Unknown keys are rejected; errors name the YAML path (`model.params.layer: unknown parameter`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)

from topoagent.protocol import API_VERSION
from topoagent.state.host import StateError, load_yaml_file
from topoagent.state.schema import Model, validation_problems
from topoctl.catalog.registry import ENTRIES, resolve_params

DTYPE_NAMES = ("float32", "float16", "bfloat16")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b)?\s*$", re.IGNORECASE)
_SIZE_SCALE = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10,
               "mib": 2**20, "gib": 2**30, "tib": 2**40}
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class JobError(StateError):
    """An invalid job file; `problems` is a list of (yaml_path, message)."""


def parse_size(v: Any) -> int:
    """`25MB`, `4MiB`, `1000000` -> bytes."""
    if isinstance(v, bool):
        raise ValueError(f"not a size: {v!r}")
    if isinstance(v, int):
        n = v
    else:
        m = _SIZE.match(str(v))
        if not m:
            raise ValueError(f"not a size (e.g. 25MB, 4MiB): {v!r}")
        n = int(float(m.group(1)) * _SIZE_SCALE[(m.group(2) or "b").lower()])
    if n < 1:
        raise ValueError(f"size must be positive: {v!r}")
    return n


Size = Annotated[int, BeforeValidator(parse_size)]
# the collective the data-parallel strategies simulate and run; the others choose their own
# (trees: packed spanning trees, topoopt: TotientPerms rings, pipeline stages)
SYNC_ALGORITHMS = ("ring",)


def _sync_algorithm(v: str) -> str:
    if v not in SYNC_ALGORITHMS:
        raise ValueError(f"unknown algorithm {v!r} ({', '.join(SYNC_ALGORITHMS)}; other "
                         f"collectives come with their strategies: trees, topoopt)")
    return v


# Catalog sizes the planner can hold: every layer, table and head is a module of the captured
# graph (a billion layers took 8 GB before capture began); rows and vocabularies only scale
# the cost model, widths and images the shapes the roofline multiplies
COUNT_PARAMS = ("layers", "mlp_layers", "tower_layers", "tables", "heads", "depth")
MAX_COUNT, MAX_SIZE, MAX_ROWS = 1024, 2**20, 2**34


def _param_limits(params: dict) -> list[tuple[str, str]]:
    """(path, message) of each catalog size parameter above what the planner can hold."""
    out = []
    for k, v in params.items():
        cap = MAX_COUNT if k in COUNT_PARAMS else MAX_ROWS if k in ("rows", "vocab") \
            else MAX_SIZE
        if isinstance(v, int) and v > cap:
            out.append((f"params.{k}", f"{v} is above {cap}, the most the planner plans"))
    return out


class InputSpec(Model):
    """One model input per sample: its shape, dtype and (integers) exclusive upper bound."""

    shape: list[Annotated[int, Field(ge=1)]]
    dtype: Literal["float32", "float16", "bfloat16", "int64", "int32"] = "float32"
    high: Annotated[int, Field(ge=1)] | None = None


class ModelSpec(Model):
    """The model: a catalog name with size parameters, or a factory import path with kwargs and
    input shapes."""

    catalog: str | None = None
    params: dict[str, int] = Field(default_factory=dict)
    factory: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)
    inputs: list[InputSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        problems: list[tuple[str, str]] = []
        if (self.catalog is None) == (self.factory is None):
            problems.append(("", "give exactly one of catalog (a built-in model) or factory "
                                 "(pkg.module:callable)"))
        elif self.catalog is not None:
            if self.catalog not in ENTRIES:
                problems.append(("catalog", f"unknown model {self.catalog!r} (catalog: "
                                            f"{', '.join(ENTRIES)})"))
            else:
                try:
                    resolve_params(self.catalog, self.params)
                except ValueError as e:
                    name, _, msg = str(e).partition(": ")
                    problems.append((f"params.{name}", msg))
                problems += _param_limits(self.params)
            if self.inputs or self.kwargs:
                problems.append(("inputs" if self.inputs else "kwargs",
                                 "only for factory models (the catalog knows its inputs)"))
        else:
            if not _FACTORY.match(self.factory or ""):
                problems.append(("factory", f"expected pkg.module:callable, got {self.factory!r}"))
            if not self.inputs:
                problems.append(("inputs", "a factory model needs its input shapes (per sample)"))
            if self.params:
                problems.append(("params", "only for catalog models (use kwargs)"))
        if problems:
            raise StateError(problems)
        return self


class BatchSpec(Model):
    """The global batch: samples per iteration over all ranks."""

    model_config = Model.model_config | {"populate_by_name": True}

    global_: Annotated[int, Field(ge=1, alias="global")]


class Parallelism(Model):
    """`microbatches` per iteration and `search` (auto: the heuristics' candidates scored by
    simulation; milp: plus the MILP warm-started from them; heuristic: HEFT by the objective;
    partition: the contiguous baseline) for the pipeline strategies (`placement`, `pipeline`)."""

    data: bool = True
    model: bool = False
    pipeline: bool = False
    microbatches: Annotated[int, Field(ge=1, le=1024)] = 4
    search: Literal["auto", "milp", "heuristic", "partition"] = "auto"


class SyncSpec(Model):
    """Gradient synchronisation: the AllReduce algorithm and the bucket size in bytes (DDP's
    ``bucket_cap_mb``). `fusion`: ``search`` lets the `trees` strategy (and `trees+bandwidth`)
    fuse the gradient into larger buckets when that is predicted faster (tensor fusion, as TAG
    and DisCo search it: `bucket`, doubled up to the whole gradient); ``fixed`` keeps
    `bucket`. The other strategies always keep `bucket`."""

    algorithm: Annotated[str, AfterValidator(_sync_algorithm)] = "ring"
    bucket: Size = 25 * 10**6
    fusion: Literal["search", "fixed"] = "search"


class CostSpec(Model):
    """`device` plans as if every host had GPUs of this type (roofline; what-if planning on a
    lab of CPU hosts); default: each host's own gpus.type."""

    method: Literal["auto", "measured", "roofline"] = "auto"
    device: str | None = None
    # multiplies every compute time: e.g. 4 for a lab whose 8 single-thread ranks share 2 cores
    scale: Annotated[float, Field(gt=0, le=1000)] = 1.0
    profile_batch: Annotated[int, Field(ge=1, le=4096)] | None = None  # measured: batch to time


class BandwidthSpec(Model):
    """The `+bandwidth` post-pass (docs/bandwidth.md). `objective`: ``minmax`` (the LP: all of
    the iteration's transfers finish as early as possible) or ``proportional`` (each pair keeps
    its routed path, links shared in proportion to demand). `multipath`: let the minmax LP split
    a destination over several first hops (one-hop detours through neighbours on direct
    fabrics), rendered as weighted next hops in policy-routing table 100 and `ip_forward` on
    the detour hosts. Off by default: it makes other hosts forward (their CPU and links) and
    cannot split into a switch; turn it on for direct-connect fabrics."""

    objective: Literal["minmax", "proportional"] = "minmax"
    multipath: StrictBool = False  # "yes" is not a boolean here

    @model_validator(mode="after")
    def _multipath_needs_minmax(self) -> BandwidthSpec:
        if self.multipath and self.objective != "minmax":
            raise StateError([("multipath", "only with objective: minmax (proportional keeps "
                                            "each pair on its routed path)")])
        return self


class LaunchSpec(Model):
    """How ranks start. `threads`: torch threads per rank (CPU hosts; measured costs are timed
    with the same number); `iterations`: training steps to run."""

    backend: Literal["gloo"] = "gloo"
    port: Annotated[int, Field(ge=1024, le=65535)] = 29500
    threads: Annotated[int, Field(ge=1, le=256)] = 1
    iterations: Annotated[int, Field(ge=1)] = 10
    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = Field(
        default_factory=lambda: ["python3", "-m", "topotrain.train"])


class TagSpec(Model):
    """The `tag` strategy's search (docs/tag.md): `playouts` (the budget, counted: the tree's
    playouts and the walk's steps; the other strategies' plans it starts from run to
    completion), `simulations` (the most distinct plans the tree and the walk simulate
    together: what bounds the search's time on large clusters), `time_limit` (unset by
    default: no wall clock, the same input gives the same plan on any machine; set, seconds
    for the whole strategy, and the plan records what the clock cut, since it may then differ
    from run to run), `seed` (tie-breaking), `prior` (gnn: the shipped weights; uniform: plain
    MCTS), `max_groups` (op-groups searched, one tree level each)."""

    playouts: Annotated[int, Field(ge=1, le=1_000_000)] = 2000
    simulations: Annotated[int, Field(ge=1, le=10_000_000)] = 500
    time_limit: Annotated[float, Field(gt=0, le=86400)] | None = None
    seed: Annotated[int, Field(ge=0)] = 0
    prior: Literal["gnn", "uniform"] = "gnn"
    max_groups: Annotated[int, Field(ge=1, le=64)] = 24


class Job(Model):
    """A validated job file: model, batch, dtype, parallelism, strategies, sync, cost, hosts,
    forwarding, bandwidth, launch."""

    model_config = Model.model_config | {"populate_by_name": True}

    api_version: Literal[API_VERSION] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["Job"] = "Job"
    name: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")]
    model: ModelSpec
    batch: BatchSpec
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    parallelism: Parallelism = Field(default_factory=Parallelism)
    strategies: Annotated[list[str], Field(min_length=1)] = Field(
        default_factory=lambda: ["baseline"])
    sync: SyncSpec = Field(default_factory=SyncSpec)
    cost: CostSpec = Field(default_factory=CostSpec)
    hosts: Annotated[list[str], Field(min_length=1)] | None = None  # absent: every GPU host
    launch: LaunchSpec = Field(default_factory=LaunchSpec)
    # how hosts forward for others on direct fabrics: kernel IP forwarding, or tc flower rules
    # with pedit/mirred (RoCE NICs, TopoOpt's testbed; rendered by strategy topoopt)
    forwarding: Literal["kernel", "tc-offload"] = "kernel"
    bandwidth: BandwidthSpec = Field(default_factory=BandwidthSpec)
    tag: TagSpec = Field(default_factory=TagSpec)

    @model_validator(mode="after")
    def _checks(self) -> Job:
        problems: list[tuple[str, str]] = []
        if not self.parallelism.data and not (self.parallelism.model or self.parallelism.pipeline):
            problems.append(("parallelism", "allow at least one of data, model, pipeline"))
        if len(set(self.strategies)) != len(self.strategies):
            problems.append(("strategies", "a strategy is listed twice"))
        if self.hosts is not None and len(set(self.hosts)) != len(self.hosts):
            problems.append(("hosts", "a host is listed twice"))
        if problems:
            raise StateError(problems)
        return self

    def to_dict(self) -> dict:
        """The job as job-file data (aliases, no unset values)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def parse_job(data: Any, source: str = "<input>") -> Job:
    """A validated Job from parsed YAML; JobError naming every problem's YAML path in `source`."""
    if not isinstance(data, dict):
        raise JobError([("", f"expected a mapping with apiVersion: {API_VERSION}, "
                             f"kind: Job, got {type(data).__name__}")], source=source)
    try:
        return Job.model_validate(data)
    except ValidationError as e:
        raise JobError(validation_problems(e, ""), source=source) from None


def load_job(path: str | Path) -> Job:
    """Read and validate a job file; JobError (one line per problem) when it is bad."""
    try:
        data = load_yaml_file(path)
    except StateError as e:
        raise JobError(e.problems, source=e.source or str(path)) from None
    return parse_job(data, str(path))
