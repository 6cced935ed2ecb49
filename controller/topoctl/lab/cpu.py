"""Per-host compute in the lab: one CPU group per host, a fixed quota from its `speed` and
its devices.

Every lab host shares this machine's cores. Every host gets one kernel CPU group
(`tp-<lab>-h-<host>`, the host namespace's name) whose bandwidth limit is the host's fixed
share: a device (rank) of a host of speed s (`hosts[].speed`, None meaning 1) runs its compute
s times as fast as one of speed 1, and a host with k devices (`gpus.count`, each a rank) gets
k device shares:

    quota_h = k_h * s_h * unit cores,   unit = min(1, 1 / max_h s_h, cores / sum_h k_h s_h)

- speed 1 is one core per device: what the planner timed a single-threaded rank on
  (`launch.threads: 1`);
- ``1 / max s``: no device gets more than one core, so a single-threaded rank can use all of
  its share and the ratios hold for the fastest host too;
- ``cores / sum k s``: the quotas never sum above the machine's cores, so every host gets its
  quota even while every host computes at once (data-parallel ranks do), and the ratios hold
  then too. The price: with many devices every speed maps to less than its nominal cores (8
  hosts of speed 1 on 2 cores: a quarter of a core each); `lab status` shows each host's cores
  and the planner predicts with the same figures (`quotas` is the one formula both use).

The share is fixed whether or not the other hosts compute: a host that runs alone (the whole
model on one host, a pipeline stage while the others wait) gets its share, not the machine. So
a lab comparison between plans on different numbers of hosts transfers to the cluster the lab
stands for, where a host has its own devices and nothing more.

A quota below ``MIN_QUOTA_US`` per ``PERIOD_US`` (the kernel's smallest, 1 ms, per 20 ms: 0.05
of a core) cannot be enforced: `check_quotas` refuses such a cluster, naming `hosts[i].speed`.
A machine without a CPU controller (or one that refuses groups) runs a cluster without any
`speed` unlimited, as before, and refuses one with speeds. The period is short (20 ms, the
kernel's default is 100 ms) so that a throttled rank runs in short slices: a 20 ms step at
a quarter core takes ~80 ms each time rather than alternately 20 and 95 ms.

Enforcement: cgroup v1's ``cpu`` controller (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, this
machine), else cgroup v2's ``cpu.max`` where the unified hierarchy has the ``cpu`` controller.
A process joins its host's group by writing its pid into the group's ``cgroup.procs`` before it
execs (`join_argv`: what the lab runs as the host, `Lab.netns_argv`); its children inherit the
group. The ranks join it through the agent that launches them ($TOPO_RANK_CGROUP,
`Lab.rank_env`); the host's sshd and the agent, the management plane, run beside the quota.
`remove_groups` finds groups by prefix, so `lab down` cleans up after a crash too.

The pure part (`quotas`, `check_quotas`) does no I/O; the rest reads and writes /sys/fs/cgroup.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from topoctl.lab.netops import LabError

__all__ = ["CpuBackend", "PERIOD_US", "MIN_QUOTA_US", "check_quotas", "detect",
           "device_quotas", "join_argv", "machine_cores", "mount_in_argv", "quotas",
           "remove_groups"]

PERIOD_US = 20_000  # bandwidth period of every lab host's group (module docstring)
MIN_QUOTA_US = 1_000  # the kernel's smallest cfs quota (v1 refuses less, v2 too)
CGROUP_ROOT = Path("/sys/fs/cgroup")


# --- the formula (pure) --------------------------------------------------------------------------
def quotas(speeds: dict[str, float | None], cores: int,
           devices: dict[str, int] | None = None) -> dict[str, float]:
    """Each host's CPU quota in cores for `speeds` (host -> `hosts[].speed`, None meaning 1)
    and `devices` (host -> its ranks, `gpus.count`; absent or 0 counts as 1: its agent still
    runs there) on a machine of `cores` cores (module docstring's formula); {} for no hosts.
    Pure; O(hosts)."""
    if not speeds:
        return {}
    s = {h: (1.0 if v is None else float(v)) for h, v in speeds.items()}
    k = {h: max(1, int((devices or {}).get(h) or 1)) for h in s}
    unit = min(1.0, 1.0 / max(s.values()), max(1, cores) / sum(k[h] * s[h] for h in s))
    return {h: k[h] * s[h] * unit for h in s}


def device_quotas(speeds: dict[str, float | None], cores: int,
                  devices: dict[str, int] | None = None) -> dict[str, float]:
    """Each host's share in cores per device (rank): `quotas` divided by its devices, what
    one single-threaded rank of the host runs at while all of them compute. Pure."""
    q = quotas(speeds, cores, devices)
    return {h: c / max(1, int((devices or {}).get(h) or 1)) for h, c in q.items()}


def quota_us(cores: float, period_us: int = PERIOD_US) -> int:
    """The quota in microseconds per `period_us` for a share of `cores` cores."""
    return max(1, round(cores * period_us))


def check_quotas(speeds: dict[str, float | None], cores: int,
                 index: dict[str, int] | None = None,
                 devices: dict[str, int] | None = None) -> list[tuple[str, str]]:
    """Problems ``(yaml_path, message)`` with the quotas of `speeds` and `devices` on `cores`
    cores: a host whose share per device falls below the smallest quota the kernel enforces
    (its ranks share the host's group, each needs a slice). `index`: host -> its position in
    the cluster's `hosts` (for the path). Pure."""
    per = device_quotas(speeds, cores, devices)
    index = index or {h: i for i, h in enumerate(speeds)}
    total = sum((1.0 if v is None else v) * max(1, int((devices or {}).get(h) or 1))
                for h, v in speeds.items())
    floor = MIN_QUOTA_US / PERIOD_US
    out = []
    for h, c in per.items():
        if quota_us(c) < MIN_QUOTA_US:
            out.append((f"hosts[{index[h]}].speed",
                        f"{h} would get {c:.3g} of a core per device ({cores} cores shared "
                        f"by devices x speeds summing to {total:g}, a device at most one "
                        f"core), below the smallest CPU quota the lab can enforce "
                        f"({floor:g} core: {MIN_QUOTA_US} us per {PERIOD_US} us); raise its "
                        f"speed, lower the others' or use fewer hosts or devices"))
    return out


def machine_cores() -> int:
    """Cores this process may run on (the lab's ranks share them)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# --- the kernel ----------------------------------------------------------------------------------
def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, options) of every cgroup mount."""
    out = []
    try:
        text = Path("/proc/self/mounts").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1], parts[2], parts[3]))
    return out


@dataclass(frozen=True)
class CpuBackend:
    """Where and how the lab's CPU groups live: ``v1`` (the ``cpu`` controller's hierarchy at
    `root`: cpu.cfs_quota_us, cpu.cfs_period_us) or ``v2`` (the unified hierarchy at `root`
    with the ``cpu`` controller: cpu.max)."""

    kind: str  # v1 | v2
    root: Path

    def group(self, name: str) -> Path:
        """The directory of group `name`."""
        return self.root / name

    def procs(self, name: str) -> Path:
        """The file a process writes its pid into to join group `name`."""
        return self.group(name) / "cgroup.procs"

    def create(self, name: str, cores: float | None, period_us: int = PERIOD_US) -> None:
        """Create group `name` (again if it exists) limited to `cores` cores (None: no limit);
        LabError when the kernel refuses."""
        d = self.group(name)
        try:
            d.mkdir(exist_ok=True)
            if self.kind == "v1":
                (d / "cpu.cfs_period_us").write_text(str(period_us))
                (d / "cpu.cfs_quota_us").write_text(
                    "-1" if cores is None else str(quota_us(cores, period_us)))
            else:
                limit = "max" if cores is None else str(quota_us(cores, period_us))
                (d / "cpu.max").write_text(f"{limit} {period_us}")
        except OSError as e:
            raise LabError(f"cannot set up CPU group {d}: {e.strerror or e}") from None

    def limit(self, name: str) -> tuple[int | None, int] | None:
        """(quota in us or None for no limit, period in us) as the kernel has it; None when
        the group does not exist."""
        d = self.group(name)
        try:
            if self.kind == "v1":
                q = int((d / "cpu.cfs_quota_us").read_text())
                p = int((d / "cpu.cfs_period_us").read_text())
                return (None if q < 0 else q), p
            q_s, p_s = (d / "cpu.max").read_text().split()
            return (None if q_s == "max" else int(q_s)), int(p_s)
        except (OSError, ValueError):
            return None

    def stat(self, name: str) -> dict[str, int]:
        """The group's cpu.stat (throttling counters: nr_periods, nr_throttled, ...); {} when
        it cannot be read."""
        try:
            text = (self.group(name) / "cpu.stat").read_text()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if v.strip().lstrip("-").isdigit():
                out[k] = int(v)
        return out

    def members(self, name: str) -> list[int]:
        """Process ids in group `name` ([] when it does not exist)."""
        try:
            return [int(x) for x in self.procs(name).read_text().split()]
        except (OSError, ValueError):
            return []


def detect(mounts: list[tuple[str, str, str]] | None = None) -> CpuBackend | None:
    """The machine's CPU controller: cgroup v2 `cpu.max` when the unified hierarchy offers
    the `cpu` controller, else cgroup v1's `cpu` hierarchy, else None. `mounts`: (mount point,
    fs type, options) as in /proc/self/mounts (default: this machine's)."""
    mounts = _mounts() if mounts is None else mounts
    for point, fs, _ in mounts:
        if fs == "cgroup2":
            try:
                ctrl = (Path(point) / "cgroup.controllers").read_text().split()
            except OSError:
                continue
            if "cpu" in ctrl:
                return CpuBackend("v2", Path(point))
    for point, fs, opts in mounts:
        if fs == "cgroup" and "cpu" in opts.split(","):
            return CpuBackend("v1", Path(point))
    return None


def enable_v2_cpu(backend: CpuBackend) -> None:
    """Let v2 groups under the root use the cpu controller (`+cpu` in its subtree_control)."""
    if backend.kind != "v2":
        return
    ctl = backend.root / "cgroup.subtree_control"
    try:
        if "cpu" not in ctl.read_text().split():
            ctl.write_text("+cpu")
    except OSError as e:
        raise LabError(f"cannot enable the cpu controller in {ctl}: {e.strerror or e}") from None


def join_argv(procs: Path | str, argv: list[str]) -> list[str]:
    """`argv` started so that it joins the group whose ``cgroup.procs`` is `procs` before it
    runs: a shell writes its own pid there, then execs `argv` (same pid). Its children inherit
    the group."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *argv]


def mount_in_argv(pid: int, backend: CpuBackend) -> list[str]:
    """Argv that mounts `backend`'s hierarchy at its usual place inside the mount namespace of
    process `pid`. `ip netns exec` gives what it starts (a lab host's sshd, and so every
    session: the agent) a fresh /sys without the cgroup mounts; mounting the same hierarchy
    again there (same type and options) shows the same groups, so the agent can put the ranks
    it launches into their host's group ($TOPO_RANK_CGROUP)."""
    opts = next((o for point, fs, o in _mounts() if Path(point) == backend.root),
                "cpu" if backend.kind == "v1" else "")
    if backend.kind == "v2":
        script = f'mount -t cgroup2 cgroup2 "{backend.root}"'
    else:
        script = (f'mountpoint -q "{backend.root.parent}" || mount -t tmpfs -o mode=755 '
                  f'tp-cgroup "{backend.root.parent}"; mkdir -p "{backend.root}" && '
                  f'mount -t cgroup -o {opts} cgroup "{backend.root}"')
    return ["nsenter", "-t", str(pid), "-m", "--", "/bin/sh", "-c", script]


def _candidate_roots() -> list[Path]:
    """Every hierarchy the lab may have made groups in (v1 cpu and v2), for removal by name."""
    roots = []
    for point, fs, opts in _mounts():
        if fs == "cgroup2" or (fs == "cgroup" and "cpu" in opts.split(",")):
            roots.append(Path(point))
    return roots


def remove_groups(prefix: str, timeout: float = 5.0) -> list[str]:
    """Remove every CPU group whose name starts with `prefix`, in every hierarchy the lab may
    use (a crashed lab's too). A group still holding processes (being killed) is retried until
    `timeout`; returns the groups that could not be removed."""
    left = []
    for root in _candidate_roots():
        try:
            groups = [d for d in root.iterdir() if d.is_dir() and d.name.startswith(prefix)]
        except OSError:
            continue
        for d in groups:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    d.rmdir()  # cgroup directories are removed with rmdir, files and all
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        left.append(str(d))
                        break
                    time.sleep(0.02)
    return left


def group_pids(prefix: str) -> list[int]:
    """Pids of the processes in the CPU groups whose name starts with `prefix`, in every
    hierarchy: a host's processes, also one that joined its group but has not entered the
    host's namespace yet."""
    pids: set[int] = set()
    for path in list_groups(prefix):
        try:
            text = Path(path, "cgroup.procs").read_text()
        except OSError:
            continue
        pids.update(int(x) for x in text.split())
    return sorted(pids)


def list_groups(prefix: str) -> list[str]:
    """Paths of the CPU groups whose name starts with `prefix`, in every hierarchy."""
    out = []
    for root in _candidate_roots():
        try:
            out += [str(d) for d in root.iterdir() if d.is_dir() and d.name.startswith(prefix)]
        except OSError:
            continue
    return sorted(out)
