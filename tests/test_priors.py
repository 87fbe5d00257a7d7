"""Priors: measured configurations seed studies of nearby shapes (portkern/priors.py)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from portkern.backends import get_backend
from portkern.backends.base import Candidate
from portkern.hwprofile import load_target
from portkern import priors
from portkern.backends.base import Artifact
from portkern.pack import Pack, PackEntry, write_pack
from portkern.priors import Measured, load_priors, nearest_configs, priors_for, priors_from_table, shape_distance
from portkern.search.records import Measurement, Verdict
from portkern.search.records import RecordLog
from portkern.search.strategy import completed_config
from portkern.synthetic import attention_task, conv2d_task, gemm_task, layernorm_task
from portkern.tasks import Task
from portkern.tuner import TaskCatalog

TRITON = get_backend(load_target("h200"))


def test_gemm_distance_is_over_m_n_k_whatever_the_layout_then_the_epilogue() -> None:
    table_shape = gemm_task(4096, 3072, 768, "float16", trans_b=True).describe()
    model_shape = gemm_task(4096, 3072, 768, "float16", bias=True, activation="gelu").describe()
    assert shape_distance(table_shape, gemm_task(4096, 3072, 768, "float16").describe()) == 0.0
    # another epilogue: half a step, so a same-epilogue winner of the same sizes comes first
    assert shape_distance(table_shape, model_shape) == 0.5
    same_epilogue = gemm_task(128, 3072, 768, "float16", bias=True, activation="gelu", batch=(32,)).describe()
    assert shape_distance(same_epilogue, model_shape) == 0.0
    assert shape_distance(table_shape, gemm_task(2048, 3072, 768, "float16").describe()) == 1.0
    assert shape_distance(table_shape, gemm_task(4096, 3072, 768, "float32").describe()) is None
    # bf16 tiles like fp16 (same width): comparable, one step behind the same dtype
    assert shape_distance(table_shape, gemm_task(4096, 3072, 768, "bfloat16").describe()) == 1.0
    # rows that TMA cannot read in place (K=777) run other kernels: two steps further
    odd = gemm_task(4096, 3072, 777, "float16", trans_b=True).describe()
    assert shape_distance(table_shape, odd) == pytest.approx(2.0 + abs(math.log2(777 / 768)))
    assert shape_distance(table_shape, layernorm_task(4096, 768, "float16").describe()) is None


def test_nearest_configs_are_distinct_closest_first_then_fastest() -> None:
    near, far = gemm_task(512, 768, 768, "float16").describe(), gemm_task(8, 64, 64, "float16").describe()
    measured = [Measured(far, "v", {"a": 1}, 1e-6), Measured(near, "v", {"a": 2}, 2e-5),
                Measured(near, "v", {"a": 3}, 1e-5), Measured(near, "v", {"a": 3}, 1e-5)]
    chosen = nearest_configs(gemm_task(500, 768, 768, "float16").describe(), measured, 3)
    assert [m.config["a"] for m in chosen] == [3, 2, 1]


def test_catalog_seeds_only_configs_the_variants_still_admit(tmp_path: Path) -> None:
    task = gemm_task(1000, 768, 768, "float16", bias=True)
    library = {v.name: v for v in TRITON.variants(task)}
    tma = library["gemm_tma"]
    good = {**tma.default, "BLOCK_M": 64}
    stale = {**tma.default, "BLOCK_M": 96}  # not in SPACE (any more)
    shape = gemm_task(1024, 768, 768, "float16", trans_b=True).describe()
    priors = [Measured(shape, "gemm_tma", stale, 1e-6), Measured(shape, "gemm_tma", good, 2e-6),
              Measured(shape, "no_such_variant", good, 1e-7)]
    catalog = TaskCatalog(tmp_path / "tasks.jsonl", priors)
    seeds = catalog.nearest(task, RecordLog(tmp_path / "records.jsonl"), library)
    assert seeds == [Candidate.of(tma, good)]
    assert TaskCatalog(tmp_path / "none.jsonl").nearest(task, RecordLog(tmp_path / "r2.jsonl"), library) == []


def test_priors_from_a_table_keep_the_fastest_ok_entries_of_complete_cases() -> None:
    def case(m: int, complete: bool) -> dict:
        entries = [{"variant": "gemm_tma", "config": {"BLOCK_M": b}, "seconds": s, "status": st}
                   for b, s, st in ((64, 3e-6, "ok"), (128, 1e-6, "ok"), (256, 5e-7, "rejected"),
                                    (32, None, "invalid"))]
        return {"task": {"kind": "gemm", "m": m, "n": 64, "k": 64, "dtype": "float16", "trans_b": True,
                         "bias": False, "activation": "none", "residual": False},
                "entries": entries, "complete": complete}
    found = priors_from_table({"cases": [case(256, True), case(512, False)]}, top=2, evidence="t.json")
    assert [(m.task["inputs"][0][0][0], m.config["BLOCK_M"]) for m in found] == [(256, 128), (256, 64)]
    assert all(m.evidence == "t.json" for m in found)


def _task_of(described: dict) -> Task:
    """A prior's task rebuilt the way a model's is (the shipped priors hold GEMMs, NHWC convs and
    attention)."""
    (x, dtype), (w, _) = described["inputs"][0], described["inputs"][1]
    attrs = described["attrs"]
    if described["kind"] == "gemm":
        return gemm_task(math.prod(x[:-1]), w[0], x[-1], dtype, trans_b=True)
    if described["kind"] == "attention":
        batch, heads, seq, head_dim = x
        return attention_task(batch, heads, seq, head_dim, dtype, seq_kv=w[2], mask=attrs["mask"],
                              causal=attrs["causal"], k_transposed=attrs["k_transposed"])
    assert described["kind"] == "conv2d" and attrs["layout"] == "nhwc", described
    n, h, width, c = x
    oc, kh, kw, _ = w
    return conv2d_task(n, c, h, width, oc, kh, kw, dtype, stride=attrs["strides"], pad=attrs["pads"][:2],
                       dilation=attrs["dilations"], group=attrs["group"], activation=attrs["activation"],
                       bias=attrs["bias"], residual=attrs["residual"], nhwc=True)


@pytest.mark.parametrize("target, card, kinds", [("h200", "H200", {"gemm", "conv2d", "attention"}),
                                                 ("h100", "H100", {"gemm"})])
def test_shipped_priors_are_admitted_by_the_current_library_and_measured_on_their_card(
        target: str, card: str, kinds: set[str]) -> None:
    priors = load_priors(target)
    assert {prior.task["kind"] for prior in priors} == kinds
    root = Path(__file__).parents[1]
    for evidence in {prior.evidence for prior in priors}:  # each names the measured table it came from
        report = json.loads((root / evidence).read_text())
        device = report.get("device", report.get("environment", {}).get("device", ""))
        assert card in device, (evidence, device)  # a card's priors come from that card's tables only
    for prior in priors:
        task = _task_of(prior.task)
        if task.kind == "conv2d":  # rebuilt exactly: the distance to a model's conv is the one measured
            assert json.loads(json.dumps(task.describe())) == prior.task
        # what the target offers (gemm_wgmma too, which this CPU cross-compiles but cannot run)
        library = {v.name: v for v in TRITON.variants(task, runnable_here=False)}
        assert prior.variant in library, prior
        config = completed_config(library[prior.variant], prior.config)
        assert config is not None, prior
        assert TRITON.target_problem(Candidate.of(library[prior.variant], config), task) is None, prior


def test_a_conv_is_seeded_with_the_nearest_measured_nhwc_config_first(tmp_path: Path) -> None:
    """A shape nobody measured (3x3 at 20 px, 96 channels) starts from the grid's 3x3 winners, their
    parameters added since (TAP_ROWS) at the default, not from the library's first variant."""
    task = conv2d_task(8, 96, 20, 20, 96, 3, 3, "float16", pad=1, activation="relu", nhwc=True)
    library = {v.name: v for v in TRITON.variants(task)}
    seeds = TaskCatalog(tmp_path / "tasks.jsonl", load_priors("h200")).nearest(
        task, RecordLog(tmp_path / "records.jsonl"), library)
    assert seeds and all(seed.variant.name == "conv2d_nhwc" for seed in seeds)
    assert seeds[0].params["TAP_ROWS"] is False and set(seeds[0].params) == set(library["conv2d_nhwc"].space)


def test_a_config_measured_before_a_parameter_existed_takes_its_default() -> None:
    variant = next(v for v in TRITON.variants(conv2d_task(2, 8, 9, 9, 8, 3, 3, "float16", pad=1, nhwc=True))
                   if v.name == "conv2d_nhwc")
    older = {k: v for k, v in variant.default.items() if k != "TAP_ROWS"}
    assert completed_config(variant, older) == dict(variant.default)
    assert completed_config(variant, {**older, "NO_SUCH_PARAMETER": 1}) is None
    assert completed_config(variant, {**variant.default, "BLOCK_M": 96}) is None  # outside the space


def test_a_target_borrows_the_priors_of_its_architecture_for_what_it_has_not_measured(tmp_path: Path) -> None:
    """An H100 (sm_90, like the H200) takes the H200's measured winners except those of a variant
    it has measured itself on that shape; an A100 (sm_80) and the CPU have no sibling with priors
    and start from the library's defaults."""
    shipped = load_priors("h200")
    assert priors_for(load_target("h200"))[:len(shipped)] == shipped
    assert priors_for(load_target("a100")) == [] and priors_for(load_target("cpu")) == []
    (tmp_path / "h200.jsonl").write_text("".join(json.dumps(item.__dict__) + "\n" for item in shipped[:3]))
    assert priors_for(load_target("h100"), tmp_path) == shipped[:3]  # nothing of its own: all borrowed
    own = Measured(shipped[0].task, shipped[0].variant, shipped[0].config, 1.5 * shipped[0].seconds, "measured here")
    (tmp_path / "h100.jsonl").write_text(json.dumps(own.__dict__) + "\n")
    replaced = [item for item in shipped[:3] if (item.task, item.variant) == (own.task, own.variant)]
    assert replaced and priors_for(load_target("h100"), tmp_path) == [own] + [item for item in shipped[:3]
                                                                              if item not in replaced]
    other_variant = Measured(own.task, "gemm_tiled", own.config, own.seconds, "measured here")
    (tmp_path / "h100.jsonl").write_text(json.dumps(other_variant.__dict__) + "\n")  # replaces nothing
    assert priors_for(load_target("h100"), tmp_path) == [other_variant] + shipped[:3]


def test_a_tuned_pack_becomes_priors_that_seed_a_nearby_shape(tmp_path: Path) -> None:
    """python -m portkern.priors --pack: every kernel a tune kept, at its measured median."""
    tuned = gemm_task(1024, 768, 768, "float16", bias=True)
    tma = {v.name: v for v in TRITON.variants(tuned)}["gemm_tma"]
    config = {**tma.default, "BLOCK_M": 64}
    entry = PackEntry(key=tuned.key, task=tuned.describe(), backend="triton", variant="gemm_tma", origin="builtin",
                      config=config, artifact=Artifact(backend="triton", variant="gemm_tma", config=config,
                                                       source=tma.source),
                      verdict=Verdict(True, "", "fp16", {}), measurement=Measurement([3e-6, 2e-6, 4e-6], "test"),
                      baseline_seconds=5e-6, floor_seconds=1e-6)
    pack = write_pack(Pack(target={"name": "h200", "backend": "triton"}, fingerprint=TRITON.fingerprint(),
                           entries={entry.key: entry}), tmp_path / "tuned.pkpack")
    assert priors.main(["--pack", str(pack), "--out", str(tmp_path / "priors" / "h200.jsonl")]) == 0
    (prior,) = load_priors("h200", tmp_path / "priors")
    assert (prior.variant, prior.config, prior.seconds, prior.evidence) == ("gemm_tma", config, 3e-6, str(pack))
    nearby = gemm_task(1000, 768, 768, "float16", bias=True)
    library = {v.name: v for v in TRITON.variants(nearby)}
    seeds = TaskCatalog(tmp_path / "tasks.jsonl", [prior]).nearest(nearby, RecordLog(tmp_path / "r.jsonl"), library)
    assert seeds == [Candidate.of(library["gemm_tma"], config)]
