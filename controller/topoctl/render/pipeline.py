"""The pipeline part of a plan's launch spec: each stage's training addresses and the
point-to-point pairs (activations forward, gradients back between replica r of consecutive
stages), so the plan says which address talks to which and how many bytes per micro-batch.
Stages of unequal replica counts (`topocontract.stages`: `shares`) pair the replicas whose rows
overlap, each pair with its rows of the micro-batch and their bytes (`send_bytes` is what
`micro_batch` rows send)."""

from __future__ import annotations

from topocontract.stages import pieces, stage_shares


def pipeline_addresses(collective: dict, training: dict[str, str]) -> dict:
    """A copy of the pipeline `collective` with `addresses` per stage and `peers`."""
    stages = [dict(s) | {"addresses": [training[h] for h in s["hosts"]]}
              for s in collective["stages"]]
    peers = []
    if any(s.get("shares") is not None for s in stages):
        shares = stage_shares(collective)
        per_row = [s["send_bytes"] / max(1, collective.get("micro_batch") or 1) for s in stages]
        for i, (a, b) in enumerate(zip(stages, stages[1:], strict=False)):
            for j, k, lo, hi in pieces(shares[i], shares[i + 1]):
                peers.append({"from": a["addresses"][j], "to": b["addresses"][k],
                              "rows": [lo, hi],
                              "bytes_per_microbatch": int(per_row[i] * (hi - lo)),
                              "carries": "activations forward, their gradients back"})
        return collective | {"stages": stages, "peers": peers}
    for a, b in zip(stages, stages[1:], strict=False):
        for r, (src, dst) in enumerate(zip(a["addresses"], b["addresses"], strict=True)):
            peers.append({"from": src, "to": dst, "replica": r,
                          "bytes_per_microbatch": a["send_bytes"],
                          "carries": "activations forward, their gradients back"})
    return collective | {"stages": stages, "peers": peers}
