"""Trial records: every candidate tried, with its status and evidence. Failures are data.

Records are appended to a JSON-lines file as the tune runs (one line per finished trial, flushed
and fsynced), so a kill -9 loses at most the trial in flight and a person can read what happened.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

STATUSES = ("ok", "invalid", "compile_error", "runtime_error", "timeout", "rejected")


@dataclass
class Measurement:
    """Times of one kernel on the target, and how they were taken."""

    times: list[float]  # seconds per run, in the order taken
    method: str  # e.g. 'cuda-events, device sync, 3 rotating input sets'
    simulated: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        """Relative interquartile range (p75 - p25) / median: a gain smaller than this is noise.
        Quartiles, not extremes, so one preempted run on a busy host does not hide a real gain."""
        ordered = sorted(self.times)
        low = ordered[len(ordered) // 4]
        high = ordered[min(len(ordered) - 1, (len(ordered) * 3) // 4)]
        return (high - low) / self.median if self.median > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "spread": self.spread, "n": len(self.times),
                "times": self.times, "method": self.method, "simulated": self.simulated}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Measurement":
        return cls(times=list(data["times"]), method=data["method"], simulated=data.get("simulated", False))


@dataclass
class Verdict:
    """The gate's answer with its evidence."""

    passed: bool
    reason: str  # '' when passed; otherwise which check failed and how
    precision: str
    tolerance: dict[str, float]
    checks: list[dict[str, Any]] = field(default_factory=list)  # one per seed/distribution/shape

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        return cls(**data)


@dataclass
class TrialRecord:
    task_key: str
    backend: str
    variant: str
    origin: str
    config: dict[str, Any]
    candidate_key: str
    status: str
    reason: str = ""
    artifact_meta: dict[str, Any] = field(default_factory=dict)
    verdict: Verdict | None = None
    measurement: Measurement | None = None
    floor_seconds: float | None = None
    wall_seconds: float = 0.0  # tuning time this trial cost
    # where that time went, seconds: wait (for the compile pool's build), load, verify, time
    # (the build itself is artifact_meta's compile_s)
    phases: dict[str, float] = field(default_factory=dict)
    number: int = -1  # the Optuna trial number

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown trial status {self.status!r}")

    @property
    def seconds(self) -> float | None:
        return self.measurement.median if self.status == "ok" and self.measurement else None

    @property
    def floor_fraction(self) -> float | None:
        """Roofline floor / time: 1.0 means at the floor."""
        if self.seconds and self.floor_seconds:
            return self.floor_seconds / self.seconds
        return None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict.to_dict() if self.verdict else None
        data["measurement"] = self.measurement.to_dict() if self.measurement else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialRecord":
        data = dict(data)
        data["verdict"] = Verdict.from_dict(data["verdict"]) if data.get("verdict") else None
        data["measurement"] = Measurement.from_dict(data["measurement"]) if data.get("measurement") else None
        return cls(**data)


class RecordLog:
    """Append-only JSON-lines log of trial records."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: TrialRecord) -> None:
        line = json.dumps(record.to_dict(), default=str)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def __iter__(self) -> Iterator[TrialRecord]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as handle:
            for line in handle:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield TrialRecord.from_dict(json.loads(line))
                except (json.JSONDecodeError, TypeError, ValueError):
                    continue  # a line torn by a kill: the trial in flight is the one we lose
