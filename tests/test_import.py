"""ONNX import: clear one-line errors, shape binding, constant folding, concrete shapes everywhere."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from portkern.errors import ModelError, PortkernError, UnsupportedOpError
from portkern.executor import run_graph
from portkern.ir import Graph
from portkern.models import export_bert, zoo_model_path
from portkern.onnx_import import load_model, parse_shape_args

SEQ = 32


def _dynamic_model(op_type: str = "Relu", opset: int = 17) -> onnx.ModelProto:
    """x (batch x 8) -> op -> y, with a named dynamic batch dim."""
    node = helper.make_node(op_type, ["x"], ["y"], name="the_node")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.fixture(scope="module")
def bert_path() -> Path:
    pytest.importorskip("transformers")
    return export_bert()  # traced at 1x128 (shared with the executor tests), bound to 2xSEQ here


@pytest.fixture(scope="module")
def bert(bert_path: Path) -> Graph:
    return load_model(bert_path, {"input_ids": (2, SEQ)})


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as exc:
        load_model(tmp_path / "nope.onnx")
    assert "not found" in _one_line(exc) and "nope.onnx" in str(exc.value)


def test_not_an_onnx_model(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("these are my notes, not a model\n" * 20)
    with pytest.raises(ModelError) as exc:
        load_model(path)
    assert "notes.onnx" in _one_line(exc)


def test_truncated_protobuf(tmp_path: Path) -> None:
    data = zoo_model_path("squeezenet").read_bytes()
    for cut in (len(data) // 3, len(data) // 2, len(data) - 7):
        with pytest.raises(ModelError) as exc:
            load_model(data[:cut])
        _one_line(exc)


def test_opset_out_of_range() -> None:
    with pytest.raises(ModelError, match="opset 8"):
        load_model(_dynamic_model(opset=8), {"x": (1, 8)})


def test_unsupported_op_names_op_and_node() -> None:
    with pytest.raises(UnsupportedOpError) as exc:
        load_model(_dynamic_model("Bernoulli"), {"x": (1, 8)})
    assert exc.value.op_type == "Bernoulli" and exc.value.node_name == "the_node"
    assert "Bernoulli" in _one_line(exc) and "the_node" in str(exc.value)


def test_unbound_dynamic_dim_names_input_and_dim() -> None:
    with pytest.raises(ModelError) as exc:
        load_model(_dynamic_model())
    message = _one_line(exc)
    assert "'x'" in message and "dim 0" in message and "'batch'" in message
    assert "--shape x=" in message


def test_shape_for_unknown_input_and_wrong_rank() -> None:
    with pytest.raises(ModelError, match="unknown input.*nope"):
        load_model(_dynamic_model(), {"x": (2, 8), "nope": (1,)})
    with pytest.raises(ModelError, match="rank 3"):
        load_model(_dynamic_model(), {"x": (2, 8, 1)})
    with pytest.raises(ModelError, match="fixed to 8"):
        load_model(_dynamic_model(), {"x": (2, 9)})


def test_value_dependent_shape_is_refused() -> None:
    """NonZero of runtime data has no static shape: a clear error, not a wrong spec."""
    with pytest.raises(ModelError, match="'the_node' \\(NonZero\\).*runtime value 'x'"):
        load_model(_dynamic_model("NonZero"), {"x": (2, 8)})


def test_parse_shape_args() -> None:
    assert parse_shape_args(["input_ids=1x128", "x=7"]) == {"input_ids": (1, 128), "x": (7,)}
    assert parse_shape_args(["a/b:0=2x3"]) == {"a/b:0": (2, 3)}
    for bad in ("input_ids", "=1x2", "x=1x", "x=0x3", "x=ax2", "x=1,2", "x=-1"):
        with pytest.raises(PortkernError, match="bad --shape"):
            parse_shape_args([bad])
    with pytest.raises(PortkernError, match="twice"):
        parse_shape_args(["x=1", "x=2"])


def test_bound_dims_run_and_feeds_are_checked() -> None:
    graph = load_model(_dynamic_model(), {"x": (3, 8)})
    assert graph.values["y"].shape == (3, 8) and graph.shapes == {"x": (3, 8)}
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_array_equal(run_graph(graph, {"x": x})["y"], np.maximum(x, 0))
    with pytest.raises(ModelError, match="missing input 'x'"):
        run_graph(graph, {})
    with pytest.raises(ModelError, match="input 'x' is 2x8:float32"):
        run_graph(graph, {"x": x[:2]})
    with pytest.raises(ModelError, match="input 'x' is 3x8:float64"):
        run_graph(graph, {"x": x.astype(np.float64)})


def test_zoo_constant_of_shape_weights_fold_to_constants() -> None:
    proto = onnx.load(zoo_model_path("resnet50"))
    fills = [n.output[0] for n in proto.graph.node if n.op_type == "ConstantOfShape"]
    graph = load_model(proto)
    assert fills and not any(n.op_type == "ConstantOfShape" for n in graph.nodes)
    conv_weights = [n.inputs[1] for n in graph.nodes if n.op_type == "Conv"]
    assert set(conv_weights) <= set(graph.constants) and set(conv_weights) <= set(fills)
    first = graph.constants[conv_weights[0]]
    assert first.shape == (64, 3, 7, 7) and np.all(first == np.float32(0.02))
    assert graph.inputs == ["gpu_0/data_0"]  # initializers listed as inputs are constants


def test_bert_reshape_targets_become_constants(bert: Graph) -> None:
    reshapes = [n for n in bert.nodes if n.op_type == "Reshape"]
    assert reshapes and all(n.inputs[1] in bert.constants for n in reshapes)
    assert not {"Shape", "ConstantOfShape", "Concat", "Unsqueeze", "Constant"} & {
        n.op_type for n in bert.nodes}
    heads_split = [bert.constants[n.inputs[1]].tolist() for n in reshapes]
    # the per-head split (batch, seq, heads, head_dim) now holds the bound batch and sequence
    assert [2, SEQ, -1, 64] in heads_split
    assert bert.shapes == {"input_ids": (2, SEQ), "attention_mask": (2, SEQ)}


@pytest.mark.parametrize("model", ["bert", "densenet121", "shufflenet"])
def test_every_value_has_a_concrete_spec(model: str, bert: Graph) -> None:
    graph = bert if model == "bert" else load_model(zoo_model_path(model))
    names = set(graph.inputs) | set(graph.constants) | {
        o for n in graph.nodes for o in n.outputs if o}
    assert names <= set(graph.values) and set(graph.outputs) <= set(graph.values)
    for name in names:
        spec = graph.values[name]
        assert all(isinstance(d, int) and d >= 0 for d in spec.shape), name
        np.dtype(spec.dtype)
    for name, value in graph.constants.items():
        assert graph.values[name].shape == value.shape
    assert len({n.name for n in graph.nodes}) == len(graph.nodes)  # overrides key on names


def test_executed_shapes_match_the_specs(bert: Graph) -> None:
    """The import's specs are what running the graph really produces, value by value."""
    from portkern.executor import run_nodes
    from portkern.models import random_feeds

    env = dict(bert.constants)
    env.update(random_feeds(bert, seed=3))
    for node in bert.nodes:
        run_nodes([node], env, bert.opset)
        for out in node.outputs:
            assert env[out].shape == bert.values[out].shape, (node.name, out)
            assert env[out].dtype.name == bert.values[out].dtype, (node.name, out)


def test_model_hash_is_sha256_of_file_bytes(bert_path: Path) -> None:
    import hashlib

    graph = load_model(zoo_model_path("squeezenet"))
    assert graph.model_hash == hashlib.sha256(zoo_model_path("squeezenet").read_bytes()).hexdigest()


def test_model_proto_input_is_not_modified() -> None:
    proto = _dynamic_model()
    before = proto.SerializeToString()
    load_model(proto, {"x": (4, 8)})
    assert proto.SerializeToString() == before


def test_initializer_and_tensor_attribute_round_trip() -> None:
    """Constants from initializers and from Constant nodes reach the graph as numpy arrays."""
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
                 np.array([10.0, 20.0, 30.0], dtype=np.float32))),
             helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "c"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        initializer=[numpy_helper.from_array(weight, "w")])
    loaded = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.op_type for n in loaded.nodes] == ["MatMul", "Add"]
    out = run_graph(loaded, {"x": np.array([[1.0, 2.0]], dtype=np.float32)})["y"]
    np.testing.assert_array_equal(out, [[16.0, 29.0, 42.0]])


def test_copies_are_elided_and_their_readers_read_the_source() -> None:
    """An Identity, a Concat of one input and a Cast to the dtype it has hand their input on: they
    are dropped and whatever read them reads the input; a copy that is a graph output stays. The
    model's outputs do not change (onnxruntime on the file)."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Identity", ["r"], ["i"]),
             helper.make_node("Concat", ["i"], ["c"], axis=0),
             helper.make_node("Cast", ["c"], ["same"], to=f),
             helper.make_node("Cast", ["same"], ["wide"], to=TensorProto.DOUBLE),
             helper.make_node("Tanh", ["same"], ["t"]),
             helper.make_node("Identity", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "copies", [helper.make_tensor_value_info("x", f, [2, 3])],
                              [helper.make_tensor_value_info("y", f, [2, 3]),
                               helper.make_tensor_value_info("wide", TensorProto.DOUBLE, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    loaded = load_model(model.SerializeToString())
    assert [(node.op_type, node.inputs) for node in loaded.nodes] == [
        ("Relu", ["x"]), ("Cast", ["r"]), ("Tanh", ["r"]), ("Identity", ["t"])]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = run_graph(loaded, feeds)
    for name, value in zip(["y", "wide"], want):
        np.testing.assert_allclose(got[name], value, rtol=1e-6)
