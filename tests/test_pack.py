"""Packs: round trip as directory and archive, tampering refused, merging keeps the faster kernel."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from portkern.backends.base import Artifact
from portkern.errors import PackError
from portkern.pack import Pack, PackEntry, fingerprint_mismatch, load_pack, merge_packs, write_pack
from portkern.search.records import Measurement, Verdict


def _entry(key: str, seconds: float, binary: bytes = b"\x7fELF-kernel") -> PackEntry:
    artifact = Artifact(backend="tvm", variant="gemm_tiled", config={"TILE": 32}, source="# kernel source\n",
                        binary=binary, binary_name="kernel.so", meta={"compile_s": 0.5})
    verdict = Verdict(passed=True, reason="", precision="fp32", tolerance={"rel_l2": 1e-5},
                      checks=[{"seed": 11, "rel_l2": 1e-7}])
    return PackEntry(key=key, task={"kind": "gemm"}, backend="tvm", variant="gemm_tiled", origin="builtin",
                     config={"TILE": 32}, artifact=artifact, verdict=verdict,
                     measurement=Measurement(times=[seconds, seconds * 1.1, seconds * 0.9], method="test"),
                     baseline_seconds=seconds * 2, floor_seconds=seconds / 4, model_hashes=["m1"])


def _pack(*entries: PackEntry, fingerprint: dict[str, str] | None = None) -> Pack:
    return Pack(target={"name": "cpu", "backend": "tvm"}, fingerprint=fingerprint or {"backend": "tvm", "tvm": "0.27"},
                entries={e.key: e for e in entries}, models={"m1": {"name": "bert", "shapes": {"ids": [1, 128]}}})


@pytest.mark.parametrize("name", ["p.pkpack", "p.tar.gz"])
def test_round_trip(tmp_path: Path, name: str) -> None:
    path = write_pack(_pack(_entry("gemm-aaaa", 1e-3)), tmp_path / name)
    pack = load_pack(path)
    entry = pack.entries["gemm-aaaa"]
    assert entry.artifact.binary == b"\x7fELF-kernel" and entry.config == {"TILE": 32}
    assert entry.verdict.passed and entry.verdict.checks[0]["seed"] == 11
    assert entry.measurement.times == pytest.approx([1e-3, 1.1e-3, 0.9e-3])
    assert pack.models["m1"]["shapes"] == {"ids": [1, 128]}


def test_tampered_file_is_refused(tmp_path: Path) -> None:
    path = write_pack(_pack(_entry("gemm-aaaa", 1e-3)), tmp_path / "p.pkpack")
    binary = path / "entries" / "gemm-aaaa" / "kernel.so"
    binary.write_bytes(binary.read_bytes() + b"\x00")
    with pytest.raises(PackError, match="checksum mismatch"):
        load_pack(path)


def test_tampered_config_is_refused(tmp_path: Path) -> None:
    path = write_pack(_pack(_entry("gemm-aaaa", 1e-3)), tmp_path / "p.pkpack")
    entry_json = path / "entries" / "gemm-aaaa" / "entry.json"
    data = json.loads(entry_json.read_text())
    data["config"]["TILE"] = 64
    entry_json.write_text(json.dumps(data))
    with pytest.raises(PackError, match="checksum"):
        load_pack(path)


def test_extra_and_missing_files_are_refused(tmp_path: Path) -> None:
    path = write_pack(_pack(_entry("gemm-aaaa", 1e-3)), tmp_path / "p.pkpack")
    (path / "entries" / "gemm-aaaa" / "evil.py").write_text("import os")
    with pytest.raises(PackError, match="not in the manifest"):
        load_pack(path)
    (path / "entries" / "gemm-aaaa" / "evil.py").unlink()
    (path / "entries" / "gemm-aaaa" / "verdict.json").unlink()
    with pytest.raises(PackError, match="missing"):
        load_pack(path)


def test_not_a_pack(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    with pytest.raises(PackError):
        load_pack(junk)
    with pytest.raises(PackError, match="not found"):
        load_pack(tmp_path / "missing.pkpack")


def test_merge_keeps_faster_and_all_models(tmp_path: Path) -> None:
    slow = _pack(_entry("gemm-aaaa", 2e-3), _entry("gemm-bbbb", 1e-3))
    fast = _pack(_entry("gemm-aaaa", 1e-3))
    fast.models = {"m2": {"name": "bert-256", "shapes": {"ids": [1, 256]}}}
    fast.entries["gemm-aaaa"].model_hashes = ["m2"]
    merged = merge_packs([slow, fast])
    assert merged.entries["gemm-aaaa"].seconds == pytest.approx(1e-3)
    assert set(merged.entries) == {"gemm-aaaa", "gemm-bbbb"}
    assert set(merged.models) == {"m1", "m2"}
    assert merged.entries["gemm-aaaa"].model_hashes == ["m1", "m2"]
    reread = load_pack(write_pack(merged, tmp_path / "merged.pkpack"))
    assert set(reread.entries) == {"gemm-aaaa", "gemm-bbbb"}


def test_merge_refuses_other_hardware() -> None:
    with pytest.raises(PackError, match="cannot merge"):
        merge_packs([_pack(_entry("a", 1e-3)), _pack(_entry("b", 1e-3), fingerprint={"backend": "tvm", "tvm": "0.28"})])


def test_fingerprint_mismatch_names_the_difference() -> None:
    pack = _pack(_entry("a", 1e-3))
    assert fingerprint_mismatch(pack, dict(pack.fingerprint)) == []
    differences = fingerprint_mismatch(pack, {"backend": "tvm", "tvm": "0.28"})
    assert differences == ["tvm: pack has '0.27', here '0.28'"]
