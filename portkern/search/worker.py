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
from typing import Any

from ..backends import get_backend
from ..backends.base import Artifact, Backend, Candidate, CompileError
from ..backends.kernel_module import KernelSourceError
from ..errors import PortkernError, TargetError
from ..hwprofile import Target, load_target
from ..measure import MeasureOptions, time_program
from ..tasks import Task
from ..verify import GateOptions, floor_violation, verify
from .records import TrialRecord


@dataclass(frozen=True)
class TrialJob:
    task: Task
    candidate: Candidate
    floor_seconds: float
    gate: GateOptions = field(default_factory=GateOptions)
    measure: MeasureOptions = field(default_factory=MeasureOptions)

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


def execute_trial(backend: Backend, job: TrialJob) -> tuple[TrialRecord, Artifact | None]:
    """check -> compile -> load -> gate -> time -> floor check. Failures become statuses."""
    start = time.perf_counter()
    candidate, task = job.candidate, job.task
    record = job.record(backend.name, "ok")

    def finish(status: str, reason: str = "", artifact: Artifact | None = None):
        record.status, record.reason = status, reason
        record.wall_seconds = time.perf_counter() - start
        return record, artifact

    try:
        invalid = backend.check(candidate, task)
    except Exception as exc:  # constraints code of a generated variant may itself be broken
        return finish("invalid", f"constraints raised {_first_line(exc)}")
    if invalid:
        return finish("invalid", invalid)
    try:
        artifact = backend.compile(candidate, task)
        record.artifact_meta = dict(artifact.meta)
        program = backend.load(artifact, task)
    except (CompileError, KernelSourceError) as exc:
        return finish("compile_error", str(exc).strip()[:4000])
    except Exception as exc:
        return finish("compile_error", _first_line(exc) + "\n" + traceback.format_exc(limit=3)[-2000:])
    record.verdict = verify(backend, program, task, candidate.variant.precision, job.gate)
    if not record.verdict.passed:
        status = "runtime_error" if record.verdict.reason.startswith("runtime error") else "rejected"
        return finish(status, record.verdict.reason)
    try:
        record.measurement = time_program(backend, program, task, job.measure)
    except Exception as exc:
        return finish("runtime_error", f"while timing: {_first_line(exc)}")
    too_fast = floor_violation(record.measurement.median, job.floor_seconds)
    if too_fast:
        return finish("rejected", too_fast)
    return finish("ok", "", artifact)


def _serve(conn: Connection, target_name: str, backend_name: str, scratch: str) -> None:
    os.makedirs(scratch, exist_ok=True)
    os.chdir(scratch)
    try:
        backend = get_backend(load_target(target_name, backend_name))
    except Exception as exc:
        conn.send(("error", _first_line(exc)))
        return
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        conn.send(("result", execute_trial(backend, job)))


class IsolatedRunner:
    """A persistent worker process per backend, restarted after a crash or a timeout."""

    START_TIMEOUT_S = 300.0

    def __init__(self, target: Target, timeout_s: float, scratch: Path) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.scratch = Path(scratch)
        self._ctx = mp.get_context("spawn")
        self._process: Any = None
        self._conn: Connection | None = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._process = self._ctx.Process(
            target=_serve, args=(child, self.target.name, self.target.backend, str(self.scratch)),
            daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
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

    def _stop(self) -> None:
        if self._process is not None and self._process.pid is not None:
            self._process.kill()
            self._process.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None

    def run(self, job: TrialJob) -> tuple[TrialRecord, Artifact | None]:
        if self._process is None or not self._process.is_alive():
            self._start()
        assert self._conn is not None
        started = time.perf_counter()
        self._conn.send(job)
        try:
            ready = self._conn.poll(self.timeout_s)
            if ready:
                kind, payload = self._conn.recv()
                return payload
        except (EOFError, OSError):
            code = None
            if self._process is not None:
                self._process.join(timeout=5)
                code = self._process.exitcode
            self._stop()
            return self._failed(job, "runtime_error", f"worker process died (exit code {code})", started)
        self._stop()
        return self._failed(job, "timeout", f"no result within {self.timeout_s:.0f} s: killed", started)

    def _failed(self, job: TrialJob, status: str, reason: str, started: float):
        record = job.record(self.target.backend, status, reason)
        record.wall_seconds = time.perf_counter() - started
        return record, None

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

    def close(self) -> None:
        pass

    def __enter__(self) -> "InProcessRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

