"""The Triton backend's matrix variants (gemm, bmm, attention, conv2d), in the Triton interpreter
(or on a GPU where there is one).

Every built-in matrix variant, in fp32 and fp16 (and bf16 on a GPU), on shapes that are not
multiples of any tile, with its DEFAULT config (or, where the default cannot serve the shape, the
first valid config one parameter away), and once with another valid config drawn from its SPACE, must pass
the verification gate (portkern.verify: float64 reference, poisoned outputs, untouched inputs,
repeat runs, new values in place) at the tolerance of its declared precision. On a GPU each is
built first as a tune's worker builds it (the JIT's warm-up, no launch); in the interpreter,
artifacts are loaded directly from source: the cross-compilation of the same candidates is tested
in test_triton_backend.py.
"""
from __future__ import annotations

import dataclasses
import math
import random
from typing import Any, Callable

import numpy as np
import pytest
import torch

from portkern import synthetic
from portkern.backends import get_backend
from portkern.backends.base import Artifact, Candidate, Variant
from portkern.backends.triton import baselines
from portkern.backends.triton.modules import builtin_variants, kernel_module
from portkern.hwprofile import load_target
from portkern.tasks import Task
from portkern.verify import GateOptions, verify

BACKEND = get_backend(load_target("h200"))
BACKEND.compile_launches = False  # on a GPU, candidates are built as a tune's workers build them
MATRIX_KINDS = ("gemm", "bmm", "attention", "conv2d")
VARIANTS = {v.name: v for v in builtin_variants() if v.kind in MATRIX_KINDS}
GATE = GateOptions(seeds=(7,), distributions=("normal",))  # one seed: the interpreter is slow
# bf16 only where it can be right: the interpreter's bf16 tl.dot is wrong (the backend refuses it)
DTYPES = ("float32", "float16", *(("bfloat16",) if torch.cuda.is_available() else ()))
SAMPLE_TRIES = 300

# Tasks per kind: odd sizes (no tile divides them), every epilogue feature at least once per dtype.
CASES: dict[str, list[Callable[[str], Task]]] = {
    "gemm": [
        lambda dt: synthetic.gemm_task(37, 50, 70, dt, bias=True, activation="gelu"),
        lambda dt: synthetic.gemm_task(8, 33, 45, dt, residual=True, activation="relu_squared", batch=(2,)),
        lambda dt: synthetic.gemm_task(5, 70, 100, dt, trans_b=True, bias=True, activation="gelu_tanh"),
        lambda dt: synthetic.gemm_task(3, 24, 200, dt, bias=True, gate=True, activation="silu"),  # SwiGLU's
        lambda dt: synthetic.gemm_task(20, 18, 33, dt, bias=True, activation="sigmoid"),
    ],
    "bmm": [
        lambda dt: synthetic.bmm_task(3, 19, 21, 40, dt),
        lambda dt: synthetic.bmm_task(2, 5, 33, 17, dt),
    ],
    "attention": [
        lambda dt: synthetic.attention_task(1, 2, 19, 16, dt),
        lambda dt: synthetic.attention_task(2, 1, 9, 24, dt, seq_kv=21, mask=True, causal=True),
        lambda dt: synthetic.attention_task(1, 2, 17, 8, dt, k_transposed=True, mask=True),
        lambda dt: synthetic.attention_task(2, 2, 3, 16, dt, seq_kv=150, mask=True, causal=True),
        # BERT's head split and merge folded in: (B, S, H, D) buffers read through strides
        lambda dt: synthetic.attention_task(2, 3, 13, 16, dt, k_transposed=True, mask=True, packed_heads=True),
        lambda dt: synthetic.attention_task(1, 2, 5, 24, dt, seq_kv=70, causal=True, packed_heads=True),
        # several query blocks on the diagonal: whole key blocks below it run unmasked, the rest masked
        lambda dt: synthetic.attention_task(1, 1, 70, 32, dt, mask=True, causal=True),
        # three 128-row query tiles under a causal mask: attention_pingpong pairs the first with the last
        lambda dt: synthetic.attention_task(1, 2, 300, 16, dt, causal=True),
        # masks with rows of whole 16 bytes: attention_pingpong loads them by TMA (with K; the third's
        # batch axis broadcast, its heads not, its keys ending inside the second or third key block),
        # a key-padding mask (one row for all queries) from global memory
        lambda dt: synthetic.attention_task(2, 2, 24, 16, dt, seq_kv=40, mask=True, causal=True),
        lambda dt: synthetic.attention_task(2, 3, 16, 16, dt, k_transposed=True, mask=True, packed_heads=True),
        lambda dt: synthetic.attention_task(2, 2, 16, 16, dt, seq_kv=136, mask=True, mask_shape=(1, 2, 16, 136)),
        lambda dt: synthetic.attention_task(2, 2, 12, 16, dt, seq_kv=32, mask=True, mask_shape=(2, 1, 1, 32)),
        # grouped-query attention (LLaMA's): each key/value head read by a group of query heads, k and v
        # before their repeat; with the head split folded in and a mask, one key/value head for all
        lambda dt: synthetic.attention_task(2, 4, 19, 16, dt, kv_heads=2, causal=True),
        lambda dt: synthetic.attention_task(1, 6, 9, 16, dt, seq_kv=40, kv_heads=1, packed_heads=True, mask=True),
        # LeViT's values twice as wide as its keys (an accumulator and an output of their own width); with a
        # packed head split and grouped key/value heads, values narrower than the keys (odd widths)
        lambda dt: synthetic.attention_task(2, 2, 19, 16, dt, mask=True, value_dim=32),
        lambda dt: synthetic.attention_task(1, 4, 9, 24, dt, seq_kv=40, kv_heads=2, causal=True, value_dim=20),
        # MPT's: the scores cast to float32 for a float32 mask and the softmax, the probabilities cast back
        lambda dt: synthetic.attention_task(1, 2, 19, 16, dt, mask=True, causal=True, scores_dtype="float32"),
    ],
    "conv2d": [
        lambda dt: synthetic.conv2d_task(2, 5, 9, 7, 6, 3, 3, dt, pad=1, activation="relu"),
        lambda dt: synthetic.conv2d_task(1, 4, 10, 11, 8, 3, 3, dt, stride=2, pad=1, group=2,
                                         residual=True, activation="sigmoid"),
        lambda dt: synthetic.conv2d_task(1, 3, 8, 8, 5, 1, 1, dt, bias=False),
        lambda dt: synthetic.conv2d_task(1, 2, 9, 9, 3, 3, 2, dt, dilation=2, pad=(2, 1), activation="tanh"),
        lambda dt: synthetic.conv2d_task(2, 6, 9, 10, 6, 3, 3, dt, stride=2, pad=1, group=6, activation="relu",
                                         residual=True),
        lambda dt: synthetic.conv2d_task(1, 3, 7, 7, 6, 5, 5, dt, pad=2, group=3, bias=False, activation="hardswish"),
        # the channels-last graph's tasks (layout.py): NHWC buffers, OHWI weights
        lambda dt: synthetic.conv2d_task(2, 5, 9, 7, 6, 3, 3, dt, pad=1, activation="relu", nhwc=True),
        lambda dt: synthetic.conv2d_task(1, 40, 7, 6, 12, 3, 3, dt, stride=(1, 2), pad=(2, 1), dilation=(2, 1),
                                         group=2, residual=True, activation="sigmoid", nhwc=True),
        lambda dt: synthetic.conv2d_task(1, 20, 6, 7, 33, 1, 1, dt, residual=True, activation="relu", nhwc=True),
        lambda dt: synthetic.conv2d_task(2, 6, 9, 10, 6, 3, 3, dt, stride=2, pad=1, group=6, activation="relu",
                                         residual=True, nhwc=True),
        # squeeze-excite's gate on x (conv2d_nhwc alone): MBConv's projection (1x1, a residual after it), and
        # a padded 3x3 (the gate must leave the zero padding zero)
        lambda dt: synthetic.conv2d_task(2, 20, 6, 7, 24, 1, 1, dt, residual=True, nhwc=True, input_scale=True),
        lambda dt: synthetic.conv2d_task(2, 12, 7, 6, 10, 3, 3, dt, pad=1, activation="silu", nhwc=True,
                                         input_scale=True),
    ],
}


def _valid(variant: Variant, config: dict[str, Any], task: Task) -> bool:
    return BACKEND.check(Candidate.of(variant, config), task) is None


def default_config(variant: Variant, task: Task, problem: Callable[[Candidate, Task], str | None] = BACKEND.check
                   ) -> dict[str, Any] | None:
    """DEFAULT, or where it cannot serve the task its first valid one-parameter neighbour (valid:
    `problem` finds none; by default what runs here)."""
    default = dict(variant.default)
    neighbours = [{**default, name: value} for name, choices in variant.space.items() for value in choices]
    return next((c for c in [default, *neighbours] if problem(Candidate.of(variant, c), task) is None), None)


def sampled_config(variant: Variant, task: Task, avoid: dict[str, Any], seed: int) -> dict[str, Any] | None:
    """A valid config drawn from the variant's SPACE, other than `avoid`."""
    rng = random.Random(seed)
    for _ in range(SAMPLE_TRIES):
        sampled = {name: rng.choice(choices) for name, choices in variant.space.items()}
        if sampled != avoid and _valid(variant, sampled, task):
            return sampled
    return None


def run_gate(variant: Variant, config: dict[str, Any], task: Task, gate: GateOptions = GATE) -> None:
    if BACKEND.on_gpu:
        artifact = BACKEND.compile(Candidate.of(variant, config), task)
    else:
        artifact = Artifact(backend="triton", variant=variant.name, config=config, source=variant.source)
    verdict = verify(BACKEND, BACKEND.load(artifact, task), task, variant.precision, gate)
    assert verdict.passed, f"{variant.name} {config} on {task.label}: {verdict.reason}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_matches_reference(name: str, dtype: str) -> None:
    variant = VARIANTS[name]
    refusal = BACKEND.check(Candidate.of(variant, variant.default), CASES[variant.kind][0](dtype))
    if refusal and "applies to float32 inputs only" in refusal:  # tf32, tf32x3: products of fp32 inputs
        assert dtype != "float32", refusal
        pytest.skip(refusal)
    if refusal and "float16/bfloat16" in refusal:  # gemm_wgmma: half-precision products only
        assert dtype == "float32", refusal
        pytest.skip(refusal)
    served = 0
    sampled_done = False
    needs_gpu = None
    for index, build in enumerate(CASES[variant.kind]):
        task = build(dtype)
        first = default_config(variant, task)
        if first is None:
            servable = default_config(variant, task, BACKEND.target_problem)
            if servable is not None:  # a config the target takes that the interpreter cannot run (Gluon)
                needs_gpu = BACKEND.check(Candidate.of(variant, servable), task)
            continue
        run_gate(variant, first, task)
        served += 1
        if not sampled_done:  # one sampled config per variant and dtype keeps the interpreter time down
            other = sampled_config(variant, task, first, seed=index)
            if other is not None:
                run_gate(variant, other, task)
                served += 1
                sampled_done = True
    if served == 0 and needs_gpu and needs_gpu.startswith("needs a GPU"):  # cross-compiled in test_triton_backend
        assert not torch.cuda.is_available(), needs_gpu
        pytest.skip(needs_gpu)
    assert served >= 2, f"{name} served fewer than two (task, config) pairs in {dtype}"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", ["attention_flash", "attention_splitkv"])
def test_attention_packs_a_groups_query_heads_into_one_tile(name: str, dtype: str) -> None:
    """PACK_GQA: a tile's rows are a key/value head's group of query heads at fewer positions each
    (row r: position r // group of head r % group), so causal edges, sequence ends, folded head
    splits, a mask shared by the heads and (attention_splitkv) each split's per-head slots must
    hold per row; what cannot be packed is refused."""
    variant = VARIANTS[name]
    packed = {**variant.default, "PACK_GQA": True, "BLOCK_N": 16}
    for task, block_m in ((synthetic.attention_task(2, 4, 19, 16, dtype, kv_heads=2, causal=True), 16),
                          (synthetic.attention_task(1, 8, 13, 16, dtype, seq_kv=21, kv_heads=2, mask=True), 32),
                          (synthetic.attention_task(2, 4, 9, 16, dtype, kv_heads=1, packed_heads=True,
                                                    causal=True), 16),
                          (synthetic.attention_task(2, 8, 3, 16, dtype, seq_kv=40, kv_heads=2, causal=True), 16)):
        run_gate(variant, {**packed, "BLOCK_M": block_m}, task)
    refused = {why: BACKEND.check(Candidate.of(variant, {**packed, "BLOCK_M": 16}), task) for why, task in {
        "one head a key/value head": synthetic.attention_task(1, 4, 16, 16, dtype),
        "groups of 3 in 16 rows": synthetic.attention_task(1, 6, 16, 16, dtype, kv_heads=2),
        "a mask per head": synthetic.attention_task(1, 4, 16, 16, dtype, kv_heads=2, mask=True,
                                                    mask_shape=(1, 4, 16, 16))}.items()}
    assert all(reason and "PACK_GQA" in reason for reason in refused.values()), refused
    # a decoding step (one query a head) is packed whenever a tile height holds whole groups: unpacked,
    # each tile reads its key/value head once for every query head that shares it
    decoding = _offered(BACKEND, synthetic.attention_task(2, 8, 1, 16, dtype, seq_kv=40, kv_heads=2))
    assert decoding[name].space["PACK_GQA"] == (True,)
    groups_of_3 = _offered(BACKEND, synthetic.attention_task(2, 6, 1, 16, dtype, seq_kv=40, kv_heads=2))
    assert groups_of_3[name].space["PACK_GQA"] == (False, True)  # no tile of 16-128 rows holds whole groups


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_attention_runs_its_heaviest_causal_blocks_first(dtype: str) -> None:
    """HEAVY_FIRST: query blocks in reverse over a swapped grid; every block still lands on its own
    rows and heads (several blocks and heads, a partial last block, a causal offset with more keys
    than queries, packed heads). Without a causal mask no order is heavier: it is pinned off."""
    variant = VARIANTS["attention_flash"]
    config = {**variant.default, "HEAVY_FIRST": True, "BLOCK_M": 16, "BLOCK_N": 16}
    for task, pack in ((synthetic.attention_task(2, 3, 37, 16, dtype, causal=True, mask=True), False),
                       (synthetic.attention_task(1, 2, 21, 16, dtype, seq_kv=50, causal=True), False),
                       (synthetic.attention_task(2, 4, 19, 16, dtype, kv_heads=2, causal=True), True)):
        run_gate(variant, {**config, "PACK_GQA": pack}, task)
    offered = _offered(BACKEND, synthetic.attention_task(1, 2, 21, 16, dtype, mask=True))
    assert offered["attention_flash"].space["HEAVY_FIRST"] == (False,)


def test_attention_keeps_its_grid_within_cuda_limits() -> None:
    """A grid's second axis holds at most 65535 programs: with more (batch x heads) programs than
    that the heads go on the first axis (HEAVY_FIRST; pinned on without a causal mask), a causal
    order that would put them second is refused, and so is attention_splitkv there, whose merge
    pass has a program for every (batch, head) even where its split pass packs them."""
    wide = synthetic.attention_task(4097, 16, 1, 16, "float16", seq_kv=8)  # 65552 (batch, head) pairs
    offered = _offered(BACKEND, wide)
    assert offered["attention_flash"].space["HEAVY_FIRST"] == (True,)
    splitkv = VARIANTS["attention_splitkv"]
    reason = BACKEND.check(Candidate.of(splitkv, splitkv.default), wide)
    assert reason is not None and "65535" in reason
    grouped = synthetic.attention_task(4097, 16, 1, 16, "float16", seq_kv=8, kv_heads=4)
    packed = {**splitkv.default, "PACK_GQA": True}  # its split pass fits; its merge pass's grid does not
    reason = BACKEND.check(Candidate.of(splitkv, packed), grouped)
    assert reason is not None and "65535" in reason
    causal = synthetic.attention_task(4097, 16, 1, 16, "float16", seq_kv=8, causal=True)
    flash = VARIANTS["attention_flash"]
    reason = BACKEND.check(Candidate.of(flash, {**flash.default, "HEAVY_FIRST": False}), causal)
    assert reason is not None and "65535" in reason
    assert BACKEND.check(Candidate.of(flash, {**flash.default, "HEAVY_FIRST": True}), causal) is None


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", ["attention_flash", "attention_splitkv"])
def test_attention_soft_caps_its_logits(name: str, dtype: str) -> None:
    """Gemma 2's softcap * tanh(scale q k^T / softcap) in the scores, before the causal edge or
    the mask, on logits well past the cap (the gate's inputs include scaled ones); the Gluon
    schedule, which does not take it, refuses."""
    variant = VARIANTS[name]
    for task in (synthetic.attention_task(2, 4, 19, 16, dtype, kv_heads=2, causal=True, softcap=2.0),
                 synthetic.attention_task(1, 2, 13, 16, dtype, seq_kv=37, mask=True, packed_heads=True,
                                          softcap=0.5)):
        run_gate(variant, default_config(variant, task), task)
    task = synthetic.attention_task(1, 2, 64, 64, "float16", causal=True, softcap=50.0)
    pingpong = VARIANTS["attention_pingpong"]
    reason = BACKEND.check(Candidate.of(pingpong, pingpong.default), task)
    assert reason is not None and "soft-capped" in reason


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", ["attention_flash", "attention_splitkv", "attention_flash_tf32x3",
                                  "attention_pingpong"])
def test_attention_averages_a_row_its_mask_hides(name: str, dtype: str) -> None:
    """A mask of transformers' finfo.min hides keys; where it hides a row's every key (a left-padded
    position) the model averages the values. The kernels scale the mask to log2 units, where
    float32's lowest overflows to -inf: without a floor such a row came out 0/0 (NaN), and NaN rows
    poison every query of the next layer through their keys. (Gluon's schedule runs on a GPU only.)"""
    if not {"attention_flash_tf32x3": dtype == "float32",
            "attention_pingpong": dtype == "float16" and BACKEND.on_gpu}.get(name, True):
        pytest.skip(f"{name} does not run {dtype} here")
    variant = VARIANTS[name]
    padding_mask = GateOptions(seeds=(7,), distributions=("negative",))  # verify._padding_mask
    for task in (synthetic.attention_task(2, 2, 9, 16, dtype, seq_kv=21, mask=True, causal=True),
                 synthetic.attention_task(1, 2, 17, 16, dtype, mask=True)):
        config = default_config(variant, task)
        assert config is not None, f"{name} serves no config on {task.label}"
        run_gate(variant, config, task, padding_mask)


def test_every_matrix_kind_has_variants() -> None:
    kinds = {v.kind for v in VARIANTS.values()}
    assert kinds == set(MATRIX_KINDS)
    assert sum(v.kind == "gemm" for v in VARIANTS.values()) >= 4


@pytest.mark.parametrize("reduce", ["step", "end"])
def test_gemv_reduces_over_k_either_way(reduce: str) -> None:
    """Both places of the K reduction (each step, or once after the loop) give the same GEMV,
    split or not, on a transposed weight whose K is no multiple of the tile."""
    variant = VARIANTS["gemm_gemv"]
    task = synthetic.gemm_task(3, 40, 300, "float16", trans_b=True, bias=True, activation="gelu")
    for split_k in (1, 2):
        config = {**variant.default, "BLOCK_N": 8, "BLOCK_K": 64, "SPLIT_K": split_k, "REDUCE": reduce}
        assert _valid(variant, config, task)
        run_gate(variant, config, task)


def test_gemv_tensor_core_rows_refuse_the_lane_reduction() -> None:
    variant = VARIANTS["gemm_gemv"]
    task = synthetic.gemm_task(16, 64, 64, "float16", trans_b=True)
    reason = BACKEND.check(Candidate.of(variant, {**variant.default, "REDUCE": "end", "SPLIT_K": 1}), task)
    assert reason is not None and "tensor cores" in reason
    assert _valid(variant, {**variant.default, "REDUCE": "step", "SPLIT_K": 1}, task)


def _offered(backend: Any, task: Task) -> dict[str, Variant]:
    return {v.name: v for v in backend.variants(task)}


def test_a_task_and_target_pin_the_choices_they_decide() -> None:
    """fixed(task, target): a choice no configuration could use here is not in the space the search
    draws from (nor flipped to after each new best); where the task could use it, it stays."""
    plain = _offered(BACKEND, synthetic.attention_task(1, 4, 19, 16, "float16"))
    grouped = _offered(BACKEND, synthetic.attention_task(1, 4, 19, 16, "float16", kv_heads=2))
    for name in ("attention_flash", "attention_splitkv"):
        assert plain[name].space["PACK_GQA"] == (False,) and grouped[name].space["PACK_GQA"] == (False, True)
    assert grouped["attention_flash"].space["TMA"] == (False, True)
    on_ampere = _offered(get_backend(load_target("a100")), synthetic.attention_task(1, 4, 19, 16, "float16"))
    assert on_ampere["attention_flash"].space["TMA"] == (False,)
    skinny, tall = (synthetic.gemm_task(m, 64, 64, "float16", trans_b=True) for m in (4, 16))
    assert _offered(BACKEND, skinny)["gemm_gemv"].space["REDUCE"] == ("step", "end")
    assert _offered(BACKEND, tall)["gemm_gemv"].space["REDUCE"] == ("step",)
    misaligned = _offered(BACKEND, synthetic.gemm_task(37, 50, 70, "float16", bias=True))
    assert misaligned["gemm_tma_staged"].space["TMA_STORE"] == (False,)
    assert _offered(BACKEND, synthetic.gemm_task(37, 64, 70, "float16"))["gemm_tma_staged"].space["TMA_STORE"] == (
        False, True)


@pytest.mark.parametrize("decides, pinned", [
    ("return {'BLOCK_N': 32}", (32,)),
    ("return {'NOT_A_PARAMETER': 1}", None),  # a proposal's mistakes leave its space as it was
    ("raise ValueError('no')", None),
])
def test_a_proposed_module_pins_only_what_its_fixed_decides(decides: str, pinned: tuple | None) -> None:
    base = VARIANTS["gemm_tiled"]
    proposal = dataclasses.replace(base, name="gemm_tiled~llm-1", origin="llm",
                                   source=f"{base.source}\n\ndef fixed(task, target):\n    {decides}\n")
    narrowed = BACKEND.for_task(proposal, synthetic.gemm_task(37, 50, 70, "float16"))
    assert narrowed.space["BLOCK_N"] == (pinned or base.space["BLOCK_N"])
    assert narrowed.default["BLOCK_N"] == (pinned[0] if pinned else base.default["BLOCK_N"])


def test_persistent_gemms_run_one_program_an_sm_of_any_count() -> None:
    """NUM_SMS is the target's SM count, also where SPACE does not list it (an H100 PCIe's 114):
    the persistent GEMMs are offered there, pinned to it, and their default passes the check."""
    profile = dataclasses.replace(load_target("h100").profile, cores=114)
    backend = get_backend(dataclasses.replace(load_target("h100"), profile=profile))
    task = synthetic.gemm_task(256, 256, 128, "float16", trans_b=True)
    offered = _offered(backend, task)
    for name in ("gemm_persistent", "gemm_tma"):
        assert offered[name].space["NUM_SMS"] == (114,) and offered[name].default["NUM_SMS"] == 114
        assert backend.check(Candidate.of(offered[name], offered[name].default), task) is None
    assert _offered(BACKEND, task)["gemm_tma"].space["NUM_SMS"] == (132,)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu", "sigmoid", "tanh"])
def test_epilogue_activations_hold_float32_accuracy(activation: str) -> None:
    """The fused epilogue's activations are approximations (A&S's erf, exp-based tanh and sigmoid, 1/d
    as rsqrt(d)^2), rewritten for fewer instructions; a slip in a folded constant would hide
    under the gate's tolerance, so each is checked alone: x through a float32 GEMM by the
    identity, against the baselines' torch activation in float64, within 1e-6 x max(1, |x|) over
    [-12, 12], and finite out to 1e30."""
    variant = VARIANTS["gemm_tiled"]
    width = 64
    x = np.concatenate([np.linspace(-12.0, 12.0, 47 * width), [-1e30, -1e6, 1e6, 1e30] * (width // 4)])
    x = x.astype(np.float32).reshape(-1, width)
    task = synthetic.gemm_task(x.shape[0], width, width, "float32", activation=activation)
    artifact = Artifact(backend="triton", variant=variant.name, config=variant.default, source=variant.source)
    out = BACKEND.empty(task.outputs[0], math.nan)
    BACKEND.load(artifact, task)([BACKEND.to_device(x), BACKEND.to_device(np.eye(width, dtype=np.float32))], [out])
    got = BACKEND.to_host(out).astype(np.float64)
    want = baselines._ACTIVATIONS[activation](torch.from_numpy(x.astype(np.float64))).numpy()
    error = np.abs(got - want) / np.maximum(1.0, np.abs(x))
    assert np.isfinite(got).all() and error.max() <= 1e-6, (activation, float(error.max()))


@pytest.mark.parametrize("name, task", [
    ("gemm_tma", synthetic.gemm_task(300, 200, 136, "float16", trans_b=True, bias=True, activation="gelu",
                                     residual=True)),
    ("gemm_tma_staged", synthetic.gemm_task(37, 48, 70, "float16", bias=True, activation="relu", batch=(2,))),
])
def test_tma_store_epilogue_clips_the_edge_tiles(name: str, task: Task) -> None:
    """TMA_STORE writes whole tiles through the output's descriptor, which must clip the rows and
    columns past the edges (none of these sizes is a multiple of a tile); the epilogue still fuses."""
    variant = VARIANTS[name]
    for block in (64, 128):
        config = {**variant.default, "TMA_STORE": True, "BLOCK_M": block, "BLOCK_N": block, "FLATTEN": block == 64}
        assert _valid(variant, config, task)
        run_gate(variant, config, task)


def test_tma_gemm_runs_its_last_rows_in_half_tiles() -> None:
    """HALF_TAIL: 1673 rows in 128-high tiles are 14 x 10 = 140 tiles for 132 programs (two rounds
    for 8 of them); the split keeps 13 row blocks whole (130 tiles) and runs the last 9 rows as
    ten 64-high tiles, dealt on after the full ones. The epilogue fuses in both phases."""
    variant = VARIANTS["gemm_tma"]
    task = synthetic.gemm_task(1673, 640, 72, "float16", trans_b=True, bias=True, activation="gelu", residual=True)
    module = kernel_module(variant, interpret=True)
    for store in (False, True):
        config = {**variant.default, "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "HALF_TAIL": True,
                  "TMA_STORE": store, "num_warps": 4}
        assert module._half_tail_split(1673, 640, config) == 1664
        assert _valid(variant, config, task)
        run_gate(variant, config, task)


def test_half_tail_split_evens_out_the_waves() -> None:
    """4096 x 768 in 128 x 128 tiles: 192 tiles take two rounds on 132 SMs; 22 row blocks whole
    (132 tiles) and 20 half ones (120 tiles) take 1.5. Where nothing evens out, the option is refused."""
    variant = VARIANTS["gemm_tma"]
    module = kernel_module(variant, interpret=True)
    config = {**variant.default, "BLOCK_M": 128, "BLOCK_N": 128, "HALF_TAIL": True}
    assert module._half_tail_split(4096, 768, config) == 22 * 128
    assert module._heaviest_share(132, 120, 132) == 1.5 and module._heaviest_share(192, 0, 132) == 2.0
    rng = random.Random(0)
    for _ in range(300):  # the closed form against dealing the tiles out one by one
        programs, full, half = rng.choice((5, 58, 132)), rng.randint(0, 400), rng.randint(1, 400)
        shares = [0.0] * programs
        for index in range(full + half):
            shares[index % programs] += 1.0 if index < full else 0.5
        assert module._heaviest_share(full, half, programs) == max(shares), (full, half, programs)
    for task, change in ((synthetic.gemm_task(4096, 4096, 64, "float16"), {"BLOCK_N": 256}),  # 4 rounds exactly
                         (synthetic.gemm_task(4096, 768, 64, "float16"), {"BLOCK_M": 64})):
        reason = BACKEND.check(Candidate.of(variant, {**config, **change}), task)
        assert reason is not None and "HALF_TAIL" in reason


def test_tma_store_refuses_misaligned_output_rows() -> None:
    variant = VARIANTS["gemm_tma_staged"]
    task = synthetic.gemm_task(37, 50, 70, "float16", bias=True)
    reason = BACKEND.check(Candidate.of(variant, {**variant.default, "TMA_STORE": True}), task)
    assert reason is not None and "TMA_STORE" in reason
    assert _valid(variant, variant.default, task)


@pytest.mark.parametrize("task", [
    synthetic.attention_task(2, 1, 9, 24, "float16", seq_kv=21, mask=True, causal=True),  # D and Sk tails
    synthetic.attention_task(1, 2, 5, 24, "float16", seq_kv=70, causal=True, packed_heads=True),
    synthetic.attention_task(1, 2, 24, 16, "float16", seq_kv=40, k_transposed=True, mask=True),
], ids=["tails", "packed-heads", "k-transposed"])
def test_attention_reads_k_and_v_through_descriptors(task: Task) -> None:
    """TMA=True: K and V tiles through 4-D descriptors (a transposed K through its own layout),
    zero-filled past Sk and D, on several query and key blocks."""
    variant = VARIANTS["attention_flash"]
    for block_m, block_n in ((16, 16), (64, 32)):
        config = {**variant.default, "TMA": True, "BLOCK_M": block_m, "BLOCK_N": block_n}
        assert _valid(variant, config, task)
        run_gate(variant, config, task)


def test_attention_tma_refuses_keys_read_across_rows() -> None:
    variant = VARIANTS["attention_flash"]
    task = synthetic.attention_task(1, 2, 17, 8, "float16", k_transposed=True, mask=True)  # K rows of 17
    reason = BACKEND.check(Candidate.of(variant, {**variant.default, "TMA": True}), task)
    assert reason is not None and "16-byte" in reason


@pytest.mark.parametrize("dtype", ("float32", "float16"))
def test_nhwc_conv_walks_filter_rows_where_a_tap_has_few_channels(dtype: str) -> None:
    """TAP_ROWS: a K step is a run of a filter row's KW x C values (a 3-channel stem), with pads
    cutting runs at both image edges, strides, and a row longer than one BLOCK_K."""
    variant = VARIANTS["conv2d_nhwc"]
    task = synthetic.conv2d_task(2, 3, 11, 13, 10, 7, 7, dtype, stride=2, pad=3, activation="relu", nhwc=True)
    for block_k in (16, 32):
        config = {**variant.default, "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": block_k, "TAP_ROWS": True}
        assert _valid(variant, config, task)
        run_gate(variant, config, task)
    assert not _valid(variant, {**variant.default, "TAP_ROWS": True}, synthetic.conv2d_task(
        1, 64, 8, 8, 64, 3, 3, dtype, pad=1, nhwc=True))  # a 64-channel tap fills BLOCK_K already


# K steps per case at BLOCK_K 16: 18 (two channel blocks of 20, the second a K tail, x 9 taps), 18 in each of two
# groups, 14 (TAP_ROWS: two runs of a 7 x 3 filter row x 7 rows); SPLIT_K 4 splits them 5+5+5+3 and 4+4+4+2
SPLIT_K_CASES = {
    "residual_relu": (lambda dt: synthetic.conv2d_task(2, 20, 6, 7, 33, 3, 3, dt, pad=1, residual=True,
                                                       activation="relu", nhwc=True), False),
    "groups_bias_residual_sigmoid": (lambda dt: synthetic.conv2d_task(
        1, 40, 7, 6, 12, 3, 3, dt, stride=(1, 2), pad=(2, 1), dilation=(2, 1), group=2, residual=True,
        activation="sigmoid", nhwc=True), False),
    "tap_rows_relu": (lambda dt: synthetic.conv2d_task(2, 3, 11, 13, 10, 7, 7, dt, stride=2, pad=3,
                                                       activation="relu", nhwc=True), True),
    # a squeeze-excite gate on x read along filter rows (its channel: a run's value index mod C)
    "gated_tap_rows": (lambda dt: synthetic.conv2d_task(2, 3, 11, 13, 10, 7, 7, dt, stride=2, pad=3,
                                                        nhwc=True, input_scale=True), True),
}


@pytest.mark.parametrize("case", sorted(SPLIT_K_CASES))
@pytest.mark.parametrize("dtype", ("float32", "float16"))
def test_nhwc_conv_splits_k_and_applies_the_epilogue_once(dtype: str, case: str) -> None:
    """SPLIT_K: each program sums a contiguous range of the K steps into an fp32 workspace and a
    second pass adds the partials and applies act(conv + bias + residual) once; tiles of 32 leave
    tails in pixels (84, 42, 84) and channels (33, 6 per group, 10), and 4 splits do not divide K."""
    variant = VARIANTS["conv2d_nhwc"]
    build, tap_rows = SPLIT_K_CASES[case]
    task = build(dtype)
    config = {**variant.default, "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "TAP_ROWS": tap_rows,
              "SPLIT_K": 4}  # uneven splits: the last one holds fewer K steps
    assert _valid(variant, config, task)
    run_gate(variant, config, task)


def test_nhwc_conv_refuses_splits_left_without_k_steps() -> None:
    variant = VARIANTS["conv2d_nhwc"]
    one_step = synthetic.conv2d_task(1, 20, 6, 6, 16, 1, 1, "float16", nhwc=True)  # 1x1, 20 channels: 1 step of 32
    nine_steps = synthetic.conv2d_task(1, 12, 6, 6, 16, 3, 3, "float16", pad=1, nhwc=True)  # 9 taps x 1 block
    base = {**variant.default, "BLOCK_K": 16}
    assert _valid(variant, {**base, "BLOCK_K": 32, "SPLIT_K": 1}, one_step)
    reason = BACKEND.check(Candidate.of(variant, {**base, "BLOCK_K": 32, "SPLIT_K": 2}), one_step)
    assert reason is not None and "SPLIT_K=2" in reason and "(1 K steps)" in reason
    assert _valid(variant, {**base, "SPLIT_K": 2}, nine_steps)  # 5 + 4
    reason = BACKEND.check(Candidate.of(variant, {**base, "SPLIT_K": 4}), nine_steps)  # 3 + 3 + 3 + 0
    assert reason is not None and "empty" in reason and "(9 K steps)" in reason


def test_nhwc_conv_splits_k_only_where_the_tiles_leave_cores_idle() -> None:
    """ResNet-50's 3x3 512-channel conv at 7x7, batch 32: 25 x 4 = 100 tiles of 64 x 128 for 132 SMs,
    a split can help; at 56x56 the 1,568 tiles fill the chip and a split only adds its second pass."""
    variant = VARIANTS["conv2d_nhwc"]
    config = {**variant.default, "BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 2}
    deep = synthetic.conv2d_task(32, 512, 7, 7, 512, 3, 3, "float16", pad=1, nhwc=True)
    wide = synthetic.conv2d_task(32, 64, 56, 56, 64, 3, 3, "float16", pad=1, nhwc=True)
    assert _valid(variant, config, deep)
    reason = BACKEND.check(Candidate.of(variant, config), wide)
    assert reason is not None and "fill the 132 cores" in reason
    assert _valid(variant, {**config, "SPLIT_K": 1}, wide)
