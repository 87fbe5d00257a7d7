"""Build, verify and time one candidate, in a separate process with a time limit.

A kernel that crashes, hangs or corrupts device memory takes only its worker down: the trial is
recorded with the reason and the next trial gets a fresh worker. Generated code never runs in the
tuner's own process.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

from ..backends import get_backend
from ..backends.base import Artifact, Backend, Candidate, CompileError
from ..backends.kernel_module import KernelSourceError
from ..errors import PortkernError, TargetError
from ..hwprofile import Target, load_target
from ..measure import MeasureOptions, one_blas_thread, time_program
from ..tasks import Task
from ..verify import GateOptions, floor_violation, gate_references, verify
from .records import TrialRecord


@dataclass(frozen=True)
class TrialJob:
    task: Task
    candidate: Candidate
    floor_seconds: float
    gate: GateOptions = field(default_factory=GateOptions)
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    artifact: Artifact | None = None  # built ahead by a CompilePool: the trial loads it

    def record(self, backend: str, status: str, reason: str = "") -> TrialRecord:
        """The trial's record before any evidence is attached."""
        candidate = self.candidate
        return TrialRecord(task_key=self.task.key, backend=backend, variant=candidate.variant.name,
                           origin=candidate.variant.origin, config=candidate.params,
                           candidate_key=candidate.key(), status=status, reason=reason,
                           floor_seconds=self.floor_seconds)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


Built = tuple["Artifact | None", str, str]  # the artifact, or None with the failing status and reason


def build_candidate(backend: Backend, job: TrialJob) -> Built:
    """check -> compile. A configuration the constraints reject is 'invalid', never compiled."""
    candidate, task = job.candidate, job.task
    try:
        invalid = backend.check(candidate, task)
    except Exception as exc:  # constraints code of a generated variant may itself be broken
        return None, "invalid", f"constraints raised {_first_line(exc)}"
    if invalid:
        return None, "invalid", invalid
    try:
        return backend.compile(candidate, task), "", ""
    except Exception as exc:
        return None, "compile_error", _build_failure(exc)


def _build_failure(exc: Exception) -> str:
    """A compile or load error as the trial's reason: the compiler's own words, else the
    exception with the end of its traceback."""
    if isinstance(exc, (CompileError, KernelSourceError)):
        return str(exc).strip()[:4000]
    return _first_line(exc) + "\n" + traceback.format_exc(limit=3)[-2000:]


def execute_trial(backend: Backend, job: TrialJob,
                  kernels_start: Callable[[float], None] | None = None) -> tuple[TrialRecord, Artifact | None]:
    """(check -> compile, unless built ahead) -> load -> references -> gate -> time -> floor check.
    Failures become statuses. `kernels_start` is told when the candidate's kernel runs begin (its
    references ready), with the seconds a reference run may still add to them."""
    start = time.perf_counter()
    candidate, task = job.candidate, job.task
    record = job.record(backend.name, "ok")

    def finish(status: str, reason: str = "", artifact: Artifact | None = None):
        record.status, record.reason = status, reason
        record.wall_seconds = time.perf_counter() - start
        return record, artifact

    def phase(name: str, since: float) -> float:
        now = time.perf_counter()
        record.phases[name] = now - since
        return now

    artifact = job.artifact
    if artifact is None:
        artifact, status, reason = build_candidate(backend, job)
        if artifact is None:
            return finish(status, reason)
    record.artifact_meta = dict(artifact.meta)
    mark = time.perf_counter()
    try:
        program = backend.load(artifact, task)
    except Exception as exc:
        return finish("compile_error", _build_failure(exc))
    mark = phase("load", mark)
    try:  # a reference that fails is a failure on the record (as it was inside verify), not a dead worker
        references = gate_references(backend, task, job.gate)
    except Exception as exc:
        return finish("runtime_error", f"runtime error: while computing the references: {_first_line(exc)}")
    mark = phase("references", mark)
    if kernels_start is not None:
        kernels_start(references.seconds)
    record.verdict = verify(backend, program, task, candidate.variant.precision, job.gate, references)
    mark = phase("verify", mark)
    if not record.verdict.passed:
        status = "runtime_error" if record.verdict.reason.startswith("runtime error") else "rejected"
        return finish(status, record.verdict.reason)
    try:
        record.measurement = time_program(backend, program, task, job.measure)
    except Exception as exc:
        return finish("runtime_error", f"while timing: {_first_line(exc)}")
    phase("time", mark)
    too_fast = floor_violation(record.measurement.median, job.floor_seconds)
    if too_fast:
        return finish("rejected", too_fast)
    return finish("ok", "", artifact)


def _prepare_references(backend: Backend, job: TrialJob) -> None:
    """The gate's references for the job's task, into this process's cache. A failure here is
    the trial's to record (it computes them again), not this job's."""
    try:
        gate_references(backend, job.task, job.gate)
    except Exception:
        pass


def _serve(conn: Connection, target_name: str, backend_name: str, scratch: str) -> None:
    os.makedirs(scratch, exist_ok=True)
    os.chdir(scratch)
    try:
        backend = get_backend(load_target(target_name, backend_name))
    except Exception as exc:
        conn.send(("error", _first_line(exc)))
        return
    # a worker's compile launches nothing: in a compile worker another process times a kernel on the
    # device; in the measuring one, a kernel's first run is then inside its kernel-run limit
    backend.compile_launches = False
    conn.send(("ready", None))
    with one_blas_thread():  # for the worker's life: it times kernels
        _serve_jobs(conn, backend)


def _serve_jobs(conn: Connection, backend: Backend) -> None:
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        kind, work = job
        try:
            if kind == "trial":
                result = execute_trial(backend, work, lambda seconds: conn.send(("kernels", seconds)))
            elif kind == "references":
                result = _prepare_references(backend, work)
            else:
                result = build_candidate(backend, work)
            conn.send(("result", result))
        except (BrokenPipeError, OSError):
            return  # the tuner is gone (killed, interrupted): nobody to tell, nothing to print


class IsolatedRunner:
    """A persistent worker process per backend, restarted after a crash or a timeout.

    timeout_s bounds a whole job. kernel_timeout_s, where given, bounds a trial's kernel runs (the
    gate's and the timing's, from the moment its references are ready, plus what a reference run
    may add): a kernel that never finishes (a deadlocked barrier, a spinning loop) is killed then,
    not at the end of a limit sized for compiling. No compile in a worker launches the kernel
    (Backend.compile_launches is False there), so its first run is always inside that limit."""

    START_TIMEOUT_S = 300.0

    def __init__(self, target: Target, timeout_s: float, scratch: Path, kernel_timeout_s: float | None = None) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.kernel_timeout_s = kernel_timeout_s
        self._kernels_deadline: float | None = None  # when the running trial's kernel runs must end
        self.scratch = Path(scratch)
        self._ctx = mp.get_context("spawn")
        self._process: Any = None
        self._conn: Connection | None = None
        self._ready = False
        self._submitted = 0.0
        self._preparing = False  # a references job sent and not yet collected

    def start(self) -> None:
        """Spawn the process without waiting for it (its imports and device setup then overlap
        the caller's work); the first job waits until it is ready."""
        if self._process is not None and self._process.is_alive():
            return
        parent, child = self._ctx.Pipe()
        self._process = self._ctx.Process(
            target=_serve, args=(child, self.target.name, self.target.backend, str(self.scratch)),
            daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
        self._ready = False

    def _await_ready(self) -> None:
        parent = self._conn
        assert parent is not None and self._process is not None
        if not parent.poll(self.START_TIMEOUT_S):
            self._stop()
            raise TargetError(f"the {self.target.backend} worker did not start in {self.START_TIMEOUT_S:.0f} s")
        try:
            kind, payload = parent.recv()
        except (EOFError, OSError):
            self._process.join(timeout=5)
            code = self._process.exitcode
            self._stop()
            raise TargetError(f"the {self.target.backend} worker died while starting (exit code {code})") from None
        if kind == "error":
            self._stop()
            raise TargetError(f"the {self.target.backend} worker could not start: {payload}")
        self._ready = True

    def _stop(self) -> None:
        if self._process is not None and self._process.pid is not None:
            self._process.kill()
            self._process.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn, self._ready, self._preparing = None, None, False, False

    def submit(self, kind: str, job: TrialJob) -> None:
        """Hand the worker a job ('trial': build, verify, time; 'build': check and compile;
        'references': the gate's references for the job's task, into the worker's cache)."""
        if self._process is None or not self._process.is_alive():
            self.start()
        if not self._ready:
            self._await_ready()
        assert self._conn is not None
        self._submitted = time.perf_counter()
        self._kernels_deadline = None
        self._conn.send((kind, job))

    def collect(self, wait: bool = True, until: float | None = None) -> tuple[str, Any] | None:
        """('result', payload), or ('failed', (status, reason)) after a death or a time limit
        (the worker is then stopped; the next job starts a fresh one). None while the job is still
        within its time limits and unfinished: at once with wait=False, else at `until` (a
        time.perf_counter() value) if given."""
        assert self._conn is not None
        try:
            while True:
                left = max(0.0, self._deadline() - time.perf_counter())
                patience = left if wait else 0.0
                if until is not None:
                    patience = min(patience, max(0.0, until - time.perf_counter()))
                if not self._conn.poll(patience):
                    if time.perf_counter() < self._deadline() and (not wait or until is not None):
                        return None
                    break
                kind, payload = self._conn.recv()
                if kind != "kernels":
                    return kind, payload
                if self.kernel_timeout_s is not None:
                    self._kernels_deadline = time.perf_counter() + self.kernel_timeout_s + payload
        except (EOFError, OSError):
            code = None
            if self._process is not None:
                self._process.join(timeout=5)
                code = self._process.exitcode
            self._stop()
            return "failed", ("runtime_error", f"worker process died (exit code {code})")
        hung = self._kernels_deadline is not None and self._kernels_deadline < self._trial_deadline()
        self._stop()
        if hung:
            return "failed", ("timeout", f"the kernel runs (gate and timing) did not end within "
                              f"{self.kernel_timeout_s:.0f} s: killed as hung (or too slow to be worth timing)")
        return "failed", ("timeout", f"no result within {self.timeout_s:.0f} s: killed")

    def _trial_deadline(self) -> float:
        return self._submitted + self.timeout_s

    def _deadline(self) -> float:
        kernels = self._kernels_deadline
        return self._trial_deadline() if kernels is None else min(kernels, self._trial_deadline())

    def prepare(self, job: TrialJob) -> None:
        """Have the worker compute the job's gate references (cached there) while its candidate
        builds in a compile worker; the next run waits for them first. On the H100 a large task's
        first trial waited 0.5-1.8 s for its build, then spent 0.7-3.4 s on references. While one
        is still out (its trial's build missed the search's deadline, so no trial collected it),
        none is sent: the worker is busy with that one, and a second would be a result nobody
        collects, taken by the next trial for its own (the tune crashed on it, H100, 2026-12-07)."""
        if self._preparing:
            return
        self.submit("references", job)
        self._preparing = True

    def run(self, job: TrialJob) -> tuple[TrialRecord, Artifact | None]:
        ahead = self._collect_prepared()
        self.submit("trial", job)
        collected = self.collect()
        assert collected is not None  # a waiting collect always returns
        kind, payload = collected
        if kind == "result":
            record, artifact = payload
        else:
            status, reason = payload
            record, artifact = job.record(self.target.backend, status, reason), None
            record.wall_seconds = time.perf_counter() - self._submitted
        if ahead:  # what the trial waited for its references past its build
            record.phases["references ahead"] = ahead
            record.wall_seconds += ahead
        return record, artifact

    def _collect_prepared(self) -> float:
        """Seconds waited for the references job prepare() sent (0 if none is out). Whatever became
        of it, the trial computes what is missing."""
        if not self._preparing:
            return 0.0
        self._preparing = False
        started = time.perf_counter()
        self.collect()
        return time.perf_counter() - started

    def close(self) -> None:
        if self._conn is not None and self._process is not None and self._process.is_alive():
            try:
                self._conn.send(None)
                self._process.join(timeout=5)
            except (BrokenPipeError, OSError):
                pass
        self._stop()

    def __enter__(self) -> "IsolatedRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessRunner:
    """Runs trials in this process: for trusted built-in variants in tests, never for generated code."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def run(self, job: TrialJob) -> tuple[TrialRecord, Artifact | None]:
        if job.candidate.variant.origin not in ("builtin", "rules"):
            raise PortkernError(f"{job.candidate.variant.origin} variants run only in an isolated worker")
        return execute_trial(self.backend, job)

    def prepare(self, job: TrialJob) -> None:
        """The references now, in this process, while the compile pool builds the candidate."""
        _prepare_references(self.backend, job)

    def close(self) -> None:
        pass

    def __enter__(self) -> "InProcessRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class CompilePool:
    """Worker processes that check and compile candidates ahead of the one that verifies and
    times them, so compiling (CPU-bound: Triton and ptxas, TVM and LLVM) overlaps measuring and
    several candidates compile at once. Each is an IsolatedRunner given build jobs only, whose
    compile launches nothing: nothing runs on the device beside the kernel being timed (a Triton candidate is
    built by the JIT's warm-up into the on-disk cache, where the measuring worker's JIT finds the
    same binary; a cross-compile would not share its cache key). A compile that crashes or runs
    past the time limit fails its trial and only its own worker is restarted."""

    def __init__(self, target: Target, workers: int, timeout_s: float, scratch: Path) -> None:
        self.workers = [IsolatedRunner(target, timeout_s, Path(scratch) / f"compile-{i}")
                        for i in range(workers)]
        self._idle = list(range(workers))
        self._abandoned: list[int] = []  # building a candidate nobody will measure

    def start(self) -> None:
        """Spawn every worker without waiting (see IsolatedRunner.start)."""
        for worker in self.workers:
            worker.start()

    def free(self) -> int:
        """Workers free now (abandoned builds that finished free theirs)."""
        self._reap(wait=False)
        return len(self._idle)

    def idle(self) -> bool:
        return self.free() > 0

    def wait_idle(self) -> None:
        """Block until a worker is free: the oldest abandoned build finishes or hits its limit."""
        while not self.idle():
            self._reap(wait=True)

    def abandon(self, ticket: int) -> None:
        """The candidate building on this ticket will not be measured (a search stopped): its
        result is dropped when it arrives, and the worker returns to the pool then. Without
        this, a search that stops with builds in flight would take those workers from every
        later search."""
        self._abandoned.append(ticket)

    def _reap(self, wait: bool) -> None:
        for ticket in list(self._abandoned):
            if self.workers[ticket].collect(wait=wait) is not None:
                self._abandoned.remove(ticket)
                self._idle.append(ticket)
                if wait:
                    return

    def submit(self, job: TrialJob) -> int:
        """Start building the job's candidate on an idle worker; the ticket collects it."""
        ticket = self._idle.pop(0)
        self.workers[ticket].submit("build", job)
        return ticket

    def collect(self, ticket: int, until: float | None = None) -> Built | None:
        """The build on this ticket; None if it is still building at `until` (time.perf_counter()),
        the ticket then still the caller's (to collect later or abandon)."""
        collected = self.workers[ticket].collect(until=until)
        if collected is None:
            return None
        kind, payload = collected
        self._idle.append(ticket)
        if kind == "result":
            return payload
        status, reason = payload
        return None, status, f"compiling: {reason}"

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    def __enter__(self) -> "CompilePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
