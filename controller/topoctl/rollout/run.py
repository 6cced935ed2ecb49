"""`topoctl run`: start a plan's training processes on every host and supervise them.

Each host's agent gets the job spec (with the model resolved to an import path and input
shapes, so the training processes need nothing of the controller) and runs its ranks
(`topo-agent launch`). Lines come back prefixed with host and rank; iteration events from
rank 0 become a live iterations/s line. If any host's ranks fail, every other host is told to
stop at once, and the result names the rank and shows its last lines.

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

from topoagent.state.host import StateError
from topoagent.state.wire import parse_launch_spec
from topoctl.rollout.links import cable_at, watched_interfaces
from topoctl.rollout.transports import UNREACHABLE, Transport

WARMUP = 2  # iterations left out of the timing (process-group setup, allocator warm-up)
# predicted seconds the timed iterations of a benchmark run cover at least (bench/demo.py,
# bench/planner_lab_check.py): a fast strategy's median is not left to a few samples, nor half
# made of a tree plan's first, still settling iterations (topoopt on hetero8, 2026-11-27 11:52:
# 0.80, 0.79, 0.77, then 0.72, 0.70, 0.73 s: with 6 timed iterations, -8.8% against the steady
# prediction); 3 until 2026-11-27
MIN_TIMED_SECONDS = 6.0


def iterations_for(predicted: float, at_least: int,
                   min_seconds: float = MIN_TIMED_SECONDS) -> int:
    """Iterations to run a plan predicted at `predicted` seconds each: `at_least`, or more
    when the timed ones (all but the `WARMUP` first) would cover less than `min_seconds`."""
    return max(at_least, WARMUP + math.ceil(min_seconds / max(predicted, 1e-3)))


@dataclass
class RankStats:
    """What one rank reported: its host, seconds per iteration and final parameter checksum."""

    host: str
    iterations: list[float] = field(default_factory=list)  # seconds per iteration
    checksum: str | None = None
    # pipeline plans: ranks of one stage hold the same parameters; < 0: a host without a stage
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
        (2026-11-26) the slowest rank's time was 0.674 s, the ranks' mean 0.659 s, the time
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
    def synchronous(self) -> bool:
        """Every rank ended with the same parameters (pipeline: every rank of a stage)."""
        groups: dict[int | None, set] = {}
        for r in self.ranks.values():
            groups.setdefault(r.stage, set()).add(r.checksum)
        return bool(groups) and all(len(v) == 1 and (None not in v or (s is not None and s < 0))
                                    for s, v in groups.items())

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
                "resumed_from": self.resumed_from,
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


def job_payload(plan: dict, iterations: int, threads: int = 1, watch: bool = True,
                checkpoint: dict | None = None) -> dict:
    """The plan's job spec for `topo-agent launch`, with the model as factory + kwargs + inputs,
    the given iterations and threads, the interfaces each launcher watches (`watch`) and the
    checkpointing (`{every, resume}`), validated as the agent will (`LaunchSpec`).
    StateError (YAML paths under `job`) when the plan has no job to run or it is invalid."""
    job = copy.deepcopy(plan["job"])
    if "command" not in job:
        raise StateError("this plan configures the network only: it has no job to run",
                         "job.command")
    model = job.get("model") or {}
    if model.get("catalog") and not model.get("factory"):  # plans rendered before factories
        from topoctl.catalog.registry import ENTRIES, resolve_params  # torch: only here

        entry = ENTRIES[model["catalog"]]
        params = resolve_params(model["catalog"], model.get("params", {}))
        job["model"] = {"factory": f"{entry.cls.__module__}:{entry.cls.__qualname__}",
                        "kwargs": params, "inputs": [asdict(s) for s in entry.inputs(params)]}
    job["iterations"] = iterations
    job["threads"] = threads
    if watch:
        job["watch"] = watched_interfaces(plan)
    if checkpoint:
        job["checkpoint"] = checkpoint
    return parse_launch_spec(job).to_dict(exclude_unset=True)


def run_job(plan: dict, transport: Transport, iterations: int = 10,
            out: Callable[[str], None] = print, verbose: bool = False,
            timeout: float | None = None, watch: bool = True,
            checkpoint: dict | None = None) -> RunResult:
    """Launch the plan's ranks on every host through `transport`, stream their lines to `out`, stop
    all when one fails or a watched cable loses its carrier (`checkpoint`: `{every, resume}`
    for the trainer)."""
    job = job_payload(plan, iterations, watch=watch, checkpoint=checkpoint)
    payload = json.dumps(job)
    hosts = sorted(job["processes"])
    rank_host = {int(p["rank"]): h for h in hosts for p in job["processes"][h]}
    ranks = {r: RankStats(h) for r, h in rank_host.items()}
    lock = threading.Lock()
    failures: list[str] = []
    links_down: list[dict] = []
    marks: dict[str, float] = {}  # resumed_from, first_iteration_at
    done_ranks: set[int] = set()  # ranks that reported their final parameters
    stopping = threading.Event()
    stoppers: list[threading.Thread] = []
    t0 = time.perf_counter()
    started_at = time.time()

    def stop_others(but: str | None) -> None:
        """Tell every host (but `but`) to stop its ranks, in parallel, once."""
        if stopping.is_set():
            return
        stopping.set()
        for other in hosts:
            if other != but:
                t = threading.Thread(target=transport.agent, args=(other, ["stop"]),
                                     kwargs={"timeout": 30})
                t.start()
                stoppers.append(t)

    def link_down(host: str, event: dict) -> None:
        iface = str(event.get("interface"))
        cable = cable_at(plan.get("fabric") or {}, host, iface)
        port = f"{host}:{iface}"
        d = {"host": host, "interface": iface, "reason": event.get("reason", "down"),
             "cable": cable.name if cable else port, "peer": cable.peer(port) if cable else None,
             "at": event.get("at"), "received": time.time()}
        links_down.append(d)
        out(f"{port}: {d['reason']}: cable {d['cable']} failed (peer {d['peer']}); "
            "stopping every rank")

    def on_line(host: str, line: str) -> None:
        rank, body = None, line
        if line.startswith("[rank "):
            head, _, body = line.partition("] ")
            rank = int(head[6:])
        event = _json(body)
        with lock:
            if event and event.get("event") == "link-down":
                link_down(host, event)
                stop_others(host)
                return
            if event and event.get("event") == "resume":
                marks["resumed_from"] = int(event["iteration"])
                if not verbose:
                    out(f"resumed after iteration {event['iteration']} (the checkpoint of "
                        f"rank {event.get('source')})")
                    return
            if event and event.get("event") == "iter" and rank in ranks:
                ranks[rank].iterations.append(float(event["seconds"]))
                if isinstance(event.get("allreduce"), list):
                    ranks[rank].allreduce.append([(int(b), float(w), float(t))
                                                  for b, w, t in event["allreduce"]])
                if event.get("stage") is not None and event.get("loss") is not None:
                    ranks[rank].losses.append(float(event["loss"]))
                if rank == min(ranks):
                    marks.setdefault("first_iteration_at", time.time())
                if rank == min(ranks) and not verbose:
                    n = len(ranks[rank].iterations)
                    dt = time.perf_counter() - t0
                    out(f"iteration {int(event.get('iter', n - 1)) + 1}/{iterations}  "
                        f"{event['seconds']:.3f} s  ({n / dt:.2f} it/s since start)")
                    return
            elif event and event.get("event") == "done" and rank in ranks:
                done_ranks.add(rank)
                ranks[rank].checksum = event["checksum"]
                ranks[rank].stage = event.get("stage")
            elif event and event.get("event") == "failed":
                failures.append(f"rank {event['rank']} on {host} exited {event['rc']}; last "
                                "lines:\n    " + "\n    ".join(event.get("last", [])))
            if links_down and not verbose:  # the ranks' broken connections and tracebacks
                return                          # after a failed cable only bury its name
            if verbose or not (event and event.get("event") in ("iter", "done", "start")):
                out(f"{host} {line}")

    def run_host(host: str) -> None:
        rc = transport.stream(host, ["launch", "--host", host, "-"], payload, on_line, timeout)
        if rc != 0:
            with lock:
                first = not stopping.is_set()
                if first and (rc == UNREACHABLE or not any(host in f for f in failures)):
                    failures.append(f"{host}: launch exited {rc}")
                stop_others(host)  # stop every other host's ranks now

    threads = [threading.Thread(target=run_host, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in stoppers:
        t.join()
    seconds = time.perf_counter() - t0
    result = RunResult(0, ranks, seconds, links_down=links_down,
                       resumed_from=int(marks["resumed_from"]) if "resumed_from" in marks
                       else None, started_at=started_at,
                       first_iteration_at=marks.get("first_iteration_at"))
    finished = done_ranks == set(ranks)
    if links_down and not finished:
        result.exit_code, result.failure = 1, cable_failure(links_down, failures)
    elif links_down:  # every rank had reported its final parameters: training is complete
        out(f"training was complete when {', '.join(result.failed_cables)} failed")
    elif failures:
        result.exit_code, result.failure = 1, "\n".join(failures)
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
    """Ask every host of the plan to stop its ranks; host -> the agent's exit code."""
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
