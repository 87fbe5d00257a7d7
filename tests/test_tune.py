"""`portkern tune` end to end on the CPU (Triton interpreter for the h200 target): profile, search,
gate, whole-model check against onnxruntime, pack, run with the pack; kill -9 and --resume."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import portkern
from portkern.measure import MeasureOptions
from portkern.models import random_feeds
from portkern.search.proposers import base_variant_name
from portkern.search.records import RecordLog
from portkern.tuner import print_summary

FAST = MeasureOptions(warmup=1, repeats=3, input_sets=2)


def _small_model(path: Path, rows: int = 8, hidden: int = 48) -> Path:
    """LayerNorm (as ONNX's op) -> MatMul + bias + Relu -> Softmax: three kinds of task."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "beta"),
             numpy_helper.from_array((rng.standard_normal((hidden, 40)) / 7).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(40).astype(np.float32), "b")]
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="ln", axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["ln", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b"], ["biased"], name="bias"),
             helper.make_node("Relu", ["biased"], ["act"], name="relu"),
             helper.make_node("Softmax", ["act"], ["y"], name="softmax", axis=-1)]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 40])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_tune_pack_run(tmp_path: Path) -> None:
    model = _small_model(tmp_path / "small.onnx")
    lines: list[str] = []
    report = portkern.tune(model, target="h200", shapes={"x": (8, 48)}, out=tmp_path / "small.pkpack",
                           trials=9, per_task_trials=3, min_task_trials=3, measure=FAST, progress=lines.append)
    kinds = {o.profile.task.kind for o in report.outcomes}
    assert kinds == {"layernorm", "gemm", "softmax"}
    assert any("trial" in line for line in lines) and any("end-to-end" in line for line in lines)
    assert report.end_to_end["passed"] and report.end_to_end["max_rel_l2_vs_onnxruntime"] < 1e-4
    tuned = [o for o in report.outcomes if o.result is not None]
    assert tuned and all(o.result.measured >= 1 for o in tuned)
    # every trial of the run is on the record, with its status
    records = list(RecordLog(report.work_dir / "records.jsonl"))
    assert len(records) == sum(o.result.measured + o.result.invalid for o in tuned)
    assert all(r.status in ("ok", "invalid", "compile_error", "runtime_error", "timeout", "rejected") for r in records)
    # the summary shows a rechecked winner's side-by-side times, the ones its speedup comes from
    summary = io.StringIO()
    print_summary(report, summary)
    rechecked = [o for o in report.outcomes if o.recheck]
    assert rechecked
    for outcome in rechecked:
        row = next(line for line in summary.getvalue().splitlines() if line.startswith(outcome.profile.task.label[:48]))
        for seconds in (outcome.recheck["baseline_seconds"], outcome.recheck["seconds"]):
            assert f"{seconds * 1e3:.4g} ms" in row
        assert f"{outcome.recheck['speedup']:.2f}x" in row
    pack = portkern.load_pack(tmp_path / "small.pkpack")
    kept = [o for o in report.outcomes if o.status.startswith("kept")]
    assert set(pack.entries) == {o.profile.task.key for o in kept}
    for entry in pack.entries.values():
        assert entry.verdict.passed and entry.measurement.median > 0 and entry.artifact.source
    # the runtime: the pack's kernels where they exist, the executor elsewhere, same answer as onnxruntime
    session = portkern.Session(model, tmp_path / "small.pkpack")
    assert len(session.kernels) == len(pack.entries)
    assert len(session.kernels) + len(session.fallbacks) == 3
    feeds = random_feeds(session.graph, seed=5)
    got = session.run(feeds)["y"]
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4


def test_skipped_variants_are_never_tried_and_an_unknown_name_is_reported(tmp_path: Path) -> None:
    model = _small_model(tmp_path / "small.onnx")
    lines: list[str] = []
    report = portkern.tune(model, target="h200", shapes={"x": (8, 48)}, out=tmp_path / "small.pkpack",
                           trials=6, per_task_trials=2,
                           min_task_trials=2, measure=FAST, progress=lines.append,
                           skip_variants=("gemm_tiled", "layernorm_onepass", "no_such_kernel"))
    tried = {base_variant_name(record.variant) for record in RecordLog(report.work_dir / "records.jsonl")}
    assert tried and not tried & {"gemm_tiled", "layernorm_onepass"}
    unknown = [line for line in lines if "--skip-variant" in line]
    assert len(unknown) == 1 and "no_such_kernel" in unknown[0] and "gemm_tiled," not in unknown[0].split("(")[0]
    with pytest.raises(portkern.PortkernError, match="sequence of variant names"):
        portkern.tune(model, target="h200", shapes={"x": (8, 48)}, out=tmp_path / "again.pkpack",
                      skip_variants="gemm_tiled")


def _small_cnn(path: Path) -> Path:
    """Conv -> BN -> Relu -> MaxPool -> Conv -> BN -> + residual -> Relu -> GlobalAveragePool ->
    Flatten -> Gemm: a ResNet block in miniature, NCHW as every exporter writes it."""
    rng = np.random.default_rng(1)

    def init(name: str, *shape: int, scale: float = 0.3, offset: float = 0.0) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale + offset).astype(np.float32), name)

    inits = [init("w1", 16, 8, 3, 3), init("w2", 16, 16, 3, 3, scale=0.1), init("fc", 10, 16), init("fc_b", 10)]
    for bn in ("bn1", "bn2"):
        inits += [init(f"{bn}_g", 16, offset=1.0), init(f"{bn}_b", 16), init(f"{bn}_m", 16),
                  numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), f"{bn}_v")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "bn1_g", "bn1_b", "bn1_m", "bn1_v"], ["n1"], name="bn1"),
             helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], name="conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c2", "bn2_g", "bn2_b", "bn2_m", "bn2_v"], ["n2"], name="bn2"),
             helper.make_node("Add", ["n2", "p1"], ["sum"], name="residual"),
             helper.make_node("Relu", ["sum"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc", "fc_b"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_trials_left_after_every_share_go_to_the_task_with_most_gain_left(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Shares of one trial each leave half of --trials: tasks whose share alone stopped them go on
    where their search stopped (no candidate measured twice), up to --per-task-trials each."""
    import portkern.tuner as tuner

    monkeypatch.setattr(tuner, "allocate_trials", lambda profiles, *_: {p.task.key: 1 for p in profiles})
    lines: list[str] = []
    report = portkern.tune(_small_model(tmp_path / "small.onnx"), target="h200", shapes={"x": (8, 48)},
                           out=tmp_path / "small.pkpack", trials=6, per_task_trials=3, min_task_trials=1, measure=FAST, progress=lines.append)
    tuned = [o for o in report.outcomes if o.result is not None]
    assert len(tuned) == 3
    assert sum(o.result.measured for o in tuned) == 6
    assert all(o.result.measured <= 3 for o in tuned) and max(o.result.measured for o in tuned) > 1
    assert sum(line.split("] ", 1)[-1].startswith("[again]") for line in lines) == 3
    records = list(RecordLog(report.work_dir / "records.jsonl"))
    keys = [(r.task_key, r.candidate_key) for r in records]
    assert len(keys) == len(set(keys)) == sum(len(o.result.records) for o in tuned)
    for outcome in tuned:  # each best is of all its passes' records (a gain within the noise is none)
        timed = [r.seconds for r in outcome.result.records if r.status == "ok" and r.seconds]
        assert outcome.best_seconds in timed and min(timed) >= outcome.best_seconds * 0.95


def test_a_cnn_tunes_and_runs_channels_last_on_the_triton_backend(tmp_path: Path) -> None:
    """The Triton backend's graph is NHWC inside (layout.py): conv and pool tasks on NHWC buffers,
    a Transpose into NHWC and, out of it, a view (the pooled (N, 1, 1, C) map transposed and
    flattened is (N, C) already: one Reshape, rewrites.collapse_layout_chains), and the model with
    the pack still answers as onnxruntime does."""
    model = _small_cnn(tmp_path / "cnn.onnx")
    report = portkern.tune(model, target="h200", out=tmp_path / "cnn.pkpack", trials=8, per_task_trials=2,
                           min_task_trials=1, measure=FAST)
    tasks = [o.profile.task for o in report.outcomes]
    assert Counter((t.kind, t.attr("layout")) for t in tasks) >= Counter({("conv2d", "nhwc"): 2, ("pool", "nhwc"): 2})
    assert report.end_to_end["passed"] and report.end_to_end["max_rel_l2_vs_onnxruntime"] < 1e-4
    session = portkern.Session(model, tmp_path / "cnn.pkpack")
    ops = [n.op_type for n in session.graph.nodes]
    assert (ops.count("Transpose"), ops[ops.index("NhwcGlobalAveragePool") + 1:-1]) == (1, ["Reshape"]), ops
    assert not session.host_fallbacks  # every NHWC op has device glue or a kernel
    feeds = random_feeds(session.graph, seed=6)
    got = session.run(feeds)["y"]
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4


def test_pack_from_other_software_is_refused(tmp_path: Path) -> None:
    model = _small_model(tmp_path / "small.onnx")
    portkern.tune(model, target="h200", shapes={"x": (8, 48)}, out=tmp_path / "p.pkpack", trials=3,
                  per_task_trials=1, min_task_trials=1, measure=FAST, max_tasks=1)
    manifest = tmp_path / "p.pkpack" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["fingerprint"]["triton"] = "0.0.1"
    manifest.write_text(json.dumps(data))
    with pytest.raises(portkern.PortkernError, match="other hardware/software"):
        portkern.Session(model, tmp_path / "p.pkpack")
    session = portkern.Session(model, tmp_path / "p.pkpack", allow_mismatch=True)  # re-verified by the gate
    assert len(session.kernels) + len(session.fallbacks) == 3


def test_kill_9_then_resume_keeps_every_finished_trial(tmp_path: Path) -> None:
    model = _small_model(tmp_path / "small.onnx")
    out = tmp_path / "k.pkpack"
    command = [sys.executable, "-m", "portkern", "tune", str(model), "--target", "h200", "--shape", "x=8x48",
               "-o", str(out), "--trials", "40", "--per-task-trials", "40", "--max-tasks", "1", "--quiet"]
    records_path = Path(f"{out}.work") / "records.jsonl"
    proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline:
        if records_path.exists() and len(records_path.read_text().splitlines()) >= 3:
            break
        if proc.poll() is not None:
            pytest.fail(f"tune ended before it could be killed: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the tuner and its worker, mid-trial
    proc.wait()
    before = {r.candidate_key: r for r in RecordLog(records_path)}
    assert len(before) >= 3 and not out.exists()
    resumed = subprocess.run(command + ["--resume", "--trials", "4", "--per-task-trials", "4"],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = list(RecordLog(records_path))
    keys = [r.candidate_key for r in after]
    assert set(before) <= set(keys), "a finished trial was lost"
    assert len(keys) == len(set(keys)), "a configuration was measured twice"
    assert len(after) > len(before)
    import optuna

    studies = optuna.get_all_study_summaries(f"sqlite:///{Path(f'{out}.work') / 'study.db'}")
    completed = sum(s.n_trials for s in studies)
    assert completed >= len(after)


def test_tune_with_an_llm_endpoint_keeps_only_what_the_gate_passes(tmp_path: Path) -> None:
    """The LLM proposer in a real tune: a replay server answers with a syntax error, a kernel wrong
    at the row tail, then a good kernel. The tune records each, keeps only verified kernels, and
    writes the transcripts."""
    from llm_fixtures.replay import REPLAY_MODEL, ReplayServer

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 100])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 100])
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=-1)], "g", [x], [y])
    model = tmp_path / "softmax.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    lines: list[str] = []
    with ReplayServer.from_fixtures("syntax_error", "no_tail_mask", "good_softmax") as server:
        report = portkern.tune(model, target="h200", out=tmp_path / "s.pkpack", trials=12, per_task_trials=12,
                               measure=FAST, proposers=("builtin", "rules", "llm"), llm_endpoint=server.url,
                               llm_model=REPLAY_MODEL, llm_timeout_s=10, progress=lines.append)
    assert "llm" in lines[0]  # the tune says which proposers ran
    records = list(RecordLog(report.work_dir / "records.jsonl"))
    from_llm = {r.variant: r for r in records if r.origin == "llm"}
    statuses = sorted(r.status for r in from_llm.values())
    assert statuses == ["ok", "rejected"], statuses  # the tail bug is caught, the good kernel passes
    rejected = next(r for r in from_llm.values() if r.status == "rejected")
    assert "error" in rejected.reason
    transcripts = sorted((report.work_dir / "transcripts").rglob("*.json"))
    assert len(transcripts) >= 3
    assert report.end_to_end["passed"]



def test_a_task_without_a_verified_kernel_says_what_became_of_its_trials() -> None:
    """'no verified kernel' names its trials' fates: the gate's rejections read differently from a
    budget spent before any trial finished."""
    from portkern import synthetic
    from portkern.search.records import TrialRecord
    from portkern.search.strategy import SearchResult
    from portkern.tuner import _why_none

    task = synthetic.softmax_task(3, 10, "float32")

    def trial(status: str, reason: str = "") -> TrialRecord:
        return TrialRecord(task.key, "triton", "softmax_onepass", "builtin", {}, status, status, reason)

    rejected = SearchResult(task, None, None, [trial("invalid", "BLOCK too big"), trial("timeout", "over 60 s"),
                                               trial("rejected", "rel_l2 3e-3 > 1e-5\nmore"), trial("rejected")],
                            stop_reason="trial budget (4) spent")
    assert _why_none(rejected) == ("3 trials: 2 rejected, 1 timeout; first: over 60 s; "
                                   "stopped: trial budget (4) spent")
    assert _why_none(SearchResult(task, None, None, [], stop_reason="time budget spent")) == (
        "0 trials; stopped: time budget spent")
