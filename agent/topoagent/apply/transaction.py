"""The transaction: validate -> observe -> check -> diff -> probe -> apply -> verify -> revert.

A host ends either fully in the desired state or exactly as it was: on any failure (an operation
the kernel rejects, a verify that does not converge, a next hop that answered before and not
after) the inverses of the operations already done run newest first, and routes the kernel
dropped as a side effect (an address removed takes its routes along) are put back."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from topoagent.apply.batch import execute
from topoagent.apply.diff import check_host, diff
from topoagent.apply.journal import Journal, complete_history, crash_point, recover, restore
from topoagent.apply.kernel_ops import Driver, Op, SetLink, SetSysctl
from topoagent.apply.mgmt import Mgmt, guard, guard_state, route_get
from topoagent.apply.probe import ping_many
from topoagent.apply.store import Store, sysctl_with_baseline
from topoagent.drivers.netlink import NetlinkDriver
from topoagent.observe.host import (
    IP6_FORWARD,
    IP_FORWARD,
    MULTIPATH_HASH,
    MULTIPATH_HASH6,
    Observed,
    observe,
    rp_filter_path,
    to_host_state,
)
from topoagent.protocol import TopoError
from topoagent.signals import only_here
from topoagent.state.host import HostState, Interface, Sysctl
from topoagent.state.values import is_link_local
from topoagent.target import Target

VERIFY_DELAYS = (0.0, 0.05, 0.2, 0.5)  # netlink changes settle asynchronously (rarely)


class Interrupted(TopoError):
    """The apply was stopped by a signal (SIGTERM) and reverted."""


class ApplyError(TopoError, RuntimeError):
    """An apply failed on the host; `done` the operations that ran, `reverted` whether they
    were undone (the host is back where it was)."""

    def __init__(self, message: str, done: list[Op], reverted: bool):
        super().__init__(message)
        self.done = done
        self.reverted = reverted


@dataclass
class Result:
    """What an apply did (or would do): its operations, seconds, whether a dry run, and the probed
    addresses."""

    ops: list[Op]
    seconds: float
    dry_run: bool = False
    probes: list[str] = field(default_factory=list)
    confirm: dict | None = None  # with --confirm-within: deadline, seconds, token

    @property
    def changed(self) -> bool:
        """Whether there were operations."""
        return bool(self.ops)


def plan(target: Target, desired: HostState, mgmt: Mgmt | None = None
         ) -> tuple[Observed, list[Op]]:
    """Observe, check and diff without touching anything; with `mgmt`, refuse operations on
    the management connection."""
    obs = observe(target)
    if mgmt is not None:  # first: starving the operator's connection is the costliest mistake
        guard_state(desired, obs, mgmt)
    check_host(desired, obs)
    ops = diff(desired, obs)
    if mgmt is not None:
        guard(ops, obs, mgmt)
    return obs, ops


def apply_state(target: Target, desired: HostState, *, dry_run: bool = False,
                probe: bool = True, store: Store | None = None,
                mgmt: Mgmt | None = None, watch: list[tuple[str, str | None]] = ()) -> Result:
    """Take the host to `desired` or leave it as it was (the caller holds `store.lock()`).
    With `store`, every change is journaled first and the applied state joins the history,
    committed with the journal's end (crash safety: topoagent.apply.journal). `watch`:
    (address, source) pairs whose path (`ip route get`) must be the same after the apply as
    before (the management connection and configured probes)."""
    t0 = time.perf_counter()
    if store is not None:
        desired = with_original_sysctls(desired, store.baseline())
    before, ops = plan(target, desired, mgmt)
    if dry_run:
        return Result(ops, time.perf_counter() - t0, dry_run=True)
    probes = _choose_probes(target, desired, before) if probe and ops else []
    if store is not None and ops:
        # the original values go to disk before anything changes: a crash or a failed apply
        # can no longer lose them (rollback to the baseline restores them)
        store.save_baseline(_baseline(ops))
    history = {"newest": store.newest(), "pop": None} if store is not None else None
    journal = _begin(store, before, history) if ops else None
    if ops:
        _transact(target, desired, before, ops, probes, journal, list(watch))
    if store is not None:
        _commit(target, store, journal, history, len(ops), lambda: store.push(desired))
    return Result(ops, time.perf_counter() - t0, probes=probes)


def rollback(target: Target, store: Store, *, dry_run: bool = False, probe: bool = True,
             mgmt: Mgmt | None = None) -> Result | None:
    """Re-apply the state before the newest and drop the newest, one transaction (the caller
    holds `store.lock()`); None when there is no earlier state. Journaled as an apply is: a
    crash before its commit leaves the host and the history as they were, after it both
    rolled back."""
    t0 = time.perf_counter()
    previous = store.previous()
    if previous is None:
        return None
    # a global sysctl an apply after that state set (say ipv6_forwarding, which the older
    # state never mentions) goes back to the host's original value too
    previous = with_original_sysctls(previous, store.baseline())
    before, ops = plan(target, previous, mgmt)
    if dry_run:
        return Result(ops, time.perf_counter() - t0, dry_run=True)
    probes = _choose_probes(target, previous, before) if probe and ops else []
    newest = store.newest()
    history = {"newest": newest, "pop": newest}
    journal = _begin(store, before, history) if ops else None
    if ops:
        _transact(target, previous, before, ops, probes, journal)
    # the newest entry leaves the history before the commit line: when it cannot (an immutable
    # file), the rollback fails whole and the host goes back (topoagent.apply.store, retire)
    _commit(target, store, journal, history, len(ops), lambda: store.retire(newest))
    return Result(ops, time.perf_counter() - t0, probes=probes)


def _begin(store: Store | None, before: Observed, history: dict | None) -> Journal | None:
    if store is None:
        return None
    journal = Journal(store.root)
    journal.begin(before, history)
    return journal


def _commit(target: Target, store: Store, journal: Journal | None, history: dict | None,
            n_ops: int, write_history) -> None:
    """After the kernel changes: the history entry, then the journal's commit line (the
    transaction counts from here), then the history's own change (prune, pop), then the
    journal goes. Anything failing before the commit line takes the host back."""
    try:
        write_history()
        crash_point(n_ops + 1)
        if journal is not None:
            journal.commit()
    except BaseException as e:
        if journal is None:
            raise
        journal.close()  # the history could not be written: back to the old state
        rec = recover(target, store)
        state = rec.describe() if rec is not None else "nothing to recover"
        if isinstance(e, TopoError):
            raise ApplyError(f"{e} ({state})", [], reverted=bool(rec and not rec.problems)
                             ) from None
        raise
    crash_point(n_ops + 2)
    complete_history(store, history or {})
    if journal is not None:
        journal.finish()


def _transact(target: Target, desired: HostState, before: Observed, ops: list[Op],
              probes: list[str], journal: Journal | None = None,
              watch: list[tuple[str, str | None]] | None = None) -> None:
    done: list[Op] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_term_as_exception())
        drv = NetlinkDriver(target)
        stack.callback(drv.close)
        paths = {(ip, src): route_get(drv.ipr, ip, src) for ip, src in watch or ()}
        try:
            _run(drv, desired, before, ops, probes, done, journal, paths)
        except ApplyError:
            if journal is not None:
                journal.finish()  # reverted in process
            raise
        except BaseException as e:  # interrupted (SIGTERM, a bug): revert, then report it
            problems = revert(drv, before, done)
            if journal is not None and not problems:
                journal.finish()  # else the next start retries from the journal
            state = ("REVERT INCOMPLETE: " + "; ".join(problems) if problems
                     else f"reverted {len(done)} operations; host is as before")
            if isinstance(e, TopoError):
                raise ApplyError(f"{e} ({state})", done, reverted=not problems) from None
            raise


@contextlib.contextmanager
def _term_as_exception() -> Iterator[None]:
    """SIGTERM during the kernel changes becomes an exception, so the apply reverts itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Interrupted(f"interrupted by signal {signum} during apply")
    # only here: a child forked meanwhile (pyroute2's netns helper) must not run it
    old = signal.signal(signal.SIGTERM, only_here(stop))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _run(drv: Driver, desired: HostState, before: Observed, ops: list[Op],
         probes: list[str], done: list[Op], journal: Journal | None = None,
         paths: dict | None = None) -> None:
    target = drv.target
    crash_point(0)
    record = journal.record_all if journal is not None else None
    failures = execute(drv, ops, done, before=record, after=crash_point)
    if failures:  # the kernel said no: undo everything done so far
        f = failures[0]
        _fail(f"{f.op.describe()}: {f.reason}", drv, before, done)

    left: list[Op] = []
    for delay in VERIFY_DELAYS:
        time.sleep(delay)
        left = diff(desired, observe(target))
        if not left:
            break
    if left:
        _fail("verify: the host does not match after apply: "
              + "; ".join(op.describe() for op in left[:5]), drv, before, done)
    changed = [f"{ip}: {was} -> {now}" for (ip, src), was in (paths or {}).items()
               if (now := route_get(drv.ipr, ip, src)) != was]
    if changed:
        _fail("management path changed (ip route get): " + "; ".join(changed)
              + "; use --force-mgmt to allow it", drv, before, done)
    if probes:
        lost = sorted(set(probes) - ping_many(target, probes))
        if lost:
            _fail(f"probe: next hops answered before the change and not after: "
                  f"{', '.join(lost)}", drv, before, done)


def _fail(message: str, drv: Driver, before: Observed, done: list[Op]) -> None:
    problems = revert(drv, before, done)
    if problems:
        message += "; REVERT INCOMPLETE: " + "; ".join(problems)
    else:
        message += f" (reverted {len(done)} operations; host is as before)"
    raise ApplyError(message, done, reverted=not problems)


def revert(drv: Driver, before: Observed, done: list[Op]) -> list[str]:
    """Undo `done` newest first, re-add any route of `before` the kernel dropped, and settle
    what is left against `before` (topoagent.apply.journal.restore); returns what still differs."""
    routes = [(o.route, o.proto) for o in before.routes.values()]
    return restore(drv, [op.inverse() for op in reversed(done)], to_host_state(before), routes)


def _choose_probes(target: Target, desired: HostState, obs: Observed) -> list[str]:
    """Planned next hops that answer now: the ones a change must not break. Only gateways in
    a subnet the host is on now can answer, so only those are pinged (no timeout wasted on a
    fresh host)."""
    nets = [ipaddress.ip_interface(a).network for addrs in obs.addresses.values()
            for a in addrs]

    def answers_now(via: str) -> bool:
        gw = ipaddress.ip_address(via)
        return any(gw.version == n.version and gw in n for n in nets)
    # link-local gateways need their link named to ping (ping -I); they are left unprobed
    gateways = sorted({h.via for r in desired.routes for h in r.hops()
                       if h.via and not is_link_local(h.via) and answers_now(h.via)})
    return sorted(ping_many(target, gateways)) if gateways else []


def with_original_sysctls(desired: HostState, base: HostState | None) -> HostState:
    """`desired`, with the host's original value (the store's baseline) for each global sysctl
    (`ip_forward`, `multipath_hash_policy`) an earlier apply changed and `desired` no longer
    sets: what the agent changed and is no longer asked for goes back, as a rollback does.
    Why: the next plan on the same hosts said nothing of the L4 hash a +bandwidth plan had set,
    so its connections kept hashing by port over parallel cables (the demo's plain trees, one
    run of three, 1.83 s instead of 1.04 s). Per-interface `rp_filter` is left alone (its
    interface may be gone)."""
    if base is None:
        return desired
    sysctl = sysctl_with_baseline(desired.sysctl, base.sysctl, rp_filter=False)
    return desired if sysctl == desired.sysctl else desired.model_copy(update={"sysctl": sysctl})


def _baseline(ops: list[Op]) -> HostState:
    """The original values of sysctls and link attributes these operations overwrite."""
    links: dict[str, Interface] = {}
    rp: dict[str, int] = {}
    forward = mp_hash = forward6 = mp_hash6 = None
    for op in ops:
        if isinstance(op, SetLink):
            links[op.dev] = Interface(name=op.dev, mtu=op.old_mtu, up=op.old_up)
        elif isinstance(op, SetSysctl) and not op.late:  # late: a link the apply creates
            if op.path.endswith("/rp_filter"):
                dev = op.path.split("/")[3]
                if rp_filter_path(dev) == op.path:
                    rp[dev] = int(op.old)
            elif op.path == MULTIPATH_HASH:
                mp_hash = int(op.old)
            elif op.path == IP_FORWARD:
                forward = op.old == "1"
            elif op.path == MULTIPATH_HASH6:
                mp_hash6 = int(op.old)
            elif op.path == IP6_FORWARD:
                forward6 = op.old == "1"
    return HostState(interfaces=list(links.values()), sysctl=Sysctl(
        ip_forward=forward, rp_filter=rp, multipath_hash_policy=mp_hash,
        ipv6_forwarding=forward6, ipv6_multipath_hash_policy=mp_hash6))
