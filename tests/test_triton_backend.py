"""The Triton backend class: registry, checks, cross-compilation for GPUs that are not here, buffers.

Every variant (matrix and memory-bound, built-in and generated) is compiled to PTX + cubin for
sm_90 (H200) and sm_80 (A100) with its DEFAULT config, and for sm_90 also with a config sampled
from its SPACE that passes `check` (a configuration that passes the checks but does not compile is
a constraints bug). The matrix variants also build HSACO for gfx942 (MI300X).
"""
from __future__ import annotations

import collections
import importlib.util
import io
import json
import random
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from portkern import synthetic
from portkern.backends import get_backend
from portkern.backends.base import Artifact, Candidate, CompileError, Variant
from portkern.backends.kernel_module import KernelSourceError, variant_from_source
from portkern.backends.triton import TritonBackend, compile_for
from portkern.backends.triton.backend import INTERPRETER_BF16, InterpreterLimitError
from portkern.backends.triton.compile_only import ARCH_TARGETS, compile_launch
from portkern.backends.triton.modules import (ALLOWED_IMPORTS, Launch, builtin_variant, builtin_variants,
                                              expand_includes, kernel_module)
from portkern.errors import PortkernError, TargetError
from portkern.hwprofile import available_targets, load_profile, load_target
from portkern.ir import Node, TensorSpec
from portkern.tasks import Task
from portkern.verify import GateOptions, verify

ARCH_PROFILES = {"sm_90": "h200", "sm_80": "a100", "gfx942": "mi300x"}
BACKENDS = {arch: get_backend(load_target(name)) for arch, name in ARCH_PROFILES.items()}
MATRIX_KINDS = ("gemm", "bmm", "attention", "conv2d")
SAMPLE_TRIES = 300

# GPU-sized tasks: nothing runs, so shapes can be what a model has (fp32 for the tf32 variants).
TASKS: dict[str, list[Task]] = {
    "gemm": [synthetic.gemm_task(512, 768, 384, "float16", bias=True, activation="silu", gate=True),  # SwiGLU
             synthetic.gemm_task(4, 1024, 768, "float32", trans_b=True, bias=True, activation="relu_squared"),
             synthetic.gemm_task(3000, 1000, 777, "float16", trans_b=True)],  # rows TMA cannot read in place
    "bmm": [synthetic.bmm_task(12, 128, 128, 64, "float16"), synthetic.bmm_task(4, 96, 80, 64, "float32")],
    # first: the flash kernels cross-compile their widest path, values wider than keys (LeViT's) with a
    # mask and causal (attention_pingpong refuses two head dims and compiles the next task)
    "attention": [synthetic.attention_task(2, 8, 196, 32, "float16", mask=True, causal=True, value_dim=64),
                  synthetic.attention_task(2, 8, 256, 64, "float16", mask=True, causal=True),
                  # a decoding-sized step (attention_splitkv's), its values narrower than its keys (MLA's shape)
                  synthetic.attention_task(4, 8, 4, 128, "float16", seq_kv=4096, k_transposed=True, value_dim=64),
                  synthetic.attention_task(32, 12, 128, 64, "float16", k_transposed=True, mask=True,
                                           packed_heads=True),
                  synthetic.attention_task(1, 12, 197, 64, "float32", mask=True),  # ViT's, fp32
                  synthetic.attention_task(4, 32, 512, 64, "float16", kv_heads=4, causal=True)],  # LLaMA's GQA
    "conv2d": [synthetic.conv2d_task(4, 64, 28, 28, 128, 3, 3, "float16", pad=1, residual=True,
                                     activation="relu"),
               synthetic.conv2d_task(8, 96, 28, 28, 96, 3, 3, "float16", stride=2, pad=1, group=96),
               # squeeze-excite's gate on x as conv2d_nhwc loads it
               synthetic.conv2d_task(32, 64, 56, 56, 64, 3, 3, "float16", pad=1, residual=True, activation="relu",
                                     nhwc=True, input_scale=True)],
    "softmax": [synthetic.softmax_task(512, 1000, "float16")],
    "layernorm": [synthetic.layernorm_task(512, 768, "float16", residual=True)],  # post-norm residuals
    "rmsnorm": [synthetic.rmsnorm_task(512, 4096, "float16", residual=True)],
    # Stable Diffusion's GroupNorm -> SiLU at 64x64 latents, channels-last
    "groupnorm": [synthetic.groupnorm_task(2, 320, (64, 64), 32, "float16", activation="silu", nhwc=True)],
    # LLaMA's q heads, the angles in float32 (OLMo 2's)
    "rotary": [synthetic.rotary_task(4, 32, 512, 64, "float16", packed_heads=True, angles_dtype="float32")],
    "reduce": [synthetic.reduce_task((64, 128, 96), "float16", "mean", (2,))],
    "pool": [synthetic.pool_task(4, 64, 56, 56, "max", 3, 2, 1, "float16"),
             synthetic.pool_task(4, 512, 7, 7, "global_avg", dtype="float16")],
    "elementwise": [synthetic.elementwise_task((64, 768), "float16", [("mul", "in0", "in1"), ("gelu", "t0")])],
}


def _all_variants() -> dict[str, tuple[Variant, Task]]:
    """Each variant (built-in and generated) with the first task it serves on the H200."""
    found: dict[str, tuple[Variant, Task]] = {}
    for tasks in TASKS.values():
        for task in tasks:
            for variant in BACKENDS["sm_90"].variants(task, runnable_here=False):
                found.setdefault(variant.name, (variant, task))
    return found


SERVED = _all_variants()


def _valid_configs(variant: Variant, task: Task, arch: str, seed: int) -> list[dict[str, Any]]:
    """DEFAULT (or its first valid one-parameter neighbour on this target), then one sampled config."""
    backend = BACKENDS[arch]

    def valid(config: dict[str, Any]) -> bool:
        return backend.target_problem(Candidate.of(variant, config), task) is None

    default = dict(variant.default)
    neighbours = [{**default, name: value} for name, choices in variant.space.items() for value in choices]
    first = next(c for c in [default, *neighbours] if valid(c))
    rng = random.Random(seed)
    sampled = ({name: rng.choice(choices) for name, choices in variant.space.items()} for _ in range(SAMPLE_TRIES))
    other = next((c for c in sampled if c != first and valid(c)), None)
    return [first] if other is None else [first, other]


def _assert_report(report: dict[str, Any], arch: str) -> None:
    assert report["arch"] == arch and report["kernels"]
    binary, text = ("hsaco", "amdgcn") if arch == "gfx942" else ("cubin", "ptx")
    for kernel in report["kernels"]:
        assert kernel["asm"][binary] and kernel["asm"][text]
        assert 0 < kernel["n_regs"] <= 512 and kernel["n_spills"] >= 0 and kernel["shared"] >= 0
        assert kernel["num_warps"] >= 1 and all(g >= 1 for g in kernel["grid"])
    if arch != "gfx942":
        assert all(f".target {arch}" in k["asm"]["ptx"] for k in report["kernels"])
    assert report["resources"]["n_regs"] == max(k["n_regs"] for k in report["kernels"])


# --- registry and variant discovery ---------------------------------------------------------------

def test_registry_finds_the_triton_backend() -> None:
    backend = get_backend(load_target("h200"))
    assert isinstance(backend, TritonBackend) and backend.name == "triton"
    assert backend.device_kinds == {"cuda", "hip"}
    assert isinstance(get_backend(load_target("mi300x")), TritonBackend)
    with pytest.raises(TargetError):
        get_backend(load_target("cpu", backend="triton"))


def test_every_kind_has_variants_and_every_file_is_served() -> None:
    assert set(TASKS) == {v.kind for v, _ in SERVED.values()}
    assert {v.name for v in builtin_variants()} <= set(SERVED), "a built-in variant serves none of TASKS"


def test_variants_are_offered_only_where_they_can_serve() -> None:
    backend = BACKENDS["sm_90"]
    skinny, square = TASKS["gemm"][1], TASKS["gemm"][0]
    assert "gemm_gemv" in {v.name for v in backend.variants(skinny)}
    assert "gemm_gemv" not in {v.name for v in backend.variants(square)}
    # the A100 has 108 SMs: the persistent GEMM is offered with NUM_SMS pinned there, not its default's 132
    assert "gemm_persistent" in {v.name for v in BACKENDS["sm_80"].variants(square)}
    persistent = SERVED["gemm_persistent"][0]
    reason = BACKENDS["sm_80"].check(Candidate.of(persistent, persistent.default), square)
    assert reason is not None and "108" in reason


def test_generic_checks_reject_impossible_launches() -> None:
    variant, task = SERVED["gemm_tiled"]
    backend = BACKENDS["sm_90"]
    for change, words in (({"num_warps": 3}, "power of 2"), ({"num_warps": 64}, "power of 2"),
                          ({"num_stages": 0}, "num_stages"),
                          ({"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "num_stages": 5}, "shared memory")):
        reason = backend.check(Candidate.of(variant, {**variant.default, **change}), task)
        assert reason is not None and words in reason, (change, reason)
    reason = backend.check(Candidate.of(variant, {"BLOCK_M": 64}), task)
    assert reason is not None and "parameters" in reason


def test_includes_expand_once_and_refuse_cycles() -> None:
    parts = {"a": "A\n# include: b\n", "b": "B\n", "loop": "# include: loop\n"}
    text = expand_includes("top\n# include: a\n# include: b\nend\n", parts.__getitem__)
    assert text == "top\nA\nB\n# (b is included above)\nend\n"
    with pytest.raises(ValueError, match="cycle"):
        expand_includes("# include: loop\n", parts.__getitem__)
    assert all("# include:" not in v.source for v in builtin_variants())


# --- cross-compilation ----------------------------------------------------------------------------

@pytest.mark.parametrize("arch, configs", [("sm_90", 2), ("sm_80", 1)])
@pytest.mark.parametrize("name", sorted(SERVED))
def test_variant_cross_compiles_with_valid_configs(name: str, arch: str, configs: int) -> None:
    variant, task = SERVED[name]
    offered = {v.name: v for v in BACKENDS[arch].variants(task, runnable_here=False)}
    if variant.name not in offered:
        reason = BACKENDS[arch].target_problem(Candidate.of(variant, variant.default), task)
        assert reason is not None  # not offered on this arch because its constraints say why
        pytest.skip(f"{name} is not offered on {arch}: {reason}")
    variant = offered[variant.name]  # as the search draws it there (the target's SM count pinned)
    for config in _valid_configs(variant, task, arch, seed=len(name))[:configs]:
        _assert_report(compile_for(Candidate.of(variant, config), task, arch), arch)


@pytest.mark.parametrize("name", sorted(n for n, (v, _) in SERVED.items() if v.kind in MATRIX_KINDS))
def test_matrix_variant_builds_hsaco_for_gfx942(name: str) -> None:
    variant, task = SERVED[name]
    offered = {v.name: v for v in BACKENDS["gfx942"].variants(task, runnable_here=False)}
    if variant.name not in offered:
        reason = BACKENDS["gfx942"].target_problem(Candidate.of(variant, variant.default), task)
        pytest.skip(f"{name} is not offered on gfx942: {reason}")
    variant = offered[variant.name]
    config = _valid_configs(variant, task, "gfx942", seed=0)[0]
    _assert_report(compile_for(Candidate.of(variant, config), task, "gfx942"), "gfx942")


def test_every_gpu_profile_has_a_cross_compiler() -> None:
    """compile() without a GPU cross-compiles for the target's arch: every GPU profile needs one."""
    profiles = [load_profile(name) for name in available_targets()]
    assert {p.arch for p in profiles if p.kind in TritonBackend.device_kinds} <= set(ARCH_TARGETS)


def test_unknown_arch_is_a_user_error() -> None:
    variant, task = SERVED["gemm_tiled"]
    with pytest.raises(PortkernError, match="sm_75"):
        compile_for(Candidate.of(variant, variant.default), task, "sm_75")


def test_compile_gives_an_artifact_that_loads_and_runs() -> None:
    """On CPU, compile cross-compiles for the target's arch; the artifact runs in the interpreter."""
    backend = BACKENDS["sm_90"]
    task = synthetic.gemm_task(20, 24, 36, "float32", bias=True, activation="relu")
    variant = next(v for v in backend.variants(task) if v.name == "gemm_splitk")
    config = _valid_configs(variant, task, "sm_90", seed=0)[0]
    artifact = backend.compile(Candidate.of(variant, config), task)
    assert artifact.binary is not None and artifact.binary_name == "kernels.zip"
    assert artifact.meta["arch"] == "sm_90"
    names = zipfile.ZipFile(io.BytesIO(artifact.binary)).namelist()
    assert names == ["0__gemm_partial.ptx", "0__gemm_partial.cubin", "1__splitk_reduce.ptx",
                     "1__splitk_reduce.cubin"]
    assert [k["name"] for k in artifact.meta["kernels"]] == ["_gemm_partial", "_splitk_reduce"]
    assert artifact.meta["n_regs"] > 0 and "asm" not in artifact.meta["kernels"][0]
    program = backend.load(artifact, task)
    assert verify(backend, program, task, variant.precision, GateOptions(seeds=(3,))).passed


# --- errors ---------------------------------------------------------------------------------------

_VALID = SERVED["gemm_tiled"][0].source


@pytest.mark.parametrize("source, words", [
    (_VALID.replace("def launch(", "def launch(:", 1), "syntax error"),
    ("import torch\n" + _VALID, "import of 'torch'"),
    (_VALID.replace("import math\n", "import os\n", 1), "import of 'os'"),
])
def test_bad_module_source_is_refused(source: str, words: str) -> None:
    with pytest.raises(KernelSourceError, match=words):
        variant_from_source("bad", source, "triton", "llm", ALLOWED_IMPORTS)
    variant, task = SERVED["gemm_tiled"]
    smuggled = Variant("bad", "gemm", "triton", source, variant.space, variant.default, "fp32", "llm")
    with pytest.raises(CompileError, match=words):
        BACKENDS["sm_90"].compile(Candidate.of(smuggled, variant.default), task)


def test_triton_compiler_error_becomes_compile_error() -> None:
    variant, task = SERVED["gemm_tiled"]
    broken_source = variant.source.replace("acc = tl.dot(a, b, acc", "acc = tl.dot(a, tl.trans(b), acc")
    broken = variant_from_source("broken", broken_source, "triton", "llm", ALLOWED_IMPORTS)
    config = {**variant.default, "BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 16}
    with pytest.raises(CompileError, match="_gemm_tiled"):
        compile_for(Candidate.of(broken, config), task, "sm_90")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's limits; a GPU runs bf16")
def test_bf16_is_refused_in_the_interpreter() -> None:
    backend = BACKENDS["sm_90"]
    task = synthetic.gemm_task(16, 16, 16, "bfloat16")
    variant = SERVED["gemm_tiled"][0]
    assert backend.check(Candidate.of(variant, variant.default), task) == INTERPRETER_BF16
    assert backend.variants(task) == []
    with pytest.raises(InterpreterLimitError, match="bf16"):
        backend.load(Artifact("triton", variant.name, dict(variant.default), variant.source), task)
    # compile-only still works: bf16 is fine for the GPU
    _assert_report(compile_for(Candidate.of(variant, variant.default), task, "sm_90"), "sm_90")


# --- baselines, buffers, identity --------------------------------------------------------------

@pytest.mark.parametrize("task", [
    synthetic.gemm_task(7, 9, 11, "float32", trans_b=True, bias=True, activation="gelu", residual=True),
    synthetic.bmm_task(2, 5, 6, 7, "float32"),
    synthetic.attention_task(1, 2, 5, 8, "float32", seq_kv=7, mask=True, causal=True),
    synthetic.attention_task(2, 3, 5, 8, "float32", k_transposed=True, mask=True, packed_heads=True),
    synthetic.attention_task(2, 4, 5, 8, "float32", kv_heads=2, causal=True),
    synthetic.attention_task(1, 4, 5, 8, "float32", seq_kv=9, kv_heads=2, mask=True),
    synthetic.attention_task(1, 4, 5, 8, "float32", seq_kv=9, kv_heads=2, mask=True, causal=True, softcap=2.0),
    synthetic.conv2d_task(1, 4, 7, 7, 6, 3, 3, "float32", stride=2, pad=1, group=2, activation="silu",
                          residual=True),
    synthetic.gemm_task(5, 6, 7, "float32", activation="silu", gate=True),
    synthetic.gemm_task(5, 6, 7, "float32", residual=True, batch=(2,)),  # the residual as cuBLAS's C
    synthetic.gemm_task(5, 6, 7, "float32", bias=True, activation="gelu", residual=True),
    synthetic.softmax_task(3, 10, "float32"),
    synthetic.layernorm_task(3, 10, "float32"),
    synthetic.rmsnorm_task(3, 10, "float32"),
    synthetic.rotary_task(2, 3, 5, 8, "float32", packed_heads=True, per_example=True),
    synthetic.rotary_task(2, 3, 5, 16, "float32", packed_heads=True, rotary_dims=4),  # GPT-NeoX's partial
    synthetic.rotary_task(2, 3, 5, 16, "float32", rotary_dims=8, interleaved=True),  # GPT-J's
    synthetic.reduce_task((3, 4, 5), "float32", "max", (1,), keepdims=False),
    synthetic.pool_task(1, 2, 7, 7, "avg", 3, 2, 1),
    synthetic.pool_task(1, 2, 7, 7, "max", 3, 2, 1),
    synthetic.elementwise_task((4, 6), "float32", [("add", "in0", "in1"), ("tanh", "t0"), ("mul", "t1", 0.5)]),
], ids=lambda task: task.label)
def test_baseline_passes_the_gate(task: Task) -> None:
    backend = BACKENDS["sm_90"]
    program = backend.baseline(task)
    assert program is not None
    assert verify(backend, program, task, "fp32", GateOptions(seeds=(5,))).passed


@pytest.fixture
def tf32_allowed() -> Any:
    """torch's TF32 switches on (as cuDNN's is by default), restored after the test; they are
    settable attributes, not monkeypatchable ones."""
    switches = (torch.backends.cudnn, torch.backends.cuda.matmul)
    before = [switch.allow_tf32 for switch in switches]
    for switch in switches:
        switch.allow_tf32 = True
    yield switches
    for switch, allowed in zip(switches, before, strict=True):
        switch.allow_tf32 = allowed


@pytest.mark.parametrize("dtype, exact", [("float32", True), ("float16", False)])
def test_float32_baselines_and_glue_run_without_tf32(monkeypatch: pytest.MonkeyPatch, tf32_allowed: Any,
                                                     dtype: str, exact: bool) -> None:
    """A float32 task's baseline, and the glue's Conv, MatMul and Gemm, turn TF32 off for their call
    and restore it after; a float16 baseline leaves the switches alone."""
    from portkern.backends.triton import baselines, glue
    seen = []

    def recording(real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> torch.Tensor:
            seen.append(tuple(switch.allow_tf32 for switch in tf32_allowed))
            return real(*args, **kwargs)
        return call

    conv2d = torch.nn.functional.conv2d
    monkeypatch.setattr(baselines.F, "conv2d", recording(conv2d))
    task = synthetic.conv2d_task(1, 4, 7, 7, 6, 3, 3, dtype, pad=1)
    baselines.for_task(task)([torch.randn(spec.shape) for spec in task.inputs])
    assert seen == [(not exact, not exact)]
    if exact:
        monkeypatch.setattr(glue, "_CONV", {2: recording(conv2d)})
        monkeypatch.setattr(glue.torch, "matmul", recording(torch.matmul))
        monkeypatch.setattr(glue.torch, "addmm", recording(torch.addmm))
        x, w, a, b = torch.randn(1, 4, 7, 7), torch.randn(6, 4, 3, 3), torch.randn(3, 5), torch.randn(5, 2)
        context = glue.GlueContext(opset=17, backend=BACKENDS["sm_90"])
        glue.GLUE["Conv"](Node("c", "Conv", ["x", "w"], ["y"]), [x, w], context)
        glue.GLUE["MatMul"](Node("m", "MatMul", ["a", "b"], ["y"]), [a, b], context)
        glue.GLUE["Gemm"](Node("g", "Gemm", ["a", "b", "c"], ["y"]), [a, b, torch.randn(2)], context)
        assert seen[1:] == [(False, False)] * 3
    assert all(switch.allow_tf32 for switch in tf32_allowed)


def test_buffers_round_trip_and_copy_in_place() -> None:
    backend = BACKENDS["sm_90"]
    for dtype in ("float32", "float16", ml_dtypes.bfloat16, "int64"):
        array = (np.arange(12).reshape(3, 4) - 5).astype(dtype)
        buffer = backend.to_device(array.T)  # non-contiguous input: the buffer is a contiguous copy
        assert np.array_equal(backend.to_host(buffer), array.T) and backend.to_host(buffer).dtype == array.dtype
        address = buffer.data_ptr()
        backend.copy_into(buffer, array.T * 2)
        assert buffer.data_ptr() == address and np.array_equal(backend.to_host(buffer), array.T * 2)
    poisoned = backend.to_host(backend.empty(TensorSpec((2, 3), "float16"), float("nan")))
    assert poisoned.dtype == np.float16 and np.isnan(poisoned).all()


def _ops_script(name: str) -> Any:
    """A benchmarks/ops script as a module (the folder is not a package)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "ops" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_benchmark_parses_and_plans_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    grid = _ops_script("grid_matrix")
    ops = "gemm:8x256x512:trans_b+bias+gelu,attention:1x2x4x64:causal,conv2d:1x8x9x9x16x3x3:pad=1+stride=2"
    assert grid.main(["--dry-run", "--configs", "2", "--dtype", "float32", "--ops", ops]) == 0
    plan = capsys.readouterr().out
    assert "gemm_gemv (fp32): 2 configs" in plan and "attention_splitkv" in plan and "conv2d_implicit" in plan
    labels = [label for label, _ in grid.parse_ops(ops, "float16")]
    assert labels[0] == "gemm:8x256x512:trans_b+bias+gelu float16"
    with pytest.raises(SystemExit, match="takes 3 sizes"):
        grid.parse_ops("gemm:8x8", "float16")


def test_variant_ab_gates_and_times_both_versions_of_a_kernel(tmp_path: Path) -> None:
    """variant_ab.py judges a kernel change: the library's kernel and another text of it (an earlier
    commit's, or an experiment's file in place of the library's) each pass the verification gate
    before either is timed; a version that computes wrong values is reported as such, with no time.
    The base may also be another built-in kernel in a config of its own (a new variant against the
    one kept today)."""
    ab = _ops_script("variant_ab")
    library = next(v for v in builtin_variants() if v.name == "softmax_online")
    text = (Path(__file__).resolve().parents[1] / "portkern/backends/triton/kernels/softmax_online.py").read_text()
    assert builtin_variant("softmax_online", text).source == library.source
    correct, wrong, out = tmp_path / "correct.py", tmp_path / "wrong.py", tmp_path / "ab.json"
    correct.write_text(text)
    wrong.write_text(text.replace("* inv_sum", "* inv_sum * 0.5"))
    for versions, statuses in ((["--base", correct], ("ok", "ok")), (["--base", wrong], ("wrong", "ok")),
                               (["--base", correct, "--new", wrong], ("ok", "wrong")),
                               (["--base-variant", "softmax_onepass", "--base-config", '{"num_warps": 2}'],
                                ("ok", "ok"))):
        assert ab.main(["--variant", "softmax_online", *map(str, versions), "--suite", "memory", "--smoke",
                        "--filter", "softmax", "--out", str(out)]) == 0
        row = json.loads(out.read_text())["rows"][0]
        assert (row["base"]["status"], row["new"]["status"]) == statuses
        assert ("new_vs_base" in row) == (statuses == ("ok", "ok"))
        assert row["base_config"] == ({"num_warps": 2} if "--base-variant" in versions else row["config"])
        assert all(len(row[label]["harness"]) == 2 for label in ("base", "new") if row[label]["status"] == "ok")


def test_kernel_at_rev_expands_includes_from_the_same_revision() -> None:
    """kernel_at_rev.py gives variant_ab a base whose includes come from the named revision, not
    the working tree: at HEAD it is the committed file with every include inlined, and it loads."""
    root = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    text = _ops_script("kernel_at_rev").kernel_at("HEAD", "gemm_tiled")
    assert "# include:" not in text and "def _activate(" in text  # _activation comes through _gemm_common
    library = next(v for v in builtin_variants() if v.name == "gemm_tiled")
    assert builtin_variant("gemm_tiled", text).space == library.space


def test_sass_loop_model_finds_attentions_key_loops() -> None:
    """The SASS model finds attention_flash's two key loops (whole blocks, then masked ones) and
    charges each iteration exactly its two products: 64x64x128 + 64x128x64 MACs for one warpgroup
    at 2048 fp16 MACs a clock is 512 cycles; the masked loop issues more instructions."""
    mix = _ops_script("sass_loop_mix")
    variant, task = SERVED["attention_flash"][0], synthetic.attention_task(2, 4, 256, 128, "float16", causal=True)
    config = {**variant.default, "BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "TMA": True}
    kernel = compile_for(Candidate.of(variant, config), task, "sm_90")["kernels"][0]
    loops = [mix.loop_model(body, 4, programs=1) for body in mix.hgmma_loops(mix.sass(kernel["asm"]["cubin"]))]
    assert [loop["tensor_cycles"] for loop in loops] == [512, 512]
    whole, masked = loops
    assert masked["instructions"] > whole["instructions"] and whole["opcodes"]["MUFU.EX2"] >= 32
    assert 0 < whole["tensor_share_bound"] < 1 and whole["tensor_share_if_overlapped"] >= whole["tensor_share_bound"]


def test_gluon_attention_probe_builds_for_sm90_with_a_product_in_flight() -> None:
    """The Gluon probe cross-compiles here: its kernels wait with one wgmma group outstanding
    (q k^T done, p v still running) and fit without spills at head dims 64 and 128; the ping-pong
    kernel runs 12 warps (two consumer warpgroups, a producer warp and its warpgroup's padding)."""
    probe = _ops_script("gluon_attention_probe")
    rows = probe.compile_only([(64, 64, 2, True)], [{"BLOCK_N": 64, "STAGES": 2, "PERSISTENT": True}])
    assert len(rows) == 8 and all(row["ok"] for row in rows), rows
    assert all("1" in row["waits"] and row["spills"] == 0 for row in rows)
    assert [row["warps"] for row in rows] == [4] * 4 + [12] * 4


@triton.jit
def _normalize_columns(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    x = tl.load(x_ptr + offsets)
    tl.store(out_ptr + offsets, x / tl.sum(x, axis=0)[None, :])


def test_cross_compiled_spills_count_the_stack_frame() -> None:
    """A 128 x 128 fp32 tile held across a reduction in one warp (512 values a thread) cannot
    fit 255 registers: ptxas spills into the stack frame, which cuobjdump lists as STACK, not
    LOCAL. The report counts it, as the driver's local size does on a GPU."""
    x = torch.empty(128 * 128, dtype=torch.float32, device="meta")
    launch = Launch(_normalize_columns, (1,), (), {"x_ptr": x, "out_ptr": x, "BLOCK": 128, "num_warps": 1})
    kernel = compile_launch(launch, ARCH_TARGETS["sm_90"])
    assert kernel["n_spills"] >= (128 * 128 // 32 - 255)


def _local_memory_in_hot_loops(kernel: dict[str, Any]) -> list[int]:
    return _ops_script("sass_loop_mix").hot_loop_spill_ops(kernel["asm"]["cubin"])


def _wait_groups(kernel: dict[str, Any]) -> set[str]:
    return _ops_script("_gluon_probe").wait_groups(kernel["asm"]["ptx"])


def test_attention_pingpong_runs_two_consumers_and_a_producer_within_its_estimate() -> None:
    """attention_pingpong (Gluon) builds for sm_90 in 12 warps (two consumer warpgroups and a
    producer warp), each consumer waiting with p v still in flight while it runs its softmax, its
    output stored by TMA, in no more shared memory than it declares (the backend refuses configs
    by that estimate); its key loops touch no local memory (its default spills a few registers outside
    them). It serves BERT's exports (K^T a view of (B, S, H, D) rows, heads packed, a mask), its
    producer loading the mask by TMA with K; a mask TMA cannot read (rows of 333 keys are not whole
    16 bytes, a key-padding mask's one row serves all queries) the consumers read from global
    memory, 16 bytes a thread where its rows allow. With a TMA mask, keys that end inside a block
    get the unmasked tasks' two key loops (whole blocks, then the edge). It refuses what it cannot
    serve, and without a GPU it is cross-compiled, never run."""
    backend = BACKENDS["sm_90"]
    mix = _ops_script("sass_loop_mix")
    masked = synthetic.attention_task(2, 3, 300, 64, "float16", seq_kv=333, causal=True, mask=True)
    variant = next(v for v in backend.variants(masked, runnable_here=False) if v.name == "attention_pingpong")
    module = kernel_module(variant, interpret=False)
    plain = synthetic.attention_task(4, 32, 2048, 128, "float16", causal=True)
    bert = synthetic.attention_task(2, 4, 128, 64, "float16", k_transposed=True, mask=True, packed_heads=True)
    padding = synthetic.attention_task(2, 4, 128, 64, "float16", mask=True, mask_shape=(2, 1, 1, 128))
    keys_end = synthetic.attention_task(2, 4, 200, 64, "float16", mask=True)  # 200 keys end inside a block
    for task, config in ((masked, variant.default), (plain, variant.default), (bert, variant.default),
                         (padding, variant.default), (keys_end, variant.default),
                         (masked, {**variant.default, "BLOCK_N": 64, "STAGES": 3, "PERSISTENT": False})):
        kernel = compile_for(Candidate.of(variant, config), task, "sm_90")["kernels"][0]
        assert _wait_groups(kernel) == {"0", "1"} and kernel["num_warps"] == 12
        assert kernel["shared"] <= module.shared_memory(task, config)
        # the output leaves through shared memory by TMA (from the accumulator's layout, stored
        # directly, each 32-byte sector took two stores)
        instructions = mix.sass(kernel["asm"]["cubin"])
        assert {op.split()[0] for _, op, _ in instructions if op.startswith(("STG", "UTMASTG"))} == {"UTMASTG.4D"}
        global_loads = {op.split()[0] for _, op, _ in instructions if op.startswith("LDG")}
        if task in (bert, keys_end):  # the mask arrives by TMA: 1.3x over the consumers' 16-byte reads below
            assert not global_loads
        if task is padding:  # both consumers read the mask 16 bytes a thread (the second, a worker
            # partition, read 2 bytes at a time while it did not know the strides' divisibility)
            assert global_loads == {"LDG.E.128"}
        spills_in_loops = _local_memory_in_hot_loops(kernel)
        if task is plain:  # each consumer's two key loops: whole blocks, then the causal edge
            assert kernel["n_spills"] > 0 and spills_in_loops == [0, 0, 0, 0]
        if task is keys_end:  # a mask by TMA and no causal edge: two loops too, whole blocks, then
            assert spills_in_loops == [0, 0, 0, 0]  # the block the keys end in (1.01-1.06x, H100)
        if task in (masked, bert, padding):  # one key loop a consumer: a second copy of a step that
            assert spills_in_loops == [0, 0]  # reads the mask from global memory spilled ~100
    target = BACKENDS["sm_90"].target
    assert module.constraints(bert, variant.default, target) is None
    refused = {name: module.constraints(other, variant.default, target) for name, other in {
        "float32": synthetic.attention_task(1, 2, 64, 64, "float32"),
        "k stored d x s": synthetic.attention_task(1, 2, 64, 64, "float16", k_transposed=True),
        "head dim 192": synthetic.attention_task(1, 2, 64, 192, "float16"),
        "rows of 60 halves": synthetic.attention_task(1, 2, 64, 60, "float16")}.items()}
    assert all(refused.values()), refused
    assert "head dim 192 > 128" in refused["head dim 192"] and "aligned" in refused["rows of 60 halves"]
    assert "sm_90" in BACKENDS["sm_80"].check(Candidate.of(variant, variant.default), task)
    if not torch.cuda.is_available():
        assert backend.check(Candidate.of(variant, variant.default), task).startswith("needs a GPU")


def test_attention_pingpong_spares_whole_key_blocks_their_selects() -> None:
    """Without an additive mask, key blocks no mask edge can reach run in a loop compiled without
    the key and causal masks' selects (ptxas had turned the edge check into 64-128 FSEL a block on
    every block: 514 instructions a loop at head dim 64, 424 without); a partial last block or a
    causal mask gets a second loop that has them. With whole blocks and no causal mask there is no
    second loop."""
    variant = next(v for v in builtin_variants() if v.name == "attention_pingpong")
    mix = _ops_script("sass_loop_mix")

    def selects(task: Task) -> list[int]:
        """FSEL in each consumer's key loops, in code order (two consumers)."""
        kernel = compile_for(Candidate.of(variant, variant.default), task, "sm_90")["kernels"][0]
        return mix.hot_loop_ops(kernel["asm"]["cubin"], ("FSEL",))

    assert selects(synthetic.attention_task(2, 4, 256, 64, "float16")) == [0, 0]
    for edged in (synthetic.attention_task(2, 4, 300, 64, "float16"),
                  synthetic.attention_task(2, 4, 256, 64, "float16", causal=True)):
        loops = selects(edged)
        assert loops[0::2] == [0, 0] and min(loops[1::2]) >= 64


def test_tf32x3_accumulators_stay_within_64_registers() -> None:
    """tf32x3 keeps each operand tile's tf32 halves in registers beside the accumulator: a 128 x 128
    tile in 4 warps (128 accumulator registers a thread) spilled ~300 accesses into its K loop and
    ran 1.8x slower than the best tile on an H200, so the tf32x3 GEMMs refuse it; in 8 warps, or
    multiplied in fp16, the same tile is admitted."""
    backend = BACKENDS["sm_90"]
    fp32 = synthetic.gemm_task(4096, 768, 3072, "float32", trans_b=True)
    fp16 = synthetic.gemm_task(4096, 768, 3072, "float16", trans_b=True)
    variants = {v.name: v for v in builtin_variants()}

    def problem(name: str, task: Task, warps: int) -> str | None:
        variant = variants[name]
        config = {**variant.default, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": warps}
        return backend.check(Candidate.of(variant, config), task)

    for name in ("gemm_tma_tf32x3", "gemm_tiled_tf32x3"):
        assert "> 64 registers" in problem(name, fp32, 4)
        assert problem(name, fp32, 8) is None
    assert problem("gemm_tma", fp16, 4) is None


def test_gemm_wgmma_keeps_two_products_in_flight_and_needs_a_gpu_to_run() -> None:
    """gemm_wgmma (Gluon) builds its 192-row tile as a 128-row and a 64-row product per K step,
    waited on together (two wgmma groups left in flight), in one warpgroup; the 128-row tile leaves
    one group in flight. Neither spills, the GELU epilogue included (beside a 192-register
    accumulator it spilled 62 values while its erf took a division). Here, without a GPU, it is
    cross-compiled but never offered to run: the interpreter cannot run Gluon."""
    backend = BACKENDS["sm_90"]
    task = synthetic.gemm_task(4096, 768, 3072, "float16", trans_b=True, bias=True, activation="gelu")
    variant = next(v for v in backend.variants(task, runnable_here=False) if v.name == "gemm_wgmma")
    kernels = {rows: compile_for(Candidate.of(variant, {**variant.default, "BLOCK_M": rows}), task, "sm_90")
               ["kernels"][0] for rows in (192, 128)}
    assert {rows: _wait_groups(kernel) for rows, kernel in kernels.items()} == {192: {"0", "2"}, 128: {"0", "1"}}
    assert kernels[192]["num_warps"] == 4
    assert {rows: kernel["n_spills"] for rows, kernel in kernels.items()} == {192: 0, 128: 0}
    hgmma = {rows: kernel["asm"]["ptx"].count("wgmma.mma_async") for rows, kernel in kernels.items()}
    assert hgmma[192] == 3 * hgmma[128] // 2  # 3 wgmma of 64 rows per K step instead of 2
    if not torch.cuda.is_available():
        reason = backend.check(Candidate.of(variant, variant.default), task)
        assert reason is not None and reason.startswith("needs a GPU") and "Gluon" in reason
        assert "gemm_wgmma" not in {v.name for v in backend.variants(task)}
        artifact = Artifact(backend="triton", variant=variant.name, config=variant.default, source=variant.source)
        with pytest.raises(InterpreterLimitError, match="Gluon"):
            backend.load(artifact, task)


def test_gemm_pingpong_gives_each_consumer_whole_tiles_and_stores_by_tma() -> None:
    """gemm_pingpong (Gluon) builds for sm_90 in 12 warps: two consumer warpgroups, each issuing a
    whole tile's products (a 128-row tile is two 64-row wgmma a K step) with one group left in
    flight, and a loader warp. Each consumer stores its tile by TMA after the fused epilogue (GELU:
    two MUFU an element) and reads the bias and the residual 4 bytes a thread: under Triton 3.6 the
    second consumer, a worker partition, read the residual 2 bytes at a time, not seeing its
    strides' divisibility, and spilled 76 values at 128 x 128, until the launch restated it. Nothing
    spills, and it uses no more shared memory than it declares. It refuses what it cannot serve;
    without a GPU it is cross-compiled, never run."""
    backend = BACKENDS["sm_90"]
    mix = _ops_script("sass_loop_mix")
    ffn = synthetic.gemm_task(128, 3072, 768, "float16", bias=True, activation="gelu", batch=(32,))
    down = synthetic.gemm_task(4096, 768, 3072, "bfloat16", trans_b=True, bias=True, residual=True)
    variant = next(v for v in backend.variants(ffn, runnable_here=False) if v.name == "gemm_pingpong")
    module = kernel_module(variant, interpret=False)
    for task, config, rows_per_step in ((ffn, variant.default, 2),
                                        (down, {**variant.default, "BLOCK_M": 64, "BLOCK_N": 256}, 1)):
        kernel = compile_for(Candidate.of(variant, config), task, "sm_90")["kernels"][0]
        assert kernel["num_warps"] == 12 and kernel["n_spills"] == 0 and _wait_groups(kernel) == {"0", "1"}
        assert kernel["shared"] <= module.shared_memory(task, config)
        ops = collections.Counter(op.split()[0] for _, op, _ in mix.sass(kernel["asm"]["cubin"]))
        steps = config["BLOCK_K"] // 16
        assert sum(n for op, n in ops.items() if op.startswith("HGMMA")) == 2 * rows_per_step * steps
        assert {op for op in ops if op.startswith(("STG", "UTMASTG"))} == {"UTMASTG.2D"}
        elements = config["BLOCK_M"] * config["BLOCK_N"] // 128  # a consumer thread's share of the tile
        bias_loads = 2 * config["BLOCK_N"] // 8  # two fp16 columns of every 8 a thread, per consumer
        if task is ffn:
            assert ops["LDG.E"] == bias_loads and ops["MUFU.EX2"] == ops["MUFU.RSQ"] == 2 * elements
        else:  # the residual: the tile's elements two at a time, in both consumers
            assert ops["LDG.E"] == bias_loads + 2 * elements // 2
        assert {op for op in ops if op.startswith("LDG")} == {"LDG.E"}
    target = backend.target
    refused = {name: module.constraints(task, variant.default, target) for name, task in {
        "float32": synthetic.gemm_task(256, 256, 256, "float32"),
        "rows of 100 halves": synthetic.gemm_task(256, 256, 100, "float16"),
    }.items()}
    assert "float16/bfloat16" in refused["float32"] and "aligned" in refused["rows of 100 halves"]
    assert "registers" in module.constraints(ffn, {**variant.default, "BLOCK_N": 256}, target)
    small = {**variant.default, "BLOCK_N": 64, "STAGES": 2}  # within an A100's shared memory
    assert "sm_90" in BACKENDS["sm_80"].check(Candidate.of(variant, small), ffn)
    if not torch.cuda.is_available():
        assert backend.check(Candidate.of(variant, variant.default), ffn).startswith("needs a GPU")


def test_time_once_and_fingerprint() -> None:
    backend = BACKENDS["sm_90"]
    assert backend.time_once(lambda: None) >= 0.0
    fingerprint = backend.fingerprint()
    assert fingerprint["triton"] and fingerprint["torch"]
    assert ("compute_capability" in fingerprint) == torch.cuda.is_available()
    assert len(backend.hash()) == 16


def test_grouped_query_attention_is_read_by_the_kernels_that_share_heads() -> None:
    """LLaMA's grouped-query attention reaches the kernels with k and v before their heads are
    repeated: attention_flash, attention_splitkv and attention_pingpong read head h // group
    (test_triton_matrix runs the first two here and all three on a GPU); attention_pingpong's
    producer loads that head's K and V by TMA, and it builds for sm_90 as on one head a query head.
    attention_flash's PACK_GQA (a tile of the group's query heads) builds without spills too."""
    backend = BACKENDS["sm_90"]
    task = synthetic.attention_task(4, 32, 512, 64, "float16", kv_heads=4, causal=True)
    assert task.inputs[1].shape == (4, 4, 512, 64)
    offered = {v.name for v in backend.variants(task, runnable_here=False)}
    assert {"attention_flash", "attention_pingpong"} <= offered
    pingpong = next(v for v in builtin_variants() if v.name == "attention_pingpong")
    assert backend.target_problem(Candidate.of(pingpong, pingpong.default), task) is None
    kernel = compile_for(Candidate.of(pingpong, pingpong.default), task, "sm_90")["kernels"][0]
    assert kernel["num_warps"] == 12 and _wait_groups(kernel) == {"0", "1"}
    flash = next(v for v in builtin_variants() if v.name == "attention_flash")
    for tma in (False, True):
        packed = Candidate.of(flash, {**flash.default, "PACK_GQA": True, "BLOCK_M": 64, "BLOCK_N": 64, "TMA": tma})
        assert backend.target_problem(packed, task) is None
        assert compile_for(packed, task, "sm_90")["kernels"][0]["n_spills"] == 0
