"""The TVM backend's CUDA family: code generation for sm_90 without a GPU, its checks, its math.

What runs here: every CUDA variant's DEFAULT and sampled configurations go through the backend's
compile() (TVM's CUDA codegen, plus PTX and ptxas's report where nvcc is installed); check()
rejects configurations the target cannot launch, with the reason; without TVM's CUDA runtime,
load and buffers fail with one clear error that the search records as the trial's outcome. The
math of each schedule is checked on its CPU twin (the same schedule, thread loops serial, built
with LLVM) through the gate. What does not run here: the kernels on a GPU (races, barriers,
codegen faults, speed): test_runs_on_gpu does that where TVM's CUDA runtime is available.
Shapes are small and not multiples of any tile.
"""
from __future__ import annotations

import dataclasses
import io
import shutil
import types
import zipfile
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tvm")

import tvm  # noqa: E402

from portkern import synthetic  # noqa: E402
from portkern.backends import get_backend  # noqa: E402
from portkern.backends.base import Candidate, CompileError, Variant  # noqa: E402
from portkern.backends.tvm import TvmBackend  # noqa: E402
from portkern.backends.tvm import groupnorm  # noqa: E402
from portkern.backends.tvm.common import sample_valid  # noqa: E402
from portkern.backends.tvm.cuda import TEMPLATES, build  # noqa: E402
from portkern.backends.tvm.cuda import conv2d as cuda_conv2d  # noqa: E402
from portkern.backends.tvm.cuda import gemm as cuda_gemm  # noqa: E402
from portkern.backends.tvm.cuda.common import STATIC_SHARED_BYTES, GpuFacts, row_shared_bytes  # noqa: E402
from portkern.backends.tvm.program import TvmProgram  # noqa: E402
from portkern.hwprofile import Target, load_target  # noqa: E402
from portkern.measure import MeasureOptions, time_program  # noqa: E402
from portkern.search.worker import TrialJob, execute_trial  # noqa: E402
from portkern.tasks import Task  # noqa: E402
from portkern.verify import verify  # noqa: E402

NO_RUNTIME = build.runtime_problem(tvm.cuda(0))
HAS_NVCC = build.ptx_compiler() == "nvcc" and shutil.which("ptxas") is not None

TASKS = {
    "gemm_gelu_residual": lambda: synthetic.gemm_task(37, 29, 24, activation="gelu", bias=True, residual=True),
    "gemm_trans_b_partial_k_step": lambda: synthetic.gemm_task(37, 32, 20, trans_b=True, bias=True),
    "gemm_silu_gate": lambda: synthetic.gemm_task(37, 29, 24, activation="silu", gate=True),
    "conv2d_resnet": lambda: synthetic.conv2d_task(1, 5, 11, 13, 7, 3, 3, pad=1, activation="relu", residual=True),
    "conv2d_grouped_strided": lambda: synthetic.conv2d_task(2, 6, 9, 10, 8, 3, 3, stride=2, pad=1, group=2),
    "softmax": lambda: synthetic.softmax_task(37, 48),
    "layernorm": lambda: synthetic.layernorm_task(37, 48),
    "rmsnorm": lambda: synthetic.rmsnorm_task(37, 48),
    "rmsnorm_residual": lambda: synthetic.rmsnorm_task(37, 48, residual=True),
    "groupnorm_silu": lambda: synthetic.groupnorm_task(2, 12, (5, 8), 3, activation="silu"),
    "elementwise_chain": lambda: synthetic.elementwise_task(
        (37, 48), "float32", [("mul", "in0", 0.5), ("add", "t0", "in1"), ("gelu", "t1"), ("pow", "t2", 2.0)]),
}


@pytest.fixture(scope="module")
def backend() -> TvmBackend:
    found = get_backend(load_target("h200", "tvm"))
    assert isinstance(found, TvmBackend) and found.gpu_target
    return found


@pytest.fixture(scope="module")
def host() -> TvmBackend:
    """The CPU backend: buffers and LLVM for the CPU twins."""
    found = get_backend(load_target("cpu"))
    assert isinstance(found, TvmBackend)
    return found


def only_variant(backend: TvmBackend, task: Task) -> Variant:
    variants = backend.variants(task)
    assert [v.name for v in variants] == [f"tvm_cuda_{task.kind}"]
    return variants[0]


def template(task: Task) -> types.ModuleType:
    (found,) = TEMPLATES[task.kind]
    return found


def configs(backend: TvmBackend, task: Task, sampled: int) -> list[dict[str, Any]]:
    """DEFAULT and `sampled` other valid configurations."""
    variant = only_variant(backend, task)
    others = sample_valid(variant.space, sampled, seed=5, valid=lambda c: c != dict(variant.default)
                          and backend.check(Candidate.of(variant, c), task) is None)
    assert len(others) == sampled
    return [dict(variant.default), *others]


def shared_estimate(task: Task, config: dict[str, Any], target: Target) -> int:
    """What check() counted as the configuration's shared memory."""
    if task.kind == "gemm":
        return cuda_gemm.shared_bytes(config)
    if task.kind == "conv2d":
        return cuda_conv2d.shared_bytes(task, config)
    if task.kind == "elementwise":
        return 0
    n = groupnorm.row_dims(task)[1] if task.kind == "groupnorm" else task.inputs[0].shape[-1]  # a row per group
    return row_shared_bytes(config, n, template(task).REDUCTIONS, GpuFacts.of(target))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_compiles_to_cuda_for_sm90(backend: TvmBackend, name: str) -> None:
    task = TASKS[name]()
    variant = only_variant(backend, task)
    for config in configs(backend, task, sampled=1):
        artifact = backend.compile(Candidate.of(variant, config), task)
        threads = template(task).threads(config)
        assert f"__global__ void __launch_bounds__({threads}) main_kernel(" in artifact.source, config
        assert "threadIdx.x" in artifact.source  # (blockIdx vanishes when the grid is one block)
        assert artifact.meta["threads_per_block"] == [threads] and artifact.meta["arch"] == "sm_90"
        with zipfile.ZipFile(io.BytesIO(artifact.binary or b"")) as bundle:
            assert bundle.read("kernel.cu").decode() == artifact.source
            assert bundle.read("kernel.so")[:4] == b"\x7fELF"
            if HAS_NVCC:
                assert b".target sm_90" in bundle.read("kernel.ptx")
                used = artifact.meta["resources"]  # check()'s shared memory is an upper bound
                assert used["shared_bytes"] <= shared_estimate(task, config, backend.target), (config, used)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_cpu_twin_passes_the_gate(host: TvmBackend, backend: TvmBackend, name: str) -> None:
    """The CUDA schedule with its thread loops serial, built with LLVM: its arithmetic against the
    float64 reference through the gate (poisoned outputs, in-place rewrites, several seeds)."""
    task = TASKS[name]()
    variant = only_variant(backend, task)
    for config in configs(backend, task, sampled=1):
        kernel = template(task).schedule(task, config, backend.target, on_device=False)
        program = TvmProgram(tvm.compile(kernel.module, target=host.llvm_target)["main"], kernel.arg_shapes)
        verdict = verify(host, program, task, variant.precision)
        assert verdict.passed, (config, verdict.reason)


def test_check_rejects_what_cannot_launch(backend: TvmBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_build(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a rejected config reached the compiler")

    monkeypatch.setattr(tvm, "compile", no_build)
    gemm = synthetic.gemm_task(256, 256, 64)
    conv = synthetic.conv2d_task(1, 64, 16, 16, 64, 3, 3, pad=1)
    rows = synthetic.softmax_task(64, 4096)
    bad = [
        (gemm, dict(block_m=128, block_n=128, thread_m=1, thread_n=2),
         "8192 threads per block exceed the target's 1024"),
        (gemm, dict(block_m=16, block_n=16, thread_m=4, thread_n=4),
         "16 threads per block are not whole 32-thread warps"),
        (conv, dict(block_oc=64, block_c=32, stage="weights"),
         f"exceed the {STATIC_SHARED_BYTES} a kernel can declare"),
        (rows, dict(rows_per_block=8, threads_per_row=128, cache_row=True), "bytes of shared memory per block"),
        (gemm, dict(vector_width=4, stage_shared=False), "vector_width applies to the shared-memory copies"),
        (synthetic.gemm_task(8, 30, 8), dict(vector_width=4), "vector_width=4 does not divide N (b's rows) (30)"),
    ]
    for task, overrides, expected in bad:
        variant = only_variant(backend, task)
        candidate = Candidate.of(variant, {**variant.default, **overrides})
        reason = backend.check(candidate, task)
        assert reason and expected in reason, reason
        with pytest.raises(CompileError, match="exceed|whole|vector_width|shared"):
            backend.compile(candidate, task)


def test_register_limits_come_from_the_profile() -> None:
    """The same configuration, on a profile with fewer registers per SM, is refused for them."""
    h200 = load_target("h200", "tvm")
    small = dataclasses.replace(h200.profile, limits={**h200.profile.limits, "registers_per_sm": 8192})
    backend = TvmBackend(Target("small_sm", "tvm", small))
    task = synthetic.gemm_task(256, 256, 64)
    variant = only_variant(get_backend(h200), task)
    candidate = Candidate.of(variant, dict(variant.default))  # 256 threads of ~48 registers
    assert get_backend(h200).check(candidate, task) is None
    reason = backend.check(candidate, task)
    assert reason and "registers of one SM" in reason, reason


@pytest.mark.skipif(not HAS_NVCC, reason="needs nvcc and ptxas to show what ptxas says")
def test_static_shared_limit_is_the_compilers(backend: TvmBackend) -> None:
    """Built past check(), 72 KiB of static shared memory fails in ptxas: the 48 KiB limit check()
    applies is real, not the profile's 227 KiB opt-in."""
    task = synthetic.conv2d_task(1, 32, 8, 8, 64, 3, 3, pad=1)
    config = {**cuda_conv2d.DEFAULT, "block_oc": 64, "block_c": 32, "stage": "weights", "block_w": 8,
              "thread_oc": 2, "thread_w": 1}
    assert "shared memory" in (cuda_conv2d.constraints(task, config, backend.target) or "")
    kernel = cuda_conv2d.schedule(task, config, backend.target)
    with pytest.raises(CompileError, match="ptxas: .*shared data"):
        build.build(kernel, backend.cuda_target)


def test_source_alone_without_a_ptx_compiler(backend: TvmBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "ptx_compiler", lambda: None)
    task = TASKS["softmax"]()
    variant = only_variant(backend, task)
    artifact = backend.compile(Candidate.of(variant, variant.default), task)
    assert "__global__" in artifact.source and artifact.meta["ptx"].startswith("not built: neither nvcc nor NVRTC")
    with zipfile.ZipFile(io.BytesIO(artifact.binary or b"")) as bundle:
        assert sorted(bundle.namelist()) == ["kernel.cu", "kernel.so"]


def test_variants_and_identity(backend: TvmBackend) -> None:
    assert not backend.host_memory and backend.baseline(TASKS["softmax"]()) is None
    assert backend.variants(synthetic.pool_task(1, 5, 13, 11, "max", kernel=3, stride=2, pad=1)) == []
    assert backend.variants(synthetic.gemm_task(8, 8, 8, "float16")) == []
    cpu_variant = get_backend(load_target("cpu")).variants(TASKS["softmax"]())[0]
    reason = backend.check(Candidate.of(cpu_variant, cpu_variant.default), TASKS["softmax"]())
    assert reason and "builds only its own templates for h200" in reason
    fingerprint = backend.fingerprint()
    assert '"arch":"sm_90"' in fingerprint["cuda_target"] and fingerprint["tvm"].startswith("0.27")
    a100 = get_backend(load_target("a100", "tvm"))
    assert a100.cuda_target.attrs["arch"] == "sm_80"


@pytest.mark.skipif(NO_RUNTIME is None, reason="TVM's CUDA runtime is available here: test_runs_on_gpu applies")
def test_no_runtime_is_one_clear_error(backend: TvmBackend) -> None:
    task = TASKS["softmax"]()
    variant = only_variant(backend, task)
    artifact = backend.compile(Candidate.of(variant, variant.default), task)
    expected = f"TVM's CUDA runtime is not available here: {NO_RUNTIME}"
    for attempt in (lambda: backend.load(artifact, task), lambda: backend.to_device(np.ones(4, np.float32)),
                    backend.synchronize):
        with pytest.raises(build.CudaRuntimeUnavailable) as raised:
            attempt()
        assert str(raised.value) == expected
    record, kept = execute_trial(backend, TrialJob(task, Candidate.of(variant, variant.default), 1e-9))
    assert (record.status, record.reason, kept) == ("compile_error", expected, None)
    assert record.artifact_meta["threads_per_block"] == [128]  # the build itself is kept as evidence


@pytest.mark.skipif(NO_RUNTIME is not None, reason=f"TVM's CUDA runtime is not available here: {NO_RUNTIME}")
def test_runs_on_gpu(backend: TvmBackend) -> None:
    """Where TVM's CUDA runtime and a GPU exist: every variant's default through the gate, timed."""
    for make in TASKS.values():
        task = make()
        variant = only_variant(backend, task)
        program = backend.load(backend.compile(Candidate.of(variant, variant.default), task), task)
        verdict = verify(backend, program, task, variant.precision)
        assert verdict.passed, (task.kind, verdict.reason)
        measurement = time_program(backend, program, task, MeasureOptions(warmup=2, repeats=10))
        assert measurement.median > 0 and "host clock" in measurement.method
