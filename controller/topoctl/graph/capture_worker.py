"""The child side of model capture for `model.factory` jobs (topoctl.graph.sandbox): runs the
job's factory, which is arbitrary code, in a process of its own as an unprivileged user.

Reads one JSON request on stdin: {"op": "graph" | "measure" | "train", "factory", "kwargs",
"inputs": [[shape, dtype, high]], "batch", "dtype", "threads"}, or {"op": "check", "factory",
"kwargs", "names": {yaml path: [module path, kind]}} (`check_names`); writes one JSON document on
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
from topoctl.graph.capture import (
    DTYPES,
    CaptureError,
    capture,
    capture_factory,
    input_failure,
    load_factory,
)
from topoctl.graph.cost import measure_costs, measure_train_costs

# the real-tensor check of integer inputs (`check_input_values`) builds the model's weights on
# this CPU: models above this many parameter bytes are left to the meta capture alone
VALUE_CHECK_MAX_BYTES = 2**30


def _request_inputs(req: dict) -> list[InputSpec]:
    """The request's input specs."""
    return [InputSpec(tuple(s), d, h) for s, d, h in req["inputs"]]


def check_names(req: dict) -> dict:
    """What a plan names in the model, checked on the model the factory builds (on the meta
    device: no memory, no weights): the factory returns a torch.nn.Module, and each name of
    ``req["names"]`` ({yaml path: [name, kind]}, kind ``module``, ``linear`` or
    ``parameter``) is one of its modules, nn.Linear modules or parameters. The problems
    (yaml path, message), under "problems" of the result (empty: all there)."""
    with torch.device("meta"):
        model = load_factory(req["factory"])(**req["kwargs"])
    if not isinstance(model, torch.nn.Module):
        return {"problems": [["job.model.factory", f"{req['factory']} returned "
                              f"{type(model).__name__}, not a torch.nn.Module"]]}
    modules = dict(model.named_modules())
    params = {n for n, _ in model.named_parameters()}
    out = []
    for path, (name, kind) in req["names"].items():
        if kind == "parameter" and name not in params:
            out.append([path, f"{name!r} is not a parameter of the model"])
        elif kind != "parameter" and name not in modules:
            near = ", ".join(sorted(n for n in modules if n)[:6]) or "none below the root"
            more = ", ..." if len(modules) > 7 else ""
            out.append([path, f"{name!r} is not a module of the model (its modules: "
                              f"{near}{more})"])
        elif kind == "linear" and not isinstance(modules[name], torch.nn.Linear):
            out.append([path, f"{name!r} is a {type(modules[name]).__name__}, not an "
                              "nn.Linear (SFB rebuilds a fully connected layer's gradient)"])
    return {"problems": out}


def extreme_inputs(specs: list[InputSpec], batch: int) -> tuple[torch.Tensor, ...]:
    """Random inputs (`make_inputs`) whose integer tensors also hold their extremes, 0 and
    ``high - 1`` (the values a model that cannot take the range fails on, whatever the
    draw)."""
    out = []
    for s, t in zip(specs, make_inputs(specs, batch), strict=True):
        if not t.dtype.is_floating_point and t.numel():
            flat = t.view(-1)
            flat[0], flat[-1] = 0, (s.high or 2) - 1
        out.append(t)
    return tuple(out)


def check_input_values(req: dict, param_bytes: int) -> None:
    """A model with integer inputs runs one real forward pass on one sample holding their
    extremes: the meta capture checks shapes and dtypes only, not values (`high: 5000`
    into an Embedding of 1000 rows passes it, and every rank then fails with IndexError).
    CaptureError at ``inputs`` with the cause when the model cannot take them."""
    specs = _request_inputs(req)
    if all(getattr(torch, s.dtype).is_floating_point for s in specs):
        return
    if param_bytes > VALUE_CHECK_MAX_BYTES:
        return
    torch.manual_seed(0)
    model = load_factory(req["factory"])(**req["kwargs"]).to(DTYPES["float32"])
    inputs = extreme_inputs(specs, 1)
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as e:  # noqa: BLE001 - the model's own code raised: report its cause
        raise CaptureError([("inputs", input_failure(req["factory"], inputs, None, e))]
                           ) from None


def handle(req: dict) -> dict:
    """Run one request (in this process, as whoever runs it); the result document."""
    torch.set_num_threads(int(req.get("threads", 1)))
    if req["op"] == "check":
        return check_names(req)
    specs, batch = _request_inputs(req), int(req["batch"])
    graph = capture_factory(req["factory"], specs, batch, req.get("dtype", "float32"),
                            kwargs=req["kwargs"])
    if req["op"] == "graph":
        check_input_values(req, sum(o.param_bytes for o in graph.ops))
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
    except Exception as e:  # noqa: BLE001 - a model that does not train here: no lab timing
        return {"costs": None, "why": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
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
