"""The pipeline part of a plan's launch spec: each stage's training addresses and the
point-to-point pairs (activations forward, gradients back between replica r of consecutive
stages), so the plan says which address talks to which and how many bytes per micro-batch."""

from __future__ import annotations


def pipeline_addresses(collective: dict, training: dict[str, str]) -> dict:
    """A copy of the pipeline `collective` with `addresses` per stage and `peers`."""
    stages = [dict(s) | {"addresses": [training[h] for h in s["hosts"]]}
              for s in collective["stages"]]
    peers = []
    for a, b in zip(stages, stages[1:], strict=False):
        for r, (src, dst) in enumerate(zip(a["addresses"], b["addresses"], strict=True)):
            peers.append({"from": src, "to": dst, "replica": r,
                          "bytes_per_microbatch": a["send_bytes"],
                          "carries": "activations forward, their gradients back"})
    return collective | {"stages": stages, "peers": peers}
