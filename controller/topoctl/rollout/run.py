"""`topoctl run`: start a plan's training processes on every host and supervise them.

Each host's agent gets the job spec (with the model resolved to an import path and input
shapes, so the training processes need nothing of the controller) and runs its ranks
(`topo-agent launch`) as the job's user. Lines come back prefixed: `[rank N] ` a rank's output
(shown, never read as an event), `[event N] ` an event from rank N's event channel, bare JSON
the launcher's own events (`failed`, `link-down`, `warning`). Iteration events from rank 0
become a live iterations/s line. An event that does not parse or lacks a field is shown as
output and otherwise ignored. If any host's ranks fail, every other host is told to stop at
once, and the result names the rank and shows its last lines; ranks that end without
reporting iterations are a failure too. Interrupted (Ctrl-C, SIGTERM, SIGHUP: the CLI turns
them into KeyboardInterrupt), the transport is closed, which ends every launcher (and each
launcher its ranks), before the interrupt goes on.

Each host's launcher also watches the carrier of the interfaces the plan routes training over
(`links.watched_interfaces`): a cable that fails is reported by the hosts at its ends within
~0.5 s as a `link-down` event, every host's ranks are stopped at once, and the result names the
cable and both its ends (`links_down`) instead of the ranks' gloo timeout 120 s later.
`topoctl run --heal` (`rollout.heal`) builds on this."""

from __future__ import annotations

import copy
import json
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from topoagent.protocol import EXIT_INTERRUPTED, STOP_AFTER_FAILURE, STOP_BY_OPERATOR
from topoagent.state.host import StateError
from topoagent.state.wire import parse_launch_spec
from topoctl.catalog.registry import ENTRIES, resolve_params
from topoctl.rollout.links import cable_at, watched_interfaces
from topoctl.rollout.transports import UNREACHABLE, Transport

WARMUP = 2  # iterations left out of the timing (process-group setup, allocator warm-up)
RANK_EVENTS = ("start", "resume", "iter", "done")  # from a rank's event channel only
LAUNCHER_EVENTS = ("failed", "stopped", "link-down", "warning")  # from the launcher only
TRACEBACK = "Traceback (most recent call last):"


def iterations_for(predicted: float, at_least: int, min_seconds: float) -> int:
    """Iterations to run a plan predicted at `predicted` seconds each: `at_least`, or more
    when the timed ones (all but the `WARMUP` first) would cover less than `min_seconds`
    (the benchmarks' default: `bench.common.MIN_TIMED_SECONDS`)."""
    return max(at_least, WARMUP + math.ceil(min_seconds / max(predicted, 1e-3)))


@dataclass
class RankStats:
    """What one rank reported: its host, seconds per iteration and final parameter checksum."""

    host: str
    iterations: list[float] = field(default_factory=list)  # seconds per iteration
    checksum: str | None = None
    # pipeline plans: ranks of one stage hold the same parameters
    stage: int | None = None
    losses: list[float] = field(default_factory=list)  # as reported (pipeline: last stage)
    # tree plans: per iteration, per gradient bucket (bytes, s waiting for the runtime's
    # thread, s of the AllReduce), as the rank reported them
    allreduce: list[list[tuple[int, float, float]]] = field(default_factory=list)

    def median(self) -> float | None:
        """Median seconds per iteration after the warm-up (None without iterations)."""
        xs = self.iterations[WARMUP:] or self.iterations
        return statistics.median(xs) if xs else None


@dataclass
class RunResult:
    """The outcome of `topoctl run`: exit code, per-rank statistics, duration and the failure, if
    any."""

    exit_code: int
    ranks: dict[int, RankStats]
    seconds: float
    failure: str = ""
    # cables found failed: {host, interface, reason, cable, peer, at (the agent's wall clock
    # when it saw the carrier go), received (the controller's)}, in the order reported
    links_down: list[dict] = field(default_factory=list)
    resumed_from: int | None = None  # iterations already done when the ranks resumed
    # hosts whose ranks an operator stopped (`topoctl stop`): the run ends as stopped (exit
    # 130), and what the other ranks did then is a consequence
    stopped: list[str] = field(default_factory=list)
    started_at: float = 0.0  # wall clock: launch requested
    first_iteration_at: float | None = None  # wall clock: rank 0's first iteration reported

    @property
    def failed_cables(self) -> list[str]:
        """The failed cables' names, each once, in the order reported."""
        return list(dict.fromkeys(d["cable"] for d in self.links_down))

    @property
    def iteration_time(self) -> float | None:
        """The job's period: median over iterations of the ranks' mean time.

        The ranks wait for each other in every iteration's collectives, so they all go through
        the iterations at one pace, but not in step: a tree's root has the last bucket's result
        before its leaves, so it starts the next iteration first and then waits for them in
        that iteration's first collective. Its own time counts that lead, which the job does
        not lose (the leaves' next iteration is as much shorter); the mean over the ranks is
        the time between one iteration's end and the next. On hetero8's TopoOpt plan
        the slowest rank's time was 0.674 s, the ranks' mean 0.659 s, the time
        between the iterations' last ends 0.660 s. Each rank's time is read on its own clock
        (hosts' clocks are never compared)."""
        per_iter: dict[int, list[float]] = {}
        for r in self.ranks.values():
            for i, t in enumerate(r.iterations):
                per_iter.setdefault(i, []).append(t)
        means = {i: statistics.fmean(ts) for i, ts in sorted(per_iter.items())}
        xs = [t for i, t in means.items() if i >= WARMUP] or list(means.values())
        return statistics.median(xs) if xs else None

    @property
    def checksums_reported(self) -> bool:
        """Some rank reported its parameters' checksum (`topotrain.report.done(model)`)."""
        return any(r.checksum is not None for r in self.ranks.values())

    @property
    def synchronous(self) -> bool:
        """Every rank ended with the same parameters (pipeline: every rank of a stage)."""
        groups: dict[int | None, set] = {}
        for r in self.ranks.values():
            groups.setdefault(r.stage, set()).add(r.checksum)
        return bool(groups) and all(len(v) == 1 and None not in v for v in groups.values())

    @property
    def allreduce_seconds(self) -> list[dict] | None:
        """Tree plans: per gradient bucket, in the order reduced, its bytes and the median over
        the timed iterations of its AllReduce's seconds on the rank that started it last (the
        others waited for that rank: their time includes the skew between the ranks, `skew`
        is the median of that spread); None without bucket timings."""
        per_iter: dict[int, list[list[tuple[int, float, float]]]] = {}
        for r in self.ranks.values():
            for i, buckets in enumerate(r.allreduce):
                per_iter.setdefault(i, []).append(buckets)
        rows: dict[int, tuple[int, list[float], list[float]]] = {}
        timed = [i for i in sorted(per_iter) if i >= WARMUP] or sorted(per_iter)
        for i in timed:
            ranks = per_iter[i]
            if len(ranks) != len(self.ranks) or len({len(b) for b in ranks}) != 1:
                continue  # a rank without this iteration, or DDP's first bucketing
            for k, per_rank in enumerate(zip(*ranks, strict=True)):
                runs = [run for _, _, run in per_rank]
                size, own, spread = rows.setdefault(k, (per_rank[0][0], [], []))
                own.append(min(runs))
                spread.append(max(runs) - min(runs))
        if not rows:
            return None
        return [{"bytes": size, "seconds": round(statistics.median(own), 6),
                 "skew": round(statistics.median(spread), 6)}
                for _, (size, own, spread) in sorted(rows.items())]

    def to_dict(self) -> dict:
        """The result as the `--json` document of `topoctl run`."""
        return {"exit_code": self.exit_code, "seconds": round(self.seconds, 3),
                "iteration_time": self.iteration_time, "synchronous": self.synchronous,
                "allreduce": self.allreduce_seconds,
                "failure": self.failure, "links_down": self.links_down,
                "stopped": self.stopped, "resumed_from": self.resumed_from,
                "ranks": {r: {"host": s.host, "iterations": len(s.iterations),
                              "median": s.median(), "checksum": s.checksum}
                          | ({"stage": s.stage, "losses": s.losses} if s.stage is not None
                             else {})
                          for r, s in sorted(self.ranks.items())}}


def allreduce_summary(rows: list[dict], predicted: list[float] | None = None) -> str:
    """One line of the tree runtime's measured seconds per bucket (`RunResult.
    allreduce_seconds`) beside the plan's prediction of each (``metadata.collective.runtime.
    bucket_seconds``) and the skew between the ranks' starts."""
    pred = predicted or []
    return "tree AllReduce per bucket, measured / predicted s (skew between ranks): " + ", ".join(
        f"{r['bytes'] / 1e6:.1f} MB {r['seconds']:.3f}"
        + (f" / {pred[k]:.3f}" if k < len(pred) else "") + f" ({r['skew']:.3f})"
        for k, r in enumerate(rows))


def predicted_buckets(plan: dict) -> list[float]:
    """The plan's predicted runtime seconds per gradient bucket (tree plans), else []."""
    runtime = (plan.get("metadata", {}).get("collective") or {}).get("runtime") or {}
    return list(runtime.get("bucket_seconds") or [])


def rank_user(plan: dict, user: str | None) -> str | None:
    """The user the ranks run as: `user` (the operator's `--user`), else the plan's
    `job.user`, else None (the agent's default, an unprivileged account). StateError at
    `job.user` when the plan asks for root and the operator did not: a plan's author cannot
    make its command run as root (docs/agent.md, trust model)."""
    if user:
        return user
    asked = (plan.get("job") or {}).get("user")
    if asked == "root":
        raise StateError("the plan asks to run the ranks as root: only the operator can "
                         "(`topoctl run --user root`)", "job.user")
    return asked


def job_payload(plan: dict, iterations: int, threads: int = 1, watch: bool = True,
                checkpoint: dict | None = None, user: str | None = None) -> dict:
    """The plan's job spec for `topo-agent launch`, with the model as factory + kwargs + inputs,
    the given iterations and threads, the interfaces each launcher watches (`watch`), the
    checkpointing (`{every, resume}`) and the ranks' user (`rank_user`), validated as the
    agent will (`LaunchSpec`). StateError (YAML paths under `job`) when the plan has no job to
    run or it is invalid."""
    job = copy.deepcopy(plan["job"])
    if "command" not in job:
        raise StateError("this plan configures the network only: it has no job to run",
                         "job.command")
    job.pop("user", None)
    if who := rank_user(plan, user):
        job["user"] = who
    model = job.get("model") or {}
    if isinstance(model, dict) and model.get("catalog") and not model.get("factory"):
        job["model"] = catalog_model(model)  # plans rendered before factories
    job["iterations"] = iterations
    job["threads"] = threads
    if watch:
        job["watch"] = watched_interfaces(plan)
    if checkpoint:
        job["checkpoint"] = checkpoint
    return parse_launch_spec(job).to_dict(exclude_unset=True)


def named_in_model(job: dict) -> dict[str, tuple[str, str]]:
    """What a launch spec names in its model, {yaml path: (name, kind)}: the fusion regions
    (modules), the SFB layers (nn.Linear modules) and the parameters of a bucket plan."""
    names: dict[str, tuple[str, str]] = {}
    for i, r in enumerate((job.get("fusion") or {}).get("regions") or []):
        names[f"job.fusion.regions[{i}]"] = (r, "module")
    for i, m in enumerate(job.get("sfb") or []):
        names[f"job.sfb[{i}]"] = (m, "linear")
    for i, b in enumerate((job.get("collective") or {}).get("bucket_plan") or []):
        for j, p in enumerate(b.get("params") or []):
            names[f"job.collective.bucket_plan[{i}].params[{j}]"] = (p, "parameter")
    return names


def check_model(job: dict) -> None:
    """Before any rank starts: the job's factory builds a torch.nn.Module that has every
    module and parameter the plan names (`named_in_model`), else StateError naming each YAML
    path (every rank would otherwise die of it with a traceback). The factory runs as in
    planning: in a child process as the capture user (`graph.sandbox`), on the meta device;
    a catalog model's exact factory (topoctl's own class) in this process, and only when the
    plan names something in it. A spec without a factory (a command of the operator's own) is
    not checked."""
    model = job.get("model") or {}
    if not model.get("factory"):
        return
    names = named_in_model(job)
    if model["factory"] in {e.factory for e in ENTRIES.values()}:
        # topoctl's own models build nn.Modules: only what the plan names needs a look, in
        # this process (no child of ~4 CPU-s per run: the demo runs a dozen)
        if not names:
            return
        from topoctl.graph.capture_worker import check_names  # torch: `run` only
        problems = check_names({"factory": model["factory"],
                                "kwargs": model.get("kwargs") or {},
                                "names": {k: list(v) for k, v in names.items()}})["problems"]
        _raise_problems(problems)
        return
    # the capture child's side imports torch: only `run` pays for it, not `stop`
    from topoctl.graph.capture import CaptureError
    from topoctl.graph.sandbox import model_problems  # torch too: `run` only, as above
    try:
        problems = model_problems(model["factory"], model.get("kwargs") or {}, names)
    except CaptureError as e:
        problems = e.problems
    _raise_problems(problems)


def _raise_problems(problems: list) -> None:
    """StateError with every (yaml path, message), paths put under ``job.model``."""
    problems = [(p if p.startswith("job.") else f"job.model.{p}" if p else "job.model", m)
                for p, m in problems]
    if problems:
        raise StateError(problems)


def catalog_model(model: dict) -> dict:
    """A plan's ``job.model`` naming a catalog model (`catalog` + `params`) as the runtime
    takes it (`factory` + `kwargs` + `inputs`); StateError at ``job.model.catalog`` or
    ``job.model.params`` when the catalog has no such model or parameter."""
    name = model["catalog"]
    if not isinstance(name, str) or name not in ENTRIES:
        raise StateError([("job.model.catalog", f"unknown model {name!r} (catalog: "
                                                f"{', '.join(sorted(ENTRIES))})")])
    params = model.get("params") or {}
    if not isinstance(params, dict):
        raise StateError([("job.model.params", "expected a mapping of parameter: value")])
    try:
        params = resolve_params(name, params)
    except ValueError as e:
        raise StateError([("job.model.params", str(e))]) from None
    entry = ENTRIES[name]
    return {"factory": f"{entry.cls.__module__}:{entry.cls.__qualname__}",
            "kwargs": params, "inputs": [asdict(s) for s in entry.inputs(params)]}


def run_job(plan: dict, transport: Transport, iterations: int = 10,
            out: Callable[[str], None] = print, verbose: bool = False,
            timeout: float | None = None, watch: bool = True,
            checkpoint: dict | None = None, user: str | None = None,
            live: bool = False) -> RunResult:
    """Launch the plan's ranks on every host through `transport`, stream their lines to `out`, stop
    all when one fails or a watched cable loses its carrier (`checkpoint`: `{every, resume}`
    for the trainer; `user`: the operator's choice of the ranks' user). `live`: `out` shows
    the ranks' output as it comes (a terminal), so the failure names the failed rank's last
    lines without repeating them; else they are in `RunResult.failure`."""
    job = job_payload(plan, iterations, watch=watch, checkpoint=checkpoint, user=user)
    check_model(job)
    hosts = sorted(job["processes"])
    ranks = {int(p["rank"]): RankStats(h) for h in hosts for p in job["processes"][h]}
    run = _Supervision(plan, transport, hosts, ranks, iterations, out, verbose, live)
    run.launch_all(json.dumps(job), timeout)
    return run.result()


def _split_line(line: str) -> tuple[int | None, dict | None]:
    """(rank, JSON event) of one launcher line: ``[event N] body`` from rank N's event
    channel, a bare body from the launcher itself; ``[rank N] body`` is a rank's output,
    never an event (rank N, event None). The event is None when the body is not a JSON
    object or its kind does not come from there."""
    for prefix, kinds in (("[event ", RANK_EVENTS), ("[rank ", ())):
        if line.startswith(prefix):
            head, _, body = line.partition("] ")
            number = head[len(prefix):]
            rank = int(number) if number.isdigit() else None
            event = _json(body) if kinds and rank is not None else None
            return rank, event if event and event.get("event") in kinds else None
    event = _json(line)
    return None, event if event and event.get("event") in LAUNCHER_EVENTS else None


@dataclass
class _Supervision:
    """One `run_job`: what the hosts' lines reported so far, and stopping every host once.
    The transport calls `on_line` from one thread per host, so every change to the shared
    state happens under `lock`."""

    plan: dict
    transport: Transport
    hosts: list[str]
    ranks: dict[int, RankStats]
    iterations: int
    out: Callable[[str], None]
    verbose: bool
    live: bool = False  # `out` shows the ranks' output (`run_job`)
    lock: threading.Lock = field(default_factory=threading.Lock)
    failures: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)  # hosts an operator's stop reached
    # output held back: other ranks' tracebacks while one is shown, and every rank's output
    # once the run is stopping (broken connections that only bury the first cause)
    muted: set[int] = field(default_factory=set)
    traceback_of: int | None = None  # the rank whose traceback is shown
    held: int = 0  # lines held back
    links_down: list[dict] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)  # resumed_from, first_iteration_at
    done_ranks: set[int] = field(default_factory=set)  # ranks that reported final parameters
    stopping: threading.Event = field(default_factory=threading.Event)
    stoppers: list[threading.Thread] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)
    started_at: float = field(default_factory=time.time)

    def launch_all(self, payload: str, timeout: float | None) -> None:
        """Run every host's launcher at once and wait for all of them, then for the stop
        requests sent meanwhile (a stop must not outlive the run that sent it)."""
        # daemons: an interrupted run must not wait at exit for a host that does not answer
        threads = [threading.Thread(target=self.run_host, args=(h, payload, timeout),
                                    daemon=True) for h in self.hosts]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except BaseException:  # Ctrl-C, or SIGTERM/SIGHUP as the CLI raises them
            self.abort()
            raise
        for t in self.stoppers:
            t.join()

    def abort(self) -> None:
        """An interrupted run: close the transport at once, which ends every launcher (this
        machine's by SIGTERM, a remote one as its SSH connection closes), and each launcher
        stops its ranks. No stop request first: it would only wait for agents to start."""
        self.stopping.set()
        self.transport.close()

    def run_host(self, host: str, payload: str, timeout: float | None) -> None:
        """One host's `topo-agent launch`; when it fails, every other host is stopped at once
        (the ranks there would otherwise wait for it until gloo's timeout)."""
        rc = self.transport.stream(host, ["launch", "--host", host, "-"], payload,
                                   self.on_line, timeout)
        if rc != 0:
            with self.lock:
                first = not self.stopping.is_set()
                # a rank's own failure already names this host; an unreachable host does not
                if first and (rc == UNREACHABLE or not any(host in f for f in self.failures)):
                    self.failures.append(f"{host}: launch exited {rc}")
                elif rc == EXIT_INTERRUPTED and host in self.stopped:
                    pass  # the operator's stop: its `stopped` event said so
                self.stop_others(host)

    def stop_others(self, but: str | None) -> None:
        """Tell every host (but `but`) to stop its ranks, in parallel, once."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        stop = ["stop", "--reason", STOP_AFTER_FAILURE]  # not the operator's: no `stopped` run
        for other in self.hosts:
            if other != but:
                t = threading.Thread(target=self.transport.agent, args=(other, stop),
                                     kwargs={"timeout": 30}, daemon=True)
                t.start()
                self.stoppers.append(t)

    def on_line(self, host: str, line: str) -> None:
        """One line from `host`'s launcher: record what it reports, then echo it to `out`
        unless it was shown otherwise (the progress line) or would only add noise."""
        rank, event = _split_line(line)
        with self.lock:
            try:
                handled = self._record(host, rank, event)
            except (KeyError, TypeError, ValueError, AttributeError):  # a malformed event:
                handled, event = False, None  # shown as the line it is, otherwise ignored
            if not handled:
                self._echo(host, line, event)

    def _record(self, host: str, rank: int | None, event: dict | None) -> bool:
        """Record `event` (None: not an event); True when the line is fully handled and must
        not be echoed."""
        kind = event.get("event") if event else None
        if kind == "link-down":
            self._link_down(host, event)
            self.stop_others(host)
            return True
        if kind == "resume":
            self.marks["resumed_from"] = int(event["iteration"])
            if not self.verbose:
                self.out(f"resumed after iteration {int(event['iteration'])} (the checkpoint "
                         f"of rank {event.get('source')})")
                return True
        elif kind == "iter" and rank in self.ranks:
            return self._record_iteration(rank, event)
        elif kind == "done" and rank in self.ranks:
            checksum, stage = event.get("checksum"), event.get("stage")
            if not (checksum is None or isinstance(checksum, str)) or not (
                    stage is None or isinstance(stage, int)):
                raise TypeError("checksum: a string; stage: an integer")
            self.done_ranks.add(rank)
            self.ranks[rank].checksum, self.ranks[rank].stage = checksum, stage
        elif kind == "failed":
            self._failed(host, event)
            self.stop_others(host)
            return not self.verbose  # its last lines are in the failure: shown once
        elif kind == "stopped":
            if str(event.get("reason")) == STOP_BY_OPERATOR and host not in self.stopped:
                self.stopped.append(host)
                self.out(f"{host}: ranks stopped (topoctl stop / topo-agent stop)")
                self.stop_others(host)  # a stop of some hosts only ends the whole job
            return not self.verbose
        elif kind == "warning":
            self.out(f"{host}: warning: {event['message']}")
            return True
        return False

    def _record_iteration(self, rank: int, event: dict) -> bool:
        """A rank's finished iteration (seconds, per-bucket AllReduce times, pipeline loss);
        rank 0's also becomes the live progress line (True: shown, not to be echoed)."""
        stats = self.ranks[rank]
        seconds = float(event["seconds"])
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"seconds: {seconds}")
        buckets = ([(int(b), float(w), float(t)) for b, w, t in event["allreduce"]]
                   if isinstance(event.get("allreduce"), list) else None)
        loss = (float(event["loss"]) if event.get("stage") is not None
                and event.get("loss") is not None else None)
        stats.iterations.append(seconds)  # only once the whole event has parsed
        if buckets is not None:
            stats.allreduce.append(buckets)
        if loss is not None:
            stats.losses.append(loss)
        if rank != min(self.ranks):
            return False
        self.marks.setdefault("first_iteration_at", time.time())
        if self.verbose:
            return False
        n = len(stats.iterations)
        dt = time.perf_counter() - self.t0
        self.out(f"iteration {n + int(self.marks.get('resumed_from', 0))}/{self.iterations}  "
                 f"{seconds:.3f} s  ({n / dt:.2f} it/s since start)")
        return True

    def _failed(self, host: str, event: dict) -> None:
        """A rank's `failed` event: the first names the rank, its exit code and its last lines
        (unless `live` showed them as they came); the later ones (most often the others'
        broken connections) one line each, their last line."""
        last = [str(x) for x in event.get("last") or []]
        head = f"rank {event['rank']} on {host} exited {event['rc']}"
        cause = next((x.strip() for x in reversed(last) if x.strip()), "")
        first = not self.failures
        if first and self.live and event["rank"] == self.traceback_of:
            self.failures.append(f"{head}: {cause} (its traceback is above)")
        elif first and self.live and event["rank"] in self.muted:
            self.failures.append(f"{head}: {cause} (its traceback held back: rank "
                                 f"{self.traceback_of}'s is above)")
        elif first:
            self.failures.append(head + "; last lines:\n    " + "\n    ".join(last))
        else:
            self.failures.append(f"{head}: {cause}" if cause else head)

    def _echo(self, host: str, line: str, event: dict | None) -> None:
        """Pass a line on to `out`: every line when verbose, else what is not a routine event
        (iterations, done, start), and nothing after a cable failed (the ranks' broken
        connections and tracebacks would only bury its name); of the ranks' output, one
        traceback (the first), and nothing once the run is stopping (`_held`)."""
        if self.links_down and not self.verbose:
            return
        if not self.verbose and self._held(line):
            self.held += 1
            return
        if self.verbose or not (event and event.get("event") in ("iter", "done", "start")):
            self.out(f"{host} {line}")

    def _held(self, line: str) -> bool:
        """Whether a rank's output line is held back: another rank's traceback while one is
        shown (every rank raising the same error showed it once per rank), and any rank's
        output once a failure or a stop is being handled."""
        if not line.startswith("[rank "):
            return False
        head, _, body = line.partition("] ")
        number = head[len("[rank "):]
        rank = int(number) if number.isdigit() else -1
        if body.startswith(TRACEBACK):
            if self.traceback_of is None:
                self.traceback_of = rank
            elif rank != self.traceback_of:
                self.muted.add(rank)
        return rank in self.muted or (self.stopping.is_set() and rank != self.traceback_of)

    def _link_down(self, host: str, event: dict) -> None:
        """A watched interface lost its carrier: name the cable at that port and its peer."""
        iface = str(event.get("interface"))
        cable = cable_at(self.plan.get("fabric") or {}, host, iface)
        port = f"{host}:{iface}"
        d = {"host": host, "interface": iface, "reason": event.get("reason", "down"),
             "cable": cable.name if cable else port, "peer": cable.peer(port) if cable else None,
             "at": event.get("at"), "received": time.time()}
        self.links_down.append(d)
        self.out(f"{port}: {d['reason']}: cable {d['cable']} failed (peer {d['peer']}); "
                 "stopping every rank")

    def result(self) -> RunResult:
        """The run's outcome once every launcher ended: a failed cable wins over the ranks'
        failures it caused, unless every rank had already finished (training complete)."""
        resumed = self.marks.get("resumed_from")
        result = RunResult(0, self.ranks, time.perf_counter() - self.t0,
                           links_down=self.links_down,
                           resumed_from=int(resumed) if resumed is not None else None,
                           started_at=self.started_at,
                           first_iteration_at=self.marks.get("first_iteration_at"))
        finished = self.done_ranks == set(self.ranks)
        if self.held:
            self.out(f"({self.held} more line(s) of the ranks' output held back: the other "
                     "ranks' tracebacks and their broken connections; --verbose shows them)")
        if self.stopped and not finished:
            result.exit_code, result.stopped = EXIT_INTERRUPTED, list(self.stopped)
            result.failure = (f"stopped on {', '.join(self.stopped)} (topoctl stop)"
                              + (f"; then {len(self.failures)} rank/host failure(s) followed"
                                 if self.failures else ""))
        elif self.links_down and not finished:
            result.exit_code = 1
            result.failure = cable_failure(self.links_down, self.failures)
        elif self.links_down:  # every rank had reported its final parameters: complete
            self.out(f"training was complete when {', '.join(result.failed_cables)} failed")
        elif self.failures:
            result.exit_code, result.failure = 1, "\n".join(self.failures)
        return result


def cable_failure(links_down: list[dict], failures: list[str]) -> str:
    """The message of a run stopped by failed cables: each cable with the ends that reported
    it; what the ranks said afterwards (stopped, or broken connections) is a consequence."""
    lines = []
    for name in dict.fromkeys(d["cable"] for d in links_down):
        first, *others = [d for d in links_down if d["cable"] == name]
        peer = first["peer"] or "unknown"
        also = " (reported there too)" if any(f"{d['host']}:{d['interface']}" == peer
                                              for d in others) else ""
        lines.append(f"cable {name} failed: {first['host']}:{first['interface']} "
                     f"{first['reason']}, peer {peer}{also}; training stopped on every host")
    if failures:
        lines.append(f"then {len(failures)} rank/host failure(s) followed (ranks stopped)")
    return "\n".join(lines)


def stop_job(plan: dict, transport: Transport) -> dict[str, int]:
    """Ask every host of the plan to stop its ranks; host -> the agent's exit code (called with
    --detailed-exitcode by every transport: 2 stopped some, 0 none ran, else an error)."""
    hosts = sorted(plan["job"]["processes"])
    return {h: transport.agent(h, ["stop"], timeout=30).rc for h in hosts}


def _json(text: str) -> dict | None:
    if not text.startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
