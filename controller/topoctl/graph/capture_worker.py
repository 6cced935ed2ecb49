"""The child side of model capture for `model.factory` jobs (topoctl.graph.sandbox): runs the
job's factory, which is arbitrary code, in a process of its own as an unprivileged user.

Reads JSON requests on stdin, one a line, until end of input: {"op": "graph" | "measure" |
"train", "factory", "kwargs", "inputs": [[shape, dtype, high]], "batch", "dtype", "threads"}, or
{"op": "check", "factory", "kwargs", "names": {yaml path: [module path, kind]}} (`check_names`);
answers each with one JSON line on its original stdout: {"ok": true, ...result, "files": ...}
or {"ok": false, "problems": [[path, message]]}. One process serves every request of one
planning call for one factory module (`sandbox.session`): torch is imported once, not once
per request. "files" lists the job's own source files the factory's import loaded, with
their status when read (`source_files`): the parent's memo of answers is valid while they are
unchanged. The factory's own prints go to stderr and it reads an empty stdin (stdin and
stdout are the request and result channels). Only plain JSON crosses back: the parent never
unpickles what this process produced.

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


def answer(line: str) -> dict:
    """The answer document to one request line: the result, or the problems the factory or
    the request caused (the factory is the user's code: reported, never a crash of this
    process)."""
    try:
        return {"ok": True} | handle(json.loads(line))
    except TopoError as e:
        return {"ok": False, "problems": [list(p) for p in e.problems]}
    except Exception as e:  # noqa: BLE001 - the factory is the user's code: report, not crash
        return {"ok": False, "problems": [["factory", f"the factory failed: "
                                                      f"{type(e).__name__}: {e}"]]}


# the directories of the interpreter, its installed packages and topoctl's own packages: what
# is not the job's code (`source_files`)
_NOT_JOB_CODE = tuple(os.path.join(os.path.realpath(p), "") for p in (
    sys.prefix, sys.base_prefix, *(os.path.dirname(m.__file__ or "/")
                                   for m in (sys.modules.get(n) for n in
                                             ("topoctl", "topoagent", "topotrain")) if m)))


# the status of each source file as the import system opened it (`_note_open`)
_OPENED: dict[str, list[int]] = {}


def _identity(st: os.stat_result) -> list[int]:
    """What tells a file's contents changed without reading it: device, inode, size,
    modification and change times (ns; a rename over it changes the inode, any write the
    change time)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _note_open(event: str, args: tuple) -> None:
    """Audit hook: the status of each .py file the first time the import system opens it
    (before reading it) or executes code compiled from it (a cached .pyc, checked against
    the source's size and time an instant before), so an edit after the import is seen."""
    if event == "open":
        path = args[0]
    elif event == "exec":
        path = getattr(args[0], "co_filename", None)
    else:
        return
    if isinstance(path, str) and path.endswith(".py") and path not in _OPENED:
        try:
            _OPENED[path] = _identity(os.stat(path))
        except OSError:
            pass


def source_files(modules: list[str]) -> list[list]:
    """[path, device, inode, size, mtime_ns, ctime_ns] of the source files of `modules`
    (names in sys.modules) that are the job's code: not under the interpreter's prefixes or
    site-packages, not topoctl's own; as they were when imported (`_note_open`). What a
    memoised answer depends on besides the request (`sandbox.run_worker`). Sorted."""
    out = []
    for name in modules:
        path = getattr(sys.modules.get(name), "__file__", None)
        if not path or not os.path.isfile(path):
            continue
        real = os.path.realpath(path)
        if real.startswith(_NOT_JOB_CODE) or "-packages" + os.sep in real:
            continue
        seen = _OPENED.get(path) or _identity(os.stat(path))
        out.append([real, *seen])
    return sorted(out)


def serve(inp, out) -> None:
    """Answer each request line of `inp` on `out` until end of input. With each answer, the
    job's source files loaded so far: the factory's module and whatever the requests
    imported (`source_files`; the parent keeps one process per factory module, so they are
    that module's doing)."""
    files: set[tuple] = set()
    for line in inp:
        if not line.strip():
            continue
        before = set(sys.modules)
        doc = answer(line)
        try:
            module = str(json.loads(line).get("factory", "")).partition(":")[0]
        except (ValueError, AttributeError):  # answered above as a failed request
            module = ""
        new = [m for m in sys.modules if m not in before or m == module]
        files.update(tuple(f) for f in source_files(new))
        if doc["ok"]:
            doc["files"] = sorted(list(f) for f in files)
        out.write(json.dumps(doc) + "\n")
        out.flush()


def main() -> int:
    """Drop to the user given as UID:GID (argv), then answer the requests on stdin, one a
    line, on the original stdout; exit 0 at end of input (errors are in the answers)."""
    sys.addaudithook(_note_open)
    out = os.fdopen(os.dup(1), "w")
    inp = os.fdopen(os.dup(0), "r")
    os.dup2(2, 1)  # whatever the factory prints must not corrupt the answer
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # nor may it read the requests that follow
    os.close(null)
    if len(sys.argv) > 1:
        uid, gid = (int(x) for x in sys.argv[1].split(":"))
        drop_privileges(uid, gid)
    serve(inp, out)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
