"""The simulator's lab-cable token credit and socket send buffers, against closed forms.

Token credit (`Link.credit`, the lab's HTB burst): a point-to-point `Transfer` that starts on
a link whose bucket holds credit passes that many bytes at once; the bucket fills with what
the link's flows leave unused, up to the credit; a collective's step empties it without being
shortened (its runtime's model counts the credit where it does). Send buffers
(`Transfer.buffer`): the sender's part (`tasks.sent`) is done once at most the buffer is still
to leave, the transfer itself when the last byte is delivered. Then the pipeline tasks of a
lab plan use both (`pipeline.gpipe.lab_network`, `pipeline_tasks`)."""

from __future__ import annotations

import pytest

from topoctl.lab.commands import cable_credit
from topoctl.labprofile import DEFAULT_SEND_BUFFER, LabProfile, tcp_send_buffer
from topoctl.sim.engine import SimError, simulate
from topoctl.sim.network import Link, Network, static_router
from topoctl.sim.schedules import Schedule, Step
from topoctl.sim.steady import chain_iterations
from topoctl.sim.tasks import Collective, Compute, Transfer, sent


def one_link(credit: float = 0.0, latency: float = 0.0, cap: dict | None = None) -> Network:
    """a -> b over one link of 1000 B/s; c -> b over the same link (another source)."""
    links = {"a>b": Link("a>b", "a", "b", 1000.0, latency, credit)}
    return Network(links, static_router({("a", "b"): [(1.0, ("a>b",))],
                                         ("c", "b"): [(1.0, ("a>b",))]}), dict(cap or {}))


def test_a_transfer_on_an_idle_shaped_link_passes_its_credit_at_once():
    assert simulate([Transfer("t", "a", "b", 1000.0)], one_link(200.0, 0.01)
                    ).iteration_time == pytest.approx(0.8 + 0.01)
    # a message within the credit only waits for the latency
    assert simulate([Transfer("t", "a", "b", 150.0)], one_link(200.0, 0.01)
                    ).iteration_time == pytest.approx(0.01)
    assert simulate([Transfer("t", "a", "b", 1000.0)], one_link(0.0)
                    ).iteration_time == pytest.approx(1.0)  # a real link: no credit


@pytest.mark.parametrize("gap, credit_back", [(0.0, 0.0), (0.1, 100.0), (5.0, 200.0)])
def test_the_credit_refills_with_idle_time_up_to_the_bucket(gap, credit_back):
    tasks = [Transfer("t", "a", "b", 1000.0), Compute("w", "x", gap, ("t",)),
             Transfer("u", "a", "b", 1000.0, ("w",))]
    r = simulate(tasks, one_link(200.0))
    assert r.finish["t"] == pytest.approx(0.8)
    assert r.finish["u"] == pytest.approx(0.8 + gap + (1000.0 - credit_back) / 1000.0)
    assert r.link_bytes["a>b"] == pytest.approx(2000.0)  # credited bytes still cross it


def test_the_bucket_fills_with_what_the_flows_leave():
    """t (a -> b, capped at 500 B/s) leaves half the link unused: the bucket is full again
    0.4 s after t took it, and u (c -> b, from 1 s) passes 200 bytes at once, then shares the
    link with t until 1.6 s and has it alone for its last 300 bytes."""
    tasks = [Transfer("t", "a", "b", 1000.0), Compute("w", "z", 1.0),
             Transfer("u", "c", "b", 800.0, ("w",))]
    r = simulate(tasks, one_link(200.0, cap={("a", "b"): 500.0}))
    assert r.finish["t"] == pytest.approx(1.6)
    assert r.finish["u"] == pytest.approx(1.9)  # 2.1 if only an idle link refilled


def test_collective_steps_are_not_credited_but_empty_the_bucket():
    step = Collective("c", Schedule("one", ("a", "b"), (Step("a", "b", 1000.0),)))
    r = simulate([step, Transfer("u", "a", "b", 1000.0, ("c",))], one_link(200.0))
    assert r.finish["c"] == pytest.approx(1.0)
    assert r.finish["u"] == pytest.approx(2.0)  # the step took the credit: none left


def test_a_path_through_an_unshaped_link_gets_no_credit():
    links = {"a>b": Link("a>b", "a", "b", 1000.0, 0.0, 500.0),
             "b>c": Link("b>c", "b", "c", 1000.0)}
    net = Network(links, static_router({("a", "c"): [(1.0, ("a>b", "b>c"))]}))
    assert simulate([Transfer("t", "a", "c", 1000.0)], net).iteration_time == pytest.approx(1.0)


def test_a_sender_goes_on_when_its_socket_holds_the_rest():
    net = one_link(latency=0.05)
    r = simulate([Transfer("t", "a", "b", 1000.0, buffer=300.0),
                  Compute("next", "a", 0.1, (sent("t"),))], net)
    assert r.finish[sent("t")] == pytest.approx(0.7)  # 300 bytes still to leave
    assert r.finish["t"] == pytest.approx(1.05)  # the receiver waits for the last byte
    assert r.finish["next"] == pytest.approx(0.8)
    # a message that fits: the sender goes on when the transfer starts (after its deps)
    r = simulate([Compute("before", "a", 0.2), Transfer("t", "a", "b", 1000.0, ("before",),
                                                        buffer=4096.0)], net)
    assert r.finish[sent("t")] == pytest.approx(0.2) and r.finish["t"] == pytest.approx(1.25)
    # the credit passes at once, then the socket holds the last 300 bytes
    r = simulate([Transfer("t", "a", "b", 1000.0, buffer=300.0)], one_link(200.0))
    assert r.finish[sent("t")] == pytest.approx(0.5) and r.finish["t"] == pytest.approx(0.8)


def test_a_senders_part_is_a_task_of_its_own():
    with pytest.raises(SimError, match="used twice"):
        simulate([Compute(sent("t"), "a", 1.0), Transfer("t", "a", "b", 1.0, buffer=0.0)],
                 one_link())
    with pytest.raises(SimError, match="unknown task"):  # no buffer: no sender's part
        simulate([Transfer("t", "a", "b", 1.0), Compute("n", "a", 1.0, (sent("t"),))],
                 one_link())
    tasks = chain_iterations([Transfer("t", "a", "b", 1000.0, buffer=300.0),
                              Compute("n", "a", 0.5, (sent("t"),))], 2)
    r = simulate(tasks, one_link())
    # copy 1's transfer waits for copy 0's last tasks (t at 1.0, n at 0.7 + 0.5), then its
    # sender goes on when 300 bytes are left
    assert r.finish["it1:" + sent("t")] == pytest.approx(1.2 + 0.7)


def test_tcp_send_buffer_reads_the_machines_tcp_wmem(tmp_path):
    f = tmp_path / "tcp_wmem"
    f.write_text("4096\t16384\t6291456\n")
    assert tcp_send_buffer(str(f)) == 6291456
    f.write_text("garbage\n")
    assert tcp_send_buffer(str(f)) == DEFAULT_SEND_BUFFER
    assert tcp_send_buffer(str(tmp_path / "absent")) == DEFAULT_SEND_BUFFER
    assert LabProfile().send_buffer_bytes == DEFAULT_SEND_BUFFER


def test_a_lab_plans_links_have_the_labs_credit_and_its_sends_the_socket_buffer():
    from tests.unit.test_pipeline_cost import _ctx, ctx_network
    from topoctl.collective.trees.pipeline import RuntimeCosts
    from topoctl.graph.cost import TrainCost
    from topoctl.pipeline.gpipe import Measured, lab_network, pipeline_tasks
    from topoctl.sim.fabric import tcp_efficiency

    ctx = _ctx()  # two hosts, one 200 Mbit/s cable, MTU 9000
    names = [o.name for o in ctx.graph.ops]
    costs = {n: TrainCost(1e-3, 2e-3, 3e-3, 0.0) for n in names}
    rc = RuntimeCosts(per_message_s=1e-4, wire_bytes_per_s=1e12)
    lab = LabProfile(send_buffer_bytes=12345)
    meas = Measured(costs, rc, None, lab)
    net = lab_network(ctx_network(ctx), ctx.hosts, meas, 9000)
    eff = tcp_efficiency(9000)
    for ln in net.links.values():  # BURST_S at the line rate, in goodput bytes
        assert ln.credit == pytest.approx(cable_credit(200_000_000, 9000) * eff, rel=1e-4)
    assert all(ln.credit == 0.0 for ln in
               lab_network(ctx_network(ctx), ctx.hosts, Measured(costs, rc, None, None),
                           9000).links.values())
    st = [names[:3], names[3:]]
    tasks, _ = pipeline_tasks(ctx, st, [["h0"], ["h1"]], 4, 1.0, meas)
    moves = [t for t in tasks if isinstance(t, Transfer)]
    assert moves and all(t.buffer == 12345 for t in moves)
    by_id = {t.id: t for t in tasks}
    for t in moves:  # the sender's CPU after its part, the receiver's after the delivery
        assert sent(t.id) in by_id[f"{t.id}/tx"].deps and t.id in by_id[f"{t.id}/rx"].deps
    # ranks on machines of their own: the sender waits for the delivery, as before
    tasks, _ = pipeline_tasks(ctx, st, [["h0"], ["h1"]], 4, 1.0,
                              Measured(costs, rc, None, None))
    assert all(t.buffer is None for t in tasks if isinstance(t, Transfer))
    # on the lab network every 4 KiB activation fits in the cable's credit and the socket:
    # delivered as it starts, and its sender goes on at once; without the credit it takes
    # its time on the wire
    tasks = pipeline_tasks(ctx, st, [["h0"], ["h1"]], 4, 1.0, meas)[0]
    moves = [t for t in tasks if isinstance(t, Transfer)]
    res = simulate(tasks, net)
    for t in moves:
        assert res.finish[t.id] == pytest.approx(res.start[t.id], abs=1e-12)
        assert res.finish[sent(t.id)] == pytest.approx(res.start[t.id], abs=1e-12)
    no_credit = Network({k: Link(ln.id, ln.src, ln.dst, ln.capacity, ln.latency)
                         for k, ln in net.links.items()}, net.router, cpu_pool=net.cpu_pool)
    res = simulate(tasks, no_credit)
    wire = 16 * 64 * 4 / (200e6 / 8 * eff)  # micro-batch 16 x 64 floats
    for t in moves:
        assert res.finish[t.id] - res.start[t.id] == pytest.approx(wire, rel=1e-6)
        assert res.finish[sent(t.id)] == pytest.approx(res.start[t.id], abs=1e-12)
