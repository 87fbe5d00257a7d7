"""The Triton backend's memory-bound variants, run in the Triton interpreter against Task.reference.

Every built-in softmax / layernorm / rmsnorm / reduce / pool variant and the generated elementwise
kernels, on shapes that are not powers of two nor multiples of any block (1, 7, 100, 1000, 3000
columns; 1, 3, 5, 7 rows against ROWS_PER_PROGRAM), in fp32 and fp16, with the DEFAULT config and
one other valid config drawn from the variant's SPACE. Outputs start as NaN, so an element a kernel
fails to write fails the check. On a machine with a GPU the same checks run the compiled kernels.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
from typing import Any, Sequence

import numpy as np
import pytest
import torch

from portkern import synthetic
from portkern.backends.base import Variant
from portkern.backends.triton import codegen
from portkern.backends.triton.modules import builtin_variants, interpreted_language, kernel_module, scratch_specs
from portkern.hwprofile import load_target
from portkern.ir import TensorSpec
from portkern.partition import evaluate_expr
from portkern.tasks import Task, freeze_attrs

TARGET = load_target("h200")
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
MEMORY_KINDS = ("softmax", "layernorm", "rmsnorm", "groupnorm", "reduce", "pool", "rotary")
VARIANTS = {v.name: v for v in builtin_variants() if v.kind in MEMORY_KINDS}
TOLERANCE = {"float32": 1e-5, "float16": 2e-3}  # relative L2 error against the float64 reference
DTYPES = tuple(TOLERANCE)
ROW_SHAPES = ((1, 1), (5, 7), (3, 100), (7, 1000), (2, 3000))
POST_NORM_SHAPES = ((5, 7), (2, 3000))  # norms with a residual added after them (Gemma 2's post-norms)


def _row_task(kind: str, rows: int, cols: int, dtype: str) -> Task:
    builder = {"softmax": synthetic.softmax_task, "layernorm": synthetic.layernorm_task,
               "rmsnorm": synthetic.rmsnorm_task}[kind]
    return builder(rows, cols, dtype)


# (task builder arguments, the variants that must accept the DEFAULT config for it)
REDUCE_CASES = (
    (((5, 7), "sum", (1,), True), {"reduce_rows", "reduce_strided"}),
    (((3, 1000), "mean", (-1,), False), {"reduce_rows", "reduce_strided"}),
    (((4, 6, 50), "max", (1, 2), True), {"reduce_rows", "reduce_strided"}),
    (((2, 3, 4), "min", (), False), {"reduce_rows", "reduce_strided"}),
    (((9, 13), "sum", (0,), False), {"reduce_strided"}),
    (((3, 17, 5), "mean", (1,), True), {"reduce_strided"}),
    (((300, 37), "mean", (0,), False), {"reduce_strided"}),
)
POOL_CASES = (
    ((2, 3, 7, 7, "max", 3, 2, 1), {"pool_window"}),
    ((1, 2, 9, 8, "avg", 3, 2, 1), {"pool_window"}),
    ((1, 3, 5, 6, "avg", 2, 1, 0), {"pool_window"}),
    ((1, 4, 13, 13, "max", 2, 2, 0), {"pool_window"}),
    ((2, 5, 7, 7, "global_avg"), {"pool_window", "pool_global"}),
    ((1, 3, 10, 13, "global_avg"), {"pool_window", "pool_global"}),
)
# the channels-last graph's pools (layout.py): lanes walk channels
NHWC_POOL_CASES = (
    ((2, 3, 7, 7, "max", 3, 2, 1), {"pool_window"}),
    ((1, 5, 9, 8, "avg", 3, 2, 1), {"pool_window"}),
    ((2, 5, 7, 7, "global_avg"), {"pool_window"}),
)


# rotary embeddings: (batch, heads, seq, head dim, the head split folded in, cos/sin per example,
# the rotated columns where partial: GPT-NeoX's quarter, Phi's half of a head, columns rotated in
# pairs: GPT-J's, partial too)
ROTARY_CASES = ((1, 1, 1, 2, False, False, None, False), (2, 3, 5, 8, False, False, None, False),
                (2, 3, 7, 24, True, True, None, False), (1, 4, 33, 64, True, False, None, False),
                (2, 3, 5, 24, True, False, 6, False), (1, 2, 9, 16, False, True, 8, False),
                (2, 3, 7, 24, True, True, None, True), (1, 2, 9, 24, False, False, 6, True))


# group norms: (N, C, spatial, groups, graph form, channels last, activation, the variants that must
# accept DEFAULT): torch's export and the op, a group per channel (1-D, wav2vec2's), one group
# (PoolFormer's), NHWC, and groups long enough for DEFAULT's eight splits of 1024
GROUPNORM_CASES = (
    ((2, 12, (5, 7), 3), "torch", False, "none", {"groupnorm_looped"}),
    ((1, 6, (9,), 6), "op", False, "silu", {"groupnorm_looped"}),
    ((1, 32, (10, 13), 1), "torch", False, "none", {"groupnorm_looped"}),
    ((2, 20, (6, 6), 4), "torch", True, "silu", {"groupnorm_looped"}),
    ((1, 8, (40, 50), 2), "torch", False, "gelu", {"groupnorm_looped", "groupnorm_split"}),
    ((2, 6, (45, 60), 2), "torch", True, "none", {"groupnorm_looped", "groupnorm_split"}),
)


def _cases(kind: str, dtype: str) -> list[tuple[Task, set[str]]]:
    if kind == "groupnorm":
        return [(synthetic.groupnorm_task(*args, dtype, form=form, nhwc=nhwc, activation=activation), names)
                for args, form, nhwc, activation, names in GROUPNORM_CASES]
    if kind == "rotary":
        every = {name for name, v in VARIANTS.items() if v.kind == kind}
        # OLMo 2's float16 model: float32 cos and sin, x widened for the products and the sum cast back
        widened = [] if dtype == "float32" else [
            (synthetic.rotary_task(2, 3, 7, 24, dtype, packed_heads=True, angles_dtype="float32"), every)]
        return [(synthetic.rotary_task(b, h, s, d, dtype, packed_heads=packed, per_example=per_example,
                                       rotary_dims=rotated, interleaved=pairs), every)
                for b, h, s, d, packed, per_example, rotated, pairs in ROTARY_CASES] + widened
    if kind in ("softmax", "layernorm", "rmsnorm"):
        every = {name for name, v in VARIANTS.items() if v.kind == kind}
        post_norms = [] if kind == "softmax" else [
            ({"layernorm": synthetic.layernorm_task, "rmsnorm": synthetic.rmsnorm_task}[kind](
                rows, cols, dtype, residual=True), every) for rows, cols in POST_NORM_SHAPES]
        return [(_row_task(kind, rows, cols, dtype), every) for rows, cols in ROW_SHAPES] + post_norms
    if kind == "reduce":
        return [(synthetic.reduce_task(shape, dtype, op, axes, keepdims), names)
                for (shape, op, axes, keepdims), names in REDUCE_CASES]
    return ([(synthetic.pool_task(*args, dtype=dtype), names) for args, names in POOL_CASES]
            + [(synthetic.pool_task(*args, dtype=dtype, nhwc=True), names) for args, names in NHWC_POOL_CASES])


def _random_inputs(task: Task, rng: np.random.Generator, scale: float = 1.0) -> list[np.ndarray]:
    """Random values at each input's dtype: normal with an offset (so means and maxima are not 0)."""
    arrays = []
    for spec in task.inputs:
        if spec.dtype == "bool":
            arrays.append(rng.random(spec.shape) < 0.5)
        else:
            arrays.append((rng.standard_normal(spec.shape) * scale + 0.3).astype(spec.dtype))
    return arrays


def _run(variant: Variant, task: Task, config: dict[str, Any], inputs: Sequence[np.ndarray]) -> np.ndarray:
    module = kernel_module(variant, interpret=not ON_GPU)
    output, *scratch = [torch.full(spec.shape, float("nan"), dtype=getattr(torch, spec.dtype), device=DEVICE)
                        for spec in [task.outputs[0], *scratch_specs(module, task, config)]]
    device_inputs = [torch.from_numpy(np.ascontiguousarray(x)).to(DEVICE) for x in inputs]
    with contextlib.nullcontext() if ON_GPU else interpreted_language():
        module.launch(task, config, device_inputs, [output, *scratch])
    return output.cpu().numpy()


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got64, want64 = got.astype(np.float64), np.asarray(want, dtype=np.float64)
    assert np.isfinite(got64).all(), "NaN/Inf in the output (an element was not written, or overflow)"
    return float(np.linalg.norm(got64 - want64) / max(np.linalg.norm(want64), 1e-30))


def _sampled_config(variant: Variant, task: Task, seed: int) -> dict[str, Any] | None:
    """A valid config other than DEFAULT, drawn from the SPACE with a fixed seed (None if none is)."""
    configs = [dict(zip(variant.space, values)) for values in itertools.product(*variant.space.values())]
    random.Random(seed).shuffle(configs)
    module = kernel_module(variant, interpret=not ON_GPU)
    return next((c for c in configs if c != dict(variant.default)
                 and module.constraints(task, c, TARGET) is None), None)


def _check(variant: Variant, task: Task, config: dict[str, Any], seed: int, scale: float = 1.0) -> None:
    inputs = _random_inputs(task, np.random.default_rng(seed), scale)
    got = _run(variant, task, config, inputs)
    want = task.reference(inputs)[0]
    assert got.shape == tuple(want.shape)
    error = _relative_error(got, want)
    assert error < TOLERANCE[task.dtype], f"{variant.name} {task.label} {config}: rel L2 error {error:.2e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_matches_reference(name: str, dtype: str) -> None:
    variant = VARIANTS[name]
    module = kernel_module(variant, interpret=not ON_GPU)
    ran = 0
    for index, (task, expected) in enumerate(_cases(variant.kind, dtype)):
        reason = module.constraints(task, dict(variant.default), TARGET)
        if name in expected:
            assert reason is None, f"{name} refuses its DEFAULT config for {task.label}: {reason}"
        if reason is not None:
            continue
        _check(variant, task, dict(variant.default), seed=index)
        other = _sampled_config(variant, task, seed=index)
        assert other is not None, f"{name}: no valid config besides DEFAULT for {task.label}"
        _check(variant, task, other, seed=100 + index)
        ran += 1
    assert ran >= 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(n for n, v in VARIANTS.items() if v.kind == "softmax"))
def test_softmax_large_logits_stay_finite(name: str, dtype: str) -> None:
    """x * 50: exp overflows unless the row max is subtracted first (and fp16 holds +-200 fine)."""
    task = synthetic.softmax_task(6, 1000, dtype)
    _check(VARIANTS[name], task, dict(VARIANTS[name].default), seed=7, scale=50.0)


@pytest.mark.parametrize("kind", ["layernorm", "groupnorm"])
def test_chunked_statistics_keep_precision_with_a_large_mean(kind: str) -> None:
    """The chunked statistics merge (mean 1000, spread 1), and the merge of a group's split parts,
    must not lose fp32 precision like E[x^2]-E[x]^2."""
    task = (synthetic.layernorm_task(3, 3000, "float32") if kind == "layernorm"
            else synthetic.groupnorm_task(1, 8, (40, 50), 2, "float32"))
    rng = np.random.default_rng(3)
    inputs = [(rng.standard_normal(spec.shape) + (1000.0 if i == 0 else 0.0)).astype(np.float32)
              for i, spec in enumerate(task.inputs)]
    for name in (v.name for v in VARIANTS.values() if v.kind == kind):
        got = _run(VARIANTS[name], task, dict(VARIANTS[name].default), inputs)
        assert _relative_error(got, task.reference(inputs)[0]) < 2e-4, name


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_split_column_reduction_combines_partials(op: str) -> None:
    """SPLIT > 1: partial results per split in scratch, combined by the second kernel (mean divides once)."""
    variant = VARIANTS["reduce_strided"]
    task = synthetic.reduce_task((333, 3, 21), "float32", op, (0,), False)
    for split in (8, 32):
        _check(variant, task, {"BLOCK_R": 4, "BLOCK_I": 16, "SPLIT": split, "num_warps": 2}, seed=split)


@pytest.mark.parametrize("dtype", DTYPES)
def test_average_pool_counting_the_pads(dtype: str) -> None:
    """count_include_pad=1 divides by the window clipped to the explicit pads, not to the image."""
    task = synthetic.pool_task(2, 3, 9, 8, "avg", 3, 2, 1, dtype)
    (node,) = task.nodes
    counted = dataclasses.replace(node, attrs={**node.attrs, "count_include_pad": 1})
    task = dataclasses.replace(task, nodes=(counted,),
                               attrs=freeze_attrs({**dict(task.attrs), "count_include_pad": True}))
    for config in ({"BLOCK": 64, "num_warps": 2}, dict(VARIANTS["pool_window"].default)):
        _check(VARIANTS["pool_window"], task, config, seed=5)


@pytest.mark.parametrize("name", ["softmax_onepass", "layernorm_onepass", "rmsnorm_onepass"])
def test_whole_row_variants_refuse_rows_that_would_spill(name: str) -> None:
    task = _row_task(VARIANTS[name].kind, 4, 1 << 17, "float16")
    module = kernel_module(VARIANTS[name], interpret=not ON_GPU)
    reason = module.constraints(task, {**VARIANTS[name].default, "num_warps": 16}, TARGET)
    assert reason is not None and "spill" in reason


# --- generated elementwise kernels ----------------------------------------------------------------

def _broadcast_task(shapes: Sequence[tuple[int, ...]], dtype: str, expr: tuple[tuple[Any, ...], ...]) -> Task:
    """An elementwise task over broadcasting inputs (synthetic tasks give every input one shape)."""
    inputs = tuple(TensorSpec(shape, dtype) for shape in shapes)
    out = TensorSpec(tuple(np.broadcast_shapes(*shapes)), dtype)
    return Task("elementwise", inputs, (out,), freeze_attrs({"expr": expr}), flops=len(expr) * out.numel,
                min_bytes=sum(s.nbytes for s in inputs) + out.nbytes)


BIAS_GELU = (("mul", "in0", 0.5), ("add", "t0", "in1"), ("gelu", "t1"))
OUTER_DISTANCE = (("sub", "in0", "in1"), ("abs", "t0"), ("max", "t1", 0.25), ("sqrt", "t2"),
                  ("div", 1.0, "t3"), ("pow", "t4", 3.0), ("tanh", "t5"))
GATED = (("sigmoid", "in0"), ("pow", "in1", 2.0), ("where", "in2", "t0", "t1"), ("exp", "t2"),
         ("log", "t3"), ("min", "t4", 3.0), ("cast", "t5", "float32"))


def _elementwise_cases(dtype: str) -> list[Task]:
    return [_broadcast_task([(7, 100), (100,)], dtype, BIAS_GELU),
            _broadcast_task([(3, 1, 13), (1, 5, 1)], dtype, OUTER_DISTANCE),
            synthetic.elementwise_task((3, 1000), dtype, GATED)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(3))
def test_generated_elementwise_matches_reference(case: int, dtype: str) -> None:
    task = _elementwise_cases(dtype)[case]
    (variant,) = codegen.elementwise_variants(task)
    assert variant.kind == "elementwise" and variant.backend == "triton"
    for seed, config in enumerate([dict(variant.default), _sampled_config(variant, task, seed=case)]):
        assert config is not None
        inputs = _random_inputs(task, np.random.default_rng(seed))
        want = task.reference(inputs)[0] if task.nodes else evaluate_expr(task.attr("expr"), inputs)
        error = _relative_error(_run(variant, task, config, inputs), want)
        assert error < TOLERANCE[dtype], f"{task.label} {config}: rel L2 error {error:.2e}"


def test_collapse_merges_dims_that_broadcast_alike() -> None:
    assert codegen.collapse((4, 5, 6), [(4, 5, 6), (4, 5, 6)]) == codegen.Geometry((120,), ((1,), (1,)))
    assert codegen.collapse((4, 5, 6), [(4, 5, 6), (6,)]) == codegen.Geometry((20, 6), ((6, 1), (0, 1)))
    assert codegen.collapse((3, 1, 13), [(3, 1, 13), (1, 1, 13), ()]) == \
        codegen.Geometry((3, 13), ((13, 1), (0, 1), (0, 0)))


def test_generated_source_rejects_unknown_steps_and_other_shapes() -> None:
    with pytest.raises(codegen.ExprError):
        codegen.elementwise_source(_broadcast_task([(4,)], "float32", (("cosh", "in0"),)))
    with pytest.raises(codegen.ExprError):
        codegen.elementwise_source(_broadcast_task([(4,)], "float32", (("add", "in0", "t3"),)))
    task = _broadcast_task([(7, 100), (100,)], "float32", BIAS_GELU)
    (variant,) = codegen.elementwise_variants(task)
    other = _broadcast_task([(8, 100), (100,)], "float32", BIAS_GELU)
    module = kernel_module(variant, interpret=not ON_GPU)
    assert module.constraints(other, dict(variant.default), TARGET) is not None
    assert module.constraints(task, dict(variant.default), TARGET) is None
