"""The child side of model capture for `model.factory` jobs (topoctl.graph.sandbox): runs the
job's factory, which is arbitrary code, in a process of its own as an unprivileged user.

Reads one JSON request on stdin: {"op": "graph" | "measure" | "train", "factory", "kwargs",
"inputs": [[shape, dtype, high]], "batch", "dtype", "threads"}; writes one JSON document on
its original stdout: {"ok": true, ...result} or {"ok": false, "problems": [[path, message]]}.
The factory's own prints go to stderr (stdout is the result channel). Only plain JSON crosses
back: the parent never unpickles what this process produced.

Everything this process imports (torch, the catalog, capture and cost) is imported at the top,
while it still runs as root: the interpreter's libraries may live where the unprivileged user
cannot read (`drop_privileges`)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import torch

from topoagent.protocol import TopoError
from topoctl.catalog.build import make_inputs
from topoctl.catalog.registry import InputSpec
from topoctl.graph.capture import DTYPES, capture, capture_factory, load_factory
from topoctl.graph.cost import measure_costs, measure_train_costs


def _request_inputs(req: dict) -> list[InputSpec]:
    """The request's input specs."""
    return [InputSpec(tuple(s), d, h) for s, d, h in req["inputs"]]


def handle(req: dict) -> dict:
    """Run one request (in this process, as whoever runs it); the result document."""
    torch.set_num_threads(int(req.get("threads", 1)))
    specs, batch = _request_inputs(req), int(req["batch"])
    graph = capture_factory(req["factory"], specs, batch, req.get("dtype", "float32"),
                            kwargs=req["kwargs"])
    if req["op"] == "graph":
        return {"graph": {"model": graph.model, "batch": graph.batch,
                          "dtype_bytes": graph.dtype_bytes,
                          "ops": [asdict(o) for o in graph.ops]}}
    torch.manual_seed(0)
    model = load_factory(req["factory"])(**req["kwargs"]).to(DTYPES["float32"])
    inputs = make_inputs(specs, batch)
    if req["op"] == "measure":
        small = capture(model, inputs, req["factory"])
        return {"costs": {k: [c.fwd, c.bwd] for k, c in
                          measure_costs(model, inputs, small).items()}}
    try:
        costs = measure_train_costs(model, inputs, graph,
                                    runtime=str(req.get("runtime", "module")),
                                    corun=int(req.get("corun", 0)),
                                    ddp_bucket_bytes=req.get("ddp_bucket_bytes"))
    except Exception:  # noqa: BLE001 - a model that does not train here: no lab timing
        return {"costs": None}
    return {"costs": {k: list(asdict(c).values()) for k, c in costs.items()}}


def drop_privileges(uid: int, gid: int) -> None:
    """Become `uid`:`gid` with no supplementary groups, for good (real, effective and saved
    ids). Called after the imports (this module's, at its top): the interpreter and its
    libraries may live where that user cannot read (a pyenv under /root); the factory's code
    runs only after this."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("capture_worker: could not drop privileges")


def main() -> int:
    """Read the request, drop to the user given as UID:GID (argv), answer on the original
    stdout; exit 0 (errors are in the answer)."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the factory prints must not corrupt the answer
    if len(sys.argv) > 1:
        uid, gid = (int(x) for x in sys.argv[1].split(":"))
        drop_privileges(uid, gid)

    try:
        doc = {"ok": True} | handle(json.loads(sys.stdin.read()))
    except TopoError as e:
        doc = {"ok": False, "problems": [list(p) for p in e.problems]}
    except Exception as e:  # noqa: BLE001 - the factory is the user's code: report, not crash
        doc = {"ok": False, "problems": [["factory", f"the factory failed: "
                                                     f"{type(e).__name__}: {e}"]]}
    out.write(json.dumps(doc))
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
