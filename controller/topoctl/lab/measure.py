"""`topoctl lab measure`: iperf3 across every cable, achieved vs configured rate.

Host ports carry no addresses of their own (the agent's job), so each measurement puts a
temporary /30 from 10.233.0.0/16 (the lab's measurement range, README address table) on the two
ports, runs one iperf3 server/client pair through the cable, and removes the addresses again,
also on failure. iperf3 reports TCP goodput: with 1500-byte frames that is 1448/1514 = 95.6% of
the shaped line rate, with 9000-byte frames 99.3% (docs/lab.md)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from topoctl.lab import netops
from topoctl.lab.lab import Lab, load_measurements

MEASURE_NET = ipaddress.IPv4Network("10.233.0.0/16")
BASE_PORT = 5201


@dataclass
class Pair:
    """One measurement: iperf3 from port `src` to port `dst`, expected at the `configured` rate."""

    name: str
    src: str  # host:nic
    dst: str
    configured: int  # bit/s: the narrowest shaped hop on the way
    at: tuple[str, ...] = ()  # the ports this measurement is "the cable at" (for filtering)


@dataclass
class Result:
    """One measurement's outcome: achieved goodput and its ratio to the configured rate (None on
    error)."""

    name: str
    src: str
    dst: str
    configured: int
    achieved: float | None  # bit/s received (TCP goodput), None on error
    ratio: float | None
    cpu_percent: float | None = None  # iperf3's host_total on the sender
    error: str | None = None


def pairs(lab: Lab) -> list[Pair]:
    """One measurement per cable (direct) or per switch port towards the next port (switched)."""
    lay = lab.layout
    if lay.kind == "direct":
        return [Pair(c.name, c.a, c.b, c.rate, (c.a, c.b)) for c in lay.cables]
    sps = lay.switch_ports
    up = {u.leaf: u.rate for u in lay.uplinks}
    out = []
    for i, s in enumerate(sps):
        t = sps[(i + 1) % len(sps)]
        if t.ref.split(":")[0] == s.ref.split(":")[0] or len(sps) < 2:
            continue
        rate = min(s.rate, t.rate)
        if s.switch != t.switch:
            rate = min([rate] + [up[x] for x in (s.switch, t.switch) if x in up])
        out.append(Pair(f"{s.ref}--{s.switch}", s.ref, t.ref, rate, (s.ref,)))
    return out


def _addrs(k: int) -> tuple[str, str]:
    base = MEASURE_NET.network_address + 4 * k
    return str(base + 1), str(base + 2)


def measure_pair(lab: Lab, p: Pair, k: int, seconds: float) -> Result:
    """Measure one pair with iperf3 for `seconds` over temporary /30 addresses (index `k`), removed
    afterwards."""
    src_h, src_nic = p.src.split(":")
    dst_h, dst_nic = p.dst.split(":")
    sns, dns = lab.netns(src_h), lab.netns(dst_h)
    a, b = _addrs(k)
    port = str(BASE_PORT + k)
    added: list[tuple[str, str, str]] = []
    server = None
    try:
        for ns, nic in ((sns, src_nic), (dns, dst_nic)):
            if "LOWER_UP" not in netops.ip_json("link", "show", "dev", nic, ns=ns)[0]["flags"]:
                return Result(p.name, p.src, p.dst, p.configured, None, None,
                              error=f"no carrier on {ns.split('-h-')[-1]}:{nic} (cut?)")
        for ns, nic, ip in ((sns, src_nic, a), (dns, dst_nic, b)):
            netops.run(["ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", nic])
            added.append((ns, nic, ip))
        iperf_s = ["iperf3", "-s", "-1", "-B", b, "-p", port]
        server = subprocess.Popen(lab.netns_argv(dst_h, iperf_s), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        data: dict = {}
        for _ in range(40):  # until the server listens
            out = netops.run(lab.netns_argv(src_h, [
                "iperf3", "-c", b, "-B", a, "-p", port, "-t", f"{seconds:g}", "-O", "1", "-J",
                "--connect-timeout", "2000"]),
                             check=False, timeout=seconds + 30).stdout
            data = json.loads(out) if out.strip() else {"error": "no output"}
            if "refused" not in data.get("error", "") or server.poll() is not None:
                break
            time.sleep(0.05)
        if "error" in data:
            return Result(p.name, p.src, p.dst, p.configured, None, None, error=data["error"])
        bps = float(data["end"]["sum_received"]["bits_per_second"])
        cpu = data["end"].get("cpu_utilization_percent", {}).get("host_total")
        return Result(p.name, p.src, p.dst, p.configured, bps, bps / p.configured, cpu)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        for ns, nic, ip in added:
            netops.run(["ip", "-n", ns, "addr", "del", f"{ip}/30", "dev", nic], check=False)


def measure(lab: Lab, only: list[str] | None = None, seconds: float = 2.0,
            jobs: int = 1) -> list[Result]:
    """Measure every cable (or those touching the HOST:PORTs in `only`); `jobs` cables at once
    (cables are independent links; only the CPU is shared). Results are kept for `status`."""
    todo = [p for p in pairs(lab) if not only or set(p.at) & set(only)]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        results = list(ex.map(lambda kp: measure_pair(lab, kp[1], kp[0], seconds),
                              enumerate(todo)))
    saved = load_measurements(lab)
    saved.update({r.name: asdict(r) for r in results})
    (lab.state_dir / "measure.json").write_text(json.dumps(saved, indent=1))
    return results
