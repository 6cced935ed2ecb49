"""OVSDB through the `ovs` package's IDL: read the agent's rows, write a whole configuration in
one transaction (retried on TRY_AGAIN), wait until ovs-vswitchd has applied it.

The agent's configuration (`DbConfig`) is plain data: bridges it owns (tagged
external_ids:topoctl-owner=topo-agent), their ports and internal ports, and per port a QoS of
type linux-htb with queues. Rows without the tag are never written or deleted; a desired bridge
whose name is taken by a foreign bridge is refused before anything is written (check_host).

OVSDB pitfalls handled here: rates are written as decimal integer strings (OVS silently ignores
`1e8` or `100000000.0`); a Queue row is deleted only in the transaction that drops every QoS
reference to it (else the commit fails on referential integrity); QoS and Queue are root tables
(not garbage-collected), so removed ones are deleted explicitly; Port and Interface rows go with
their last reference.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from topoagent.protocol import TopoError
from topoagent.state.ovs import OVS_OWNER

OWNER_KEY = "topoctl-owner"
TABLES = ("Open_vSwitch", "Bridge", "Port", "Interface", "QoS", "Queue")
DEFAULT_DB = "unix:/run/openvswitch/db.sock"
TIMEOUT_S = 10.0


class OvsDbError(TopoError, RuntimeError):
    """ovsdb-server unreachable or a transaction refused."""


@dataclass(frozen=True)
class PortQos:
    """A port's linux-htb QoS: link rate and (queue id, min-rate, max-rate, burst) per queue.

    A burst of 0 leaves OVS's default, one frame of token credit (rows of earlier releases)."""

    max_rate: int  # bit/s
    queues: tuple[tuple[int, int, int, int], ...]  # (queue id, min-rate, max-rate, burst) bits


@dataclass(frozen=True)
class PortConfig:
    """A port of an agent bridge: internal or not, its QoS, and whether it is protected (the
    NORMAL action forwards nothing between two protected ports)."""

    internal: bool = False
    qos: PortQos | None = None
    protected: bool = False


@dataclass(frozen=True)
class BridgeConfig:
    """An agent bridge: datapath type and its ports, sorted by name."""

    datapath_type: str
    ports: tuple[tuple[str, PortConfig], ...]  # sorted by name

    def port_map(self) -> dict[str, PortConfig]:
        """Port name -> its configuration."""
        return dict(self.ports)


@dataclass
class DbConfig:
    """What the agent owns in OVSDB (desired or observed)."""

    bridges: dict[str, BridgeConfig] = field(default_factory=dict)


@dataclass
class DbSnapshot:
    """Observed: the agent's bridges plus the names of every bridge and port (foreign too)."""

    config: DbConfig
    all_bridges: dict[str, bool]  # name -> owned by the agent
    all_ports: dict[str, str]  # port name -> bridge name
    ovs_version: str | None = None


def socket_path(db: str) -> str | None:
    """The file of a `unix:PATH` OVSDB remote, None for other remotes."""
    return db[len("unix:"):] if db.startswith("unix:") else None


def rundir(db: str) -> str:
    """Where ovs-vswitchd's sockets (bridge.mgmt) are: next to a lab's db.sock, else the
    system's run directory."""
    path = socket_path(db)
    if path and os.path.dirname(path) not in ("/run/openvswitch", "/var/run/openvswitch"):
        return os.path.dirname(path)
    return "/run/openvswitch"


def reachable(db: str) -> bool:
    """Whether the OVSDB remote may answer (for unix sockets: the socket file exists)."""
    path = socket_path(db)
    return os.path.exists(path) if path else True


class OvsDb:
    """One IDL connection, synchronised with the server before use."""

    def __init__(self, db: str = DEFAULT_DB, timeout: float = TIMEOUT_S):
        # the ovs package (its IDL, ~0.1 s) loads only where a host's OVS is read or written
        import ovs.db.idl
        import ovs.jsonrpc
        import ovs.poller
        import ovs.stream

        self._idl_mod, self._poller = ovs.db.idl, ovs.poller
        self.db = db
        self.timeout = timeout
        err, stream = ovs.stream.Stream.open_block(ovs.stream.Stream.open(db),
                                                   int(timeout * 1000))
        if err:
            raise OvsDbError(f"cannot reach ovsdb-server at {db}: {os.strerror(err)}")
        rpc = ovs.jsonrpc.Connection(stream)
        err, reply = rpc.transact_block(
            ovs.jsonrpc.Message.create_request("get_schema", ["Open_vSwitch"]))
        rpc.close()
        if err or reply.error:
            raise OvsDbError(f"{db}: get_schema failed: {err or reply.error}")
        import ovs.db.schema  # as above
        helper = ovs.db.idl.SchemaHelper(schema_json=reply.result)
        for t in TABLES:
            helper.register_table(t)
        self.idl = ovs.db.idl.Idl(db, helper)
        self._sync()

    def close(self) -> None:
        """Close the IDL connection."""
        self.idl.close()

    def _block(self) -> None:
        p = self._poller.Poller()
        self.idl.wait(p)
        p.timer_wait(100)
        p.block()

    def _sync(self) -> None:
        deadline = time.monotonic() + self.timeout
        seq = self.idl.change_seqno
        while True:
            self.idl.run()
            if self.idl.has_ever_connected() and self.idl.change_seqno != seq:
                return
            if time.monotonic() > deadline:
                raise OvsDbError(f"{self.db}: no answer from ovsdb-server in {self.timeout:g} s")
            self._block()

    def rows(self, table: str) -> list:
        """Every row of `table` in the IDL's replica."""
        return list(self.idl.tables[table].rows.values())

    # --- read ------------------------------------------------------------------------------------
    def snapshot(self) -> DbSnapshot:
        """The agent's bridges, ports and QoS as a DbConfig, plus what others own."""
        cfg = DbConfig()
        all_bridges, all_ports = {}, {}
        for br in self.rows("Bridge"):
            owned = br.external_ids.get(OWNER_KEY) == OVS_OWNER
            all_bridges[br.name] = owned
            ports = []
            for p in br.ports:
                all_ports[p.name] = br.name
                if p.name == br.name:
                    continue  # the bridge's own local port
                internal = any(i.type == "internal" for i in p.interfaces)
                ports.append((p.name, PortConfig(internal, _read_qos(p),
                                                 bool(getattr(p, "protected", False)))))
            if owned:
                cfg.bridges[br.name] = BridgeConfig(br.datapath_type or "system",
                                                    tuple(sorted(ports)))
        root = self.rows("Open_vSwitch")
        ver = (root[0].ovs_version[0] if root and root[0].ovs_version else None)
        return DbSnapshot(cfg, all_bridges, all_ports, ver)

    # --- write -----------------------------------------------------------------------------------
    def write(self, want: DbConfig, retries: int = 5) -> None:
        """Make the agent's rows match `want` in one transaction; wait for ovs-vswitchd."""
        txn_mod = self._idl_mod.Transaction
        for _ in range(retries):
            txn = txn_mod(self.idl)
            self._build(txn, want)
            root = self.rows("Open_vSwitch")[0]
            root.increment("next_cfg")
            status = txn.commit_block()
            if status == txn_mod.TRY_AGAIN:  # someone else wrote meanwhile: resync, rebuild
                self._sync_quiet()
                continue
            if status in (txn_mod.SUCCESS, txn_mod.UNCHANGED):
                if status == txn_mod.SUCCESS:
                    self._wait_applied(txn.get_increment_new_value())
                return
            raise OvsDbError(f"OVSDB transaction {status}: {txn.get_error()}")
        raise OvsDbError(f"OVSDB transaction still conflicting after {retries} tries")

    def _sync_quiet(self) -> None:
        deadline = time.monotonic() + self.timeout
        seq = self.idl.change_seqno
        while self.idl.change_seqno == seq and time.monotonic() < deadline:
            self.idl.run()
            self._block()

    def _wait_applied(self, cfg: int) -> None:
        """ovs-vswitchd copies next_cfg to cur_cfg once it has reconfigured (ovs-vsctl --wait)."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            self.idl.run()
            root = self.rows("Open_vSwitch")[0]
            if root.cur_cfg >= cfg:
                return
            self._block()
        raise OvsDbError(f"ovs-vswitchd did not apply the configuration in {self.timeout:g} s "
                         "(is it running?)")

    def _build(self, txn, want: DbConfig) -> None:
        tag = {OWNER_KEY: OVS_OWNER}
        root = self.rows("Open_vSwitch")[0]
        bridges = {b.name: b for b in self.rows("Bridge")}
        keep = [b for b in root.bridges]
        doomed_qos: list = []
        for name, br in bridges.items():
            if br.external_ids.get(OWNER_KEY) == OVS_OWNER and name not in want.bridges:
                keep = [b for b in keep if b.uuid != br.uuid]
                for p in br.ports:
                    doomed_qos += _drop_qos(p)
        for name, bc in sorted(want.bridges.items()):
            br = bridges.get(name)
            if br is None:
                br = txn.insert(self.idl.tables["Bridge"])
                br.name = name
                br.external_ids = tag
                br.datapath_type = bc.datapath_type
                keep.append(br)
                have, ports = {}, [self._port(txn, name, True)]  # the bridge's local port
                old_ports: list = []
            elif br.external_ids.get(OWNER_KEY) != OVS_OWNER:
                raise OvsDbError(f"bridge {name} exists and is not the agent's")
            else:
                if (br.datapath_type or "system") != bc.datapath_type:
                    br.datapath_type = bc.datapath_type
                old_ports = list(br.ports)
                have = {p.name: p for p in old_ports}
                ports = [p for p in old_ports if p.name == name]
            for pname, pc in bc.ports:
                p = have.get(pname)
                internal = p is not None and any(i.type == "internal" for i in p.interfaces)
                if p is None or internal != pc.internal:
                    if p is not None:
                        doomed_qos += _drop_qos(p)
                    p = self._port(txn, pname, pc.internal)
                if bool(p.protected) != pc.protected:
                    p.protected = pc.protected
                ports.append(p)
                doomed_qos += self._set_qos(txn, p, pc.qos)
            for pname, p in have.items():
                if pname != name and pname not in bc.port_map():
                    doomed_qos += _drop_qos(p)
            if sorted(x.uuid for x in ports) != sorted(x.uuid for x in old_ports):
                br.ports = ports
        if sorted(b.uuid for b in keep) != sorted(b.uuid for b in root.bridges):
            root.bridges = keep
        # QoS rows first, then the queues only they referenced (same transaction)
        gone = {}
        for q in doomed_qos:
            if q.uuid not in gone:
                gone[q.uuid] = q
        queues = {}
        for q in gone.values():
            for qu in q.queues.values():
                queues[qu.uuid] = qu
            q.delete()
        for qu in queues.values():
            qu.delete()

    def _port(self, txn, name: str, internal: bool):
        i = txn.insert(self.idl.tables["Interface"])
        i.name = name
        if internal:
            i.type = "internal"
        p = txn.insert(self.idl.tables["Port"])
        p.name = name
        p.interfaces = [i]
        p.qos = []  # readable in this transaction (a fresh row has no columns yet)
        p.protected = False
        p.external_ids = {OWNER_KEY: OVS_OWNER}
        return p

    def _set_qos(self, txn, port, want: PortQos | None) -> list:
        """Point `port` at a QoS matching `want`; returns QoS rows to delete."""
        old = list(port.qos)
        if old and _qos_of(old[0]) == want:
            return []
        if want is None:
            if old:
                port.qos = []
            return old
        q = txn.insert(self.idl.tables["QoS"])
        q.type = "linux-htb"
        q.other_config = {"max-rate": str(int(want.max_rate))}  # integers: floats are ignored
        q.external_ids = {OWNER_KEY: OVS_OWNER}
        qmap = {}
        for qid, lo, hi, *burst in want.queues:  # journals of earlier releases: no burst
            qu = txn.insert(self.idl.tables["Queue"])
            qu.other_config = {"min-rate": str(int(lo)), "max-rate": str(int(hi)),
                               **({"burst": str(int(burst[0]))} if burst and burst[0] else {})}
            qu.external_ids = {OWNER_KEY: OVS_OWNER}
            qmap[qid] = qu
        q.queues = qmap
        port.qos = [q]
        return old


def _drop_qos(port) -> list:
    """Unreference a leaving port's QoS (a port on its way to garbage collection still counts
    as a reference at commit time) and return it for deletion."""
    old = list(port.qos)
    if old:
        port.qos = []
    return old


def _qos_of(q) -> PortQos | None:
    if q.type != "linux-htb":
        return None
    try:
        mx = int(q.other_config.get("max-rate", "0"))
        queues = tuple(sorted((int(k), int(v.other_config.get("min-rate", "0")),
                               int(v.other_config.get("max-rate", "0")),
                               int(v.other_config.get("burst", "0")))
                              for k, v in q.queues.items()))
    except ValueError:
        return None
    return PortQos(mx, queues)


def _read_qos(port) -> PortQos | None:
    return _qos_of(port.qos[0]) if port.qos else None
