"""The pipeline runtime's cost model on CPU hosts (`placement.runtime`, `graph.cost.TrainCost`,
`pipeline.gpipe.pipeline_tasks` with measured costs): which backward each op pays in
a stage, the per-message CPU, the lab's core floor, the GPipe iteration against its closed
form, timing real ops on this CPU, and the planner choosing no split when the split is
slower."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import pytest
import torch

from topoctl.catalog import build_model, example_inputs
from topoctl.collective.trees.pipeline import RuntimeCosts
from topoctl.graph import cache
from topoctl.graph.capture import capture_catalog
from topoctl.graph.cost import TrainCost, fit_to_whole_step, measure_train_costs
from topoctl.labprofile import LabProfile
from topoctl.pipeline.gpipe import Measured, pipeline_tasks
from topoctl.placement.runtime import allreduce_cpu, message_cpu, needs_grad, stage_costs
from topoctl.planner import prepare
from topoctl.sim.engine import simulate
from topoctl.sim.fabric import tcp_efficiency
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies.placement import plan_pipeline

MLP = {"layers": 2, "hidden": 64, "features": 32, "classes": 10}


def test_first_layer_pays_no_input_gradient_unless_received():
    g = capture_catalog("mlp", MLP, 8)  # x, net_0 (linear), net_1 (relu), net_2, net_3, net_4
    names = [o.name for o in g.ops]
    assert names[:3] == ["x", "net_0", "net_1"]
    one = dict.fromkeys(names, 0)
    grad = needs_grad(g, one, 0)
    assert grad["x"] is False and grad["net_0"] is True and grad["net_1"] is True
    costs = {n: TrainCost(1.0, 10.0, 100.0, 0.5) for n in names}
    fwd, bwd, step = stage_costs(g, one, 0, costs)
    assert fwd == len(names) and step == 0.5 * len(names)
    # net_0 reads x (no gradient): bwd_params; every later op reads a value that needs one
    assert bwd == 10.0 + 100.0 * (len(names) - 2) + 10.0  # x itself: bwd_params too
    # split after net_1: stage 1 receives net_1's float output, which needs a gradient there
    two = {n: (0 if i <= 2 else 1) for i, n in enumerate(names)}
    _, b1, _ = stage_costs(g, two, 1, costs)
    assert b1 == 100.0 * (len(names) - 3)
    # x itself received by a later stage (float input): that stage differentiates through it
    late = {n: (0 if n == "x" else 1) for n in names}
    assert needs_grad(g, late, 1)["x"] is True


def test_integer_inputs_received_need_no_gradient():
    g = capture_catalog("bert", {"layers": 1, "hidden": 64, "heads": 2, "seq": 8,
                                 "vocab": 100}, 2)
    first = g.ops[0]
    assert first.kind == "placeholder"
    late = {o.name: (0 if o.name == first.name else 1) for o in g.ops}
    assert needs_grad(g, late, 1)[first.name] is False  # token ids (int64)


def test_message_cpu_closed_forms():
    rc = RuntimeCosts(per_message_s=50e-6, wire_bytes_per_s=5e9)
    lab = LabProfile(cores=2, emulation_bytes_per_s=0.5e9)
    assert message_cpu(1e6, rc) == pytest.approx(50e-6 + 1e6 / 5e9)
    # the lab: the shared per-message figure, and a byte costs the emulation (half per end)
    assert message_cpu(1e6, rc, lab=lab, per_message_shared_s=100e-6) == pytest.approx(
        100e-6 + 1e6 / 1e9)
    assert message_cpu(1e6, rc, lab=lab) == pytest.approx(50e-6 + 1e6 / 1e9)


def test_allreduce_cpu_closed_form():
    """A ring over m replicas: 2(m-1) chunks of S/m sent and as many received, (m-1)/m of S
    added, S flattened and copied back."""
    rc = RuntimeCosts(per_message_s=1e-4, wire_bytes_per_s=1e9, reduce_bytes_per_s=2e9,
                      copy_bytes_per_s=4e9)
    s = 8e6
    per = 1e-4 + (s / 4) / 1e9
    assert allreduce_cpu(s, 4, rc) == pytest.approx(2 * 6 * per + 0.75 * s / 2e9 + 2 * s / 4e9)
    assert allreduce_cpu(s, 1, rc) == 0.0 and allreduce_cpu(0.0, 4, rc) == 0.0
    # in the lab a byte costs the emulation as well (the slower of the two rates)
    slow = LabProfile(emulation_bytes_per_s=0.1e9)
    assert allreduce_cpu(s, 2, rc, lab=slow) > 3 * allreduce_cpu(s, 2, rc)


def _ctx(n: int = 2, mbit: int = 200, global_batch: int = 32):
    cluster = parse_cluster({
        "apiVersion": "topoctl/v1", "kind": "Cluster", "name": "pair",
        "defaults": {"nic_speed": f"{mbit}mbit", "gpus": {"count": 1, "type": "cpu"}},
        "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                  for i in range(n)],
        "fabric": {"kind": "direct", "mtu": 9000, "links": [
            {"a": f"h{i}:eth0", "b": f"h{(i + 1) % n}:eth1", "bandwidth": f"{mbit}mbit"}
            for i in range(n - 1)]}})
    job = parse_job({"apiVersion": "topoctl/v1", "kind": "Job", "name": "mlp-pc",
                     "model": {"catalog": "mlp", "params": MLP},
                     "batch": {"global": global_batch},
                     "parallelism": {"data": False, "pipeline": True, "microbatches": 4},
                     "strategies": ["pipeline"], "cost": {"method": "roofline"}})
    return prepare(cluster, job, use_cache=False)


def test_two_stage_gpipe_matches_its_closed_form():
    """Stage 0 = x..net_1, stage 1 = the rest; every op 1 ms forward, 2 ms backward (3 ms with
    input gradients); one message per micro-batch each way, CPU c per end; transfer t. GPipe
    in program order with gloo's blocking sends (`_gpipe_two`); no core sharing."""
    ctx = _ctx()
    names = [o.name for o in ctx.graph.ops]
    st = [names[:3], names[3:]]
    costs = {n: TrainCost(1e-3, 2e-3, 3e-3, 1e-4) for n in names}
    rc = RuntimeCosts(per_message_s=1e-3, wire_bytes_per_s=1e12)
    meas = Measured(costs, rc, None, lab=None)
    micro = 8
    tasks, _ = pipeline_tasks(ctx, st, [["h0"], ["h1"]], 4, micro / ctx.local_batch, meas)
    res = simulate(tasks, ctx_network(ctx), record=False)
    act = micro * 64 * 4  # net_1's output: micro x hidden floats
    rate = 200e6 / 8 * tcp_efficiency(9000)  # goodput
    t = act / rate
    c = 1e-3 + act / 1e12
    f0 = 3 * 1e-3  # x (a placeholder costs what it is given here), net_0, net_1
    f1 = (len(names) - 3) * 1e-3
    b0 = 2e-3 + 2e-3 + 3e-3  # x, net_0: bwd_params; net_1: input grads
    b1 = (len(names) - 3) * 3e-3
    assert res.iteration_time == pytest.approx(_gpipe_two(f0, f1, b0, b1, c, t, 4, 1e-4 * 3,
                                                         1e-4 * (len(names) - 3)), rel=1e-6)


def ctx_network(ctx):
    from topoctl.sim.fabric import network_from_fabric
    from topoctl.sim.routing import shortest_next_hops

    return network_from_fabric(ctx.fabric, shortest_next_hops(ctx.fabric, required=ctx.hosts))


def _gpipe_two(f0, f1, b0, b1, c, t, m, s0, s1):
    """A two-host GPipe timeline, event by event, as the runtime runs it: each rank one
    program; a send starts when the receiver has posted its receive (finished what it did
    before) and returns on delivery, then costs the sender c; a receive costs c after it."""
    h0 = h1 = 0.0
    for _ in range(m):
        h0 += f0
        arrival = max(h0, h1) + t
        h0 = arrival + c
        h1 = arrival + c + f1
    for _ in range(m):  # reverse micro-batch order, the same shape the other way
        h1 += b1
        arrival = max(h1, h0) + t
        h1 = arrival + c
        h0 = arrival + c + b0
    return max(h0 + s0, h1 + s1)


def test_shared_cores_are_processor_shared():
    """`Network.cpu_pool`: three single-threaded 1 s tasks on three devices and 2 cores run at
    2/3 of a core each (done at 1.5 s); one core per task at most (two tasks on 4 cores: 1 s);
    a device still runs its tasks one after the other; devices outside the pool are free."""
    from topoctl.sim.network import Network
    from topoctl.sim.tasks import Compute

    def run(tasks, pool, cores):
        net = Network({}, lambda a, b: [], cpu_pool=(frozenset(pool), cores))
        return simulate(tasks, net)

    three = [Compute(f"t{i}", f"d{i}", 1.0) for i in range(3)]
    r = run(three, ["d0", "d1", "d2"], 2)
    assert r.iteration_time == pytest.approx(1.5)
    assert r.compute_time == pytest.approx(1.0) and r.comm_active == 0.0
    assert run(three[:2], ["d0", "d1"], 4).iteration_time == pytest.approx(1.0)
    assert run(three, ["d0", "d1"], 1).finish["t2"] == pytest.approx(1.0)  # d2 not pooled
    # d0 runs t0 then t3 (1 s each); d1's t1 shares the one core with them: 3 s of work
    chain = three[:2] + [Compute("t3", "d0", 1.0, ("t0",))]
    r = run(chain, ["d0", "d1"], 1)
    assert r.iteration_time == pytest.approx(3.0)
    assert r.finish["t0"] == pytest.approx(2.0) and r.finish["t1"] == pytest.approx(2.0)


def test_lab_ranks_share_the_cores():
    """The same two-stage pipeline (micro-batch 16) on 1 core takes every task's CPU in
    sequence; on 64 cores the stages overlap."""
    from topoctl.pipeline.gpipe import lab_network

    ctx = _ctx()
    names = [o.name for o in ctx.graph.ops]
    costs = {n: TrainCost(1e-3, 2e-3, 3e-3, 0.0) for n in names}
    st = [names[:3], names[3:]]
    net = ctx_network(ctx)
    times = {}
    for cores in (1, 64):
        rc = RuntimeCosts(per_message_s=0.0, wire_bytes_per_s=1e15)
        # no socket buffer: a send returns on delivery (test_sim_credit has the buffer)
        meas = Measured(costs, rc, None, LabProfile(cores=cores, emulation_bytes_per_s=1e15,
                                                    send_buffer_bytes=0))
        tasks, _ = pipeline_tasks(ctx, st, [["h0"], ["h1"]], 4, 1.0, meas)
        lab = lab_network(net, ctx.hosts, meas, 9000)
        times[cores] = simulate(tasks, lab, record=False).iteration_time
        # without the lab's cable credit (`Link.credit`)
        bare = replace(lab, links={k: replace(ln, credit=0.0) for k, ln in lab.links.items()})
        times[cores, "bare"] = simulate(tasks, bare, record=False).iteration_time
        work = sum(t.duration for t in tasks if hasattr(t, "duration"))
    # one core: all the work in sequence, plus the 8 transfers, during which both ranks wait
    # in gloo's rendezvous (no CPU work to overlap); each 4 KiB message passes within the
    # lab cable's credit (`BURST_S` at 200 Mbit/s: 100 kB), at once
    t = 16 * 64 * 4 / (200e6 / 8 * tcp_efficiency(9000))
    assert times[1, "bare"] == pytest.approx(work + 8 * t, rel=1e-6)
    assert times[1] == pytest.approx(work, rel=1e-6)
    assert times[64] < 0.9 * work


def test_train_costs_are_measured_for_real():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    params = {"layers": 2, "hidden": 512, "features": 512, "classes": 10}
    model = build_model("mlp", params)
    x = example_inputs("mlp", params, 256)
    g = capture_catalog("mlp", params, 256)
    c = measure_train_costs(model, x, g, warmup=1, repeats=5)
    # fitted to the pipeline runtime's own path: the same ops, the stage's whole step
    st = measure_train_costs(model, x, g, warmup=1, repeats=5, runtime="stage")
    assert set(st) == set(c) and sum(v.fwd for v in st.values()) > 0
    with pytest.raises(ValueError, match="module or stage"):
        measure_train_costs(model, x, g, warmup=0, repeats=1, runtime="ddp")
    assert set(c) == {o.name for o in g.ops}
    assert c["x"] == TrainCost(0.0, 0.0, 0.0)
    lin = c["net_2"]  # 512x512 linear: the input gradient is one more matmul
    assert lin.fwd > 0 and lin.bwd_params > 0 and lin.step > 0
    # about one forward more; 0.1 of one leaves room for timing noise on a loaded machine
    # (0.3 failed once in CI with other benchmarks running: 1.53 ms against 1.33 + 0.26)
    assert lin.bwd_inputs > lin.bwd_params + 0.1 * lin.fwd
    assert c["net_1"].bwd_params == 0.0 and c["net_1"].step == 0.0  # relu: no parameters
    # the parameters are unchanged by timing their step
    assert torch.equal(model.net[0].weight, build_model_again(params).net[0].weight)
    # the sum is the model's real training step on this thread (fwd, loss, backward)
    total = sum(v.fwd + (v.bwd_inputs if k not in ("x", "net_0") else v.bwd_params)
                for k, v in c.items())

    def step() -> float:
        t0 = time.thread_time()
        model(*x).float().pow(2).mean().backward()
        return time.thread_time() - t0

    step()
    whole = statistics.median(step() for _ in range(5))
    assert 0.7 * whole < total < 1.4 * whole  # fitted to a whole step timed the same way


def test_per_op_times_are_fitted_to_a_whole_step():
    """Backward and step get one factor per phase, the same for every op; the forward's excess
    over its ops is shared equally per interpreted node (placeholders not); a whole-model step
    adds up to the whole step timed, with the backward autograd runs (the staged rule of
    `needs_grad` with one stage)."""
    g = capture_catalog("mlp", MLP, 8)
    names = [o.name for o in g.ops]
    costs = {n: TrainCost(1.0 + i, 10.0 + i, 100.0 + i, 0.5) for i, n in enumerate(names)}
    one = dict.fromkeys(names, 0)
    fwd, bwd, step = stage_costs(g, one, 0, costs)
    fitted = fit_to_whole_step(costs, g, (2 * fwd, 3 * bwd, 4 * step))
    assert stage_costs(g, one, 0, fitted) == pytest.approx((2 * fwd, 3 * bwd, 4 * step))
    nodes = [o.name for o in g.ops if o.kind != "placeholder"]
    assert 0 < len(nodes) < len(names)  # the input is a placeholder: no share
    for n in names:
        c, f = costs[n], fitted[n]
        share = fwd / len(nodes) if n in nodes else 0.0
        assert (f.fwd, f.bwd_params, f.bwd_inputs, f.step) == pytest.approx(
            (c.fwd + share, 3 * c.bwd_params, 3 * c.bwd_inputs, 4 * c.step))
    zero = {n: TrainCost(0.0, 0.0, 0.0) for n in names}  # nothing timed: nothing to fit
    assert fit_to_whole_step(zero, g, (1.0, 1.0, 1.0)) == zero
    # a whole forward below its ops' sum: one factor, no work per node to share
    below = fit_to_whole_step(costs, g, (0.5 * fwd, bwd, step))
    assert all(below[n].fwd == pytest.approx(0.5 * costs[n].fwd) for n in names)


def test_a_stage_of_cheap_nodes_is_charged_their_runtime_work():
    """Two stages whose ops add up to the same forward, one of a single heavy op and one of
    several cheap ones: the runtime's work per node (what a whole step takes beyond its ops)
    goes to the stage with more nodes, not in proportion to the ops' times (which charged
    stars6's seven-node second stage 15% short of the stage run alone)."""
    g = capture_catalog("mlp", MLP, 8)
    names = [o.name for o in g.ops]
    first = next(i for i, o in enumerate(g.ops) if o.param_bytes > 0)
    heavy, rest = names[:first + 1], names[first + 1:]
    costs = dict.fromkeys(names, TrainCost(0.0, 0.0, 0.0, 0.0))
    costs[names[first]] = TrainCost(float(len(rest)), 1.0, 1.0)
    costs.update({n: TrainCost(1.0, 1.0, 1.0) for n in rest})
    stage_of = {n: 0 if n in heavy else 1 for n in names}
    raw = [stage_costs(g, stage_of, s, costs)[0] for s in (0, 1)]
    assert raw[0] == raw[1] == len(rest)
    whole = sum(raw) + 2.0 * (1 + len(rest))  # two seconds of the runtime's work per node
    fitted = fit_to_whole_step(costs, g, (whole, 1.0, 1.0))
    f0, f1 = (stage_costs(g, stage_of, s, fitted)[0] for s in (0, 1))
    assert f0 == pytest.approx(raw[0] + 2.0)
    assert f1 == pytest.approx(raw[1] + 2.0 * len(rest))


def build_model_again(params):
    torch.manual_seed(0)
    return build_model("mlp", params)


def test_train_cost_cache_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    costs = {"a": TrainCost(1.0, 2.0, 3.0, 4.0)}
    cache.store_train("k", costs)
    assert cache.load_train("k") == costs
    assert cache.load_train("missing") is None
    (tmp_path / "profiles" / "bad.json").write_text('{"a": [1, 2]}x')
    assert cache.load_train("bad") is None


def test_planner_keeps_one_stage_when_the_split_is_slower():
    """Measured costs (the lab path, `PlanContext.train_costs`): at 10 Mbit/s a micro-batch's
    activation (1024 x 64 floats, 0.2 s) takes longer than the whole model's compute, so the
    pipeline keeps every op on one host; the same job at 100 Gbit/s splits."""
    for mbit, stages in ((10, 1), (100_000, 2)):
        ctx = _ctx(mbit=mbit, global_batch=4096)
        names = [o.name for o in ctx.graph.ops]
        ctx.train_costs = lambda b, runtime="module", names=names: {
            n: TrainCost(5e-3, 1e-2, 1.5e-2, 0.0) for n in names}
        s = plan_pipeline(ctx)
        assert s.notes["stages"] == stages, (mbit, s.notes)
        assert len(s.collective["stages"]) == stages


def test_measured_plans_are_deterministic(tmp_path, monkeypatch):
    """The lab path times the model once per machine and micro-batch (cached): planning again
    gives the same bytes, and the plan says what its compute rests on."""
    from topoctl.planner import make_plan
    from topoctl.render.yamlout import dump

    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    ctx = _ctx(n=2)
    docs = []
    for _ in range(2):
        plan = make_plan(ctx.cluster, ctx.job)[0]
        docs.append(dump(plan))
    assert docs[0] == docs[1]
    assert list((tmp_path / "profiles").glob("*.json"))
    plan = make_plan(ctx.cluster, ctx.job)[0]
    note = plan["metadata"]["collective"]["compute"]
    assert note["micro_batch"] == 8 and note["threads"] == 1
    from topoctl.render.explain import collective_lines

    assert "timed on this CPU at micro-batch 8" in collective_lines(plan)[0]


def test_a_model_that_cannot_be_timed_keeps_the_context_costs():
    """`train_costs` answering None (the model does not run a training step here): the
    strategy plans with the context's per-op costs, as without the lab path."""
    ctx = _ctx()
    plain = plan_pipeline(ctx)
    ctx.train_costs = lambda b, runtime="module": None
    s = plan_pipeline(ctx)
    assert "compute" not in s.notes
    assert s.notes["candidates"] == plain.notes["candidates"]
