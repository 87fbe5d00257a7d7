"""Hardware profiles and targets: the numbers a search and a roofline need, each with its source.

One YAML per target in portkern/hwprofiles/. The `cpu` profile is read off the host at load time
(cores, vector width, caches, clock); its bandwidth is measured once per process.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .errors import TargetError

_PROFILE_DIR = Path(__file__).parent / "hwprofiles"


@dataclass(frozen=True)
class HwProfile:
    """Peak rates, bandwidth and on-chip limits of one piece of hardware."""

    name: str
    kind: str  # 'cuda' | 'hip' | 'cpu' | 'npu'
    arch: str  # 'sm_90', 'gfx942', 'x86_64', 'ascend910b'
    backend: str  # default backend for this target
    description: str
    peak_flops: dict[str, float]  # dtype name -> FLOP/s (dense)
    mem_bandwidth: float  # bytes/s, measured where a measurement exists
    cores: int  # SMs, CUs, CPU cores, NPU AI cores
    warp_size: int
    alignment: int  # bytes
    limits: dict[str, float] = field(default_factory=dict)  # shared_mem_per_block, registers, ub_bytes, ...
    sources: dict[str, str] = field(default_factory=dict)  # field -> where the number came from
    simulated: bool = False

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a compute dtype; unknown dtypes fall back to the fp32 rate.

        float32 is the fastest way to fp32-accurate products: where the chip has TF32 tensor cores,
        three TF32 products per product (tf32x3) can beat its fp32 FMA lanes, and a floor above a
        kernel's measured time would stop searches early and reject that kernel as impossible."""
        fp32 = self.peak_flops["float32"]
        if dtype == "float32":
            return max(fp32, self.peak_flops.get("tf32", 0.0) / 3)
        return self.peak_flops.get(dtype, fp32)

    def floor_seconds(self, flops: float, nbytes: float, dtype: str) -> float:
        """Roofline floor: no kernel can beat both the arithmetic and the memory time.

        Where the profile knows an on-chip cache's bandwidth and the task's bytes fit in it, that
        is the ceiling (a small task's data stays in cache across runs on a CPU)."""
        bandwidth = self.mem_bandwidth
        if nbytes <= self.limits.get("cache_bytes", 0):
            bandwidth = max(bandwidth, self.limits.get("cache_bandwidth", 0.0))
        return max(flops / self.peak(dtype), nbytes / bandwidth)

    def reachable_seconds(self, flops: float, nbytes: float, dtype: str) -> float:
        """The least time a kernel of this size is measured at here: the roofline floor, or the
        shortest kernel this target's timing shows at all (limits.launch_seconds, where known),
        whichever is longer. A tiny task already there has nothing left for a search to find."""
        return max(self.floor_seconds(flops, nbytes, dtype), self.limits.get("launch_seconds", 0.0))

    def limit(self, name: str) -> float:
        try:
            return self.limits[name]
        except KeyError:
            raise TargetError(f"hwprofile {self.name} has no limit '{name}'") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "arch": self.arch, "backend": self.backend,
            "description": self.description, "peak_flops": dict(self.peak_flops),
            "mem_bandwidth": self.mem_bandwidth, "cores": self.cores, "warp_size": self.warp_size,
            "alignment": self.alignment, "limits": dict(self.limits), "sources": dict(self.sources),
            "simulated": self.simulated,
        }


@dataclass(frozen=True)
class Target:
    """What a tune is for: a profile and the backend that compiles for it."""

    name: str
    backend: str
    profile: HwProfile

    def hash(self) -> str:
        blob = json.dumps({"backend": self.backend, **self.profile.to_dict()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


PLUGIN_GROUP = "portkern.hwprofiles"


def _plugin_profiles() -> dict[str, Path]:
    """Profiles shipped by other packages: entry point name -> object that is a YAML path."""
    found: dict[str, Path] = {}
    for entry in metadata.entry_points(group=PLUGIN_GROUP):
        try:
            found[entry.name] = Path(str(entry.load()))
        except ImportError:
            continue
    return found


def available_targets() -> list[str]:
    builtin = {path.stem for path in _PROFILE_DIR.glob("*.yaml")}
    return sorted(builtin | set(_plugin_profiles()))


def _load_yaml(name: str) -> dict[str, Any]:
    path: Path | None = _PROFILE_DIR / f"{name}.yaml"
    if path is None or not path.is_file():
        path = _plugin_profiles().get(name)
    if path is None or not path.is_file():
        raise TargetError(f"unknown target '{name}' (known: {', '.join(available_targets())})")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TargetError(f"hwprofile '{name}' is not valid YAML: {exc}") from None


@functools.lru_cache(maxsize=None)
def load_profile(name: str) -> HwProfile:
    data = _load_yaml(name)
    if data.get("detect") == "host":
        data = _read_host(data)
    return HwProfile(
        name=name, kind=data["kind"], arch=data["arch"], backend=data["backend"],
        description=data.get("description", ""),
        peak_flops={k: float(v) for k, v in data["peak_flops"].items()},
        mem_bandwidth=float(data["mem_bandwidth"]), cores=int(data["cores"]),
        warp_size=int(data.get("warp_size", 1)), alignment=int(data.get("alignment", 1)),
        limits={k: float(v) for k, v in data.get("limits", {}).items()},
        sources=dict(data.get("sources", {})), simulated=bool(data.get("simulated", False)),
    )


def load_target(name: str, backend: str | None = None) -> Target:
    """The target named on the command line; `backend` overrides the profile's default."""
    profile = load_profile(name)
    return Target(name=name, backend=backend or profile.backend, profile=profile)


# --- the host CPU --------------------------------------------------------------------------------

def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    match = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return set(match.group(1).split()) if match else set()


def _cpu_mhz() -> float | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    match = re.search(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)
    return float(match.group(1)) if match else None


def _cache_sizes() -> dict[str, float]:
    sizes: dict[str, float] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 1024, "M": 1024**2}.get(size[-1], 1)
        sizes[f"l{level}_bytes"] = float(int(size.rstrip("KM")) * scale)
    return sizes


@functools.lru_cache(maxsize=None)
def measure_copy_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes/s (read + write) of one core's numpy copy of `nbytes`, best of `repeats`."""
    src = np.full(nbytes // 4, 1.5, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _read_host(data: dict[str, Any]) -> dict[str, Any]:
    flags = _cpu_flags()
    vector_bytes = 64 if "avx512f" in flags else 32 if "avx2" in flags else 16
    cores = usable_cores()
    mhz = _cpu_mhz() or float(data.get("fallback_mhz", 2000))
    fma_units = int(data.get("fma_units_per_core", 2))
    fp32_lanes = vector_bytes // 4
    fp32_peak = cores * mhz * 1e6 * fp32_lanes * 2 * fma_units
    caches = _cache_sizes()
    l2 = int(caches.get("l2_bytes", 1 << 20))
    # ceilings for a floor must not be underestimated (a kernel faster than the floor is rejected):
    # one core's best copy times the cores, from DRAM and from a quarter of L2
    limits = {"vector_bytes": float(vector_bytes), **caches, "cache_bytes": float(l2 * cores // 2),
              "cache_bandwidth": measure_copy_bandwidth(l2 // 4, 50) * cores}
    data = dict(data)
    data.update(
        arch=platform.machine() or "unknown", cores=cores, alignment=vector_bytes,
        peak_flops={"float32": fp32_peak, "float64": fp32_peak / 2, "float16": fp32_peak},
        mem_bandwidth=measure_copy_bandwidth(128 << 20, 5) * cores, limits=limits,
    )
    data["sources"] = {
        **data.get("sources", {}),
        "peak_flops": f"cores({cores}) x {mhz:.0f} MHz x {fp32_lanes} fp32 lanes x 2 (FMA) x {fma_units} FMA units",
        "mem_bandwidth": f"numpy copy of 128 MiB on one core of this host, best of 5, read+write bytes, x {cores} cores",
        "cache_bandwidth": f"numpy copy of L2/4 on one core, best of 50, x {cores} cores; used for tasks under cache_bytes",
        "limits": "/proc/cpuinfo flags and /sys/devices/system/cpu/cpu0/cache",
    }
    return data
