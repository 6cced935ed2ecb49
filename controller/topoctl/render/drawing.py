"""The fabric of a Plan as a PNG (matplotlib, Agg backend): hosts on a circle in plan order,
switches in the middle, line width proportional to link bandwidth, the AllReduce order drawn as
arrows. Writes only the file it is given."""

from __future__ import annotations

import math

from topoagent.state import parse_rate


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
    for a, b, bw in edges:
        if a in pos and b in pos:
            (x1, y1), (x2, y2) = pos[a], pos[b]
            ax.plot([x1, x2], [y1, y2], color="0.5", lw=0.5 + 3 * bw / top, zorder=1)
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
    ax.set_aspect("equal")
    ax.axis("off")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
