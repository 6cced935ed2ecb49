"""`topoctl explain`: a readable summary of a Plan document (pure text, no I/O).

Sections: the headline (strategy, predicted iteration time and breakdown, the bound, what each
post-pass chose and why: DisCo's gradient buckets, SFB's layers), one table per host
(addresses, forwarding, routes by next hop, QoS classes, ranks), and the topology as text
(adjacency list with bandwidths; the AllReduce ring order). Figures are rounded for reading
(`_num`: four significant digits); the plan keeps them whole."""

from __future__ import annotations

from collections import Counter

from topoctl.sim.memory import Footprint, format_gb


def _ms(x) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    return f"{x * 1e3:.3f} ms" if abs(x) < 1 else f"{x:.3f} s"


def _num(x) -> str:
    """A figure as people read it: a float to four significant digits (5.439, not
    5.439028873416763), anything else (whole numbers, names, None) as it is."""
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {_num(v)}" for k, v in x.items()) + "}"
    if isinstance(x, list):
        return "[" + ", ".join(_num(v) for v in x) + "]"
    return str(x)


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + \
        [fmt.format(*map(str, r)) for r in rows]
    return [x.rstrip() for x in lines]


def headline(doc: dict) -> list[str]:
    """The summary lines: strategy, predicted iteration time with its breakdown, and the bound."""
    m = doc.get("metadata", {})
    p = m.get("prediction", {})
    b = m.get("bound", {})
    out = [f"plan: cluster {m.get('cluster')}, job {m.get('job')}, strategy {m.get('strategy')} "
           f"({m.get('planner')})",
           f"predicted iteration: {_ms(p.get('iteration_time'))} (compute {_ms(p.get('compute'))},"
           f" exposed communication {_ms(p.get('exposed_communication'))}, busiest link "
           f"{100 * p.get('max_link_utilisation', 0):.0f}%)",
           f"lower bound: {_ms(b.get('iteration_time'))} [{b.get('name')}], "
           f"plan/bound = {_num(b.get('ratio'))}"]
    if p.get("isolated_iteration") is not None:  # a steady-state period (topoctl.sim.steady)
        out.append(f"steady state: ranks leave the AllReduce one by one and start the next "
                   f"iteration under its tail; one iteration alone "
                   f"{_ms(p['isolated_iteration'])}")
    busy = p.get("busiest_links") or {}
    if busy:
        out.append("busiest links: " + ", ".join(f"{k} {100 * u:.0f}%" for k, u in busy.items()))
    for name, s in m.get("strategies", {}).items():
        out.append(f"  strategy {name}: {_ms(s.get('iteration_time'))}")
    out += layout_lines(doc) + collective_lines(doc) + stage_lines(doc)
    bw = m.get("collective", {}).get("bandwidth") if isinstance(m.get("collective"), dict) \
        else None
    if isinstance(bw, dict):  # the +bandwidth post-pass (docs/bandwidth.md)
        mp = bw.get("multipath")
        out.append(f"bandwidth post-pass: objective {_num(bw.get('objective'))}, multipath "
                   f"{'on' if mp else 'off' if mp is not None else '?'} "
                   f"({bw.get('multipath_pairs')} pair(s) split), LP communication time "
                   f"{_ms(bw.get('lp_comm_time'))}, HTB ceiling = {_num(bw.get('ceil'))}")
    return out + post_pass_lines(doc) + tag_lines(doc)


def layout_lines(doc: dict) -> list[str]:
    """Per device group (`metadata.layout`, `topoctl.sim.layout`): the parallelism degrees,
    the memory per device by kind against its capacity (the planner's memory check's own
    figures), then the collectives of one iteration with their bytes."""
    lay = doc.get("metadata", {}).get("layout")
    if not isinstance(lay, dict):
        return []
    out = [f"device groups (memory: {lay.get('memory_model')}):"]
    for g in lay.get("groups", []):
        stage = f", stage {g['stage']}" if g.get("stage") is not None else ""
        deg = g.get("degrees", {})
        out.append(f"  {g.get('devices')}: {g.get('count')} x {g.get('device')}{stage}, "
                   + ", ".join(f"{k} {v}" for k, v in deg.items()))
        out.append(f"    memory per device: {memory_line(g.get('memory', {}))}")
    for c in lay.get("collectives", []):
        out.append(f"  per iteration: {c.get('count')} x {c.get('kind')} (up to "
                   f"{c.get('members')} members), {format_gb(c.get('bytes', 0))} sent")
    return out


def memory_line(mem: dict) -> str:
    """'212 GB (parameters 26 GB, ...) of 80 GB (265%)': a group's footprint by kind (as
    `Footprint.describe` words the planner's refusals) against its capacity."""
    fp = Footprint(**{k: float(mem.get(k, 0)) for k in ("parameters", "gradients", "optimiser",
                                                        "activations", "gathered")})
    cap = mem.get("capacity")
    if not isinstance(cap, (int, float)) or isinstance(cap, bool) or cap <= 0:
        return f"{fp.describe()} of an unknown capacity (not checked)"
    return f"{fp.describe()} of {format_gb(cap)} ({100 * fp.total / cap:.0f}%)"


def tag_lines(doc: dict) -> list[str]:
    """What the ``tag`` search decided per op-group (docs/tag.md)."""
    c = doc.get("metadata", {}).get("collective")
    t = c.get("tag") if isinstance(c, dict) else None
    if not isinstance(t, dict):
        return []
    out = [f"TAG search: {t.get('playouts')} playouts, {t.get('simulated_plans')} plans "
           f"simulated, {_num(t.get('speedup_over_baseline'))}x the baseline"
           + (f" (wall-clock limit tag.time_limit {t['time_limit']:g} s)"
              if isinstance(t.get("time_limit"), (int, float)) else "")]
    if t.get("cut_short"):  # the job's wall clock decided part of this plan
        out.append(f"  TAG cut by the clock: {', '.join(map(str, t['cut_short']))}: "
                   f"{t.get('cut_short_note', 'this plan may differ from run to run')}")
    out += [f"  TAG group {g.get('group')}: {g.get('ops')} op(s) {g.get('first')}.."
            f"{g.get('last')}: {g.get('decision')}" for g in t.get("groups", [])]
    return out


def post_pass_lines(doc: dict) -> list[str]:
    """What the ``+shares`` (samples per host) and ``+sfb`` (layers synchronised by
    sufficient-factor broadcasting) post-passes chose."""
    c = doc.get("metadata", {}).get("collective")
    c = c if isinstance(c, dict) else {}
    out = []
    sh = c.get("shares")
    if isinstance(sh, dict):  # docs/shares-sfb.md
        out.append("batch shares by speed: " + ", ".join(
            f"{h} {sh.get('samples', {}).get(h)} (speed {_num(v)})"
            for h, v in (sh.get("speeds") or {}).items()))
    sfb = c.get("sfb")
    if isinstance(sfb, dict):
        out += sfb_lines(sfb)
    return out + disco_lines(doc)


def sfb_lines(sfb: dict) -> list[str]:
    """SFB's choice (`metadata.collective.sfb`): the layers synchronised by it and, when some
    candidate was left to the AllReduce, why (the closest one's saving against its cost)."""
    layers = sfb.get("layers") or {}
    out = [f"sufficient-factor broadcasting: {len(layers)} of {sfb.get('candidates')} "
           f"fully connected layer(s), program objective {_ms(sfb.get('objective_s'))}"
           f", {_mb(sfb.get('gathered_bytes_per_replica'))} gathered per replica"]
    if sfb.get("candidates") == 0:
        out[0] += ": the model has no fully connected layer with a weight"
    elif sfb.get("forced"):
        out[0] += " (the layers were forced, not chosen)"
    out += [f"  SFB layer {name}: {v.get('m')} -> {v.get('n')}, {v.get('k')} rows per "
            "replica" for name, v in layers.items()]
    near = sfb.get("closest")
    if isinstance(near, dict):  # the best candidate left out, and why
        out.append(f"  {'none pays' if not layers else 'the others do not pay'}: the closest, "
                   f"{near.get('module')}, would save {_ms(near.get('saved_s'))} of AllReduce "
                   f"per iteration but cost {_ms(near.get('cost_s'))} (all-gathering its "
                   f"factors and rebuilding its gradient)")
    return out


def disco_lines(doc: dict) -> list[str]:
    """DisCo's gradient buckets (``job.collective.bucket_plan``, in AllReduce order, or sliced
    and by priority: ``bucket_slicing``) with what its search chose
    (`metadata.collective.disco`): overlap, fusion, the gap it closed."""
    coll = doc.get("job", {}).get("collective", {})
    plan = coll.get("bucket_plan") if isinstance(coll, dict) else None
    if not isinstance(plan, list) or not plan:
        return []
    c = doc.get("metadata", {}).get("collective")
    d = c.get("disco") if isinstance(c, dict) else None
    d = d if isinstance(d, dict) else {}
    sl = coll.get("bucket_slicing")
    order = "AllReduced in this order" if not isinstance(sl, dict) else (
        f"cut into {_mb(sl.get('slice_bytes'))} slices (or the plan's own sizes), "
        f"AllReduced by priority {sl.get('priority')} within a credit of "
        f"{_mb(sl.get('credit'))} in flight")
    head = (f"DisCo: {len(plan)} gradient bucket(s) named by the plan, {order}, overlap "
            f"{coll.get('bucket_overlap', 'backward')}")
    if d:
        head += (f", operator fusion {d.get('fusion')}; gap to the ideal closed "
                 f"{_num(d.get('gap_closed'))} (of 1); anchors: " + ", ".join(
                     f"{k} {_ms(v)}" for k, v in (d.get("anchors") or {}).items()))
    out = [head]
    for i, b in enumerate(plan):
        params = b.get("params") if isinstance(b, dict) else None
        names = params if isinstance(params, list) else []
        shown = ", ".join(map(str, names[:3])) + (f", ... ({len(names)} in all)"
                                                  if len(names) > 3 else "")
        out.append(f"  bucket {i}: {_mb(b.get('bytes') if isinstance(b, dict) else None)}, "
                   f"{len(names)} parameter(s): {shown}")
    return out


def collective_lines(doc: dict) -> list[str]:
    """The gradient collective's predicted cost, network part and CPU part separately (trees:
    the runtime's pipeline and CPU model; pipelines on lab hosts: what their CPU model rests
    on; other collectives: their network time only)."""
    m = doc.get("metadata", {})
    c = m.get("collective", {})
    algo = doc.get("job", {}).get("collective", {}).get("algorithm")
    rt = c.get("runtime")
    if not algo:
        return []
    comp = c.get("compute")
    if algo == "pipeline" and isinstance(comp, dict):  # lab hosts: docs/placement.md
        return [f"collective pipeline: stages timed on this CPU at micro-batch "
                f"{comp.get('micro_batch')} ({comp.get('threads')} thread(s)); messages, "
                f"blocking sends and the shared cores in the simulation above (CPU costs "
                f"{_num(comp.get('runtime_cpu'))})"]
    if not rt:
        return [f"collective {algo}: network part in the simulation above; CPU part not "
                "modelled"]
    out = [f"collective {algo}: {rt.get('buckets')} AllReduce(s) per iteration, network part "
           f"{_ms(rt.get('network_s'))}, CPU part {_ms(rt.get('cpu_s'))} "
           f"({_num(rt.get('ranks_per_core'))} ranks per core; CPU costs "
           f"{_num(rt.get('cpu_costs'))}); "
           "the two overlap, the CPU adds "
           f"{_ms(rt.get('exposed_cpu_s', rt.get('cpu_s')))}",
           f"  largest bucket: {rt.get('chunks')} chunks per tree of up to "
           f"{rt.get('chunk_bytes')} bytes, {rt.get('steps')} lock-step steps, "
           f"{rt.get('messages')} messages on the busiest rank"]
    fz = c.get("fusion")
    if isinstance(fz, dict) and fz.get("candidates"):
        tried = ", ".join(f"{_mb(b)} {_ms(t)}" for b, t in fz["candidates"])
        out.append(f"  tensor fusion: buckets of up to {_mb(fz.get('bucket_bytes'))} "
                   f"({fz.get('buckets')} per iteration); simulated iteration per cap: {tried}")
    if "achieved_over_optimal" in c:
        out.append(f"  {c.get('trees')} trees at {_num(c.get('achieved_over_optimal'))} of the "
                   f"optimum [{c.get('bound')}]")
    return out


def stage_lines(doc: dict) -> list[str]:
    """A pipeline's stages: hosts, ranks and how the replicas sync their gradients
    (`topocontract.stages`), with each sync option's simulated seconds when the plan has them."""
    coll = doc.get("job", {}).get("collective", {})
    if coll.get("algorithm") != "pipeline":
        return []
    notes = doc.get("metadata", {}).get("collective", {}).get("sync") or []
    out = []
    for i, st in enumerate(coll.get("stages", [])):
        sync = st.get("sync") or {"kind": "ring (unstated)" if len(st.get("hosts", [])) > 1
                                  else "none (unstated)"}
        how = sync.get("kind", "?") + (f" on {sync['server']}" if sync.get("server") else "")
        if isinstance(sync.get("schedule"), dict):  # trees: how many
            how += f" ({len(sync['schedule'].get('trees', []))} trees)"
        opts = notes[i].get("options_s") if i < len(notes) and isinstance(notes[i], dict) \
            else None
        tried = (" (simulated: " + ", ".join(f"{k} {_ms(v)}" for k, v in opts.items()) + ")"
                 if opts else "")
        rows = (f", rows {'/'.join(map(str, st['shares']))} of each micro-batch"
                if isinstance(st.get("shares"), list) else "")
        out.append(f"  stage {i}: hosts {', '.join(st.get('hosts', []))} (ranks "
                   f"{', '.join(map(str, st.get('ranks', [])))}), {len(st.get('ops', []))} ops"
                   f"{rows}, sync {how}{tried}")
    return out


def _mb(b) -> str:
    return f"{b / 1e6:.4g} MB" if isinstance(b, (int, float)) and not isinstance(b, bool) \
        else "?"


def host_tables(doc: dict, only: list[str] | None = None) -> list[str]:
    """One table per host (addresses, forwarding, routes by next hop, QoS, ranks); `only` limits the
    hosts."""
    procs = doc.get("job", {}).get("processes", {})
    addr, owner = {}, {}
    for h, st in doc.get("hosts", {}).items():
        for i in st.get("interfaces", []):
            for a in i.get("addresses", []):
                addr[a.split("/")[0]] = f"{h}:{i['name']}"
                owner[a.split("/")[0]] = h
    switched = doc.get("fabric", {}).get("kind") == "switched"
    out = []
    for h, st in doc.get("hosts", {}).items():
        if only is not None and h not in only:
            continue
        ranks = ",".join(str(p["rank"]) for p in procs.get(h, [])) or "-"
        sysctl = st.get("sysctl", {})
        fwd = "yes" if sysctl.get("ip_forward") or sysctl.get("ipv6_forwarding") else "no"
        out.append(f"host {h}  ranks {ranks}  forwarding {fwd}")
        rows = [[i["name"], " ".join(i.get("addresses", [])), str(i.get("mtu", ""))]
                for i in st.get("interfaces", [])]
        out += ["  " + x for x in _table(rows, ["interface", "addresses", "mtu"])]
        by_hop: Counter = Counter()
        for r in st.get("routes", []):
            hops = r.get("nexthops") or [{"via": r.get("via"), "dev": r.get("dev")}]
            dst_host = owner.get(r["dst"].split("/")[0])
            if switched and len(hops) == 1 and dst_host and \
                    owner.get(hops[0].get("via")) == dst_host:
                key = f"(the destination itself) via {hops[0].get('dev')}"
            else:
                key = " + ".join(f"{addr.get(x.get('via'), x.get('via'))} via {x.get('dev')}"
                                 for x in hops)
            by_hop[key] += 1
        rows = [[k, str(n)] for k, n in sorted(by_hop.items())]
        if rows:
            out += ["  " + x for x in _table(rows, ["next hop (host:port) via dev", "routes"])]
        out += _bandwidth_rows(st, owner, addr)
        out.append("")
    return out


def _bandwidth_rows(st: dict, owner: dict, addr: dict) -> list[str]:
    """Per-destination rates (destination host, egress link, rate, ceiling, driver) and the
    policy-routing multipath weights of locally originated traffic."""
    rows = []
    for q in st.get("qos", []):
        for c in q.get("classes", []):
            dst = c["dst"].split("/")[0]
            rows.append([owner.get(dst, dst), f"{q['dev']} ({q['rate']})", c["rate"],
                         c.get("ceil", q["rate"]), q.get("driver", "tc")])
    out = ["  " + x for x in _table(rows, ["destination", "link", "rate", "ceil", "driver"])] \
        if rows else []
    for r in st.get("routes", []):
        if r.get("table", "main") in ("main", 254) or not r.get("nexthops"):
            continue
        dst = r["dst"].split("/")[0]
        out.append(f"  multipath to {owner.get(dst, dst)} (table {r['table']}): " + ", ".join(
            f"{x.get('dev')} -> {addr.get(x.get('via'), x.get('via'))} weight {x['weight']}"
            for x in r["nexthops"]))
    return out


def topology_text(doc: dict) -> list[str]:
    """The fabric as text: per host its neighbours (direct) or per switch its members (switched)."""
    f = doc.get("fabric", {})
    out = [f"fabric ({f.get('kind')}):"]
    if f.get("kind") == "direct":
        adj: dict[str, list[str]] = {}
        for ln in f.get("links", []):
            a, b = ln["a"].split(":")[0], ln["b"].split(":")[0]
            bw = ln.get("bandwidth", "")
            adj.setdefault(a, []).append(f"{b}({bw})")
            adj.setdefault(b, []).append(f"{a}({bw})")
        for h in doc.get("hosts", {}):
            out.append(f"  {h:>6} -- " + " ".join(adj.get(h, [])))
    else:
        for s in f.get("switches", []):
            up = f" -> {s['uplink']}" if s.get("uplink") else ""
            att = [a["port"] for a in f.get("attach", []) if a.get("switch") == s["name"]]
            if not f.get("attach") and len(f.get("switches", [])) == 1:
                att = list(doc.get("hosts", {}))
            out.append((f"  [{s['name']}]{up}: " + " ".join(att)).rstrip())
    order = doc.get("job", {}).get("collective", {}).get("order", [])
    if order:
        algo = doc["job"]["collective"].get("algorithm")
        out.append(f"  {algo} order: " + " -> ".join(order + order[:1]))
    return out


def explain_text(doc: dict, only: list[str] | None = None) -> str:
    """The whole summary; `only` limits the per-host tables to these hosts."""
    return "\n".join(headline(doc) + [""] + topology_text(doc) + [""] + host_tables(doc, only))
