"""Throwaway network namespaces for tests: real kernel state, always removed.

Names start with `tpt-` (topoctl test) so a crashed run's leftovers are found and removed by the
next run, and nothing can collide with the machine's own networking. Addresses used by tests live
in 10.231.0.0/16, which nothing else on the machine uses."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PREFIX = "tpt-"


def sh(cmd: list[str], check: bool = True,
       input_text: str | None = None) -> subprocess.CompletedProcess:
    # surrogateescape: link names are bytes to the kernel, not always UTF-8
    return subprocess.run(cmd, check=check, capture_output=True, text=True,
                          errors="surrogateescape", input=input_text)


def ns_exec(ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh(["ip", "netns", "exec", ns, *cmd], check=check)


CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def sysctl_lines(ns: str, patterns: list[str]) -> str:
    """What `grep -H . PATTERNS` prints inside the namespace `ns` ("path:value" per line, globs
    expanded there), read by this process: a thread of its own enters the namespace (setns),
    reads /proc/sys (which shows the reading thread's namespace) and ends. The kernel's own
    report, as with grep, without the three processes `ip netns exec ns sh -c grep` costs:
    a host dump is read thousands of times in the property tests. (Not the agent's
    `Target.inside`, which does the same: the dump must read the host independently of it.)"""
    out: list[str] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            with open(f"/run/netns/{ns}") as target:
                if _libc.setns(target.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {ns}")
            for pattern in patterns:
                for path in sorted(glob.glob(pattern)):
                    with open(path) as f:
                        out.extend(f"{path}:{line}" for line in f.read().splitlines() if line)
        except BaseException as e:  # handed to the caller's thread
            failed.append(e)

    # the thread ends inside the namespace: nothing else ever runs on it
    t = threading.Thread(target=read, name=f"sysctl-{ns}")
    t.start()
    t.join()
    if failed:
        raise failed[0]
    return "".join(line + "\n" for line in out)


def ip_json(ns: str, *args: str) -> list:
    """What iproute2 (an independent reader) reports, as JSON."""
    out = sh(["ip", "-n", ns, "-j", *args]).stdout
    return json.loads(out) if out.strip() else []


def tc_json(ns: str, *args: str) -> list:
    out = sh(["tc", "-n", ns, "-j", *args]).stdout
    return json.loads(out) if out.strip() else []


def json_batch(tool: str, ns: str, options: list[str], commands: list[str]) -> list[list]:
    """What `ip` or `tc` (`tool`) reports for each of `commands` as JSON, from one process
    (`-batch`: one JSON document per command, one after the other; an empty one for a command
    that prints nothing is an empty list). Fewer processes than one per command: a host dump
    is read thousands of times in the property tests."""
    out = sh([tool, "-n", ns, "-j", *options, "-batch", "-"],
             input_text="".join(c + "\n" for c in commands)).stdout
    docs, decoder, i = [], json.JSONDecoder(), 0
    while True:
        while i < len(out) and out[i].isspace():
            i += 1
        if i == len(out):
            break
        doc, i = decoder.raw_decode(out, i)
        docs.append(doc)
    assert len(docs) == len(commands), (commands, out)
    return docs


def list_netns() -> list[str]:
    out = sh(["ip", "-j", "netns", "list"], check=False).stdout
    return [n["name"] for n in json.loads(out)] if out.strip() else []


def remove_leftovers(prefix: str = PREFIX) -> None:
    """Remove namespaces of test runs that died (names are PREFIX<pid>-<n>); a run still alive
    (another pytest on the same machine) keeps its own."""
    for name in list_netns():
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-")[0]
        if pid.isdigit() and (int(pid) == os.getpid() or not os.path.exists(f"/proc/{pid}")):
            sh(["ip", "netns", "del", name], check=False)


def pid_tag(pid: int | None = None) -> str:
    """This process's pid (or `pid`) in base 36: at most 5 characters for any Linux pid
    (pid_max <= 4194304 < 36**5), so a lab name can carry the whole pid and a leftover check
    can tell a live test process's lab (another pytest worker's) from a dead one's."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    n, out = os.getpid() if pid is None else pid, ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def is_root() -> bool:
    return os.geteuid() == 0


_UNITS = {"bit": 1, "Kbit": 10**3, "Mbit": 10**6, "Gbit": 10**9, "Tbit": 10**12}


def tc_classes(ns: str, dev: str) -> list[dict]:
    """`tc class show` (iproute2 6.1 has no JSON for HTB classes): handle, parent, rate, ceil
    in bit/s, burst and cburst in bytes, plus the raw line for exact before/after comparisons."""
    out = []
    for line in sh(["tc", "-n", ns, "class", "show", "dev", dev]).stdout.splitlines():
        words = line.split()
        if len(words) < 3 or words[0] != "class":
            continue
        entry: dict = {"kind": words[1], "handle": words[2], "line": line.strip()}
        for key in ("parent", "rate", "ceil", "burst", "cburst"):
            if key in words:
                entry[key] = words[words.index(key) + 1]
        for key in ("rate", "ceil"):
            if key in entry:
                num = entry[key].rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
                entry[key] = round(float(num) * _UNITS[entry[key][len(num):]])
        for key in ("burst", "cburst"):  # bytes: "25000b", "97Kb", "1Mb" (iproute2 sprint_size)
            if key in entry:
                num = entry[key].rstrip("bKM")
                entry[key] = round(float(num) * {"b": 1, "Kb": 1024, "Mb": 1024**2}[
                    entry[key][len(num):]])
        out.append(entry)
    return out


CARRIER = {"NO-CARRIER", "LOWER_UP", "M-DOWN", "linkdown"}


def _strip(obj):
    """Drop what moves without anyone changing configuration: counters of packets in flight and
    the carrier of a veth, which follows its peer's admin state a moment later."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items()
                if k not in ("direct_packets_stat", "stats", "stats64", "xstats", "operstate")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj if not (isinstance(v, str) and v in CARRIER)]
    return obj


def host_dump(ns: str, links: tuple[str, ...] | list[str]) -> dict:
    """Everything the agent could touch on `links` and host-wide, as iproute2 and /proc
    report it: compare two dumps to prove a host unchanged.

    The readers (iproute2 and tc, with a batch of commands where the output can be told apart,
    and /proc/sys as seen from inside the namespace) read independently of each other, so they
    run side by side (a dump was never one atomic snapshot either)."""
    devs = list(links)
    readers = {
        # (`link show` lists every link under -4 too)
        "ip": lambda: json_batch("ip", ns, ["-4"], ["addr show", "route show table all",
                                                    "rule show", "link show"]),
        "sysctl": lambda: sysctl_lines(ns, ["/proc/sys/net/ipv4/ip_forward",
                                            "/proc/sys/net/ipv4/fib_multipath_hash_policy",
                                            "/proc/sys/net/ipv4/conf/*/rp_filter",
                                            "/proc/sys/net/ipv4/conf/*/promote_secondaries"]),
        "tc": lambda: json_batch("tc", ns, [], [f"{what} show dev {dev}" for dev in devs
                                               for what in ("qdisc", "filter")]),
    }
    for dev in devs:  # (no batch: iproute2 6.1 lists HTB classes as text, even under -j, and
        # one link's list would run into the next's)
        readers[f"class {dev}"] = functools.partial(tc_classes, ns, dev)
    with ThreadPoolExecutor(max_workers=len(readers)) as pool:
        futures = {key: pool.submit(read) for key, read in readers.items()}
        got = {key: f.result() for key, f in futures.items()}
    addr, route, rule, links = got["ip"]
    out = {"addr": addr, "route": route, "rule": rule, "sysctl": got["sysctl"],
           "link": [{k: link.get(k) for k in ("ifname", "mtu", "flags", "qdisc")}
                    for link in links]}
    for k, dev in enumerate(devs):
        qdisc, filters = got["tc"][2 * k], got["tc"][2 * k + 1]
        out[f"tc {dev}"] = [qdisc, got[f"class {dev}"], filters]
    return _strip(out)


CC = Path("/proc/sys/net/ipv4/tcp_congestion_control")
CC_ALLOWED = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


@contextlib.contextmanager
def restricted_congestion() -> Iterator[None]:
    """The machine set to reno, with only reno allowed to other namespaces (cubic available
    but not allowed, as on a kernel whose default is BBR); both restored on exit."""
    assert "cubic" in Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text()
    before, allowed = CC.read_text().strip(), CC_ALLOWED.read_text().strip()
    try:
        CC.write_text("reno\n")
        CC_ALLOWED.write_text("reno\n")
        yield
    finally:
        CC_ALLOWED.write_text(allowed + "\n")
        CC.write_text(before + "\n")
