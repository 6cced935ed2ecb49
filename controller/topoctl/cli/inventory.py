"""`topoctl inventory cluster.yaml`: an Ansible inventory (YAML) for the playbooks in playbooks/.

From a cluster file: every host with its `address` (ansible_host), the cluster's `inventory`
(user, port, key, known_hosts with strict checking, the agent command), `topo_agent_require_ovs`
for hosts with `ovs: true` and `topo_agent_ovsdb` (the agent's --ovsdb: the cluster's
`inventory.ovsdb` / `hosts[].ovsdb`, in a lab the host's own ovsdb-server), and one group per
rack. With `--lab NAME`: the lab's management
addresses, key, known_hosts and per-host agent state directories, and this installation's
agent (the lab hosts share this machine's filesystem). Hosts without an address are an error
naming their YAML path; nothing is written."""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from topoagent.cliutil import add_json
from topoagent.protocol import EXIT_OK, TopoError
from topoctl.cli.output import write_output
from topoctl.lab.lab import Lab
from topoctl.spec.cluster import Cluster
from topoctl.spec.cluster_load import load_cluster

# The lab hosts run the agent of this installation through the system Python's ansible modules.
LAB_PYTHON = "/usr/bin/python3"


def cluster_inventory(cluster: Cluster) -> dict:
    """Inventory for a bare-metal cluster (hosts[].address, the cluster's `inventory`)."""
    missing = [(f"hosts[{i}].address", f"host {h.name} has no address (needed for SSH)")
               for i, h in enumerate(cluster.hosts) if not h.address]
    if missing:
        raise TopoError(missing)
    inv = cluster.inventory
    common = {"ansible_user": inv.user if inv else "root",
              "ansible_port": inv.port if inv else 22}
    if inv:
        common["ansible_ssh_private_key_file"] = inv.key
        common["ansible_ssh_common_args"] = (f"-o UserKnownHostsFile={inv.known_hosts} "
                                             "-o StrictHostKeyChecking=yes")
        if inv.agent != ["topo-agent"]:
            common["topo_agent_command"] = list(inv.agent)
            common["topo_agent_install_method"] = "none"
    hosts = {h.name: {"ansible_host": str(h.address), **_host_vars(cluster, h.name)}
             for h in cluster.hosts}
    return _document(cluster, hosts, common)


def lab_inventory(lab: Lab, agent: list[str] | None = None) -> dict:
    """Inventory for a running lab: its sshd per host, the agent of this installation."""
    agent = agent or [sys.executable, "-m", "topoagent.cli"]
    common = {
        "ansible_user": "root",
        "ansible_python_interpreter": LAB_PYTHON,
        "ansible_ssh_private_key_file": str(lab.ssh_key),
        "ansible_ssh_common_args": f"-F {lab.ssh_config}",
        "topo_agent_install_method": "none",
        "topo_agent_command": agent,
        "topo_agent_service": False,  # no systemd in a lab namespace
        "topo_agent_python": LAB_PYTHON,
    }
    hosts = {h.name: {"ansible_host": lab.mgmt_ip(h.name),
                      "topo_agent_state_dir": str(lab.state_dir / "agent" / h.name),
                      "topo_agent_config_dir": str(lab.state_dir / "agent-etc" / h.name),
                      "topo_agent_systemd_dir": str(lab.state_dir / "agent-etc" / h.name),
                      **_host_vars(lab.cluster, h.name, lab.ovsdb(h.name))}
             for h in lab.cluster.hosts}
    return _document(lab.cluster, hosts, common)


def _host_vars(cluster: Cluster, host: str, ovsdb: str | None = None) -> dict:
    """`topo_agent_require_ovs` for a host that runs OVS, and `topo_agent_ovsdb` (its agent's
    --ovsdb) where it has a remote of its own: `ovsdb`, else the cluster's for that host."""
    if not cluster.runs_ovs(host):
        return {}
    db = ovsdb or cluster.ovsdb(host)
    return {"topo_agent_require_ovs": True, **({"topo_agent_ovsdb": db} if db else {})}


def _document(cluster: Cluster, hosts: dict[str, dict], common: dict) -> dict:
    racks: dict[str, dict] = {}
    for h in cluster.hosts:
        if h.rack:
            racks.setdefault(f"rack_{h.rack}", {"hosts": {}})["hosts"][h.name] = {}
    return {"all": {"vars": common, "hosts": hosts,
                    **({"children": dict(sorted(racks.items()))} if racks else {})}}


def inventory_text(doc: dict) -> str:
    """The inventory document as YAML text with a header comment."""
    return f"# topoctl inventory: Ansible YAML inventory\n{yaml.safe_dump(doc, sort_keys=False)}"


def run(args: argparse.Namespace) -> int:
    """Write the inventory of a cluster file or a lab; exit 0, or a TopoError for bad input
    (printed as `topoctl: FILE: yaml.path: message` by the CLI, like every verb)."""
    if args.lab:
        doc = lab_inventory(Lab.load(args.lab))
    elif args.cluster:
        try:
            doc = cluster_inventory(load_cluster(args.cluster))
        except TopoError as e:  # the hosts' addresses are the file's: name it
            raise e.at(args.cluster) from None
    else:
        raise TopoError("give a cluster file or --lab NAME")
    text = inventory_text(doc)
    to_file = args.output not in (None, "-")
    if to_file:
        write_output(args.output, text)
    if args.json:  # what was written (the inventory itself too when it went to no file)
        print(json.dumps({"ok": True, "output": args.output if to_file else None,
                          "hosts": sorted(doc["all"]["hosts"]),
                          "groups": sorted(doc["all"].get("children", {})),
                          **({} if to_file else {"inventory": doc})}))
    elif not to_file:
        print(text, end="")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl inventory` to the topoctl parser."""
    text = "write an Ansible inventory for the cluster's hosts (or a lab's)"
    p = sub.add_parser("inventory", help=text, description=text,
                       epilog="example: topoctl inventory cluster.yaml -o inventory.yml")
    p.add_argument("cluster", nargs="?", help="cluster.yaml (hosts need an address)")
    p.add_argument("--lab", help="a running lab instead of a cluster file")
    p.add_argument("-o", "--output", help="file to write (default stdout)")
    add_json(p, "one JSON document on stdout: the hosts and groups written (the inventory "
                "too, without -o)")
    p.set_defaults(func=run)
