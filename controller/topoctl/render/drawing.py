"""The fabric of a Plan as a PNG (matplotlib, Agg backend): hosts on a circle in plan order,
switches in the middle, line width proportional to link bandwidth, the AllReduce order drawn as
arrows. A TopoOpt fabric (strategy `topoopt`) has its links coloured by why they exist, with a
legend: one colour per TotientPerms ring stride, model-parallel matching links dashed black,
fill links (free ports paired) dotted grey. Writes only the file it is given."""

from __future__ import annotations

import math
import re

from topoagent.state.values import parse_rate

STRIDE_COLOURS = ("tab:green", "tab:purple", "tab:orange", "tab:cyan", "tab:brown", "tab:pink",
                  "tab:olive", "gold", "navy", "teal")
MP_STYLE = {"color": "black", "linestyle": "--", "label": "model-parallel matching"}
FILL_STYLE = {"color": "0.6", "linestyle": ":", "label": "fill (free ports paired)"}
PLAIN_STYLE = {"color": "0.5", "linestyle": "-", "label": ""}


def link_styles(doc: dict) -> list[dict] | None:
    """Per `fabric.links` entry of a TopoOpt plan its line style (`color`, `linestyle`, legend
    `label`), from `metadata.collective.topology.link_kinds` (`ring:P`, `mp`, `fill`); strides
    get colours in increasing order. For plans without the kinds (older topoopt plans) a link
    whose hosts are P apart in the plan's host order, P one of `strides`, is taken to be on
    ring P, any other is `mp`. None when the plan is not a TopoOpt fabric."""
    meta = doc.get("metadata")
    coll = meta.get("collective") if isinstance(meta, dict) else None
    topo = coll.get("topology") if isinstance(coll, dict) else None
    fabric = doc.get("fabric")
    if not isinstance(topo, dict) or not isinstance(fabric, dict) or \
            fabric.get("kind") != "direct" or not isinstance(fabric.get("links"), list):
        return None
    links = fabric["links"]
    kinds = topo.get("link_kinds")
    if not isinstance(kinds, list) or len(kinds) != len(links):
        hosts = list(doc.get("hosts", {}))
        pos = {h: i for i, h in enumerate(hosts)}
        raw = topo.get("strides")
        strides = {x for x in raw if isinstance(x, int) and x > 0} \
            if isinstance(raw, list) else set()
        kinds = []
        for ln in links:
            ln = ln if isinstance(ln, dict) else {}
            a, b = (pos.get(str(ln.get(k, "")).split(":")[0]) for k in ("a", "b"))
            d = (b - a) % len(hosts) if a is not None and b is not None else 0
            p = next((x for x in sorted(strides) if d in (x, len(hosts) - x)), None)
            kinds.append(f"ring:{p}" if p else "mp")
    strides_of = [_ring_stride(k) for k in kinds]
    ring = sorted({p for p in strides_of if p is not None})
    colour = {p: STRIDE_COLOURS[i % len(STRIDE_COLOURS)] for i, p in enumerate(ring)}
    out = []
    for k, p in zip(kinds, strides_of, strict=True):
        if p is not None:
            out.append({"color": colour[p], "linestyle": "-", "label": f"ring stride {p}"})
        elif k == "mp":
            out.append(MP_STYLE)
        elif k == "fill":
            out.append(FILL_STYLE)
        else:
            out.append(PLAIN_STYLE)
    return out


def draw_png(doc: dict, path: str) -> None:
    """Draw the plan's fabric (and AllReduce order) into the PNG file `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hosts = list(doc.get("hosts", {}))
    n = max(len(hosts), 1)
    pos = {h: (math.cos(2 * math.pi * i / n), math.sin(2 * math.pi * i / n))
           for i, h in enumerate(hosts)}
    f = doc.get("fabric", {})
    edges: list[tuple[str, str, float]] = []
    styles = link_styles(doc) or []
    if f.get("kind") == "direct":
        for ln in f.get("links", []):
            edges.append((ln["a"].split(":")[0], ln["b"].split(":")[0],
                          parse_rate(ln.get("bandwidth", "1gbit"))))
    else:
        sw = f.get("switches", [])
        for i, s in enumerate(sw):
            r = 0.0 if len(sw) == 1 else 0.45
            a = 2 * math.pi * i / max(len(sw), 1)
            pos[s["name"]] = (r * math.cos(a), r * math.sin(a))
            if s.get("uplink"):
                edges.append((s["name"], s["uplink"], 1e9))
        attach = f.get("attach") or [{"port": h, "switch": sw[0]["name"]} for h in hosts]
        for at in attach:
            edges.append((at["port"].split(":")[0], at["switch"], 1e9))
    top = max((e[2] for e in edges), default=1.0)
    fig, ax = plt.subplots(figsize=(7, 7))
    counts: dict[str, int] = {}
    handles: dict[str, dict] = {}
    for i, (a, b, bw) in enumerate(edges):
        st = styles[i] if i < len(styles) else PLAIN_STYLE
        if a in pos and b in pos:
            (x1, y1), (x2, y2) = pos[a], pos[b]
            ax.plot([x1, x2], [y1, y2], color=st["color"], linestyle=st["linestyle"],
                    lw=0.5 + 3 * bw / top, zorder=1)
            if st["label"]:
                counts[st["label"]] = counts.get(st["label"], 0) + 1
                handles.setdefault(st["label"], st)
    order = doc.get("job", {}).get("collective", {}).get("order", [])
    for a, b in zip(order, order[1:] + order[:1], strict=False):
        if a in pos and b in pos and len(order) > 1:
            ax.annotate("", xy=pos[b], xytext=pos[a], zorder=2,
                        arrowprops={"arrowstyle": "->", "color": "tab:red", "alpha": 0.5,
                                    "connectionstyle": "arc3,rad=0.15"})
    for name, (x, y) in pos.items():
        is_host = name in doc.get("hosts", {})
        ax.scatter([x], [y], s=300 if is_host else 500, zorder=3,
                   color="tab:blue" if is_host else "tab:orange", marker="o" if is_host else "s")
        ax.annotate(name, (x, y), ha="center", va="center", fontsize=7, color="white", zorder=4)
    m = doc.get("metadata", {})
    ax.set_title(f"{m.get('cluster')} / {m.get('job')}: {m.get('strategy')}, predicted "
                 f"{m.get('prediction', {}).get('iteration_time', 0) * 1e3:.2f} ms/iteration")
    if handles:
        from matplotlib.lines import Line2D

        order_ = sorted(handles, key=lambda k: (not k.startswith("ring"), _stride_key(k)))
        ax.legend([Line2D([0], [0], color=handles[k]["color"],
                          linestyle=handles[k]["linestyle"], lw=2) for k in order_],
                  [f"{k} ({counts[k]} cables)" for k in order_], loc="upper left",
                  bbox_to_anchor=(1.0, 1.0), fontsize=8, title="TopoOpt links")
    ax.set_aspect("equal")
    ax.axis("off")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _ring_stride(kind: object) -> int | None:
    """P of a `ring:P` link kind; None for anything else (`mp`, `fill`, damaged values)."""
    m = re.fullmatch(r"ring:(\d+)", str(kind))
    return int(m.group(1)) if m else None


def _stride_key(label: str) -> int:
    tail = label.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0
