"""The plugin API: an out-of-tree package (tests/plugin_backend) adds a chip through entry points.

The package is built and installed with pip, as a third party would ship it, but into a
temporary directory put on sys.path (not into the shared virtualenv), so it is seen only by this
test's process and the worker processes it starts.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import portkern
from portkern import backends
from portkern.backends.base import Candidate
from portkern.hwprofile import available_targets, load_target
from portkern.measure import MeasureOptions
from portkern.synthetic import gemm_task, softmax_task
from portkern.verify import verify

PLUGIN_SOURCE = Path(__file__).with_name("plugin_backend")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    work = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN_SOURCE, work / "src")  # pip builds in the tree: keep ours clean
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                    "--no-index", "--target", str(site), str(source)], check=True, capture_output=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        backends._entry_points.cache_clear()
        yield
    backends._entry_points.cache_clear()


def test_plugin_is_listed(plugin: None) -> None:
    assert "toycpu" in backends.backend_names()
    assert "toycpu" in available_targets()
    target = load_target("toycpu")
    assert target.backend == "toycpu" and target.profile.kind == "toy"
    assert target.profile.sources["peak_flops"] == "made up for the plugin test"


@pytest.mark.parametrize("task", [gemm_task(37, 45, 29, "float32", bias=True, activation="relu", residual=True),
                                  gemm_task(20, 24, 16, "float32", trans_b=True),
                                  softmax_task(33, 70, "float32")], ids=["gemm-epilogue", "gemm-transb", "softmax"])
def test_plugin_kernels_pass_the_gate(plugin: None, task: portkern.tasks.Task) -> None:
    backend = backends.get_backend(load_target("toycpu"))
    (variant,) = backend.variants(task)
    assert variant.origin == "plugin"
    for config in (variant.default, {name: choices[0] for name, choices in variant.space.items()}):
        program = backend.load(backend.compile(Candidate.of(variant, config), task), task)
        verdict = verify(backend, program, task, variant.precision)
        assert verdict.passed, verdict.reason


def test_plugin_constraints_reject_before_running(plugin: None) -> None:
    backend = backends.get_backend(load_target("toycpu"))
    task = gemm_task(16, 16, 16, "float32", activation="gelu")
    (variant,) = backend.variants(task)
    assert "gelu" in (backend.check(Candidate.of(variant, variant.default), task) or "")
    plain = gemm_task(16, 16, 16, "float32")
    assert "exceeds" in (backend.check(Candidate.of(variant, {"BLOCK_M": 512}), plain) or "")


def _tiny_model(path: Path) -> Path:
    """MatMul + bias + Relu -> Softmax: a gemm task and a softmax task, both on the toy CPU."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((24, 16)) / 5).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b"], ["biased"], name="bias"),
             helper.make_node("Relu", ["biased"], ["act"], name="relu"),
             helper.make_node("Softmax", ["act"], ["y"], name="softmax", axis=-1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_tune_a_tiny_model_on_the_plugin(plugin: None, tmp_path: Path) -> None:
    model = _tiny_model(tmp_path / "tiny.onnx")
    report = portkern.tune(model, target="toycpu", out=tmp_path / "tiny.pkpack", trials=6, per_task_trials=3,
                           min_task_trials=3, measure=MeasureOptions(warmup=1, repeats=3, input_sets=2))
    assert report.backend == "toycpu"
    assert {o.profile.task.kind for o in report.outcomes} == {"gemm", "softmax"}
    assert all(o.result is not None and o.result.measured >= 1 for o in report.outcomes)
    assert report.end_to_end["passed"]
    session = portkern.Session(model, tmp_path / "tiny.pkpack")
    feeds = {"x": np.random.default_rng(3).standard_normal((8, 24)).astype(np.float32)}
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = session.run(feeds)["y"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
