"""The search on its own: dedupe across runs and workers, budget rules, the rules proposer,
PostgreSQL storage for distributed tunes (CI starts one; skipped where none is configured)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import optuna
import pytest

from portkern.backends import get_backend
from portkern.backends.base import Candidate, Variant
from portkern.hwprofile import load_target
from portkern.measure import MeasureOptions
from portkern.profile import floor_seconds
from portkern.search.proposers import Feedback, RulesProposer
from portkern.search.records import RecordLog, TrialRecord
from portkern.search.records import Measurement
from portkern.search.strategy import (ArtifactStore, SearchOptions, VariantAllocator, search_workload, space_size,
                                     study_name, switch_neighbours)
from portkern.search.worker import InProcessRunner, TrialJob
from portkern.profile import TaskProfile
from portkern.search.strategy import SearchResult
from portkern.synthetic import conv2d_task, gemm_task, pool_task, softmax_task
from portkern.tuner import (RESERVED_SHARE, RESERVED_TRIALS, TaskOutcome, TuneOptions, allocate_trials, next_task,
                            time_slice, variant_admitted)
from portkern.verify import GateOptions

FAST = MeasureOptions(warmup=1, repeats=3, input_sets=2)
GATE = GateOptions(seeds=(11,))


@pytest.fixture(scope="module")
def backend():
    return get_backend(load_target("h200"))


def _search(backend, tmp_path: Path, storage: str, log_name: str, trials: int, reachable_seconds: float = 0.0):
    task = softmax_task(4, 100, "float32")
    return search_workload(task, backend.variants(task), InProcessRunner(backend), storage=storage,
                           log=RecordLog(tmp_path / log_name), store=ArtifactStore(tmp_path / "artifacts"),
                           floor_seconds=floor_seconds(task, backend.target), backend=backend.name,
                           options=SearchOptions(trials=trials, patience=100, reachable_seconds=reachable_seconds),
                           gate=GATE, measure=FAST)


def test_a_second_run_never_remeasures(backend, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    first = _search(backend, tmp_path, storage, "records.jsonl", trials=3)
    assert first.measured == 3 and first.best is not None and first.artifact is not None
    second = _search(backend, tmp_path, storage, "records.jsonl", trials=2)
    keys = [r.candidate_key for r in RecordLog(tmp_path / "records.jsonl")]
    assert len(keys) == len(set(keys)) == first.measured + first.invalid + second.measured + second.invalid
    assert second.best is not None and second.best.seconds <= first.best.seconds


def test_budget_counts_measurements_not_invalid_configs(backend, tmp_path: Path) -> None:
    result = _search(backend, tmp_path, f"sqlite:///{tmp_path / 's.db'}", "r.jsonl", trials=2)
    assert result.measured == 2
    assert all(r.status != "invalid" for r in result.records if r.measurement)
    assert result.stop_reason.startswith("trial budget")


def test_a_task_at_the_launch_floor_is_done(backend, tmp_path: Path) -> None:
    """A kernel measured within the floor margin of the least time any kernel takes on the target
    (its launch floor, longer than a tiny task's roofline floor) ends the search: nothing is left
    to find. The floor counts in the headroom that shares out the trials too."""
    done = _search(backend, tmp_path, f"sqlite:///{tmp_path / 's.db'}", "r.jsonl", trials=4, reachable_seconds=60.0)
    assert done.measured == 1 and done.stop_reason == "within 10% of the launch floor"
    h100 = load_target("h100").profile
    assert h100.reachable_seconds(1e3, 4e3, "float16") == h100.limit("launch_seconds") > h100.floor_seconds(
        1e3, 4e3, "float16")
    assert h100.reachable_seconds(1e12, 1e9, "float16") == h100.floor_seconds(1e12, 1e9, "float16")
    task = softmax_task(4, 100, "float32")
    profile = TaskProfile(task, 2, 1e-7, Measurement([5e-6] * 3, "test"), "test", reachable_floor_seconds=3.4e-6)
    assert profile.headroom_seconds == pytest.approx(2 * (5e-6 - 3.4e-6))


def test_trials_follow_headroom() -> None:
    class P:
        def __init__(self, key: str, headroom: float) -> None:
            self.task = type("T", (), {"key": key})()
            self.headroom_seconds = headroom

    budget = allocate_trials([P("a", 9.0), P("b", 1.0), P("c", 0.0)], total=100, cap=60, minimum=4)
    assert budget == {"a": 60, "b": 10, "c": 4}


def test_time_follows_headroom_after_a_reserve_for_every_task_left() -> None:
    now = time.time()
    deadline = now + 100.0
    # one task left gets all of the time, whatever its share
    assert time_slice(deadline, 1.0, 1.0, tasks_left=1) == pytest.approx(now + 100.0, abs=1.0)
    assert time_slice(deadline, 0.0, 0.0, tasks_left=1) == pytest.approx(now + 100.0, abs=1.0)
    # 10 tasks left at 2 s a trial: each is held RESERVED_TRIALS x 2 s; the rest goes by headroom
    reserve = RESERVED_TRIALS * 2.0
    assert time_slice(deadline, 9.0, 10.0, 10, 2.0) == pytest.approx(now + reserve + (100 - 10 * reserve) * 0.9,
                                                                    abs=1.0)
    # a task of no headroom still gets its reserve
    assert time_slice(deadline, 0.0, 10.0, 10, 2.0) == pytest.approx(now + reserve, abs=1.0)
    # more tasks than the reserve holds: RESERVED_SHARE of the time in equal parts, the rest by headroom
    equal = RESERVED_SHARE * 100.0 / 100
    assert time_slice(deadline, 9.0, 10.0, 100, 2.0) == pytest.approx(now + equal + 50.0 * 0.9, abs=0.5)
    assert time_slice(deadline, 0.0, 10.0, 100, 2.0) == pytest.approx(now + equal, abs=0.2)
    assert time_slice(None, 1.0, 2.0) is None


def test_a_kind_that_keeps_losing_yields_its_turn_to_kinds_not_yet_tried() -> None:
    def profile(task, baseline_s: float) -> TaskProfile:
        return TaskProfile(task, 1, 0.0, Measurement([baseline_s] * 3, "test"), "test baseline")

    def tuned(profile: TaskProfile, status: str, measured: int = 2) -> TaskOutcome:
        return TaskOutcome(profile, SearchResult(task=profile.task, best=None, artifact=None, measured=measured),
                           status)

    convs = [profile(conv2d_task(1, c, 14, 14, 128, 1, 1), 35e-6) for c in (992, 960, 928, 896)]
    pool = profile(pool_task(1, 64, 112, 112, "max", 3, stride=2, pad=1), 28e-6)
    untuned = [*convs[1:], pool]
    # nothing tuned yet: the headroom order
    assert next_task(untuned, []) is convs[1]
    # one convolution lost: 35 us x (0 + 1) / (1 + 2) is below the pool's 28 us x 1/2, so the pool goes first
    assert next_task(untuned, [tuned(convs[0], "slower than the baseline")]) is pool
    # the convolutions' kind won before: it keeps its turn
    assert next_task(untuned, [tuned(convs[0], "kept")]) is convs[1]
    # a task never tried (budget spent, 0 trials) says nothing about its kind
    assert next_task(untuned, [tuned(convs[0], "no verified kernel (0 trials)", measured=0)]) is convs[1]


def test_rules_proposer_widens_past_the_edge(backend) -> None:
    task = softmax_task(4, 100, "float32")
    variant = next(v for v in backend.variants(task) if any(isinstance(c[0], int) for c in v.space.values()))
    param, choices = next((p, c) for p, c in variant.space.items()
                          if all(isinstance(x, int) and not isinstance(x, bool) for x in c) and len(c) > 1)
    best_config = dict(variant.default)
    best_config[param] = max(choices)
    from portkern.search.records import TrialRecord

    best = TrialRecord(task_key=task.key, backend="triton", variant=variant.name, origin="builtin",
                       config=best_config, candidate_key="k", status="ok")
    derived = RulesProposer().propose(task, backend, Feedback(floor_seconds=1e-9, baseline_seconds=None, best=best,
                                                             library={variant.name: variant}, round=1))
    assert len(derived) == 1 and derived[0].origin == "rules" and derived[0].source == variant.source
    assert max(choices) * 2 in derived[0].space[param]
    assert space_size(derived) < space_size([variant]) * 3


def test_a_pinned_parameter_stays_pinned_and_its_study_is_its_own(backend) -> None:
    """NUM_SMS, which the target decides (one choice), is no edge for the rules to widen; a space
    that differs only in a pinned choice is another study (Optuna keeps one set of choices a name)."""
    from portkern.search.records import TrialRecord

    task = gemm_task(512, 512, 256, "float16", trans_b=True)
    variant = next(v for v in backend.variants(task) if v.name == "gemm_persistent")
    assert variant.space["NUM_SMS"] == (backend.target.profile.cores,)
    best = TrialRecord(task_key=task.key, backend="triton", variant=variant.name, origin="builtin",
                       config={**variant.default, "BLOCK_M": 256}, candidate_key="k", status="ok")
    derived = RulesProposer().propose(task, backend, Feedback(floor_seconds=1e-9, baseline_seconds=None, best=best,
                                                             library={variant.name: variant}, round=1))
    assert len(derived) == 1 and 512 in derived[0].space["BLOCK_M"]
    assert derived[0].space["NUM_SMS"] == variant.space["NUM_SMS"]
    unpinned = dataclasses.replace(variant, space={**variant.space, "NUM_SMS": (108, 132)})
    assert study_name(task, backend.name, [variant]) != study_name(task, backend.name, [unpinned])


@pytest.mark.skipif(not os.environ.get("PORTKERN_TEST_POSTGRES"), reason="no PostgreSQL configured "
                    "(.ci/run starts one and sets PORTKERN_TEST_POSTGRES)")
def test_two_workers_share_a_postgres_study(backend, tmp_path: Path) -> None:
    storage = os.environ["PORTKERN_TEST_POSTGRES"]
    for summary in optuna.get_all_study_summaries(storage):
        optuna.delete_study(study_name=summary.study_name, storage=storage)
    first = _search(backend, tmp_path, storage, "worker1.jsonl", trials=2)
    # a second worker with its own record log: it learns what the first measured from the storage
    second = _search(backend, tmp_path, storage, "worker2.jsonl", trials=2)
    one = {r.candidate_key for r in RecordLog(tmp_path / "worker1.jsonl")}
    two = {r.candidate_key for r in RecordLog(tmp_path / "worker2.jsonl")}
    assert one and two and not (one & two), "the second worker re-measured the first one's configurations"
    (summary,) = optuna.get_all_study_summaries(storage)
    assert summary.n_trials >= first.measured + second.measured


def test_a_compile_pool_builds_ahead_and_failures_stay_trials(backend, tmp_path: Path) -> None:
    """Two compile workers build candidates ahead of the measuring worker; a variant that does not
    compile and one that crashes its process are trials with their reasons, and the search goes on."""
    from test_gate import CORPUS, _variant

    from portkern.search.worker import CompilePool, IsolatedRunner

    task = softmax_task(4, 100, "float32")
    broken = [_variant(CORPUS / "compile_fails.py"), _variant(CORPUS / "crashes.py")]
    variants = [*backend.variants(task), *broken]
    storage = f"sqlite:///{tmp_path / 's.db'}"
    target = backend.target
    with IsolatedRunner(target, 120, tmp_path / "scratch") as runner, \
            CompilePool(target, 2, 120, tmp_path / "scratch") as pool:
        result = search_workload(task, variants, runner, storage=storage, log=RecordLog(tmp_path / "r.jsonl"),
                                 store=ArtifactStore(tmp_path / "artifacts"),
                                 floor_seconds=floor_seconds(task, target), backend=backend.name,
                                 options=SearchOptions(trials=8, patience=100), gate=GATE, measure=FAST, pool=pool)
    by_variant = {r.variant: r for r in result.records}
    assert by_variant["compile_fails"].status == "compile_error"
    assert by_variant["crashes"].status == "runtime_error" and "died" in by_variant["crashes"].reason
    assert result.best is not None and result.best.status == "ok" and result.artifact is not None
    assert result.measured == 8 and result.stop_reason.startswith("trial budget")
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))  # nothing left in flight
    keys = [r.candidate_key for r in RecordLog(tmp_path / "r.jsonl")]
    assert len(keys) == len(set(keys))  # built ahead, still never measured twice


def test_a_search_that_stops_early_gives_its_compile_workers_back(backend, tmp_path: Path) -> None:
    """Builds still in flight when a search stops (no gain, deadline) are dropped, not leaked:
    the next task's search gets every compile worker back and measures its full budget."""
    from portkern.search.worker import CompilePool, IsolatedRunner

    storage = f"sqlite:///{tmp_path / 's.db'}"
    target = backend.target
    with IsolatedRunner(target, 120, tmp_path / "scratch") as runner, \
            CompilePool(target, 2, 120, tmp_path / "scratch") as pool:
        def search(task, options):
            return search_workload(task, backend.variants(task), runner, storage=storage,
                                   log=RecordLog(tmp_path / "r.jsonl"), store=ArtifactStore(tmp_path / "artifacts"),
                                   floor_seconds=floor_seconds(task, target), backend=backend.name,
                                   options=options, gate=GATE, measure=FAST, pool=pool)
        first = search(softmax_task(4, 100, "float32"), SearchOptions(trials=20, patience=1))
        assert first.stop_reason.startswith("no gain")
        waited = time.time() + 60  # the dropped build finishes (seconds in the interpreter)
        while pool.free() < 2 and time.time() < waited:
            time.sleep(0.1)
        assert pool.free() == 2
        second = search(softmax_task(8, 60, "float32"), SearchOptions(trials=4, patience=100))
        assert second.measured == 4 and second.stop_reason.startswith("trial budget")


def test_a_build_still_running_at_the_deadline_is_not_waited_for(backend, tmp_path: Path) -> None:
    """A new variant's first build can take seconds (a Gluon kernel's 6 s on the H100, past its
    task's slice): the search stops at its deadline instead of waiting, the trial is not measured,
    and the compile worker comes back once the build ends."""
    from test_gate import CORPUS, _variant

    from portkern.search.worker import CompilePool, IsolatedRunner

    slow = tmp_path / "slow_build.py"
    slow.write_text((CORPUS / "correct.py").read_text() + """

def shared_memory(task, config):  # the backend's check calls it before compiling: ~7 s here
    total = 0
    for step in range(100_000_000):
        total += step
    return 0
""")
    task = softmax_task(4, 100, "float32")
    target = backend.target
    with IsolatedRunner(target, 120, tmp_path / "scratch") as runner, \
            CompilePool(target, 1, 120, tmp_path / "scratch") as pool:
        def search(variant: Variant, options: SearchOptions) -> SearchResult:
            return search_workload(task, [variant], runner, storage=f"sqlite:///{tmp_path / 's.db'}",
                                   log=RecordLog(tmp_path / "r.jsonl"), store=ArtifactStore(tmp_path / "artifacts"),
                                   floor_seconds=floor_seconds(task, target), backend=backend.name,
                                   options=options, gate=GATE, measure=FAST, pool=pool)
        assert search(_variant(CORPUS / "correct.py"), SearchOptions(trials=1)).measured == 1  # workers up
        result = search(_variant(slow), SearchOptions(trials=4, deadline=time.time() + 1.0))
        assert result.measured == 0 and result.stop_reason == "time budget spent", result.stop_reason
        assert pool.free() == 0  # the search returned while its build was still running
        asked = optuna.load_study(study_name=study_name(task, backend.name, [_variant(slow)]),
                                  storage=f"sqlite:///{tmp_path / 's.db'}").get_trials()
        assert [t.state for t in asked] == [optuna.trial.TrialState.FAIL]  # asked, never told a value
        assert [r.variant for r in RecordLog(tmp_path / "r.jsonl")] == ["correct"]
        waited = time.time() + 120
        while pool.free() < 1 and time.time() < waited:
            time.sleep(0.1)
        assert pool.free() == 1


def test_references_prepared_while_a_build_runs_are_the_trials(backend, tmp_path: Path) -> None:
    """prepare() has the worker compute a task's gate references before its trial arrives: the
    trial then finds them cached (its references phase a lookup) and passes the gate on them."""
    from test_gate import CORPUS, _variant

    from portkern.search.worker import IsolatedRunner

    variant = _variant(CORPUS / "correct.py")
    task = softmax_task(64, 16384, "float32")  # 1M values a set: references ~0.1 s here
    job = TrialJob(task=task, candidate=Candidate.of(variant, variant.default), floor_seconds=0.0, gate=GATE,
                   measure=FAST)
    phases = {}
    for prepared in (False, True):
        with IsolatedRunner(backend.target, 120, tmp_path / f"scratch-{prepared}") as runner:
            if prepared:
                runner.prepare(job)
            record, _ = runner.run(job)
        assert record.status == "ok", record.reason
        phases[prepared] = record.phases
    assert phases[True]["references"] < phases[False]["references"] / 4, phases
    assert "references ahead" in phases[True] and "references ahead" not in phases[False]


def test_a_search_that_leaves_its_references_uncollected_does_not_spill_into_the_next(backend,
                                                                                     tmp_path: Path) -> None:
    """A search's first trial prepares references while its build runs; where the build misses the
    deadline, nothing collects them, and the next search prepares again. Its trial must get its
    own result, not a references job's (a whole-model tune died of that)."""
    from test_gate import CORPUS, _variant

    from portkern.search.worker import IsolatedRunner

    variant = _variant(CORPUS / "correct.py")
    jobs = [TrialJob(task=softmax_task(rows, 256, "float32"), candidate=Candidate.of(variant, variant.default),
                     floor_seconds=0.0, gate=GATE, measure=FAST) for rows in (8, 16)]
    with IsolatedRunner(backend.target, 120, tmp_path / "scratch") as runner:
        runner.prepare(jobs[0])  # its build missed the deadline: never run
        runner.prepare(jobs[1])
        record, _ = runner.run(jobs[1])
    assert record.status == "ok" and record.task_key == jobs[1].task.key, record.reason


def _efficiency_benchmark():
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "search" / "efficiency.py"
    spec = importlib.util.spec_from_file_location("efficiency", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_efficiency_replays_a_measured_table(backend, tmp_path: Path) -> None:
    """A measured table's grid is what the replay searches: the entries' values make the
    sub-space, a candidate without an entry is invalid (no trial spent), the table's best is found."""
    efficiency = _efficiency_benchmark()
    default = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}

    def entry(block_m: int, block_n: int, status: str, seconds: float | None) -> dict:
        return {"variant": "gemm_tiled", "config": {**default, "BLOCK_M": block_m, "BLOCK_N": block_n},
                "seconds": seconds, "status": status, "reason": "" if status == "ok" else "made up"}

    task = {"kind": "gemm", "m": 64, "n": 128, "k": 64, "dtype": "float16", "trans_b": True, "bias": False,
            "activation": "none", "residual": False}
    entries = [entry(32, 32, "ok", 3e-5), entry(32, 64, "ok", 1e-5), entry(64, 64, "compile_error", None)]
    table = {"device": "made up", "target": "h200", "backend": "triton", "date": "2026-12-03", "command": "test",
             "versions": {}, "method": "made up",
             "cases": [{"case": "tiny", "task": task, "entries": entries, "complete": True},
                       {"case": "unfinished", "task": task, "entries": entries[:1], "complete": False}]}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    out = tmp_path / "replay.json"
    assert efficiency.main(["--table", str(path), "--seeds", "3", "--within", "0", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["tiny"]  # the incomplete case is skipped
    row = rows[0]
    assert (row["grid"], row["valid"], row["grid_best_seconds"]) == (4, 2, 1e-5)
    for sampler in ("tpe", "random"):  # (64, 32) never costs a trial: the best comes within the 3 others
        assert all(count is not None and count <= 3 for count in row[sampler]["trials"])

    (case,) = list(efficiency.table_cases(table))
    (variant,) = case.variants
    assert variant.space["BLOCK_M"] == (32, 64) and variant.space["num_stages"] == (3,)
    runner = efficiency.TableRunner(case)

    def replayed(block_m: int, block_n: int) -> TrialRecord:
        job = TrialJob(task=case.task, candidate=Candidate.of(variant, {**default, "BLOCK_M": block_m,
                                                                        "BLOCK_N": block_n}), floor_seconds=0.0)
        return runner.run(job)[0]

    assert replayed(64, 32).status == "invalid"
    assert replayed(64, 64).status == "compile_error"
    assert replayed(32, 64).seconds == 1e-5


def test_a_table_measured_before_a_parameter_existed_replays_at_its_default(backend) -> None:
    """Entries without a parameter the variant gained later (gemm_tma's HALF_TAIL) were measured
    with its default: they replay as that config, not as configs of another variant."""
    efficiency = _efficiency_benchmark()
    old = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "NUM_SMS": 132, "FLATTEN": True,
           "TMA_STORE": False, "num_warps": 8, "num_stages": 3}
    task = {"kind": "gemm", "m": 4096, "n": 768, "k": 768, "dtype": "float16", "trans_b": True, "bias": False,
            "activation": "none", "residual": False}
    entries = [{"variant": "gemm_tma", "config": {**old, "num_stages": stages}, "seconds": 1e-5 * stages,
                "status": "ok", "reason": ""} for stages in (3, 4)]
    table = {"device": "made up", "target": "h200", "backend": "triton", "date": "2026-12-06", "command": "test",
             "versions": {}, "method": "made up", "cases": [{"case": "old", "task": task, "entries": entries,
                                                             "complete": True}]}
    (case,) = list(efficiency.table_cases(table))
    (variant,) = case.variants
    assert variant.space["HALF_TAIL"] == (False,) and variant.space["num_stages"] == (3, 4)
    assert len(case.outcomes) == 2


def test_a_new_best_puts_its_switch_neighbours_next(backend, tmp_path: Path) -> None:
    """Each on/off parameter of a new best is flipped, one at a time, and those configs are the
    search's next trials: a switch that pays only on the right tile gets tried on it. Replayed on
    a made-up table of 36 tiles where only the default with TMA_STORE on beats the default."""
    efficiency = _efficiency_benchmark()
    variant = next(v for v in backend.variants(gemm_task(4096, 768, 768, "float16", trans_b=True))
                   if v.name == "gemm_tma")
    flips = switch_neighbours(Candidate.of(variant, variant.default))
    assert [next(k for k in flip if flip[k] != variant.default[k]) for flip in flips] == [
        "FLATTEN", "HALF_TAIL", "TMA_STORE"]

    def seconds(config: dict) -> float:
        if config == {**variant.default, "TMA_STORE": True}:
            return 1e-5
        return 2e-5 if config == dict(variant.default) else 5e-5

    configs = [{**variant.default, "BLOCK_M": m, "BLOCK_N": n, "FLATTEN": flatten, "TMA_STORE": store}
               for m in (64, 128, 256) for n in (64, 128, 256) for flatten in (False, True) for store in (False, True)]
    task = {"kind": "gemm", "m": 4096, "n": 768, "k": 768, "dtype": "float16", "trans_b": True, "bias": False,
            "activation": "none", "residual": False}
    table = {"device": "made up", "target": "h200", "backend": "triton", "date": "2026-12-06", "command": "test",
             "versions": {}, "method": "made up",
             "cases": [{"case": "switches", "task": task, "complete": True, "entries": [
                 {"variant": "gemm_tma", "config": c, "seconds": seconds(c), "status": "ok", "reason": ""}
                 for c in configs]}]}
    (case,) = list(efficiency.table_cases(table))
    result = search_workload(case.task, case.variants, efficiency.TableRunner(case),
                             storage=optuna.storages.InMemoryStorage(), log=RecordLog(tmp_path / "r.jsonl"),
                             store=ArtifactStore(tmp_path / "artifacts"), floor_seconds=0.0, backend="triton",
                             options=SearchOptions(trials=3, patience=10, seed=0))
    measured = [r.config for r in result.records if r.status != "invalid"]  # HALF_TAIL's flip: no entry
    assert measured == [dict(variant.default), {**variant.default, "FLATTEN": False},
                        {**variant.default, "TMA_STORE": True}]
    assert result.best is not None and result.best.seconds == 1e-5


def test_variant_allocator_balances_variants_then_drops_the_clear_losers() -> None:
    records: list[TrialRecord] = []
    allocator = VariantAllocator(["fast", "slow", "broken"], records)

    def measure(variant: str, seconds: float | None) -> None:
        allocator.asked(variant)
        status = "ok" if seconds is not None else "invalid"
        records.append(TrialRecord(task_key="t", backend="b", variant=variant, origin="builtin", config={},
                                   candidate_key=f"{variant}{len(records)}", status=status,
                                   measurement=None if seconds is None else Measurement(times=[seconds],
                                                                                        method="made up")))
    order = []
    for _ in range(3 * VariantAllocator.MIN_TRIALS):
        name = allocator.next()
        order.append(name)
        measure(name, {"fast": 1.0, "slow": 2.0, "broken": None}[name])
    assert order.count("fast") == order.count("slow") == VariantAllocator.MIN_TRIALS  # balanced first
    # 'slow' is 2x the best after its trials: out; 'broken' had only invalid configs: still explored
    for _ in range(20):
        name = allocator.next()
        assert name != "slow"
        measure(name, {"fast": 1.0, "broken": None}[name])


def test_the_one_by_one_model_check_is_skipped_only_when_the_winners_deliver() -> None:
    """The whole model with every winner must save most of what the winners' own times promise
    (occurrences x (baseline - best)) before the per-winner sessions are skipped."""
    from types import SimpleNamespace

    from portkern.tuner import _delivered

    def winner(count: int, baseline: float, best: float) -> SimpleNamespace:
        return SimpleNamespace(profile=SimpleNamespace(count=count, seconds=baseline), best_seconds=best)

    kept = [winner(12, 50e-6, 40e-6), winner(36, 25e-6, 15e-6)]  # promise 0.12 + 0.36 = 0.48 ms a run
    assert _delivered(kept, (False, 2.0e-3, 2.45e-3))[0]  # 0.45 ms saved
    ok, gained, promised = _delivered(kept, (False, 2.0e-3, 2.2e-3))  # 0.2 ms: someone is not delivering
    assert not ok and abs(gained - 0.2e-3) < 1e-12 and abs(promised - 0.48e-3) < 1e-12
    assert not _delivered(kept, (True, 2.5e-3, 2.0e-3))[0]  # slower with them


def test_the_deadline_outranks_a_trial_budget_filled_by_builds_in_flight() -> None:
    """With a compile pool as many trials as the budget may be in flight at once: past the
    deadline they are dropped, not finished (a slow-to-verify task once ran 28 s past it)."""
    from portkern.search.strategy import SearchResult, _stop_reason

    task = softmax_task(4, 100, "float32")
    late = SearchOptions(trials=8, deadline=time.time() - 1.0)
    assert _stop_reason(SearchResult(task=task, best=None, artifact=None), late, 1e-6, 0, 0, 8, 100) == \
        ("time budget spent", False)
    on_time = SearchOptions(trials=8, deadline=time.time() + 60.0)
    reason, finish = _stop_reason(SearchResult(task=task, best=None, artifact=None), on_time, 1e-6, 0, 0, 8, 100)
    assert reason.startswith("trial budget") and finish


def test_float32_tasks_take_tf32_kernels_only_when_the_user_allows() -> None:
    """A tf32 kernel is faster than the IEEE float32 baselines by giving up precision the model
    asked for: a float32 task is offered one only with allow_tf32 (--allow-tf32); float16 data,
    whose products are no finer than TF32's, is unaffected."""
    triton = get_backend(load_target("h200"))
    single, half = gemm_task(64, 64, 64, "float32"), gemm_task(64, 64, 64, "float16")
    offered = triton.variants(single)
    assert {v.precision for v in offered} >= {"fp32", "tf32"}
    strict, allowed = TuneOptions(target="h200"), TuneOptions(target="h200", allow_tf32=True)
    kept = [v.name for v in offered if variant_admitted(v, single, strict)]
    assert kept and all(v.precision != "tf32" for v in offered if v.name in kept)
    assert all(variant_admitted(v, single, allowed) for v in offered)
    assert all(variant_admitted(v, half, strict) for v in triton.variants(half))


def test_skipped_variants_and_what_the_rules_derive_from_them_are_left_out() -> None:
    triton = get_backend(load_target("h200"))
    task = gemm_task(64, 64, 64, "float16")
    offered = {v.name: v for v in triton.variants(task)}
    skipping = TuneOptions(target="h200", skip_variants=("gemm_tma",))
    assert not variant_admitted(offered["gemm_tma"], task, skipping)
    assert variant_admitted(offered["gemm_tiled"], task, skipping)
    derived = dataclasses.replace(offered["gemm_tma"], name="gemm_tma~rules-0a1b2c")
    assert not variant_admitted(derived, task, skipping)
    assert variant_admitted(derived, task, TuneOptions(target="h200"))


def test_the_recheck_counts_each_sides_least_disturbed_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round in which something else held a core (the winner at twice its time) must not decide
    the recheck, nor turn the spread of the pooled times into 'noise' that hides a real gain."""
    import portkern.tuner as tuner
    from portkern.backends.base import Artifact

    task = gemm_task(8, 8, 8)
    winner, baseline = object(), object()
    scripted = {id(winner): iter([2e-3, 1e-3, 1e-3]), id(baseline): iter([1.5e-3, 1.5e-3, 1.5e-3])}

    def timed(backend, program, task, measure, inputs=None):  # one round of one side
        return Measurement([next(scripted[id(program)])] * 5, "scripted")

    class Device:
        host_memory = False

        def load(self, artifact, task):
            return winner

    monkeypatch.setattr(tuner, "time_program", timed)
    monkeypatch.setattr(tuner, "baseline_program", lambda backend, task: (baseline, "scripted baseline"))
    monkeypatch.setattr(tuner, "device_inputs", lambda backend, task, sets: [[]])
    result = SearchResult(task=task, best=None, artifact=Artifact(backend="x", variant="v", config={}, source=""))
    recheck = tuner._confirm_gain(Device(), task, result, MeasureOptions())
    assert recheck["seconds"] == 1e-3 and recheck["baseline_seconds"] == 1.5e-3
    assert recheck["noise"] == 0.02 and recheck["gain"]
