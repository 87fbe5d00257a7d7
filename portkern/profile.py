"""Profile: time every task with the baseline on the target, against its roofline floor.

The ranking by headroom ((time - floor) x occurrences) is where the tuning budget goes. This is the
dense feedback everything after it consumes; `portkern profile` prints it and writes a trace.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .backends.base import Backend, Candidate, Program
from .hwprofile import Target
from .measure import MeasureOptions, time_program
from .search.records import Measurement
from .tasks import Task


@dataclass
class TaskProfile:
    task: Task
    count: int  # occurrences in the model (identical layers share one workload)
    floor_seconds: float
    baseline: Measurement | None
    baseline_source: str
    # the baseline runtime's own time for the task's nodes inside the whole model, where it can
    # tell (Backend.baseline_in_model): what a kernel really has to beat when it is less
    in_model_seconds: float | None = None
    # the least time any kernel of it is measured at (HwProfile.reachable_seconds): the roofline
    # floor, or the target's launch floor where that is longer; 0: the roofline floor
    reachable_floor_seconds: float = 0.0

    @property
    def reachable_seconds(self) -> float:
        return max(self.floor_seconds, self.reachable_floor_seconds)

    @property
    def seconds(self) -> float | None:
        alone = self.baseline.median if self.baseline else None
        if alone is not None and self.in_model_seconds is not None:
            return min(alone, self.in_model_seconds)
        return alone

    @property
    def total_seconds(self) -> float:
        return (self.seconds or 0.0) * self.count

    @property
    def headroom_seconds(self) -> float:
        return max(0.0, (self.seconds or 0.0) - self.reachable_seconds) * self.count

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task.label, "key": self.task.key, "count": self.count,
                "flops": self.task.flops, "min_bytes": self.task.min_bytes,
                "floor_seconds": self.floor_seconds, "reachable_seconds": self.reachable_seconds,
                "baseline_seconds": self.seconds,
                "baseline_source": self.baseline_source, "headroom_seconds": self.headroom_seconds,
                "baseline_in_model_seconds": self.in_model_seconds,
                "baseline": self.baseline.to_dict() if self.baseline else None}


def floor_seconds(task: Task, target: Target) -> float:
    return target.profile.floor_seconds(task.flops, task.min_bytes, task.dtype)


def baseline_program(backend: Backend, task: Task) -> tuple[Program | None, str]:
    """The vendor/framework op if the backend has one, else its first valid default kernel."""
    program = backend.baseline(task)
    if program is not None:
        return program, f"{backend.name} baseline"
    for variant in backend.variants(task):
        candidate = Candidate.of(variant, variant.default)
        if backend.check(candidate, task) is None:
            try:
                return backend.load(backend.compile(candidate, task), task), f"default {variant.name}"
            except Exception:
                continue
    return None, "none"


def profile_tasks(tasks: Sequence[tuple[Task, int]], backend: Backend,
                  options: MeasureOptions = MeasureOptions(),
                  in_model: Mapping[str, float] | None = None) -> list[TaskProfile]:
    """Each workload's baseline timed alone, and its time inside the model where `in_model`
    (Backend.baseline_in_model) has it; sorted by headroom."""
    profiles = []
    for task, count in tasks:
        program, source = baseline_program(backend, task)
        measurement = None
        if program is not None:
            try:
                measurement = time_program(backend, program, task, options)
            except Exception as exc:  # a baseline that cannot run this task is reported, not fatal
                source = f"{source} failed: {type(exc).__name__}: {exc}"[:200]
        in_model_seconds = (in_model or {}).get(task.key)
        if measurement is not None and in_model_seconds is not None and in_model_seconds < measurement.median:
            source = f"{source} inside the model; {measurement.median * 1e3:.4g} ms alone"
        reachable = backend.target.profile.reachable_seconds(task.flops, task.min_bytes, task.dtype)
        profiles.append(TaskProfile(task, count, floor_seconds(task, backend.target), measurement, source,
                                    in_model_seconds, reachable))
    return sorted(profiles, key=lambda p: p.headroom_seconds, reverse=True)


def write_trace(order: Sequence[Task], profiles: Sequence[TaskProfile], path: str | Path) -> None:
    """A Chrome/Perfetto trace of one forward pass: each task as its baseline time, in model order."""
    by_key = {p.task.key: p for p in profiles}
    events: list[dict[str, Any]] = []
    clock_us = 0.0
    for task in order:
        profile = by_key.get(task.key)
        if profile is None or profile.seconds is None:
            continue
        duration = profile.seconds * 1e6
        events.append({"name": task.label, "cat": task.kind, "ph": "X", "ts": clock_us, "dur": duration,
                       "pid": 0, "tid": 0, "args": {"floor_us": profile.floor_seconds * 1e6,
                                                    "key": task.key, "baseline": profile.baseline_source}})
        clock_us += duration
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, indent=1))
