"""The TVM backend: templates built with LLVM on this host match the float64 reference.

Shapes are small and deliberately not multiples of any tile; every test counts its builds
(~0.4 s each with export_library), about 20 in all.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tvm")

from portkern import synthetic  # noqa: E402
from portkern.backends import get_backend  # noqa: E402
from portkern.backends.base import Artifact, Backend, Candidate, CompileError, Program, Variant  # noqa: E402
from portkern.backends.tvm import TvmBackend  # noqa: E402
from portkern.backends.tvm.common import HostFacts, sample_valid  # noqa: E402
from portkern.backends.tvm.common import configs as every_config  # noqa: E402
from portkern.hwprofile import load_target  # noqa: E402
from portkern.partition import EPILOGUE_ACTIVATIONS  # noqa: E402
from portkern.tasks import Task  # noqa: E402
from portkern.verify import compare, make_inputs, verify  # noqa: E402

FP32_TOL = 1e-5


@pytest.fixture(scope="module")
def backend() -> TvmBackend:
    found = get_backend(load_target("cpu"))
    assert isinstance(found, TvmBackend)
    return found


def only_variant(backend: Backend, task: Task) -> Variant:
    variants = backend.variants(task)
    assert len(variants) == 1, [v.name for v in variants]
    return variants[0]


def build(backend: Backend, task: Task, config: dict[str, Any] | None = None) -> tuple[Artifact, Program]:
    variant = only_variant(backend, task)
    artifact = backend.compile(Candidate.of(variant, config or variant.default), task)
    return artifact, backend.load(artifact, task)


def run(backend: Backend, program: Program, task: Task, inputs: list[np.ndarray]) -> np.ndarray:
    outputs = [backend.empty(spec, float("nan")) for spec in task.outputs]
    program([backend.to_device(a) for a in inputs], outputs)
    return backend.to_host(outputs[0])


def assert_matches_reference(backend: Backend, program: Program, task: Task, seed: int = 3) -> np.ndarray:
    inputs = make_inputs(task, seed, "normal")
    got = run(backend, program, task, inputs)
    result = compare(got, task.reference(inputs)[0], FP32_TOL)
    assert result["passed"], result["reason"]
    return got


def sampled(backend: Backend, task: Task, count: int, seed: int) -> list[dict[str, Any]]:
    variant = only_variant(backend, task)
    configs = sample_valid(variant.space, count, seed,
                           lambda c: c != dict(variant.default)
                           and backend.check(Candidate.of(variant, c), task) is None)
    assert len(configs) == count
    return configs


GEMM_ODD: dict[str, Any] = dict(m=37, n=29, k=24)  # 37 rows, 29 columns: boundary tiles in both dimensions
CONV_ODD: dict[str, Any] = dict(n=1, c=5, h=11, w=13, oc=7, kh=3, kw=3)


@pytest.mark.parametrize("activation", ["none", *EPILOGUE_ACTIVATIONS])
def test_gemm_default_every_activation(backend: TvmBackend, activation: str) -> None:
    task = synthetic.gemm_task(**GEMM_ODD, activation=activation, bias=True, residual=activation == "gelu")
    _, program = build(backend, task)
    assert_matches_reference(backend, program, task)


@pytest.mark.parametrize("shape", [dict(trans_b=True, bias=True), dict(batch=(2,), residual=True),
                                   dict(activation="silu", gate=True)], ids=["trans_b", "batched", "swiglu_gate"])
def test_gemm_sampled_configs(backend: TvmBackend, shape: dict[str, Any]) -> None:
    task = synthetic.gemm_task(**GEMM_ODD, **shape)
    for config in sampled(backend, task, 2, seed=5):
        _, program = build(backend, task, config)
        assert_matches_reference(backend, program, task)


def test_conv2d_default_resnet_epilogue(backend: TvmBackend) -> None:
    task = synthetic.conv2d_task(**CONV_ODD, pad=1, activation="relu", residual=True)
    _, program = build(backend, task)
    assert_matches_reference(backend, program, task)


@pytest.mark.parametrize("options", [dict(stride=2, pad=1, group=1, activation="silu"),
                                     dict(stride=1, pad=2, dilation=2, group=1, bias=False, activation="hardswish")],
                         ids=["strided", "dilated"])
def test_conv2d_sampled_configs(backend: TvmBackend, options: dict[str, Any]) -> None:
    task = synthetic.conv2d_task(**CONV_ODD, **options)
    for config in sampled(backend, task, 2, seed=7):
        _, program = build(backend, task, config)
        assert_matches_reference(backend, program, task)


def test_conv2d_grouped_and_flat_pointwise(backend: TvmBackend) -> None:
    grouped = synthetic.conv2d_task(2, 6, 9, 10, 8, 3, 3, stride=2, pad=1, group=2)
    _, program = build(backend, grouped)
    assert_matches_reference(backend, program, grouped)
    pointwise = synthetic.conv2d_task(1, 6, 9, 10, 12, 1, 1, activation="relu")
    variant = only_variant(backend, pointwise)
    _, program = build(backend, pointwise, {**variant.default, "spatial": "flat", "tile_w": 16,
                                            "c_block": 8})
    assert_matches_reference(backend, program, pointwise)


def test_program_passes_the_gate(backend: TvmBackend) -> None:
    """Poisoned outputs, in-place rewrites, input hashing, two seeds and distributions."""
    task = synthetic.gemm_task(**GEMM_ODD, activation="gelu", bias=True)
    variant = only_variant(backend, task)
    _, program = build(backend, task)
    verdict = verify(backend, program, task, variant.precision)
    assert verdict.passed, verdict.reason


def test_artifact_round_trips_through_bytes(backend: TvmBackend) -> None:
    task = synthetic.conv2d_task(**CONV_ODD, pad=1, activation="relu")
    artifact, program = build(backend, task)
    assert artifact.binary_name == "kernel.so" and artifact.binary and artifact.binary[:4] == b"\x7fELF"
    assert "T.prim_func" in artifact.source  # the lowered TensorIR, readable
    reread = Artifact(backend=artifact.backend, variant=artifact.variant, config=dict(artifact.config),
                      source=artifact.source, binary=bytes(bytearray(artifact.binary)),
                      binary_name=artifact.binary_name, meta=dict(artifact.meta))
    inputs = make_inputs(task, 9, "normal")
    first = run(backend, program, task, inputs)
    again = run(backend, backend.load(reread, task), task, inputs)
    np.testing.assert_array_equal(first, again)


def test_constraints_reject_before_building(backend: TvmBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    import tvm

    def no_build(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a rejected config reached the compiler")

    monkeypatch.setattr(tvm, "compile", no_build)
    task = synthetic.gemm_task(**GEMM_ODD, trans_b=True)
    variant = only_variant(backend, task)
    lanes = HostFacts.of(backend.target).lanes
    bad: dict[str, tuple[dict[str, Any], str]] = {
        "lanes": (dict(tile_n=8, vector_lanes=16),
                  "not a multiple of vector_lanes" if lanes >= 16 else "exceeds the host"),
        "registers": (dict(tile_m=16, tile_n=64, vector_lanes=lanes), "vector registers"),
        "gather": (dict(pack_b=False), "trans_b"),
        "unroll": (dict(unroll_k=16), "not one of"),
    }
    for overrides, expected in bad.values():
        candidate = Candidate.of(variant, {**variant.default, **overrides})
        reason = backend.check(candidate, task)
        assert reason and expected in reason, reason
        with pytest.raises(CompileError, match=expected):
            backend.compile(candidate, task)


def test_row_reductions_refuse_rows_their_lanes_do_not_split(backend: TvmBackend) -> None:
    """lane_reduce keeps vector_lanes partials while walking a row (or a pooled plane): a length
    that does not split into them is refused, and the same config without it is not."""
    for task, length in ((synthetic.layernorm_task(3, 37), "row length 37"),
                         (synthetic.softmax_task(3, 37), "row length 37"),
                         (synthetic.pool_task(1, 3, 7, 7, "global_avg"), "plane size 49")):
        variant = only_variant(backend, task)
        split = {**variant.default, "vector_lanes": 4, "lane_reduce": True}
        reason = backend.check(Candidate.of(variant, split), task)
        assert reason and f"lane_reduce needs the {length} divisible by vector_lanes=4" in reason, reason
        assert backend.check(Candidate.of(variant, {**split, "lane_reduce": False}), task) is None


def test_variants_and_identity(backend: TvmBackend) -> None:
    gemm = synthetic.gemm_task(8, 8, 8)
    variant = only_variant(backend, gemm)
    assert variant.precision == "fp32" and set(variant.default) == set(variant.space)
    assert backend.check(Candidate.of(variant, variant.default), gemm) is None
    assert "KIND = \"gemm\"" in variant.source
    assert backend.variants(synthetic.gemm_task(8, 8, 8, "float16")) == []
    assert backend.variants(synthetic.bmm_task(2, 4, 8, 8)) == []  # a kind with no CPU template
    import tvm

    assert tvm.runtime.num_threads() == backend.target.profile.cores  # not TVM's halved default
    fingerprint = backend.fingerprint()
    assert fingerprint["tvm"].startswith("0.27") and "llvm" in fingerprint["llvm_target"]
    assert fingerprint["cpu"]


def test_baseline_runs_on_tvm_buffers(backend: TvmBackend) -> None:
    task = synthetic.gemm_task(**GEMM_ODD, activation="relu", bias=True)
    baseline = backend.baseline(task)
    assert baseline is not None
    inputs = make_inputs(task, 4, "normal")
    got = run(backend, baseline, task, inputs)
    result = compare(got, task.reference(inputs)[0], FP32_TOL)
    assert result["passed"], result["reason"]


OTHER_KINDS = {
    "softmax": lambda: synthetic.softmax_task(37, 48),
    "layernorm": lambda: synthetic.layernorm_task(37, 48),
    "rmsnorm": lambda: synthetic.rmsnorm_task(37, 48),
    # a post-norm block's residual added after the norm (Gemma 2, OLMo 2)
    "layernorm_residual": lambda: synthetic.layernorm_task(37, 48, residual=True),
    "rmsnorm_residual": lambda: synthetic.rmsnorm_task(37, 48, residual=True),
    # GroupNorm -> SiLU as torch exports it, and a group per channel over a 1-D signal (wav2vec2's)
    "groupnorm_silu": lambda: synthetic.groupnorm_task(2, 12, (5, 8), 3, activation="silu"),
    "groupnorm_per_channel": lambda: synthetic.groupnorm_task(1, 6, (40,), 6, form="op"),
    "attention_mask": lambda: synthetic.attention_task(2, 3, 16, 32, mask=True),
    "attention_causal_kt": lambda: synthetic.attention_task(1, 2, 16, 16, seq_kv=32, causal=True, k_transposed=True),
    # 37 keys: no tile divides them, the last tile is padded (and k_transposed is packed then)
    "attention_odd_keys_mask": lambda: synthetic.attention_task(1, 2, 5, 16, seq_kv=37, mask=True),
    "attention_odd_keys_causal_kt": lambda: synthetic.attention_task(1, 2, 5, 16, seq_kv=37, causal=True,
                                                                     k_transposed=True),
    "maxpool": lambda: synthetic.pool_task(1, 5, 13, 11, "max", kernel=3, stride=2, pad=1),
    "avgpool": lambda: synthetic.pool_task(2, 3, 9, 11, "avg", kernel=3, stride=1, pad=1),
    "global_avgpool": lambda: synthetic.pool_task(2, 5, 8, 8, "global_avg"),
    # a chain of pow, tanh and constants, one pass with the steps kept apart (no known activation:
    # GPT-2's written-out GELU is partitioned as the one step gelu_tanh, below)
    "elementwise_chain": lambda: synthetic.elementwise_task(
        (3, 5, 80), "float32", [("pow", "in0", 3.0), ("mul", "t0", 0.044715), ("add", "in0", "t1"),
                                ("tanh", "t2"), ("mul", "in0", "t3")]),
    "elementwise_gelu_tanh": lambda: synthetic.elementwise_task((3, 5, 80), "float32", [("gelu_tanh", "in0")]),
    # float32's lowest (an attention mask's fill) as the expression writes it, -3.4028235e38: a
    # double just past float32's range, which TVM refused as a float32 literal
    "elementwise_float32_lowest": lambda: synthetic.elementwise_task(
        (4, 70), "float32", [("max", "in0", float(np.finfo(np.float32).min))]),
    # a mask broadcast over batch and heads; 210 elements: no whole 4-lane vectors
    "elementwise_broadcast_where": lambda: synthetic.elementwise_task(
        (2, 3, 7, 5), "float32", [("add", "in0", "in1"), ("where", "in2", "t0", -1e4)],
        input_shapes={"in1": (1, 1, 7, 5), "in2": (1, 1, 7, 5)}),
}


@pytest.mark.parametrize("form", [dict(softcap=2.0), dict(value_dim=32)], ids=["soft_capped", "wider_values"])
def test_attention_the_template_lacks_is_left_to_the_baseline(backend: TvmBackend, form: dict[str, Any]) -> None:
    """Gemma 2's tanh-capped logits, LeViT's values wider than its keys: the template computes
    neither, so it is not offered, and onnxruntime's run of the task's own nodes passes the gate."""
    task = synthetic.attention_task(1, 2, 16, 16, seq_kv=32, causal=True, **form)
    assert backend.variants(task) == []
    baseline = backend.baseline(task)
    assert baseline is not None and verify(backend, baseline, task, "fp32").passed


@pytest.mark.parametrize("name", sorted(OTHER_KINDS))
def test_other_kinds_pass_the_gate(backend: TvmBackend, name: str) -> None:
    """Default and one sampled config; the gate's 'large' inputs (logits x30, mean 50) included."""
    task = OTHER_KINDS[name]()
    variant = only_variant(backend, task)
    for config in [dict(variant.default), *sampled(backend, task, 1, seed=3)]:
        _, program = build(backend, task, config)
        verdict = verify(backend, program, task, variant.precision)
        assert verdict.passed, (config, verdict.reason)


def test_a_pool_one_output_wide_builds_and_matches_in_every_config(backend: TvmBackend) -> None:
    """A 7x7 average pool of a 7x7 map (shufflenet's, resnet50's last pool): the output stage has
    no column loop of its own under the tile, which every config once failed to build on."""
    task = synthetic.pool_task(1, 6, 7, 7, "avg", kernel=7, stride=1, pad=0)
    variant = only_variant(backend, task)
    configs = [c for c in every_config(variant.space) if backend.check(Candidate.of(variant, c), task) is None]
    assert len(configs) >= 6
    for config in configs:
        assert_matches_reference(backend, build(backend, task, config)[1], task)


# a parallel kernel, then the process's CPU time while its main thread sleeps: what TVM's pool
# workers burn waiting for a next kernel that does not come (TVM's default spin: ~0.2 s)
_IDLE_CPU_AFTER_A_KERNEL = """
import time
from portkern import synthetic
from portkern.backends import get_backend
from portkern.backends.base import Candidate
from portkern.hwprofile import load_target
from portkern.verify import make_inputs
backend = get_backend(load_target("cpu"))
task = synthetic.layernorm_task(128, 256)
variant = backend.variants(task)[0]
program = backend.load(backend.compile(Candidate.of(variant, dict(variant.default)), task), task)
inputs = [backend.to_device(a) for a in make_inputs(task, 1, "normal")]
outputs = [backend.empty(spec, 0.0) for spec in task.outputs]
program(inputs, outputs)
time.sleep(0.5)
program(inputs, outputs)
start = time.process_time()
time.sleep(0.3)
print(time.process_time() - start)
"""


def test_pool_workers_sleep_soon_after_a_kernel() -> None:
    """A TVM worker that spins after a kernel takes its pinned core from the onnxruntime stretch
    that runs next in a model (the demo BERT ran 2x slower with two kept kernels)."""
    env = {k: v for k, v in os.environ.items() if k != "TVM_THREAD_POOL_SPIN_COUNT"}
    done = subprocess.run([sys.executable, "-c", _IDLE_CPU_AFTER_A_KERNEL], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    assert float(done.stdout.split()[-1]) < 0.03, done.stdout



# the CPUs each thread that TVM's pool started may run on, and the process's, after a parallel kernel
_POOL_WORKER_CPUS = """
import os
from pathlib import Path

def cpus_of_threads():
    found = {}
    for tid in os.listdir("/proc/self/task"):
        status = Path(f"/proc/self/task/{tid}/status").read_text()
        found[tid] = next(l.split(":", 1)[1].strip() for l in status.splitlines() if l.startswith("Cpus_allowed_list"))
    return found

import tvm
before = set(cpus_of_threads())
from portkern import synthetic
from portkern.backends import get_backend
from portkern.backends.base import Candidate
from portkern.hwprofile import load_target
from portkern.verify import make_inputs
backend = get_backend(load_target("cpu"))
started = set(cpus_of_threads()) - before
task = synthetic.layernorm_task(128, 256)
variant = backend.variants(task)[0]
program = backend.load(backend.compile(Candidate.of(variant, dict(variant.default, parallel=True)), task), task)
program([backend.to_device(a) for a in make_inputs(task, 1, "normal")], [backend.empty(s, 0.0) for s in task.outputs])
now = cpus_of_threads()
print(now[str(os.getpid())], *sorted(now[tid] for tid in started))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="TVM starts no pool worker with one CPU to run on")
def test_pool_workers_are_not_pinned() -> None:
    """A worker pinned to one CPU waits out whatever else runs there (onnxruntime's default session
    pins its own spinning worker to the same CPU): each parallel kernel then took a scheduler slice
    (~4 ms for a 20 us LayerNorm, benchmarks/cpu/pool_affinity_probe.py --hog 1). The workers may
    run on every CPU the process may, as the calling thread may."""
    done = subprocess.run([sys.executable, "-c", _POOL_WORKER_CPUS], capture_output=True, text=True,
                          timeout=120, check=True)
    process, *workers = done.stdout.split()
    assert workers, done.stdout
    assert all(cpus == process for cpus in workers), done.stdout


def test_whole_model_check_ships_winners_only_if_a_second_look_finds_them_faster(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the final whole-model timing says the model is slower with the winners, a second look
    that finds it no faster with them drops them (it used to take a second look slower beyond
    noise too: bert-mini shipped a LayerNorm at 8.58 ms with it vs 3.66 ms without). The timings
    and the winner's recheck are scripted here; the model, the tune and the sessions are real."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import portkern
    import portkern.runtime
    import portkern.tuner
    from portkern.measure import MeasureOptions

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], name="ln", axis=-1, epsilon=1e-5)],
        "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 256])],
        [numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), "gamma"),
         numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), "beta")])
    model = tmp_path / "ln.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)

    def scripted(runners: dict[str, Any], repeats: int, **_: Any) -> dict[str, float]:
        for run in runners.values():
            run()
        if "with" in runners:  # every with/without comparison: no difference
            return {"with": 1e-3, "without": 1e-3}
        return {name: 1.2e-3 if name == "portkern" else 1e-3 for name in runners}  # the final timing: slower

    monkeypatch.setattr(portkern.runtime, "interleaved_latency", scripted)
    monkeypatch.setattr(portkern.tuner, "_confirm_gain", lambda *_: None)  # every verified winner counts
    report = portkern.tune(model, target="cpu", trials=3, per_task_trials=3, min_task_trials=1, isolate=False,
                           work_dir=tmp_path / "work",
                           measure=MeasureOptions(warmup=1, repeats=5, input_sets=2))
    statuses = [o.status for o in report.outcomes]
    assert any(s.startswith("dropped: the model runs no faster with them") for s in statuses), statuses
    assert not any(s.startswith("kept") for s in statuses) and report.end_to_end["kernels_used"] == 0, statuses


def test_kernels_are_timed_with_numpy_blas_on_one_thread(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenBLAS's threads spin ~0.1 s after each call (the gate's float64 reference, its error
    norms, the sampler between trials): a parallel TVM kernel timed meanwhile measured in 4 ms
    scheduler ticks on a 2-core host. While a tune runs, this process's BLAS keeps to one thread
    (and the isolated worker's, for its life: search/worker._serve), and the caller's comes back."""
    import onnx
    from onnx import TensorProto, helper
    from threadpoolctl import threadpool_info

    import portkern
    import portkern.search.worker as worker
    from portkern.measure import MeasureOptions

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    seen: list[list[int]] = []
    timed = worker.time_program

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(blas_threads())
        return timed(*args, **kwargs)

    monkeypatch.setattr(worker, "time_program", spy)
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=-1)], "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 128])])
    model = tmp_path / "softmax.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    before = blas_threads()
    assert os.cpu_count() == 1 or max(before) > 1  # numpy's BLAS is threaded here: the limit shows
    portkern.tune(model, target="cpu", trials=2, per_task_trials=2, min_task_trials=1, isolate=False,
                  work_dir=tmp_path / "work", measure=MeasureOptions(warmup=1, repeats=3, input_sets=2))
    assert seen and all(threads == [1] * len(before) for threads in seen)
    assert blas_threads() == before
