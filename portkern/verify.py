"""The verification gate: no kernel's time counts until it passes. One verifier for every backend.

Generated kernels are known to fool harnesses (stale buffers, caches keyed by pointer or shape,
in-place input edits, lower precision than promised, partial writes). Each check below closes one
of those doors; the verdict keeps the evidence (seeds, distributions, errors, tolerances).

  1. float64 reference (the task's own subgraph, by Backend.reference: the host executor, or a
     backend's float64 runtime of the same ONNX semantics), tolerance from the declared precision
     and dtype; an output over it is held instead to a multiple of the problem's own sensitivity at
     that dtype (an ill-conditioned check, e.g. attention with huge logits, where correct float32
     arithmetic misses the tolerance), which still rejects narrower arithmetic
  2. fresh random inputs per check, several seeds and distributions, never zeros; then new values
     written in place at the same addresses (pointer/shape caches return stale answers and fail)
  3. outputs poisoned (NaN) in fresh memory each run, with the reference output alive on the device
  4. inputs compared with what was written, before and after: unchanged; outputs must not alias inputs
  5. boundary shapes: a kernel is verified on, and packed for, exactly one workload key (shapes
     included), so it never serves a shape the gate did not run; the variant tests run every
     variant over sizes that are not multiples of its tiles
  6. two runs on the same inputs agree (races and stale reads move results)
  9. a task is admitted only if its reference varies with its inputs
 Timing below the roofline floor (7) is checked by `floor_violation`; static checks and process
 isolation (8) live in kernel_module and the search worker.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

import ml_dtypes
import numpy as np

from .backends.base import Backend, Program
from .hwprofile import usable_cores
from .ir import TensorSpec
from .search.records import Verdict
from .tasks import Task

T = TypeVar("T")

# Relative L2 error allowed, by declared precision and by output dtype (the looser one applies).
TOLERANCE = {
    # tf32: 10-bit mantissa inputs; measured 7.9e-4 rel L2 on an H200 (bmm, K=40), so 3e-4 fails real TF32
    "fp64": 1e-12, "fp32": 1e-5, "tf32": 2e-3, "fp16": 2e-3, "bf16": 1e-2,
    "float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2,
}
# A local error (one bad tile, a wrong tail) hides in the L2 norm; the largest single error,
# relative to the output's scale, is held to this multiple of the L2 tolerance.
MAX_ERROR_FACTOR = 20.0
# Some checks are ill-conditioned at the task's precision: attention on the 'large' inputs has logits
# near 900, and a plain float32 evaluation misses its float64 reference by up to 1.5e-5 rel L2 (numpy,
# 2026-12-04), over the 1e-5 of fp32. Where an output fails its tolerance, it is held instead to
# SENSITIVITY_FACTOR x the problem's own sensitivity: how far the float64 reference moves when every
# float input moves by up to one unit roundoff of its dtype. A float32 evaluation's error measured 4-30x
# that on attention (normal, negative, large) and 7-70x on GEMMs, whose sensitivity stays far below
# their tolerance; a kernel computing in a narrower precision misses by ~1e-3, far beyond it.
SENSITIVITY_FACTOR = 32.0
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
FLOOR_SLACK = 0.9  # a time under 90% of the floor is impossible given measured ceilings


@dataclass(frozen=True)
class GateOptions:
    seeds: tuple[int, ...] = (11, 23, 47)
    distributions: tuple[str, ...] = ("normal", "negative", "large")


def tolerance_for(precision: str, task: Task) -> float:
    out_dtype = task.outputs[0].dtype
    return max(TOLERANCE.get(precision, TOLERANCE["fp32"]), TOLERANCE.get(out_dtype, 0.0))


def make_inputs(task: Task, seed: int, distribution: str) -> list[np.ndarray]:
    """Fresh random inputs; 'large' stresses softmax (large logits) and norms (large mean). A large
    input is drawn in chunks of fixed size, each by its own generator spawned from the seed (the
    same values on any host), several at once: one thread drew a 2048x5632x2048 GEMM's three
    operands in 0.66 s, and the gate draws three sets."""
    rng = np.random.default_rng(seed)
    padded = task.kind == "attention" and task.attr("mask", False) and distribution == "negative"
    return [_padding_mask(spec, rng) if padded and index == 3 else _draw(spec, rng, distribution, task.kind)
            for index, spec in enumerate(task.inputs)]


def _padding_mask(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """An attention mask as models build it: 0 where a key is seen, the dtype's lowest finite value
    where it is hidden (transformers' finfo.min), about a quarter of the keys hidden and, where the
    mask has a row per query, every key of the first (a left-padded position), which the model
    averages over all its keys."""
    hidden = rng.random(spec.shape) < 0.25
    if len(spec.shape) >= 2 and spec.shape[-2] > 1:  # not an encoder's (B, 1, 1, Sk) key mask
        hidden[..., 0, :] = True
    dtype = np.dtype(_numpy_dtype(spec.dtype))
    return np.where(hidden, ml_dtypes.finfo(dtype).min, 0).astype(dtype)


_DRAW_CHUNK = 1 << 20


def _draw(spec: TensorSpec, rng: np.random.Generator, distribution: str, kind: str) -> np.ndarray:
    flat = np.empty(math.prod(spec.shape), np.dtype(_numpy_dtype(spec.dtype)))
    generators = rng.spawn(max(1, -(-flat.size // _DRAW_CHUNK)))

    def fill(index: int) -> None:
        part = flat[index * _DRAW_CHUNK:(index + 1) * _DRAW_CHUNK]
        part[...] = _values(generators[index], part.size, part.dtype, distribution, kind)
    _in_parallel(fill, range(len(generators)))
    return flat.reshape(spec.shape)


def _values(rng: np.random.Generator, size: int, dtype: np.dtype, distribution: str, kind: str) -> np.ndarray:
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=size)
    if dtype.kind == "b":
        return rng.random(size) < 0.5
    # drawn in float32 unless the task is float64: the draws cost half, and every narrower
    # dtype rounds them anyway
    draw = np.float64 if dtype == np.float64 else np.float32
    if distribution == "negative":
        values = rng.random(size, dtype=draw) * draw(3.5) - draw(3.0)  # uniform in [-3, 0.5)
    else:
        values = rng.standard_normal(size, dtype=draw)
    if distribution == "large":
        if kind in ("softmax", "attention"):
            values = values * 30.0
        elif kind in ("layernorm", "rmsnorm", "groupnorm"):
            values = values * 20.0 + 50.0
        else:
            values = values + 0.5
    values[values == 0] = 0.125  # never zeros
    return values


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        return ml_dtypes.bfloat16
    return name


def _poisoned(backend: Backend, spec: TensorSpec) -> Any:
    dtype = np.dtype(_numpy_dtype(spec.dtype))
    fill: float = float("nan") if dtype.kind == "f" or spec.dtype == "bfloat16" else np.iinfo(dtype).max
    return backend.empty(spec, fill)


def compare(out: np.ndarray, ref: np.ndarray, tol: float) -> dict[str, Any]:
    """Errors of one output against its float64 reference; the check's evidence."""
    # float64 for small outputs and tight tolerances; float32 (pairwise sums) keeps big ones cheap
    work = np.float64 if np.size(out) < (1 << 20) or tol < 1e-6 else np.float32
    out, ref_w = np.asarray(out), np.asarray(ref, dtype=work)
    if out.shape != ref_w.shape:
        return {"passed": False, "reason": f"shape {out.shape} != reference {ref_w.shape}"}
    sums = _error_sums(out.ravel(), ref_w.ravel(), work)
    if math.isfinite(sums.squared_error):  # a NaN or Inf anywhere on either side would make the sum one
        return _judge(out, ref_w, sums, np.ones((), dtype=bool), tol)
    # something non-finite, or squares past float32's range: the rare case, in float64
    out_w, ref_w = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    finite = np.isfinite(ref_w)
    bad = int(np.count_nonzero(finite & ~np.isfinite(out_w)))
    if bad:
        return {"passed": False, "reason": f"{bad} of {out.size} elements unwritten or non-finite (NaN/Inf)",
                "bad_elements": bad}
    if np.any(~finite & np.isfinite(out_w)):
        return {"passed": False, "reason": "finite output where the reference is NaN/Inf"}
    return _judge(out, ref_w, _error_sums(out_w[finite], ref_w[finite], np.float64), finite, tol)


@dataclass(frozen=True)
class _ErrorSums:
    squared_error: float
    max_error: float
    squared_reference: float
    max_reference: float


# A large output is compared in chunks, several at once: each chunk's difference stays in cache (one
# pass over memory, not four), and numpy releases the GIL. 6304x3072 float16 against float32: 62 ms
# in one pass, the gate compares six of them a trial.
_CHUNK = 1 << 18
_THREADS = min(8, usable_cores())
_pool: ThreadPoolExecutor | None = None


def _in_parallel(work: Callable[[int], T], items: Sequence[int]) -> list[T]:
    """work(item) for each item, on the gate's threads where there are several items."""
    global _pool
    if len(items) < 2 or _THREADS < 2:
        return [work(item) for item in items]
    if _pool is None:
        _pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="portkern-gate")
    return list(_pool.map(work, items))


def _error_sums(out: np.ndarray, ref: np.ndarray, work: Any) -> _ErrorSums:
    """Sums of squares and largest magnitudes of out - ref and of ref (flat arrays), in `work`."""
    def chunk(start: int) -> tuple[float, float, float, float]:
        o, r = out[start:start + _CHUNK], ref[start:start + _CHUNK]
        diff = np.subtract(o, r, dtype=work)
        with np.errstate(over="ignore", invalid="ignore"):
            return (float(np.dot(diff, diff)), _max_abs(diff), float(np.dot(r, r)), _max_abs(r))

    parts = _in_parallel(chunk, range(0, out.size, _CHUNK)) or [(0.0, 0.0, 0.0, 0.0)]
    return _ErrorSums(sum(p[0] for p in parts), max(p[1] for p in parts),
                      sum(p[2] for p in parts), max(p[3] for p in parts))


def _judge(out: np.ndarray, ref: np.ndarray, sums: _ErrorSums, finite: np.ndarray, tol: float) -> dict[str, Any]:
    """The verdict on the finite elements: relative L2 error and the largest single error."""
    scale = math.sqrt(sums.squared_reference) or 1.0
    rel_l2 = math.sqrt(sums.squared_error) / scale
    max_abs = sums.max_error
    norm_max = max_abs / (sums.max_reference or 1.0)
    result: dict[str, Any] = {"rel_l2": rel_l2, "max_abs": max_abs, "norm_max": norm_max, "tol": tol}
    if rel_l2 <= tol and norm_max <= tol * MAX_ERROR_FACTOR:
        result.update(passed=True, reason="")
        return result
    errors = np.where(finite, np.subtract(out, ref, dtype=ref.dtype), 0)
    worst = np.unravel_index(int(np.argmax(np.abs(errors))), out.shape)
    at = tuple(int(i) for i in worst)
    if rel_l2 > tol:
        reason = (f"relative L2 error {rel_l2:.3g} > {tol:.1g} "
                  f"(worst at {at}: got {float(out[worst]):.6g}, want {float(ref[worst]):.6g})")
    else:
        reason = (f"max error {max_abs:.3g} is {norm_max:.3g} of the output scale "
                  f"> {tol * MAX_ERROR_FACTOR:.1g} (at {at})")
    result.update(passed=False, reason=reason, worst_index=list(at))
    return result


def _norm(values: np.ndarray) -> float:
    """L2 norm without a squared temporary (a BLAS dot; float32 data is accumulated blockwise)."""
    return float(np.sqrt(np.dot(values, values))) if values.size else 0.0


def _max_abs(values: np.ndarray) -> float:
    return float(max(values.max(), -values.min())) if values.size else 0.0


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equal (NaNs with their payloads, signed zeros): one integer pass, where
    np.array_equal(equal_nan=True) masks and copies and costs seconds on a large output."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)))


def admit_task(task: Task, backend: Backend) -> str | None:
    """Check 9: a task whose reference ignores its inputs cannot tell a kernel from a constant."""
    first = backend.reference(task, make_inputs(task, 1, "normal"))
    second = backend.reference(task, make_inputs(task, 2, "normal"))
    if all(same_bits(a, b) for a, b in zip(first, second)):
        return "reference output does not vary with its inputs"
    return None


class _Failed(Exception):
    def __init__(self, check: dict[str, Any]) -> None:
        super().__init__(check["reason"])
        self.check = check


@dataclass(frozen=True)
class GateReferences:
    """What one gate run compares against, per check: its inputs' reference and the reference of
    the new values written in place. Computed before any kernel runs, so a trial can bound its
    kernel runs apart from them (a large task's reference costs seconds)."""

    checks: list[tuple[_Reference, _Reference]]

    @property
    def seconds(self) -> float:
        """What computing them took (cached or not): an output that misses its tolerance costs
        one more reference run of its set (its sensitivity), so at most this again."""
        distinct = {id(reference): reference for pair in self.checks for reference in pair}
        return sum(reference.seconds for reference in distinct.values())


def gate_references(backend: Backend, task: Task, options: GateOptions = GateOptions()) -> GateReferences:
    """The references `verify` needs for these options, from the cache or computed now."""
    inputs = list(zip(options.seeds, _cycle(options.distributions, len(options.seeds))))
    # each check's in-place values are the next check's inputs (their reference is needed anyway);
    # a single check makes a set of its own for it
    in_place = inputs[1:] + inputs[:1] if len(inputs) > 1 else [(seed + 1000, dist) for seed, dist in inputs]
    return GateReferences([(_references.get(backend, task, *now), _references.get(backend, task, *then))
                           for now, then in zip(inputs, in_place)])


def verify(backend: Backend, program: Program, task: Task, precision: str,
           options: GateOptions = GateOptions(), references: GateReferences | None = None) -> Verdict:
    """Run the gate on a loaded program (on `references`, computed from `options` if not given).
    Exceptions from the program are verdicts, not crashes."""
    tol = tolerance_for(precision, task)
    checks: list[dict[str, Any]] = []
    verdict = Verdict(passed=False, reason="", precision=precision, tolerance={"rel_l2": tol,
                      "norm_max": tol * MAX_ERROR_FACTOR}, checks=checks)
    if references is None:
        references = gate_references(backend, task, options)
    try:
        for reference, fresh in references.checks:
            checks.extend(_check_one(backend, program, task, tol, reference, fresh))
    except _Failed as failed:
        checks.append(failed.check)
        verdict.reason = failed.check["reason"]
        return verdict
    except Exception as exc:  # a crash in the kernel is evidence, not a harness failure
        verdict.reason = f"runtime error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return verdict
    verdict.passed = True
    return verdict


def _cycle(items: Sequence[str], n: int) -> list[str]:
    return [items[i % len(items)] for i in range(n)]


def _run_once(backend: Backend, program: Program, task: Task, inputs: list[Any], reference: _Reference,
              label: dict[str, Any]) -> list[np.ndarray]:
    """One run on fresh poisoned outputs; the reference's inputs are what the device inputs must
    still hold after it."""
    outputs = [_poisoned(backend, spec) for spec in task.outputs]
    program(inputs, outputs)
    backend.synchronize()
    if any(out is inp for out in outputs for inp in inputs):
        raise _Failed({**label, "passed": False, "reason": "an output aliases an input"})
    # inputs compared in full with what was written (stronger than a hash, and as cheap)
    if not all(same_bits(backend.to_host(buffer), array) for buffer, array in zip(inputs, reference.inputs)):
        raise _Failed({**label, "passed": False, "reason": "the kernel modified its inputs"})
    return [backend.to_host(out) for out in outputs]


def _check_against(backend: Backend, task: Task, host: Sequence[np.ndarray], indices: Sequence[int],
                   reference: _Reference, tol: float, label: dict[str, Any]) -> dict[str, Any]:
    """Outputs `indices` against their references; the first output's errors are the evidence kept.
    An output over the tolerance gets the problem's own sensitivity as a second measure."""
    evidence: dict[str, Any] = {}
    for index, out in zip(indices, host, strict=True):
        ref = reference.refs[index]
        result = compare(out, ref, tol)
        if not result["passed"] and "rel_l2" in result:  # a numeric miss, not NaNs or a wrong shape
            sensitivity = reference.sensitivity(backend, task)[index]
            if SENSITIVITY_FACTOR * sensitivity > tol:
                result = {**compare(out, ref, SENSITIVITY_FACTOR * sensitivity), "sensitivity": sensitivity}
        if not result["passed"]:
            raise _Failed({**label, "output": index, **result})
        evidence = evidence or result
    return evidence


@dataclass(frozen=True)
class _Reference:
    """One check's inputs and what its outputs must be."""

    inputs: list[np.ndarray]
    refs: list[np.ndarray]  # float32 (rounding 6e-8, far below any tolerance), float64 for float64 outputs
    answers: list[np.ndarray]  # refs in the outputs' dtypes: what a kernel handing back stale memory finds
    seed: int
    distribution: str
    seconds: float  # computing refs
    _sensitivities: list[float] = field(default_factory=list, compare=False)  # filled on first use

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.inputs, *self.refs, *self.answers))

    def sensitivity(self, backend: Backend, task: Task) -> list[float]:
        """Per output, the relative L2 change of the float64 reference when every float input is
        scaled by 1 + r u, r uniform in [-1, 1], u its dtype's unit roundoff (measured against the
        stored float32 reference, whose own rounding, ~3e-8, only adds to it). One more reference
        run, made only when an output misses its tolerance."""
        if not self._sensitivities:
            rng = np.random.default_rng(self.seed + 7919)
            moved = [array.astype(np.float64) * (1.0 + UNIT_ROUNDOFF[spec.dtype] * rng.uniform(-1.0, 1.0, array.shape))
                     if spec.dtype in UNIT_ROUNDOFF else array for array, spec in zip(self.inputs, task.inputs)]
            for out, ref in zip(backend.reference(task, moved), self.refs):
                scale = _norm(np.ravel(ref).astype(np.float64)) or 1.0
                self._sensitivities.append(_norm(np.ravel(np.asarray(out, np.float64) - ref)) / scale)
        return self._sensitivities


class _ReferenceCache:
    """References by (task, seed, distribution): a search checks dozens of candidates of one
    task on the same seeds, and a large task's reference costs seconds."""

    def __init__(self, max_bytes: int = 6 << 30) -> None:
        self.max_bytes = max_bytes
        self._items: dict[tuple[str, int, str], _Reference] = {}

    def get(self, backend: Backend, task: Task, seed: int, distribution: str) -> _Reference:
        key = (task.key, seed, distribution)
        if key in self._items:
            return self._items[key]
        inputs = make_inputs(task, seed, distribution)
        start = time.perf_counter()
        refs = [r if spec.dtype == "float64" else r.astype(np.float32)
                for r, spec in zip(backend.reference(task, inputs), task.outputs)]
        seconds = time.perf_counter() - start
        answers = [r.astype(_numpy_dtype(spec.dtype)) for r, spec in zip(refs, task.outputs)]
        item = _Reference(inputs, refs, answers, seed, distribution, seconds)
        if item.nbytes <= self.max_bytes:
            while self._items and sum(i.nbytes for i in self._items.values()) + item.nbytes > self.max_bytes:
                self._items.pop(next(iter(self._items)))
            self._items[key] = item
        return item


_references = _ReferenceCache()


def _check_one(backend: Backend, program: Program, task: Task, tol: float, reference: _Reference,
               fresh: _Reference) -> list[dict[str, Any]]:
    label = {"seed": reference.seed, "distribution": reference.distribution}
    # the answers stay alive on the device through the check's runs: a kernel that hands back
    # stale memory finds poison in its fresh outputs, not these
    answers_alive = [backend.to_device(answer) for answer in (*reference.answers, *fresh.answers)]
    inputs = [backend.to_device(a) for a in reference.inputs]
    first = _run_once(backend, program, task, inputs, reference, {**label, "run": "fresh"})
    evidence = _check_against(backend, task, first, range(len(first)), reference, tol, {**label, "run": "fresh"})
    second = _run_once(backend, program, task, inputs, reference, {**label, "run": "repeat"})
    for index, (a, b) in enumerate(zip(first, second)):
        if same_bits(a, b):
            continue  # the same bits already passed against the reference
        agree = compare(b, a, tol / 4)
        if not agree["passed"]:
            raise _Failed({**label, "run": "repeat", "output": index, "passed": False,
                           "reason": f"two runs on the same inputs disagree: {agree['reason']}"})
        _check_against(backend, task, [b], [index], reference, tol, {**label, "run": "repeat"})
    # new values at the same addresses: a cache keyed by pointer or shape returns stale results
    for buffer, array in zip(inputs, fresh.inputs):
        backend.copy_into(buffer, array)
    label_fresh = {**label, "run": f"in-place new values (seed {fresh.seed}, {fresh.distribution})"}
    host = _run_once(backend, program, task, inputs, fresh, label_fresh)
    _check_against(backend, task, host, range(len(host)), fresh, tol, label_fresh)
    del answers_alive
    return [{**label, "passed": True, "runs": ["fresh", "repeat", "in-place new values"],
             **{k: v for k, v in evidence.items() if k != "passed"}}]


def floor_violation(seconds: float, floor_seconds: float) -> str | None:
    """Check 7: faster than physics allows is a bug or a cheat."""
    if floor_seconds > 0 and seconds < floor_seconds * FLOOR_SLACK:
        return (f"measured {seconds * 1e6:.2f} us is below the roofline floor "
                f"{floor_seconds * 1e6:.2f} us: impossible, rejected")
    return None
