"""`retime`: the ranks' ops are timed at most once per process (a timing this process made
counts), and again after `forget_retimed` (the demo plans each strategy right before
measuring it); without `retime` the cached timing is used. Read back through the cache file
the timing writes."""

from __future__ import annotations

from topoctl.graph.profile import forget_retimed, measure_train_job
from topoctl.spec.job import parse_job

JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "retime",
       "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 48, "features": 40,
                                              "classes": 3}},
       "batch": {"global": 8}, "strategies": ["baseline"]}


def test_retime_times_once_per_process_and_again_after_forget(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    job = parse_job(JOB, "job")
    forget_retimed()

    def stamp() -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in (tmp_path / "profiles").glob("*.json")}
    assert measure_train_job(job, 4) is not None  # no cache: timed now
    first = stamp()
    assert len(first) == 1
    # already timed by this process: retime takes that timing
    assert measure_train_job(job, 4, retime=True) is not None and stamp() == first
    forget_retimed()
    assert measure_train_job(job, 4) is not None and stamp() == first  # the cache
    assert measure_train_job(job, 4, retime=True) is not None
    second = stamp()
    assert second.keys() == first.keys() and second != first  # timed again
    assert measure_train_job(job, 4, retime=True) is not None and stamp() == second  # once


def test_retime_measures_the_runtime_calibration_once_per_process(tmp_path, monkeypatch):
    """The tree runtime's CPU calibration is re-measured with the ops (`--retime`): once per
    process, again after `forget_retimed`; read back through the cache file it writes."""
    from topoctl.graph.profile import retime_runtime_calibration
    from topotrain.collectives import calibration_path, load_calibration

    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    forget_retimed()
    path = calibration_path()
    assert not path.exists()
    retime_runtime_calibration()
    first = path.stat().st_mtime_ns
    assert load_calibration()["per_message_s"] > 0
    retime_runtime_calibration()
    assert path.stat().st_mtime_ns == first  # once per process
    forget_retimed()
    retime_runtime_calibration()
    assert path.stat().st_mtime_ns != first  # measured again


def test_a_timing_beside_co_running_ranks_is_cached_apart(tmp_path, monkeypatch):
    """`corun` (the lab's other ranks on this machine): its own timing and cache entry."""
    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    job = parse_job(JOB, "job")
    forget_retimed()
    alone = measure_train_job(job, 4)
    files = set((tmp_path / "profiles").glob("*.json"))
    beside = measure_train_job(job, 4, corun=2)
    assert alone is not None and beside is not None and alone.keys() == beside.keys()
    assert len(set((tmp_path / "profiles").glob("*.json")) - files) == 1


def test_the_crowdings_timing_alone_serves_the_stage_timing_after_it(tmp_path, monkeypatch):
    """`measure_stage_crowding` times the stage alone and beside copies; the pipeline
    strategies then ask for the same stage timing (`retime`, the same grid batch): it is the
    crowding's, read from the cache it wrote, not timed a second time (a cold `make demo` did
    both). Read back through the cache files' modification times."""
    from topoctl.graph.profile import measure_stage_crowding

    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    job = parse_job(JOB, "job")
    forget_retimed()

    def stamp() -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in (tmp_path / "profiles").glob("*.json")}
    measure_stage_crowding(job, 4, copies=1)  # the ratio may be None (a busy machine)
    after = stamp()
    assert len(after) >= 1  # the stage's timing alone, cached whatever the ratio
    stage = measure_train_job(job, 4, retime=True, runtime="stage")
    assert stage is not None and stamp() == after  # not timed again
    forget_retimed()
    assert measure_train_job(job, 4, retime=True, runtime="stage") is not None
    assert stamp() != after  # a new process's retime still times it


def test_a_child_adopting_its_parents_timings_does_not_time_them_again(tmp_path, monkeypatch):
    """`retimed` hands what this process timed to a child (the demo's planning ahead), which
    `adopt_retimed`s it: its `retime` reads those timings from the cache, others it times."""
    from topoctl.graph.profile import adopt_retimed, retimed

    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    job = parse_job(JOB, "job")
    forget_retimed()

    def stamp() -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in (tmp_path / "profiles").glob("*.json")}
    assert measure_train_job(job, 4, retime=True) is not None
    done, first = retimed(), stamp()
    assert len(done) == 1 and len(first) == 1
    forget_retimed()  # as a new process starts
    adopt_retimed(done)
    assert measure_train_job(job, 4, retime=True) is not None and stamp() == first
    assert measure_train_job(job, 8, retime=True) is not None  # not the parent's: timed
    assert len(stamp()) == 2 and sorted(retimed()) == sorted(set(retimed()) | set(done))
