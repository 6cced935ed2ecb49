"""bench/demo/run.py's table: each row says what its plan is, read from the plan's `job` and
`hosts` sections, so a one-host plan reads as one."""

from __future__ import annotations

from bench.demo.run import table
from bench.demo.summary import plan_summary

HOSTS = [f"h{i}" for i in range(8)]


def _plan(collective: dict, qos: dict[str, int] | None = None) -> dict:
    """A plan with `collective` and, per host, a QoS entry of that many classes."""
    hosts = {h: {"interfaces": []} for h in HOSTS}
    for h, n in (qos or {}).items():
        hosts[h]["qos"] = [{"dev": "eth0", "classes": [{"id": i, "dst": f"10.236.0.{i + 1}/32",
                                                        "rate": "50mbit"} for i in range(n)]}]
    return {"metadata": {"prediction": {"iteration_time": 1.0}}, "hosts": hosts,
            "job": {"processes": {h: [{"rank": i}] for i, h in enumerate(HOSTS)},
                    "collective": collective}}


def _stage(hosts: list[str]) -> dict:
    return {"hosts": hosts, "ranks": [HOSTS.index(h) for h in hosts], "ops": ["fc1"]}


RING = {"algorithm": "ring", "order": HOSTS}
TREES = {"algorithm": "trees", "order": HOSTS,
         "schedule": {"world_size": 8, "trees": [{"root": 0}, {"root": 3}, {"root": 5}]}}
ONE_HOST = {"algorithm": "pipeline", "schedule": "gpipe", "microbatches": 8, "replicas": 1,
            "stages": [_stage(["h0"])]}
STAGES = {"algorithm": "pipeline", "schedule": "gpipe", "microbatches": 4, "replicas": 2,
          "stages": [_stage(["h0", "h4"]), _stage(["h1", "h5"]), _stage(["h2", "h6"]),
                     _stage(["h3", "h7"])]}


def test_plan_summary_says_hosts_and_what_the_plan_is():
    assert plan_summary(_plan(RING)) == "8 hosts, ring"
    assert plan_summary(_plan(RING, {h: 2 for h in HOSTS})) == \
        "8 hosts, ring, bandwidth classes: 16"
    assert plan_summary(_plan(TREES)) == "8 hosts, 3 trees"
    assert plan_summary(_plan(ONE_HOST)) == "1 host (h0): whole model"
    assert plan_summary(_plan(STAGES)) == "8 hosts: 4 stages, 2 replicas"
    recabled = _plan(TREES) | {"fabric": {"kind": "direct", "links": [{}] * 8}}
    recabled["metadata"]["collective"] = {"topology": {"strides": [1]}}
    assert plan_summary(recabled) == "8 hosts, 3 trees, re-cabled: 8 cables"


def test_table_has_a_plan_column_and_a_one_host_row_reads_as_one():
    plans = {"baseline": _plan(RING), "trees+bandwidth": _plan(TREES, {"h0": 3}),
             "pipeline": _plan(ONE_HOST), "placement": _plan(STAGES)}
    measured = {"baseline": 4.5, "trees+bandwidth": 1.0, "pipeline": 0.15, "placement": 0.2}
    rows = [{"strategy": s, "plan": plan_summary(p), "predicted": 0.9 * measured[s],
             "measured": measured[s]} for s, p in plans.items()]
    lines = table(rows, optimum=0.85).splitlines()
    assert [c.strip() for c in lines[0].split("|")][:4] == \
        ["strategy", "plan", "predicted s/it", "measured s/it"]
    by_name = {ln.split(" | ")[0]: ln.split(" | ") for ln in lines[2:]}
    assert by_name["baseline"][1:] == ["8 hosts, ring", "4.050", "4.500", "-10.0%", "1.00x",
                                       "5.29"]
    assert by_name["pipeline"][1] == "1 host (h0): whole model"
    assert by_name["pipeline"][5] == "30.00x"
    assert by_name["placement"][1] == "8 hosts: 4 stages, 2 replicas"
    assert by_name["trees+bandwidth"][1] == "8 hosts, 3 trees, bandwidth classes: 3"


def test_table_without_a_plan_or_a_baseline_says_so():
    (line,) = table([{"strategy": "trees", "predicted": 1.0, "measured": 1.0}],
                    optimum=None).splitlines()[2:]
    assert line.split(" | ")[1] == "-" and line.split(" | ")[5:] == ["-", "-"]


def test_the_demo_rows_are_one_per_strategy_without_the_post_passes_with_nothing_to_do():
    from bench.demo.run import default_strategies
    from topoctl.strategies import available

    rows = default_strategies(available())
    assert rows == ["baseline", "baseline+bandwidth", "pipeline", "placement", "topoopt",
                    "trees"]
    assert "bandwidth" not in rows and not [r for r in rows if "shares" in r or "sfb" in r]


def test_all_rows_add_the_post_passes_once_each():
    from bench.demo.run import default_strategies
    from topoctl.strategies import available

    rows = default_strategies(available(), every=True)
    assert {"baseline+shares", "baseline+sfb", "baseline+disco", "tag", "trees+bandwidth",
            "trees+shares"} <= set(rows)
    assert len(rows) == len(set(rows)) and "bandwidth" not in rows and "disco" not in rows


def _run_plan(shares=None, hosts=("h0", "h1")) -> dict:
    batch = {"global": 96, **({"shares": shares} if shares else {})}
    return {"metadata": {"strategy": "x", "prediction": {"iteration_time": 1.0}},
            "fabric": {"links": []}, "hosts": {h: {"interfaces": []} for h in hosts},
            "job": {"batch": batch, "collective": {"algorithm": "ring"}}}


def test_a_plan_that_runs_as_a_measured_one_is_found_and_differences_are_not_hidden():
    from bench.demo.run import same_plan_as

    measured = [("baseline", _run_plan()), ("pipeline", _run_plan(hosts=("h0",)))]
    assert same_plan_as(_run_plan(shares=[48, 48]), measured) == "baseline"  # even shares
    assert same_plan_as(_run_plan(hosts=("h0",)), measured) == "pipeline"
    assert same_plan_as(_run_plan(shares=[64, 32]), measured) is None  # uneven shares run apart
    other = _run_plan()
    other["job"]["collective"]["algorithm"] = "trees"
    assert same_plan_as(other, measured) is None
    other = _run_plan()
    other["metadata"]["strategy"] = "tag"  # metadata is not what runs
    assert same_plan_as(other, measured) == "baseline"


def test_plan_summary_names_disco_buckets_and_sfb_layers():
    from bench.demo.summary import plan_summary

    plan = _run_plan()
    plan["job"]["collective"].update(bucket_plan=[{"params": ["a"]}, {"params": ["b"]}],
                                     bucket_overlap="forward", order=["h0", "h1"])
    assert plan_summary(plan) == "2 hosts, ring, 2 buckets (forward overlap)"
    plan = _run_plan()
    plan["job"].update(sfb=["net.0", "net.2"])
    plan["job"]["collective"]["order"] = ["h0", "h1"]
    assert plan_summary(plan) == "2 hosts, ring, SFB on 2 layers"
