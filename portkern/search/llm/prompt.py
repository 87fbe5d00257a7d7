"""The prompt: everything a kernel engineer would want before writing this one kernel.

Exact shapes and the model's own semantics (not a paraphrase), the target's limits, the contract
the module must follow, how far the best kernel so far is from the roofline floor, working kernels
of this backend to imitate, and, on a retry, exactly what went wrong last time (the compiler's
words, the static check's reason, or the gate's per-seed errors).
"""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ... import tasks as tasks_module
from ...backends import kernel_module
from ...backends.base import Backend
from ...backends.kernel_module import KernelSourceError, expand_includes, read_header
from ...errors import PortkernError
from ...ir import TensorSpec
from ...tasks import Task
from ..proposers import Feedback
from ..records import TrialRecord
from .client import Message

_MAX_SOURCE_CHARS = 12_000  # one kernel in a prompt (examples, best, previous attempt)
_MAX_ERROR_CHARS = 3_000  # compiler output: its tail holds the error
_MAX_CHECKS = 8


@dataclass
class PreviousAttempt:
    """The proposer's last kernel for this task and what became of it."""

    name: str
    source: str  # the kernel source; for an unreadable reply, the reply's text
    stage: str  # parse | static_check | duplicate | or the trial status: compile_error, rejected, ok, ...
    message: str  # the compiler error, the static check's reason, the gate's reason ('' when ok)
    checks: list[dict[str, Any]] = field(default_factory=list)  # the gate's evidence, per seed
    config: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None
    floor_fraction: float | None = None

    @classmethod
    def from_record(cls, source: str, record: TrialRecord) -> "PreviousAttempt":
        return cls(name=record.variant, source=source, stage=record.status, message=record.reason,
                   checks=list(record.verdict.checks) if record.verdict else [], config=dict(record.config),
                   seconds=record.seconds, floor_fraction=record.floor_fraction)


def _backend_module(backend: Backend) -> Any:
    return sys.modules.get(type(backend).__module__)


def contract_imports(backend: Backend) -> tuple[str, ...]:
    """The modules a kernel module for this backend may import: the backend's `allowed_imports`
    attribute, else the ALLOWED_IMPORTS its module passes to the static check."""
    allowed = getattr(backend, "allowed_imports", None) or getattr(_backend_module(backend), "ALLOWED_IMPORTS", None)
    if not allowed:
        raise PortkernError(f"backend '{backend.name}' declares no kernel-module imports (ALLOWED_IMPORTS): "
                            "the LLM proposer serves source-based backends only")
    return tuple(sorted(allowed))


def backend_notes(backend: Backend) -> str:
    """What the backend's module says about its kernels (extra contract functions, buffers)."""
    return inspect.cleandoc(getattr(_backend_module(backend), "__doc__", None) or "")


def kernel_files(backend: Backend) -> list[Path]:
    """The backend's built-in kernel files: <backend package>/kernels/*.py, except the shared
    fragments (_NAME.py) that files pull in with `# include: NAME`."""
    module_file = getattr(_backend_module(backend), "__file__", None) or inspect.getfile(type(backend))
    folder = Path(module_file).parent / "kernels"
    return [p for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")] if folder.is_dir() else []


def complete_source(path: Path) -> str:
    """A kernel file with its `# include: NAME` lines replaced by kernels/_NAME.py, as the backend
    reads its library: an example must be a whole module, because a proposal has to be one."""
    return expand_includes(path.read_text(encoding="utf-8"),
                           lambda name: path.with_name(f"_{name}.py").read_text(encoding="utf-8"))


def pick_examples(files: Sequence[Path], kind: str, limit: int = 2) -> list[str]:
    """Few-shot sources: kernels of the task's kind first, any kernel when none of that kind exists."""
    same_kind: list[str] = []
    other: list[str] = []
    for path in files:
        try:
            source = complete_source(path)
            declared = read_header(source).get("KIND")
        except (KernelSourceError, OSError):
            continue
        (same_kind if declared == kind else other).append(source)
    return (same_kind or other)[:limit]


def example_sources(backend: Backend, task: Task, limit: int = 2) -> list[str]:
    """The backend's built-in variants for this task (complete sources that pass the gate); when it
    has none, its kernel files, of this kind first, else of any kind."""
    offered = [variant.source for variant in backend.variants(task)]
    return offered[:limit] if offered else pick_examples(kernel_files(backend), task.kind, limit)


def kind_signature(kind: str) -> str:
    """The kind's kernel signature, as tasks.py documents it (the lines of that kind)."""
    lines = (tasks_module.__doc__ or "").splitlines()
    found: list[str] = []
    for line in lines:
        words = line.split()
        starts_kind = line.startswith("  ") and not line.startswith("   ") and bool(words)
        if found and (starts_kind or not line.strip()):
            break
        if starts_kind and words[0] == kind:
            found.append(line.strip())
        elif found:
            found.append("  " + line.strip())
    return "\n".join(found) or f"{kind} (no documented signature)"


def _value(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            return f"array{value.tolist()}"
        return f"array(shape={list(value.shape)}, dtype={value.dtype})"
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def reference_text(task: Task) -> str:
    """The task's ONNX nodes, one per line, with the shapes of the values the kernel sees."""
    specs = {name: str(spec) for name, spec in zip(task.input_names, task.inputs)}
    specs.update({name: str(spec) for name, spec in zip(task.output_names, task.outputs)})
    specs.update({name: f"{'x'.join(map(str, v.shape)) or 'scalar'}:{v.dtype} constant"
                  for name, v in task.constants.items()})

    def named(name: str) -> str:
        if not name:
            return "<omitted>"
        return f"{name}[{specs[name]}]" if name in specs else name

    lines = []
    for node in task.nodes:
        attrs = ", ".join(f"{k}={_value(v)}" for k, v in sorted(node.attrs.items()))
        op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
        outs = ", ".join(named(n) for n in node.outputs)
        ins = ", ".join(named(n) for n in node.inputs)
        lines.append(f"{outs} = {op}({ins})" + (f"  attrs: {attrs}" if attrs else ""))
    small_constants = [f"{name} = {_value(v)}" for name, v in task.constants.items() if v.size <= 8]
    if small_constants:
        lines.append("constants: " + "; ".join(small_constants))
    return "\n".join(lines) or "(no nodes recorded)"


def _seconds(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{seconds * 1e6:.2f} us"


def _percent_of_floor(floor: float, seconds: float | None) -> str:
    return "" if not seconds or not floor else f" ({100 * floor / seconds:.1f}% of the floor)"


def _clip(text: str, limit: int, keep: str = "head") -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + "\n... (cut)" if keep == "head" else "... (cut)\n" + text[-limit:]


def _fenced(source: str) -> str:
    return f"```python\n{_clip(source.rstrip(), _MAX_SOURCE_CHARS)}\n```"


def _check_text(check: dict[str, Any]) -> str:
    parts = []
    for key, value in check.items():
        if key == "reason":
            continue
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    reason = check.get("reason")
    return " ".join(parts) + (f": {reason}" if reason else "")


def attempt_text(attempt: PreviousAttempt, floor_seconds: float) -> str:
    """What became of the last kernel, in the words of whoever judged it."""
    head = f"Your previous kernel `{attempt.name}`"
    if attempt.stage == "ok":
        verdict = (f"{head} passed the gate and ran in {_seconds(attempt.seconds)}"
                   f"{_percent_of_floor(floor_seconds, attempt.seconds)} with config {attempt.config}.")
    elif attempt.stage == "parse":
        verdict = f"{head} could not be read from your answer: {attempt.message}"
    elif attempt.stage in ("static_check", "duplicate"):
        verdict = f"{head} was refused before compiling ({attempt.stage}): {attempt.message}"
    elif attempt.stage == "compile_error":
        verdict = (f"{head} failed to compile (config {attempt.config}). The compiler said:\n"
                   f"```\n{_clip(attempt.message, _MAX_ERROR_CHARS, keep='tail')}\n```")
    elif attempt.stage == "invalid":
        verdict = (f"{head} was not run with config {attempt.config}: its constraints() or the target's "
                   f"limits refused it: {attempt.message}")
    elif attempt.stage in ("runtime_error", "timeout"):
        what = "crashed while running" if attempt.stage == "runtime_error" else "ran past the time limit"
        verdict = f"{head} {what} (config {attempt.config}): {attempt.message}"
    else:
        verdict = f"{head} failed verification ({attempt.stage}, config {attempt.config}): {attempt.message}"
    lines = [verdict]
    if attempt.checks:
        ordered = sorted(attempt.checks, key=lambda c: c.get("passed", False) is not False)
        lines.append("Gate checks (seed, input distribution, run, errors against the float64 reference):")
        lines += [f"- {_check_text(c)}" for c in ordered[:_MAX_CHECKS]]
    label = "Its source" if attempt.stage != "parse" else "Your answer"
    lines.append(f"{label}:\n{_fenced(attempt.source)}")
    if attempt.stage != "ok":
        lines.append("Fix exactly this problem in the new kernel.")
    return "\n".join(lines)


def _system_message(backend: Backend) -> str:
    contract = inspect.cleandoc(kernel_module.__doc__ or "")
    notes = backend_notes(backend)
    return "\n".join([
        "You write one high-performance kernel at a time for portkern, a kernel autotuner. Every kernel "
        "you write is compiled, checked against a float64 reference on fresh random inputs (several seeds, "
        "outputs poisoned before each run, inputs hashed, repeated runs compared) and timed with a "
        "device-wide synchronization. Anything that fails is discarded; you are told why.",
        "",
        "## Kernel-module contract",
        contract,
        "",
        f"Allowed imports: {', '.join(contract_imports(backend))} (nothing else).",
        "Forbidden (a static check refuses the module): framework compute ops (torch, library softmax/matmul/"
        "conv/attention), streams and device synchronization, threads and processes, files, network, "
        "timers, eval/exec, introspection. Buffers arrive as the backend's device tensors; pass them to "
        "your kernel and write every element of every output.",
        *(["", f"## The `{backend.name}` backend", notes] if notes else []),
        "",
        "## Answer format",
        'Answer with one JSON object: {"name": "<short_snake_case>", "source": "<the complete module>", '
        '"rationale": "<why it is correct and faster>"}. If you cannot write JSON, answer with the complete '
        "module in one ```python fenced block.",
    ])


def _tensor_lines(role: str, names: Sequence[str], specs: Sequence[TensorSpec]) -> list[str]:
    named = list(names) if len(names) == len(specs) else ["?"] * len(specs)
    return [f"- {role} {i}: {name} {spec}" for i, (name, spec) in enumerate(zip(named, specs, strict=True))]


def build_prompt(task: Task, backend: Backend, feedback: Feedback, examples: Sequence[str],
                 previous_attempt: PreviousAttempt | None) -> list[Message]:
    """System message (role, contract, answer format) + user message (this task, this target, the
    search so far, examples, the previous attempt's outcome)."""
    profile = backend.target.profile
    floor = feedback.floor_seconds
    sections = [
        f"## Task: {task.label} (workload {task.key})",
        f"Kind `{task.kind}`; kernel signature (inputs in this order):\n{kind_signature(task.kind)}",
        "Exact tensors (write the kernel for exactly these; contiguous, row-major):",
        *_tensor_lines("input", task.input_names, task.inputs),
        *_tensor_lines("output", task.output_names, task.outputs),
        f"Attributes: {dict(task.attrs)}",
        f"FLOPs: {task.flops}; minimum bytes moved: {task.min_bytes}",
        "",
        "## Reference semantics (the model's ONNX nodes; the gate runs them in float64)",
        reference_text(task),
        "",
        f"## Target: {backend.target.name}{f' ({profile.description})' if profile.description else ''}, "
        f"backend `{backend.name}`",
        f"kind {profile.kind}, arch {profile.arch}, {profile.cores} cores (SMs/CUs), warp size {profile.warp_size}, "
        f"alignment {profile.alignment} B",
        "peak FLOP/s by dtype: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(profile.peak_flops.items())),
        f"memory bandwidth: {profile.mem_bandwidth / 1e12:.3g} TB/s",
        "limits: " + ", ".join(f"{k}={v:g}" for k, v in sorted(profile.limits.items())),
        "",
        "## Performance",
        f"Roofline floor for this task: {_seconds(floor)} (no kernel can be faster).",
        f"Baseline (framework/vendor) time: {_seconds(feedback.baseline_seconds)}"
        f"{_percent_of_floor(floor, feedback.baseline_seconds)}.",
    ]
    if feedback.best is not None and feedback.best.seconds is not None:
        sections.append(f"Best verified kernel so far: `{feedback.best.variant}` config {feedback.best.config}, "
                        f"{_seconds(feedback.best.seconds)}{_percent_of_floor(floor, feedback.best.seconds)}.")
        if feedback.best_source:
            sections.append(_fenced(feedback.best_source))
    else:
        sections.append("No kernel has passed the gate yet for this task.")
    if examples:
        sections += ["", "## Built-in kernels of this backend (working modules that follow the contract)"]
        sections += [_fenced(source) for source in examples]
    if previous_attempt is not None:
        sections += ["", "## Previous attempt", attempt_text(previous_attempt, floor)]
    sections += ["", "## Your job",
                 "Write a new kernel module for this task that passes the gate and is faster than the best so "
                 "far (closer to the floor). Declare a SPACE of parameters worth searching; constraints() "
                 "must reject configurations the target cannot run; an optional fixed(task, target) returns "
                 "the parameters this task and target decide alone (they are not searched)."]
    return [{"role": "system", "content": _system_message(backend)},
            {"role": "user", "content": "\n".join(sections)}]
