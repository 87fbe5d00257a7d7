"""TVM kernels inside onnxruntime's graph: one session for the whole model (backends/tvm/inline.py
and its custom op, kernel_op.c, built here with the host's C compiler)."""
from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from portkern.backends import get_backend
from portkern.backends.base import Artifact, Candidate
from portkern.backends.tvm import TvmBackend, inline
from portkern.hwprofile import load_target
from portkern.ir import Graph
from portkern.models import export_bert, random_feeds
from portkern.onnx_import import load_model
from portkern.ort_subgraph import session_options
from portkern.pack import Pack, PackEntry
from portkern.partition import backend_tasks
from portkern.runtime import Session
from portkern.search.records import Measurement, Verdict
from portkern.tasks import Task


@pytest.fixture(scope="module")
def backend() -> TvmBackend:
    backend = get_backend(load_target("cpu"))
    assert isinstance(backend, TvmBackend)
    return backend


def _kernels(backend: TvmBackend, graph: Graph, kinds: set[str]) -> list[tuple[Task, Artifact]]:
    """Every task of these kinds with its first variant built at the default config (not tuned)."""
    built: dict[str, Artifact] = {}
    kernels = []
    for task in backend_tasks(graph, backend)[1]:
        if task.kind not in kinds:
            continue
        if task.key not in built:
            variant = backend.variants(task)[0]
            built[task.key] = backend.compile(Candidate.of(variant, variant.default), task)
        kernels.append((task, built[task.key]))
    return kernels


def _pack(backend: TvmBackend, kernels: list[tuple[Task, Artifact]]) -> Pack:
    entries = {task.key: PackEntry(key=task.key, task=task.describe(), backend="tvm", variant=artifact.variant,
                                   origin="builtin", config=artifact.config, artifact=artifact,
                                   verdict=Verdict(True, "", "fp32", {}), measurement=Measurement([1e-3], "test"),
                                   baseline_seconds=None, floor_seconds=0.0)
               for task, artifact in kernels}
    return Pack(target={"name": "cpu", "backend": "tvm"}, fingerprint=backend.fingerprint(), entries=entries)


def _onnxruntime(model: Path | onnx.ModelProto, feeds: dict[str, np.ndarray], custom_ops: bool = False
                 ) -> list[np.ndarray]:
    loadable = str(model) if isinstance(model, Path) else model.SerializeToString()
    options = session_options(2, custom_ops=inline.op_library() if custom_ops else None)
    return ort.InferenceSession(loadable, options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


@pytest.fixture(scope="module")
def bert() -> tuple[Path, dict[str, tuple[int, ...]]]:
    return export_bert(layers=1, hidden=64, heads=2, intermediate=128, seq=32, vocab=100), {"input_ids": (2, 32)}


def test_bert_runs_its_kernels_inside_one_onnxruntime_session(backend: TvmBackend, bert: tuple[Path, dict]) -> None:
    path, shapes = bert
    graph = load_model(path, shapes)
    kernels = _kernels(backend, graph, {"gemm", "layernorm", "attention"})
    session = Session(path, _pack(backend, kernels), shapes=shapes)
    assert len(session.kernels) == len(kernels) >= 6
    assert len(session.steps) == 1 and len(session.pieces) == 1 and not session.baselines
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for seed in (1, 2):
        feeds = random_feeds(graph, seed=seed)
        got = session.run(feeds)
        for name, want in zip(graph.outputs, reference.run(graph.outputs, feeds)):
            assert _rel_error(got[name], want) < 1e-5, name


def test_the_model_file_keeps_all_but_the_kernels_tasks(backend: TvmBackend, bert: tuple[Path, dict]) -> None:
    """Edited from the file, every node the kernels do not replace stays as exported; rebuilt from
    the graph it is the graph's own nodes (the import folded the shape arithmetic). Both compute
    the model."""
    path, shapes = bert
    graph = load_model(path, shapes)
    kernels = _kernels(backend, graph, {"gemm", "attention", "layernorm"})
    replaced = {node.name for task, _ in kernels for node in task.nodes}
    edited = inline.inline_model(graph, kernels, 2, source=path)
    rebuilt = inline.inline_model(graph, kernels, 2)
    for model in (edited, rebuilt):
        ops = Counter(node.op_type for node in model.graph.node)
        assert ops[inline.OP_TYPE] == len(kernels)
        assert not replaced & {node.name for node in model.graph.node}
    edited_names = {node.name for node in edited.graph.node}
    assert all(node.name in edited_names for node in onnx.load(str(path)).graph.node if node.name not in replaced)
    assert len(rebuilt.graph.node) < len(edited.graph.node)
    feeds = random_feeds(graph, seed=3)
    want = _onnxruntime(path, feeds)
    for model in (edited, rebuilt):
        for got, expected in zip(_onnxruntime(model, feeds, custom_ops=True), want):
            assert _rel_error(got, expected) < 1e-5


def test_a_shape_read_inside_a_kernels_task_becomes_a_constant(backend: TvmBackend, tmp_path: Path) -> None:
    """MatMul -> Add -> Relu is one GEMM task; a Shape of the MatMul's own output (which the
    import folds) would read a value the kernel no longer computes: it becomes that shape."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b"], ["biased"], name="bias"),
             helper.make_node("Relu", ["biased"], ["act"], name="relu"),
             helper.make_node("Shape", ["mm"], ["shape"], name="shape_of_mm", start=-1),
             helper.make_node("Concat", ["minus_one", "shape"], ["flat"], name="concat", axis=0),
             helper.make_node("Reshape", ["act", "flat"], ["y"], name="reshape")]
    inits = [numpy_helper.from_array(rng.standard_normal((16, 24)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one")]
    proto = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 24])], inits)
    path = tmp_path / "shape_read.onnx"
    onnx.save(helper.make_model(proto, opset_imports=[helper.make_opsetid("", 17)]), path)
    graph = load_model(path)
    kernels = _kernels(backend, graph, {"gemm"})
    assert [node.name for node in kernels[0][0].nodes] == ["mm", "bias", "relu"]
    edited = inline.inline_model(graph, kernels, 2, source=path)
    constant = next(node for node in edited.graph.node if node.name == "shape_of_mm")
    assert constant.op_type == "Constant"
    assert numpy_helper.to_array(constant.attribute[0].t).tolist() == [24]
    feeds = {"x": rng.standard_normal((2, 8, 16)).astype(np.float32)}
    np.testing.assert_allclose(_onnxruntime(edited, feeds, custom_ops=True)[0], _onnxruntime(path, feeds)[0],
                               rtol=1e-5, atol=1e-5)


def _cnn(path: Path) -> Path:
    """Conv -> BatchNormalization -> Relu -> MaxPool -> GlobalAveragePool -> Flatten -> Gemm on a
    1x3x17x17 input, its weights listed among the graph inputs too, as old exporters (IR < 4) did:
    the BN folds into the conv's task, so the conv's own weight is read by nothing once the kernel
    replaces them."""
    rng = np.random.default_rng(5)
    weights = {"w": rng.standard_normal((8, 3, 3, 3)), "scale": rng.standard_normal(8), "shift": rng.standard_normal(8),
               "mean": rng.standard_normal(8), "var": rng.random(8) + 0.5, "fc": rng.standard_normal((4, 8)),
               "fcb": rng.standard_normal(4)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1)]
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 17, 17])] + [
        helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in weights.items()]
    graph = helper.make_graph(nodes, "cnn", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_kernels_with_workspaces_and_a_feed_at_an_unaligned_address(backend: TvmBackend, tmp_path: Path) -> None:
    """The conv reads the graph's input, here from memory 4 bytes off TVM's 64-byte alignment
    (the op copies it); conv and pool kernels allocate workspaces; several runs reuse them; the
    conv's own weight, folded away, leaves the file's initializers and inputs."""
    path = _cnn(tmp_path / "cnn.onnx")
    graph = load_model(path)
    kernels = _kernels(backend, graph, {"conv2d", "pool", "gemm"})
    assert {task.kind for task, _ in kernels} == {"conv2d", "pool", "gemm"}
    assert all(b"__TVMBackendAllocWorkspace" in artifact.binary for task, artifact in kernels if task.kind == "conv2d")
    edited = inline.inline_model(graph, kernels, 2, source=path).graph
    assert "w" not in {value.name for value in (*edited.input, *edited.initializer)}
    session = Session(path, _pack(backend, kernels))
    assert len(session.steps) == 1
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 3, 17, 17)).astype(np.float32)
        raw = np.empty(x.nbytes + 128, dtype=np.uint8)
        start = (-raw.ctypes.data) % 64 + 4
        unaligned = raw[start:start + x.nbytes].view(np.float32).reshape(x.shape)
        unaligned[...] = x
        assert unaligned.ctypes.data % 64 == 4
        got = session.run({"x": unaligned})["y"]
        np.testing.assert_allclose(got, reference.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_without_the_op_kernels_run_as_steps_and_say_why(backend: TvmBackend, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    path = _cnn(tmp_path / "cnn.onnx")
    kernels = _kernels(backend, load_model(path), {"conv2d"})

    def no_compiler() -> Path:
        raise inline.InlineUnavailable("no C compiler for the onnxruntime op (cc: not found)")
    monkeypatch.setattr(inline, "op_library", no_compiler)
    with caplog.at_level(logging.WARNING, logger="portkern.tvm"):
        session = Session(path, _pack(backend, kernels))
    assert len(session.steps) > 1 and len(session.kernels) == 1
    assert any("not inside one: no C compiler" in record.getMessage() for record in caplog.records)
    x = np.random.default_rng(0).standard_normal((1, 3, 17, 17)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_a_kernel_with_an_output_the_op_cannot_write_is_refused(backend: TvmBackend) -> None:
    from portkern.synthetic import layernorm_task

    task = layernorm_task(4, 8, "float16")
    artifact = Artifact(backend="tvm", variant="tvm_layernorm", config={}, source="", binary=b"\x7fELF",
                        meta={"arg_shapes": [[4, 8], [8], [8], [4, 8]]})
    with pytest.raises(inline.InlineUnavailable, match="float32 outputs only"):
        inline.kernel_node(task, artifact, 2)


def test_baselines_inside_the_model_come_from_onnxruntimes_profiler(backend: TvmBackend,
                                                                  bert: tuple[Path, dict]) -> None:
    """Each workload whose nodes the profiler names gets its in-model time; a profile's baseline
    is the lesser of that and its time alone (what a kernel must beat in the model)."""
    from portkern.profile import TaskProfile
    from portkern.search.records import Measurement

    path, shapes = bert
    graph, tasks = backend_tasks(load_model(path, shapes), backend)
    in_model = backend.baseline_in_model(graph, tasks, path)
    assert in_model is not None
    assert {task.kind for task in tasks if task.key in in_model} >= {"gemm", "layernorm"}
    assert all(0.0 < seconds < 0.1 for seconds in in_model.values())
    gemm = next(task for task in tasks if task.kind == "gemm" and task.key in in_model)
    alone = TaskProfile(gemm, 1, 0.0, Measurement([2 * in_model[gemm.key]] * 3, "test"), "tvm baseline",
                        in_model[gemm.key])
    assert alone.seconds == in_model[gemm.key]
    assert TaskProfile(gemm, 1, 0.0, Measurement([1e-9] * 3, "test"), "tvm baseline", in_model[gemm.key]).seconds == 1e-9
