"""The typed documents that cross the wire between controller and agent (the protocol's half
that needs the schema; API version, exit codes and the error type are in `topoagent.protocol`,
which this module cannot live in: the schema imports the protocol).

- `HostState` (topoagent.state.host): one host's network state, sent to `topo-agent diff/apply -`.
- `LaunchSpec`: the plan's `job`, sent to `topo-agent launch -`: the command, the model as an
  import path (so the training process needs no controller code), and per host its processes
  with rank and environment.
- a plan file (`plan_problems`): `hosts` (name -> HostState) and `job` (a LaunchSpec, or for a
  network-only plan a mapping without `command`).

The controller renders through these models (`topoctl.render.plan`); the agent validates with
them; errors name the YAML path (`job.processes.h3[0].rank: ...`).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from topoagent.protocol import API_VERSION
from topoagent.state.host import StateError, load_yaml, parse_host_state, read_text
from topoagent.state.schema import Model, validation_problems
from topocontract.buckets import BUCKET_PLAN_KEY, overlap_problems, shape_problems
from topocontract.collective import collective_problems
from topocontract.fusion import parse_fusion
from topocontract.slicing import slicing_problems


class Master(Model):
    """Rank 0's training address and the rendezvous port (MASTER_ADDR, MASTER_PORT)."""

    address: str
    port: int = Field(ge=1, le=65535)


class Batch(Model):
    """Samples per iteration: over all ranks, and per rank. `shares` (batch shares by speed):
    rank r's samples per iteration, indexed by global rank, summing to `global`; the ranks
    weight their gradients by them so the average equals one process on the whole batch.
    Without it every rank takes `per_rank`."""

    global_: int = Field(alias="global", ge=1)
    per_rank: int = Field(ge=1)
    shares: list[Annotated[int, Field(ge=1)]] | None = None

    @model_validator(mode="after")
    def _shares_add_up(self) -> Batch:
        if self.shares is not None and sum(self.shares) != self.global_:
            raise ValueError(f"shares: {sum(self.shares)} samples, not the global batch "
                             f"{self.global_}")
        return self

    def samples(self, rank: int) -> int:
        """Samples per iteration of global rank `rank`: its share, else `per_rank`."""
        return self.shares[rank] if self.shares is not None else self.per_rank


class InputSpec(Model):
    """One model input per sample (the batch dimension is added by the trainer)."""

    shape: list[int]
    dtype: str = "float32"
    high: int | None = None  # integer inputs: values in [0, high)


class ModelSpec(Model):
    """How a training process builds the model: `factory` ("module:callable") called with
    `kwargs`, fed `inputs`. Plans written before factories carry `catalog` + `params` only
    (`topoctl run` resolves them before launching)."""

    catalog: str | None = None
    factory: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)
    params: dict[str, Any] | None = None
    inputs: list[InputSpec] = Field(default_factory=list)


class Process(Model):
    """One rank on a host: its global and local rank, the training address gloo binds, and the
    environment it starts with (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""

    rank: int = Field(ge=0)
    local_rank: int = Field(ge=0)
    bind_address: str | None = None
    env: dict[str, str] = Field(default_factory=dict)


class Checkpointing(Model):
    """Checkpoints of a data-parallel run (`topoctl run --heal`): every `every` iterations
    (0: never) each host's first rank writes the parameters and optimizer state under the
    agent's run directory; with `resume` the ranks continue from the newest one any rank has
    (else stale checkpoints are removed first)."""

    every: int = Field(0, ge=0)
    resume: bool = False


# what `topo-agent launch` gives the ranks besides the job spec ($TOPOCTL_JOB): the schedule
# of a `trees` collective, in this file of the ranks' directory, named by this variable (the
# runtime's DDP hook, `register_tree_hook(model)`, reads it)
TREE_SCHEDULE_ENV = "TOPO_TREE_SCHEDULE"
TREE_SCHEDULE_FILE = "tree-schedule.json"


class LaunchSpec(Model):
    """The plan's `job`: what `topo-agent launch` runs and `topotrain.train` reads."""

    name: str
    backend: Literal["gloo"] = "gloo"
    command: list[str] = Field(min_length=1)
    world_size: int = Field(ge=1)
    master: Master
    threads: int = Field(1, ge=1)
    iterations: int = Field(10, ge=1)
    batch: Batch
    model: ModelSpec
    dtype: str = "float32"
    bucket_cap_mb: float = Field(25.0, gt=0)
    # how gradients are synchronised: {"algorithm": "ring" | "trees", ...}; the trees schedule
    # is validated by topocontract.schedule when the trainer loads it
    collective: dict[str, Any] = Field(default_factory=dict)
    # sufficient-factor broadcasting: the nn.Linear modules (qualified names, as
    # `model.named_modules()` gives them) whose weight gradients the ranks rebuild from
    # all-gathered inputs and output gradients instead of all-reducing them
    sfb: list[str] = Field(default_factory=list)
    # operator fusion: {"mode": none|groups|whole, "regions": [module path], "budget_s": s},
    # validated by topocontract.fusion when the trainer loads it (topotrain.fusion)
    fusion: dict[str, Any] = Field(default_factory=dict)
    processes: dict[str, list[Process]]
    seed: int = 0
    lr: float = 1e-3
    # the account the ranks run as (default: the agent's $TOPO_RANK_USER, else `nobody`);
    # `root` only when named here (`topoctl run --user root`): docs/agent.md, trust model
    user: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
    # added by `topoctl run`, never rendered into plans: per host, the fabric interfaces whose
    # carrier the launcher watches (a lost one stops the host's ranks and is reported as a
    # `link-down` event), and checkpointing
    watch: dict[str, list[str]] = Field(default_factory=dict)
    checkpoint: Checkpointing = Field(default_factory=Checkpointing)

    @model_validator(mode="after")
    def _one_share_per_rank(self) -> LaunchSpec:
        shares = self.batch.shares
        if shares is not None and len(shares) != self.world_size:
            raise ValueError(f"batch.shares: {len(shares)} shares for world_size "
                             f"{self.world_size}")
        if shares is not None and self.sfb:
            raise ValueError("sfb: the ranks all-gather equal factor rows; not with "
                             "batch.shares")
        return self

    def to_dict(self, exclude_unset: bool = False) -> dict:
        """Plain data for YAML/JSON, keys as written in plans (`batch.global`); with
        `exclude_unset` only the keys that were given (how plans are rendered)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True,
                               exclude_unset=exclude_unset)


PLAN_KEYS = ("apiVersion", "kind", "metadata", "fabric", "hosts", "job")


def plan_problems(doc: Any) -> list[tuple[str, str]]:
    """Every problem (YAML path, message) of a plan document: its shape, every host's
    HostState, and the job's LaunchSpec when it has a `command` (a job without one is a
    network-only plan: apply works, launch does not). Empty when valid. `metadata` and
    `fabric` are the controller's own: only their shape is checked here."""
    if not isinstance(doc, dict):
        return [("", "expected a mapping (a Plan)")]
    problems = []
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != "Plan":
        problems.append(("kind", f"expected apiVersion: {API_VERSION}, kind: Plan"))
    for key in PLAN_KEYS[2:]:
        if not isinstance(doc.get(key), dict):
            problems.append((key, "missing (a mapping)"))
    problems += [(str(k), "unknown key") for k in sorted(set(doc) - set(PLAN_KEYS), key=str)]
    hosts = doc["hosts"] if isinstance(doc.get("hosts"), dict) else {}
    for name, state in hosts.items():
        try:
            parse_host_state(state, prefix=f"hosts.{name}")
        except StateError as e:
            problems += e.problems
    job = doc["job"] if isinstance(doc.get("job"), dict) else {}
    if "command" in job:
        try:
            parse_launch_spec(job)
        except StateError as e:
            problems += e.problems
    procs = job.get("processes")
    for name in procs if isinstance(procs, dict) else {}:
        if name not in hosts:
            problems.append((f"job.processes.{name}", "no such host in hosts"))
    return problems


def parse_launch_spec(data: Any, prefix: str = "job") -> LaunchSpec:
    """Validate plain data into a LaunchSpec; StateError with YAML paths under `prefix`."""
    if not isinstance(data, dict):
        raise StateError([(prefix, f"expected a job launch spec (a mapping), got "
                                   f"{type(data).__name__}")])
    try:
        spec = LaunchSpec.model_validate(data)
    except ValidationError as e:
        raise StateError(validation_problems(e, prefix)) from None
    if BUCKET_PLAN_KEY in spec.collective:  # plan-named gradient buckets: their shape here
        problems = shape_problems(spec.collective[BUCKET_PLAN_KEY],
                                  f"{prefix}.collective.{BUCKET_PLAN_KEY}")
        if problems:
            raise StateError(problems)
    problems = overlap_problems(spec.collective, f"{prefix}.collective")
    if problems:  # `bucket_overlap`: a known mode, next to a bucket plan
        raise StateError(problems)
    problems = slicing_problems(spec.collective, f"{prefix}.collective")
    if problems:  # `bucket_slicing`: slices, priority and credit of the plan's buckets
        raise StateError(problems)
    # what the runtime would otherwise refuse in every rank, or run some other way than
    # written: checked wherever a plan is read (apply, run, launch), one path
    problems = (rank_problems(spec, prefix)
                + collective_problems(spec.collective, spec.world_size, f"{prefix}.collective")
                + fusion_problems(spec.fusion, f"{prefix}.fusion"))
    if problems:
        raise StateError(problems)
    return spec


def rank_problems(spec: LaunchSpec, prefix: str = "job") -> list[tuple[str, str]]:
    """The processes' global ranks must be 0 .. world_size-1, each once: a rank missing or
    given twice would wait for the others until gloo's timeout, a job.world_size that is not
    the processes' count trains some other job than the plan's. O(ranks log ranks), whatever
    job.world_size says (it is the plan's word, maybe 2**70: never a range of it)."""
    ranks = sorted(p.rank for procs in spec.processes.values() for p in procs)
    if len(ranks) != spec.world_size:
        return [(f"{prefix}.world_size", f"{spec.world_size}, but job.processes has "
                                          f"{len(ranks)} rank(s)")]
    if all(r == i for i, r in enumerate(ranks)):  # sorted and as many: 0 .. world_size-1
        return []
    twice = sorted(r for r, n in Counter(ranks).items() if n > 1)
    return [(f"{prefix}.processes", f"the ranks must be 0 to {spec.world_size - 1}, each once "
                                    f"(given twice: {twice or 'none'}; out of range: "
                                    f"{[r for r in ranks if r >= spec.world_size] or 'none'})")]


def fusion_problems(doc: Any, at: str = "job.fusion") -> list[tuple[str, str]]:
    """`job.fusion` as the runtime reads it (`topocontract.fusion.parse_fusion`), its
    message split into the YAML path it names and the reason."""
    try:
        parse_fusion(doc, at)
    except ValueError as e:
        where, _, why = str(e).partition(": ")
        return [(where, why) if why else (at, str(e))]
    return []


def load_launch_spec(path: str) -> LaunchSpec:
    """Read (path "-": stdin) and validate a launch spec (JSON or YAML); StateError naming the
    file and YAML path when it is bad."""
    source = "<stdin>" if path == "-" else path
    try:
        return parse_launch_spec(load_yaml(read_text(path), source))
    except StateError as e:
        raise e.at(source) from None
