"""The transaction: validate -> observe -> check -> diff -> probe -> apply -> verify -> revert.

A host ends either fully in the desired state or exactly as it was: on any failure (an operation
the kernel rejects, a verify that does not converge, a next hop that answered before and not
after) the inverses of the operations already done run newest first, and routes the kernel
dropped as a side effect (an address removed takes its routes along) are put back."""

from __future__ import annotations

import contextlib
import ipaddress
import time
from dataclasses import dataclass, field

from topoagent.diff import check_host, diff
from topoagent.kernel_ops import AddQdisc, Driver, Op, RestoreQdisc, SetLink, SetSysctl
from topoagent.mgmt import Mgmt, guard
from topoagent.observe import Observed, observe, rp_filter_path
from topoagent.probe import ping_many
from topoagent.protocol import TopoError
from topoagent.state import HostState, Interface, Sysctl
from topoagent.store import Store
from topoagent.target import Target

VERIFY_DELAYS = (0.0, 0.05, 0.2, 0.5)  # netlink changes settle asynchronously (rarely)
COMPOSITE = (AddQdisc, RestoreQdisc)  # several kernel requests: may fail half-done


class ApplyError(TopoError, RuntimeError):
    """An apply failed on the host; `done` the operations that ran, `reverted` whether they
    were undone (the host is back where it was)."""

    def __init__(self, message: str, done: list[Op], reverted: bool):
        super().__init__(message)
        self.done = done
        self.reverted = reverted


@dataclass
class Result:
    ops: list[Op]
    seconds: float
    dry_run: bool = False
    probes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.ops)


def plan(target: Target, desired: HostState, mgmt: Mgmt | None = None
         ) -> tuple[Observed, list[Op]]:
    """Observe, check and diff without touching anything; with `mgmt`, refuse operations on
    the management connection."""
    obs = observe(target)
    check_host(desired, obs)
    ops = diff(desired, obs)
    if mgmt is not None:
        guard(ops, obs, mgmt)
    return obs, ops


def apply_state(target: Target, desired: HostState, *, dry_run: bool = False,
                probe: bool = True, store: Store | None = None,
                mgmt: Mgmt | None = None) -> Result:
    t0 = time.perf_counter()
    before, ops = plan(target, desired, mgmt)
    if dry_run:
        return Result(ops, time.perf_counter() - t0, dry_run=True)
    probes = _choose_probes(target, desired, before) if probe and ops else []
    if ops:
        _transact(target, desired, before, ops, probes)
    if store is not None:
        store.push(desired, _baseline(ops))
    return Result(ops, time.perf_counter() - t0, probes=probes)


def _transact(target: Target, desired: HostState, before: Observed, ops: list[Op],
              probes: list[str]) -> None:
    from topoagent.drivers.netlink import NetlinkDriver  # pyroute2: only when writing

    with contextlib.closing(target.iproute()) as ipr:
        _run(NetlinkDriver(target, ipr), desired, before, ops, probes)


def _run(drv: Driver, desired: HostState, before: Observed, ops: list[Op],
         probes: list[str]) -> None:
    target = drv.target
    done: list[Op] = []
    for op in ops:
        try:
            op.apply(drv)
        except Exception as e:  # the kernel said no: undo everything done so far
            if isinstance(op, COMPOSITE):
                done.append(op)
            _fail(f"{op.describe()}: {_reason(e)}", drv, before, done)
        done.append(op)

    left: list[Op] = []
    for delay in VERIFY_DELAYS:
        time.sleep(delay)
        left = diff(desired, observe(target))
        if not left:
            break
    if left:
        _fail("verify: the host does not match after apply: "
              + "; ".join(op.describe() for op in left[:5]), drv, before, done)
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
    """Undo `done` newest first, then re-add any route of `before` the kernel dropped."""
    problems = []
    for op in reversed(done):
        inv = op.inverse()
        try:
            inv.apply(drv)
        except Exception as e:
            problems.append(f"{inv.describe()}: {_reason(e)}")
    now = observe(drv.target)
    for key, o in before.routes.items():
        if key not in now.routes:
            try:
                drv.set_route(o.route, o.proto)
            except Exception as e:
                problems.append(f"restore route {o.route.dst}: {_reason(e)}")
    return problems


def _reason(e: Exception) -> str:
    # NetlinkError carries (code, message); the message alone reads best
    args = getattr(e, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        return f"{args[1]} (errno {args[0]})"
    return str(e) or type(e).__name__


def _choose_probes(target: Target, desired: HostState, obs: Observed) -> list[str]:
    """Planned next hops that answer now: the ones a change must not break. Only gateways in
    a subnet the host is on now can answer, so only those are pinged (no timeout wasted on a
    fresh host)."""
    nets = [ipaddress.IPv4Interface(a).network for addrs in obs.addresses.values()
            for a in addrs]
    gateways = sorted({h.via for r in desired.routes for h in r.hops()
                       if h.via and any(ipaddress.IPv4Address(h.via) in n for n in nets)})
    return sorted(ping_many(target, gateways)) if gateways else []


def _baseline(ops: list[Op]) -> HostState:
    """The original values of sysctls and link attributes these operations overwrite."""
    links: dict[str, Interface] = {}
    rp: dict[str, int] = {}
    forward = None
    for op in ops:
        if isinstance(op, SetLink):
            links[op.dev] = Interface(name=op.dev, mtu=op.old_mtu, up=op.old_up)
        elif isinstance(op, SetSysctl):
            if op.path.endswith("/rp_filter"):
                dev = op.path.split("/")[3]
                if rp_filter_path(dev) == op.path:
                    rp[dev] = int(op.old)
            else:
                forward = op.old == "1"
    return HostState(interfaces=list(links.values()), sysctl=Sysctl(ip_forward=forward,
                                                                     rp_filter=rp))
