"""A real sshd per lab host, so ssh, paramiko and Ansible reach lab hosts as on bare metal.

Each host namespace runs `/usr/sbin/sshd -f <state>/ssh/sshd_config.<host>` listening only on its
management address, with its own host key. One lab client key is authorised on every host; the
state directory also gets known_hosts (so clients verify host keys, no TOFU), an ssh_config with
one `Host` entry per lab host, and an Ansible inventory. Keys are made in-process (cryptography,
a paramiko dependency) instead of one ssh-keygen spawn per host.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from topoctl.lab.layout import Layout
from topoctl.lab.netops import LabError

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it


def write_private(path: Path, data: str | bytes) -> None:
    """Write a file only its owner can read (0600, also when it existed with another mode):
    the lab's keys, sshd configs, known_hosts and inventory are root's alone."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data.encode() if isinstance(data, str) else data)


def _keypair(path: Path, comment: str) -> str:
    """Write an ed25519 private key and its .pub (both 0600); return the public key line."""
    key = Ed25519PrivateKey.generate()
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                        serialization.PublicFormat.OpenSSH).decode()
    write_private(path, priv)
    line = f"{pub} {comment}"
    write_private(path.with_name(path.name + ".pub"), line + "\n")
    return line


def sshd_config(layout: Layout, host: str, ssh_dir: Path, run_dir: Path,
                env: dict[str, str] | None = None) -> str:
    """The sshd_config of `host`: listening on its management address only, its own host key and
    authorized keys; every session gets the lab's and host's names and `env`."""
    h = layout.host(host)
    session_env = {"TOPOCTL_LAB": layout.lab, "TOPOCTL_HOST": host, **(env or {})}
    return "\n".join([
        f"# topoctl lab {layout.lab}: host {host} (namespace {h.ns})",
        f"ListenAddress {h.mgmt_ip}:22",
        *([f"ListenAddress [{layout.ssh_ip(host)}]:22"] if layout.mgmt_ipv6 else []),
        f"HostKey {ssh_dir / f'host_{host}'}",
        f"AuthorizedKeysFile {ssh_dir / 'authorized_keys'}",
        f"PidFile {run_dir / f'sshd-{host}.pid'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "MaxStartups 200:30:400",
        "MaxSessions 100",
        "LogLevel ERROR",
        "SetEnv " + " ".join(f"{k}={v}" for k, v in session_env.items()),
        "Subsystem sftp internal-sftp",
        "",
    ])


def write_ssh_files(layout: Layout, state_dir: Path,
                    env: dict[str, dict[str, str]] | None = None) -> None:
    """Keys, sshd configs, known_hosts, ssh_config and inventory under `state_dir`, every one
    0600 in 0700 directories; `env`: host -> what its sessions get besides the lab's and host's
    names (`Lab.rank_env`)."""
    ssh_dir, run_dir = state_dir / "ssh", state_dir / "run"
    for d in (ssh_dir, run_dir):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        d.chmod(0o700)
    client = _keypair(ssh_dir / "id_ed25519", f"topoctl-lab-{layout.lab}")
    write_private(ssh_dir / "authorized_keys", client + "\n")
    known, cfg, inv = [], [], ["[lab]"]
    for h in layout.hosts:
        pub = _keypair(ssh_dir / f"host_{h.name}", f"{h.name}@{layout.lab}")
        known += [f"{ip} {' '.join(pub.split()[:2])}" for ip in sorted({h.mgmt_ip,
                                                                        layout.ssh_ip(h.name)})]
        write_private(ssh_dir / f"sshd_config.{h.name}",
                      sshd_config(layout, h.name, ssh_dir, run_dir, (env or {}).get(h.name)))
        ip = layout.ssh_ip(h.name)  # an IPv6-only lab: its IPv6 management address
        cfg += [f"Host {h.name} {ip}", f"    HostName {ip}", "    User root",
                f"    IdentityFile {ssh_dir / 'id_ed25519'}", "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {ssh_dir / 'known_hosts'}",
                "    StrictHostKeyChecking yes", "    BatchMode yes", "    LogLevel ERROR", ""]
        inv.append(f"{h.name} ansible_host={ip} ansible_user=root "
                   f"topoctl_netns={h.ns}")
    write_private(ssh_dir / "known_hosts", "\n".join(known) + "\n")
    write_private(ssh_dir / "config", "\n".join(cfg))
    inv += ["", "[lab:vars]", f"ansible_ssh_private_key_file={ssh_dir / 'id_ed25519'}",
            f"ansible_ssh_common_args='-F {ssh_dir / 'config'}'", ""]
    write_private(state_dir / "inventory.ini", "\n".join(inv))


def start_sshd(layout: Layout, state_dir: Path, timeout: float = 20.0,
               prefix: dict[str, list[str]] | None = None) -> None:
    """Start one sshd per host namespace and wait until each accepts TCP connections.
    `prefix`: host -> argv its sshd is started under (none by default: the lab's sshd runs
    outside its host's CPU group, which only the ranks join, `Lab.rank_env`)."""
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    ssh_dir = state_dir / "ssh"
    prefix = prefix or {}
    procs = [(h.name, subprocess.Popen(
        [*prefix.get(h.name, []), "ip", "netns", "exec", h.ns, SSHD, "-f",
         str(ssh_dir / f"sshd_config.{h.name}")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)) for h in layout.hosts]
    errors = []
    for name, p in procs:  # sshd forks into the background; the launcher exits at once
        _, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            errors.append(f"{name}: sshd exited {p.returncode}: {err.strip()}")
    if errors:
        raise LabError("; ".join(errors))
    wait_listening([layout.ssh_ip(h.name) for h in layout.hosts], 22, timeout)


def wait_listening(addrs: list[str], port: int, timeout: float) -> None:
    """Wait until every address accepts TCP on `port`; LabError after `timeout` seconds."""
    pending, deadline = list(addrs), time.monotonic() + timeout
    while pending:
        still = []
        for a in pending:
            try:
                with socket.create_connection((a, port), timeout=0.5):
                    pass
            except OSError:
                still.append(a)
        pending = still
        if pending and time.monotonic() > deadline:
            raise LabError(f"sshd not answering on {', '.join(pending)} after {timeout:g}s")
        if pending:
            time.sleep(0.05)


def sshd_pids(state_dir: Path) -> dict[str, int]:
    """host -> sshd pid, from the pid files of live daemons."""
    out = {}
    for f in (state_dir / "run").glob("sshd-*.pid"):
        try:
            pid = int(f.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            continue
        out[f.stem.removeprefix("sshd-")] = pid
    return out
