"""onnx.backend.test's node cases, pointed at the numpy executor for every supported op.

Every case of a supported op must pass, except the cases below, each with its reason. A listed
case that starts passing fails the test too, so the list never goes stale.
docs/conformance.md is this run's report (with the real-model results added):
`python -m portkern.executor --conformance docs/conformance.md --with-models`.
"""
from __future__ import annotations

import pytest

from portkern.executor import SUPPORTED_OPS, CaseResult, conformance_markdown, conformance_results

# reason -> the cases it covers (each name explicit, so a renamed or new case shows up)
_SKIPS_BY_REASON: dict[str, list[str]] = {
    # random drops: the expected output comes from numpy's global RNG, not reproducible here
    "training-mode dropout with ratio > 0 is random": [
        "test_training_dropout_default", "test_training_dropout_default_mask",
        "test_training_dropout", "test_training_dropout_mask"],
    # the executor's env holds numpy tensors only
    "sequence- or optional-typed value (the IR has tensors only)": [
        "test_identity_sequence", "test_identity_opt"],
    # function bodies built on control flow (subgraph attributes are not supported)
    "expanded body uses Loop (control flow)": [
        "test_range_float_type_positive_delta_expanded",
        "test_range_float16_type_positive_delta_expanded",
        "test_range_bfloat16_type_positive_delta_expanded",
        "test_range_int32_type_negative_delta_expanded"],
    "expanded body uses If (control flow)": [
        "test_affine_grid_2d_expanded", "test_affine_grid_2d_align_corners_expanded",
        "test_affine_grid_3d_expanded", "test_affine_grid_3d_align_corners_expanded"],
    "expanded body uses Scan (control flow)": [
        f"test_linear_attention_{variant}_expanded" for variant in (
            "linear", "gated", "gated_per_head_decay", "delta", "gated_delta",
            "gated_delta_beta_scalar", "gated_delta_gqa", "gated_delta_mqa", "decode_step",
            "prefill_with_past", "no_past_explicit_zeros", "explicit_scale", "fp16",
            "linear_t1_no_past")],
    # float8e8m0 is an opset-24 scale type with its own round_mode: not a compute dtype here
    "float8e8m0 round_mode casts are not implemented": [
        "test_cast_e8m0_FLOAT_to_FLOAT8E8M0", "test_cast_e8m0_FLOAT16_to_FLOAT8E8M0"],
}
SKIPPED: dict[str, str] = {case: reason for reason, cases in _SKIPS_BY_REASON.items()
                           for case in cases}

# the ops the rest of portkern relies on (task references, the models it tunes)
CORE_OPS = {"MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg",
            "Exp", "Log", "Erf", "Tanh", "Sigmoid", "Relu", "Gelu", "Softmax",
            "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "Transpose", "Reshape",
            "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization",
            "Flatten", "Cast", "Identity", "Constant"}


@pytest.fixture(scope="module")
def results() -> list[CaseResult]:
    return conformance_results()


def test_every_case_of_a_supported_op_passes(results: list[CaseResult]) -> None:
    unexpected = [f"{r.case} ({r.op}): {r.status} {r.detail}" for r in results
                  if r.status != "pass" and r.case not in SKIPPED]
    stale = [r.case for r in results if r.status == "pass" and r.case in SKIPPED]
    assert not unexpected, "failing conformance cases:\n" + "\n".join(unexpected)
    assert not stale, f"these now pass, remove them from SKIPPED: {stale}"
    assert set(SKIPPED) <= {r.case for r in results}, "SKIPPED names a case that does not exist"


def test_core_ops_are_supported_and_covered(results: list[CaseResult]) -> None:
    assert CORE_OPS <= SUPPORTED_OPS
    passing = {r.op for r in results if r.status == "pass"}
    assert CORE_OPS <= passing, f"core ops without a passing case: {CORE_OPS - passing}"
    assert len(results) > 1000


def test_report_lists_every_op_and_failure(results: list[CaseResult]) -> None:
    report = conformance_markdown(results)
    passed = sum(r.status == "pass" for r in results)
    assert f"**{passed} of {len(results)} cases pass**" in report
    for op in {r.op for r in results}:
        assert f"\n| {op} |" in report
    for case in SKIPPED:
        assert case in report
