"""Kernel packs: precompiled, shape-specific, verified kernels with their evidence.

A pack is a directory (or a .tar.gz of one) holding manifest.json and one folder per workload:
the kernel source, the compiled binary, the configuration, the gate's verdict, the timing
distribution and the baseline's time. The manifest records the format version, the model hash,
the target profile, the hardware/software fingerprint and a sha256 of every other file; a pack
whose files do not match is refused.
"""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .backends.base import Artifact
from .errors import PackError
from .search.records import Measurement, Verdict

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class PackEntry:
    key: str  # workload key
    task: dict[str, Any]  # Task.describe()
    backend: str
    variant: str
    origin: str
    config: dict[str, Any]
    artifact: Artifact
    verdict: Verdict
    measurement: Measurement
    baseline_seconds: float | None
    floor_seconds: float
    model_hashes: list[str] = field(default_factory=list)  # models this kernel was tuned in

    @property
    def seconds(self) -> float:
        return self.measurement.median


@dataclass
class Pack:
    target: dict[str, Any]  # the HwProfile as a dict, plus the target name and backend
    fingerprint: dict[str, str]
    entries: dict[str, PackEntry]
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # model hash -> {name, shapes}
    created: str = ""
    portkern_version: str = __version__
    report: dict[str, Any] = field(default_factory=dict)  # tune summary, end-to-end check
    path: Path | None = None

    def entry_for(self, task_key: str) -> PackEntry | None:
        return self.entries.get(task_key)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _entry_files(entry: PackEntry) -> dict[str, bytes]:
    art = entry.artifact
    files = {
        "kernel_source.txt": art.source.encode(),
        "entry.json": json.dumps({
            "key": entry.key, "task": entry.task, "backend": entry.backend, "variant": entry.variant,
            "origin": entry.origin, "config": entry.config, "baseline_seconds": entry.baseline_seconds,
            "floor_seconds": entry.floor_seconds, "model_hashes": entry.model_hashes,
            "artifact": {"variant": art.variant, "binary_name": art.binary_name if art.binary else "",
                         "meta": art.meta},
        }, indent=1, sort_keys=True, default=str).encode(),
        "verdict.json": json.dumps(entry.verdict.to_dict(), indent=1, default=str).encode(),
        "measurement.json": json.dumps(entry.measurement.to_dict(), indent=1).encode(),
    }
    if art.binary is not None:
        files[art.binary_name or "kernel.bin"] = art.binary
    return files


def write_pack(pack: Pack, path: str | Path) -> Path:
    """Write atomically: a crash leaves the old pack or none, never half of one.

    A path ending in .tar.gz / .tgz is written as one archive, anything else as a directory.
    """
    path = Path(path)
    pack.created = pack.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    files: dict[str, bytes] = {}
    for key, entry in sorted(pack.entries.items()):
        for name, data in _entry_files(entry).items():
            files[f"entries/{key}/{name}"] = data
    manifest = {
        "format": FORMAT_VERSION, "portkern_version": pack.portkern_version, "created": pack.created,
        "target": pack.target, "fingerprint": pack.fingerprint, "models": pack.models,
        "entries": sorted(pack.entries), "report": pack.report,
        "checksums": {name: _sha256(data) for name, data in sorted(files.items())},
    }
    files[MANIFEST] = json.dumps(manifest, indent=1, sort_keys=True, default=str).encode()
    staging = Path(tempfile.mkdtemp(prefix=".pkpack-", dir=path.parent if path.parent.exists() else None))
    try:
        if path.name.endswith((".tar.gz", ".tgz")):
            archive = staging / path.name
            with tarfile.open(archive, "w:gz") as tar:
                for name, data in sorted(files.items()):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    info.mtime = 0
                    tar.addfile(info, io.BytesIO(data))
            archive.replace(path)
        else:
            root = staging / "pack"
            for name, data in files.items():
                target = root / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            if path.exists():
                old = path.with_name(path.name + ".old")
                shutil.rmtree(old, ignore_errors=True)
                path.rename(old)
                root.rename(path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                root.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    pack.path = path
    return path


def _read_files(path: Path) -> dict[str, bytes]:
    if not path.exists():
        raise PackError(f"pack not found: {path}")
    if path.is_dir():
        return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    try:
        with tarfile.open(path, "r:*") as tar:
            files = {}
            for member in tar.getmembers():
                if member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None:
                        files[member.name] = handle.read()
            return files
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PackError(f"{path} is not a pack (neither a directory nor a readable archive): {exc}") from None


def load_pack(path: str | Path) -> Pack:
    """Read a pack and check every file against the manifest's checksums."""
    path = Path(path)
    files = _read_files(path)
    if MANIFEST not in files:
        raise PackError(f"{path} has no {MANIFEST}: not a portkern pack")
    try:
        manifest = json.loads(files[MANIFEST])
    except json.JSONDecodeError as exc:
        raise PackError(f"{path}: manifest is corrupt ({exc.msg})") from None
    if manifest.get("format") != FORMAT_VERSION:
        raise PackError(f"{path}: pack format {manifest.get('format')} is not supported "
                        f"(this portkern reads format {FORMAT_VERSION})")
    checksums: dict[str, str] = manifest["checksums"]
    for name, digest in checksums.items():
        if name not in files:
            raise PackError(f"{path}: file {name} listed in the manifest is missing")
        if _sha256(files[name]) != digest:
            raise PackError(f"{path}: checksum mismatch for {name}: the pack was modified or corrupted")
    extra = set(files) - set(checksums) - {MANIFEST}
    if extra:
        raise PackError(f"{path}: files not in the manifest: {', '.join(sorted(extra)[:3])}")
    entries = {}
    for key in manifest["entries"]:
        prefix = f"entries/{key}/"
        meta = json.loads(files[prefix + "entry.json"])
        art_meta = meta["artifact"]
        binary_name = art_meta["binary_name"]
        artifact = Artifact(backend=meta["backend"], variant=art_meta["variant"], config=meta["config"],
                            source=files[prefix + "kernel_source.txt"].decode(),
                            binary=files[prefix + binary_name] if binary_name else None,
                            binary_name=binary_name, meta=art_meta["meta"])
        entries[key] = PackEntry(
            key=key, task=meta["task"], backend=meta["backend"], variant=meta["variant"],
            origin=meta["origin"], config=meta["config"], artifact=artifact,
            verdict=Verdict.from_dict(json.loads(files[prefix + "verdict.json"])),
            measurement=Measurement.from_dict(json.loads(files[prefix + "measurement.json"])),
            baseline_seconds=meta["baseline_seconds"], floor_seconds=meta["floor_seconds"],
            model_hashes=meta.get("model_hashes", []))
    return Pack(target=manifest["target"], fingerprint=manifest["fingerprint"], entries=entries,
                models=manifest.get("models", {}), created=manifest["created"],
                portkern_version=manifest["portkern_version"], report=manifest.get("report", {}),
                path=path)


def merge_packs(packs: list[Pack]) -> Pack:
    """One pack serving every shape and model of its inputs; same target and fingerprint required.

    Where two packs hold the same workload, the faster verified kernel wins.
    """
    if not packs:
        raise PackError("nothing to merge")
    first = packs[0]
    merged = Pack(target=first.target, fingerprint=first.fingerprint, entries={}, models={})
    for pack in packs:
        if pack.fingerprint != first.fingerprint or pack.target.get("name") != first.target.get("name"):
            raise PackError(f"cannot merge {pack.path}: made for {pack.target.get('name')} "
                            f"{pack.fingerprint} - not {first.target.get('name')} {first.fingerprint}")
        merged.models.update(pack.models)
        for key, entry in pack.entries.items():
            current = merged.entries.get(key)
            if current is None or entry.seconds < current.seconds:
                if current is not None:
                    entry.model_hashes = sorted(set(entry.model_hashes) | set(current.model_hashes))
                merged.entries[key] = entry
            else:
                current.model_hashes = sorted(set(entry.model_hashes) | set(current.model_hashes))
    return merged


def fingerprint_mismatch(pack: Pack, current: dict[str, str]) -> list[str]:
    """What differs between the machine a pack was made on and this one."""
    keys = sorted(set(pack.fingerprint) | set(current))
    return [f"{k}: pack has {pack.fingerprint.get(k)!r}, here {current.get(k)!r}"
            for k in keys if pack.fingerprint.get(k) != current.get(k)]
