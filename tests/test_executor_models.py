"""The numpy executor runs real models and matches onnxruntime; dtypes and overrides behave."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from portkern.errors import UnsupportedOpError
from portkern.executor import SUPPORTED_OPS, run_graph, run_nodes
from portkern.ir import Graph, Node
from portkern.models import ZOO_MODELS, export_bert, random_feeds, randomize_weights, zoo_model_path
from portkern.onnx_import import load_model

ort = pytest.importorskip("onnxruntime")
ort.set_default_logger_severity(3)

FP32_TOLERANCE = 1e-4  # relative L2 error against onnxruntime
DEFAULT_ZOO = ("squeezenet", "shufflenet", "resnet50", "inception_v1")


def _rel_l2(out: np.ndarray, ref: np.ndarray) -> float:
    diff = out.astype(np.float64) - ref.astype(np.float64)
    return float(np.linalg.norm(diff) / np.linalg.norm(ref.astype(np.float64)))


def _onnxruntime(model: bytes | str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _check_zoo_model(name: str) -> None:
    proto = randomize_weights(onnx.load(zoo_model_path(name)), seed=0)
    graph = load_model(proto)
    feeds = random_feeds(graph, seed=1)
    ours = run_graph(graph, feeds)
    reference = _onnxruntime(proto.SerializeToString(), feeds)
    for output in graph.outputs:
        ref = reference[output]
        assert np.isfinite(ref).all() and np.std(ref) > 0
        if output.endswith("softmax_1") or output in ("prob_1", "softmaxout_1"):
            assert ref.max() < 0.5, "saturated softmax: the check would be blind"
        assert ours[output].dtype == ref.dtype and ours[output].shape == ref.shape
        assert _rel_l2(ours[output], ref) <= FP32_TOLERANCE, (name, _rel_l2(ours[output], ref))


@pytest.mark.parametrize("name", DEFAULT_ZOO)
def test_zoo_model_matches_onnxruntime(name: str) -> None:
    _check_zoo_model(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(ZOO_MODELS) - set(DEFAULT_ZOO)))
def test_zoo_model_matches_onnxruntime_all(name: str) -> None:
    _check_zoo_model(name)


def test_randomize_weights_is_seeded_and_keeps_shapes() -> None:
    proto = onnx.load(zoo_model_path("squeezenet"))
    first, again, other = (randomize_weights(proto, seed) for seed in (5, 5, 6))
    assert not any(n.op_type == "ConstantOfShape" for n in first.graph.node)
    arrays = {t.name: onnx.numpy_helper.to_array(t) for t in first.graph.initializer}
    same = {t.name: onnx.numpy_helper.to_array(t) for t in again.graph.initializer}
    different = {t.name: onnx.numpy_helper.to_array(t) for t in other.graph.initializer}
    weight = "conv1_w_0"
    assert arrays[weight].shape == (64, 3, 3, 3) and np.std(arrays[weight]) > 0
    np.testing.assert_array_equal(arrays[weight], same[weight])
    assert not np.array_equal(arrays[weight], different[weight])
    assert load_model(first).values["softmaxout_1"] == load_model(proto).values["softmaxout_1"]


def test_randomized_batchnorm_statistics_are_calibrated() -> None:
    """Running variances positive, and equal to what the layer really sees on the seed input."""
    proto = randomize_weights(onnx.load(zoo_model_path("shufflenet")), seed=0)
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    norms = [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    assert norms and all((initializers[n.input[4]] > 0).all() for n in norms)
    graph = load_model(proto)
    first = next(n for n in graph.nodes if n.op_type == "BatchNormalization")
    env = dict(graph.constants)
    env.update(random_feeds(graph, seed=0))  # the seed randomize_weights calibrated with
    run_nodes(graph.nodes[:graph.nodes.index(first)], env, graph.opset)
    seen = env[first.inputs[0]]
    np.testing.assert_allclose(graph.constants[first.inputs[4]], seen.var(axis=(0, 2, 3)),
                               rtol=1e-4)


@pytest.fixture(scope="module")
def bert_path() -> Path:
    pytest.importorskip("transformers")
    return export_bert(seq=128)


@pytest.mark.parametrize(("opset", "dtype", "tolerance"), [
    (17, "float32", FP32_TOLERANCE),  # LayerNormalization op, Gelu as Erf
    (14, "float32", FP32_TOLERANCE),  # LayerNorm spelled as ReduceMean/Sub/Pow/Sqrt/Div
    (17, "float16", 5e-3),  # fp16 end to end (contractions accumulate in fp32 on both sides)
])
def test_bert_encoder_matches_onnxruntime(opset: int, dtype: str, tolerance: float) -> None:
    pytest.importorskip("transformers")
    path = export_bert(seq=128, opset=opset, dtype=dtype)
    graph = load_model(path, {"input_ids": (1, 128)})
    assert graph.opset == opset
    feeds = random_feeds(graph, seed=2)
    assert feeds["attention_mask"][0, -1] == 0 and feeds["attention_mask"][0, 0] == 1
    ours = run_graph(graph, feeds)
    reference = _onnxruntime(str(path), feeds)
    for output in ("last_hidden_state", "pooler_output"):
        assert ours[output].dtype == reference[output].dtype == np.dtype(dtype)
        assert ours[output].shape == reference[output].shape
        assert _rel_l2(ours[output], reference[output]) <= tolerance


def test_bert_export_matches_torch_at_other_bound_shape(bert_path: Path) -> None:
    """The export is traced at 1x128; bound to 3x48 it still computes the torch model."""
    import torch

    from portkern.models import _bert_module

    graph = load_model(bert_path, {"input_ids": (3, 48)})
    feeds = random_feeds(graph, seed=5)
    ours = run_graph(graph, feeds)
    module = _bert_module(layers=2, hidden=128, heads=2, intermediate=512, vocab=1000,
                          dtype="float32", seed=0)
    with torch.no_grad():
        hidden, pooled = module(torch.from_numpy(feeds["input_ids"]),
                                torch.from_numpy(feeds["attention_mask"]))
    assert _rel_l2(ours["last_hidden_state"], hidden.numpy()) <= FP32_TOLERANCE
    assert _rel_l2(ours["pooler_output"], pooled.numpy()) <= FP32_TOLERANCE


def test_bert_float64_run_agrees_with_float32(bert_path: Path) -> None:
    """Upcasting every float constant runs the whole encoder in float64 (the gate's reference)."""
    graph = load_model(bert_path, {"input_ids": (1, 128)})
    feeds = random_feeds(graph, seed=4)

    def run(dtype: type) -> np.ndarray:
        env = {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in graph.constants.items()}
        env.update(feeds)
        run_nodes(graph.nodes, env, graph.opset)
        return env["last_hidden_state"]

    wide, narrow = run(np.float64), run(np.float32)
    assert wide.dtype == np.float64 and narrow.dtype == np.float32
    assert _rel_l2(narrow, wide) <= FP32_TOLERANCE


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_is_preserved(dtype: type) -> None:
    rng = np.random.default_rng(0)
    env: dict[str, np.ndarray] = {"x": rng.standard_normal((2, 4, 6, 6)).astype(dtype),
           "w": rng.standard_normal((3, 4, 3, 3)).astype(dtype),
           "g": np.ones(3, dtype=dtype), "b": np.zeros(3, dtype=dtype),
           "w2": rng.standard_normal((3, 5)).astype(dtype)}
    nodes = [Node("conv", "Conv", ["x", "w"], ["c"], {"pads": [1, 1, 1, 1]}),
             Node("gelu", "Gelu", ["c"], ["a"]),
             Node("t", "Transpose", ["a"], ["t"], {"perm": [0, 2, 3, 1]}),
             Node("ln", "LayerNormalization", ["t", "g", "b"], ["n"], {"axis": -1}),
             Node("sm", "Softmax", ["n"], ["s"], {"axis": -1}),
             Node("mm", "MatMul", ["s", "w2"], ["m"]),
             Node("rm", "ReduceMean", ["m"], ["r"], {"axes": [1], "keepdims": 0}),
             Node("sq", "Sqrt", ["s"], ["q"])]
    run_nodes(nodes, env, 17)
    for name in "catnsmrq":
        assert env[name].dtype == dtype, name
    np.testing.assert_allclose(env["s"].astype(np.float64).sum(-1), 1.0, rtol=1e-2)


def test_unknown_op_raises_with_node_name() -> None:
    with pytest.raises(UnsupportedOpError, match="FancyOp.*'n1'"):
        run_nodes([Node("n1", "FancyOp", ["x"], ["y"])], {"x": np.zeros(2)}, 17)
    with pytest.raises(UnsupportedOpError, match="'n2'"):
        run_nodes([Node("n2", "Relu", ["x"], ["y"], domain="com.microsoft")], {"x": np.zeros(2)}, 17)
    assert {"MatMul", "Conv", "LayerNormalization", "Gelu", "Softmax"} <= SUPPORTED_OPS


def _conv_relu_pool() -> Graph:
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [onnx.helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             onnx.helper.make_node("Relu", ["c"], ["r"], name="relu"),
             onnx.helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool")]
    graph = onnx.helper.make_graph(
        nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 1, 1])],
        initializer=[weight])
    return load_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]))


def test_overrides_replace_nodes_by_name() -> None:
    """A task's nodes: the last computes all outputs, the others are no-ops (as the runtime does)."""
    graph = _conv_relu_pool()
    feeds = random_feeds(graph, seed=0)
    expected = run_graph(graph, feeds)["y"]
    conv, relu = graph.nodes[0], graph.nodes[1]
    calls: list[str] = []

    def fused_conv_relu(env: dict[str, np.ndarray]) -> None:
        calls.append("fused")
        scratch = {name: env[name] for name in conv.inputs if name}
        run_nodes([conv], scratch, graph.opset)
        env["r"] = np.maximum(scratch["c"], 0)

    got = run_graph(graph, feeds, {conv.name: lambda env: None, relu.name: fused_conv_relu})
    assert calls == ["fused"]
    np.testing.assert_array_equal(got["y"], expected)

    def wrong(env: dict[str, np.ndarray]) -> None:
        env["r"] = np.abs(env["c"])

    assert not np.array_equal(run_graph(graph, feeds, {relu.name: wrong})["y"], expected)


def test_graph_is_reusable(bert_path: Path) -> None:
    """Running does not mutate the graph's constants (the runtime runs a graph many times)."""
    graph: Graph = load_model(bert_path, {"input_ids": (1, 128)})
    before = {k: v.copy() for k, v in graph.constants.items()}
    run_graph(graph, random_feeds(graph, seed=0))
    for name, value in before.items():
        np.testing.assert_array_equal(graph.constants[name], value)


def test_erf_matches_libm_to_rounding() -> None:
    """The executor's vectorized erf (the gate's GELU references) against libm's, element by
    element, across both of its regimes and the switch between them, the tails and the specials."""
    import math

    from portkern.executor import _erf

    x = np.concatenate([np.linspace(-7.0, 7.0, 70001), np.random.default_rng(0).standard_normal(20000) * 3,
                        np.nextafter(2.5, [0.0, 5.0]), [0.0, -0.0, 1e-300, 30.0, -30.0]])
    want = np.array([math.erf(v) for v in x])
    rel = np.abs(_erf(x) - want) / np.maximum(np.abs(want), 1e-300)
    assert rel.max() < 2e-15
    assert list(_erf(np.array([np.inf, -np.inf]))) == [1.0, -1.0] and np.isnan(_erf(np.array([np.nan]))[0])
    assert _erf(np.ones(3, np.float16)).dtype == np.float16


@pytest.mark.parametrize("op, attrs", [
    ("AveragePool", {"count_include_pad": 0}),
    ("AveragePool", {"count_include_pad": 1, "pads": [1, 0, 0, 2]}),
    ("MaxPool", {"pads": [0, 1, 1, 0]}),
])
def test_pool_with_a_kernel_far_past_its_input_matches_onnxruntime(op: str, attrs: dict[str, object]) -> None:
    """HF EfficientNet's pooler is AvgPool2d(2560, ceil_mode=True) over a 7x7 map: a window of
    100000 taps here must read only the padded input (padding to the whole window would need
    10^11 elements), and give onnxruntime's answer."""
    import onnxruntime as ort

    x = np.random.default_rng(3).standard_normal((1, 3, 7, 5)).astype(np.float32)
    node = onnx.helper.make_node(op, ["x"], ["y"], kernel_shape=[100000, 100000], strides=[100000, 100000],
                                 ceil_mode=1, **attrs)
    graph = onnx.helper.make_graph([node], "pool", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                                       x.shape)],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    env = {"x": x}
    run_nodes([Node("pool", op, ["x"], ["y"], {"kernel_shape": [100000, 100000], "strides": [100000, 100000],
                                               "ceil_mode": 1, **attrs})], env, 17)
    assert env["y"].shape == expected.shape == (1, 3, 1, 1)
    np.testing.assert_allclose(env["y"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("training", [0, 1])
def test_float16_batch_norm_is_computed_in_float32(training: int) -> None:
    """A float16 BatchNormalization (BiT's weight standardization is one in training mode) is
    computed in float32 and rounded once, as onnxruntime's CPU provider computes it: rounded at
    each step it was 7x onnxruntime's float16 error on BiT's output."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((1, 64, 147)) * 0.02 + 0.01).astype(np.float16)
    params = [np.ones(64, np.float16), np.zeros(64, np.float16), rng.random(64).astype(np.float16) * 0.01,
              (rng.random(64) * 1e-3 + 1e-4).astype(np.float16)]
    names = ["scale", "bias", "mean", "var"]
    outputs = ["y"] + (["running_mean", "running_var"] if training else [])
    node = onnx.helper.make_node("BatchNormalization", ["x", *names], outputs, epsilon=1e-8, training_mode=training)
    graph = onnx.helper.make_graph(
        [node], "bn", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT16, x.shape)],
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT16, None) for name in outputs],
        [onnx.numpy_helper.from_array(value, name) for name, value in zip(names, params)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 15)])
    model.ir_version = 8
    want = _onnxruntime(model.SerializeToString(), {"x": x})["y"]
    env = {"x": x, **dict(zip(names, params))}
    run_nodes([Node("bn", "BatchNormalization", ["x", *names], outputs,
                    {"epsilon": 1e-8, "training_mode": training})], env, 15)
    np.testing.assert_array_max_ulp(env["y"], want, maxulp=1)
