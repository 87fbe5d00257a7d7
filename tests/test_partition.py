"""partition on real models (a BERT-style encoder, ResNet-50) and on exporter spellings of ops."""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper
import pytest

from portkern import synthetic
from portkern.backends import get_backend
from portkern.backends.base import Candidate
from portkern.executor import run_graph, run_nodes
from portkern.hwprofile import load_target
from portkern.ir import Graph
from portkern.models import export_bert, random_feeds, randomize_weights, zoo_model_path
from portkern.onnx_import import load_model
from portkern.partition import ACTIVATION_FLOPS, backend_tasks, canonical_float, evaluate_expr, partition, summarize
from portkern.synthetic import GraphBuilder
from portkern.tasks import Task
from portkern.verify import GateOptions, verify

BATCH, SEQ, LAYERS, HIDDEN, HEADS, FFN = 2, 16, 2, 64, 2, 128
COMPUTE_OPS = {"MatMul", "Gemm", "Conv", "BatchNormalization", "Softmax", "LayerNormalization",
               "ReduceMean", "ReduceSum", "Erf", "Tanh", "Sqrt", "Pow", "Div", "Mul", "Add", "Sub",
               "Sum", "Relu", "MaxPool", "AveragePool", "GlobalAveragePool"}


@pytest.fixture(scope="module")
def bert() -> dict[int, Graph]:
    """The encoder at opset 14 (LayerNorm as primitives) and opset 17 (LayerNormalization op)."""
    pytest.importorskip("transformers")
    shapes = {"input_ids": (BATCH, SEQ), "attention_mask": (BATCH, SEQ)}
    return {opset: load_model(export_bert(layers=LAYERS, hidden=HIDDEN, heads=HEADS, intermediate=FFN,
                                          seq=SEQ, batch=BATCH, opset=opset), shapes)
            for opset in (14, 17)}


@pytest.fixture(scope="module")
def resnet50() -> Graph:
    """ResNet-50 from the zoo with seeded random weights (the zoo's 0.02 fill hides BN mistakes)."""
    return load_model(randomize_weights(onnx.load(zoo_model_path("resnet50")), seed=0))


def _graph_values(graph: Graph, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's own values of `names`, computed by run_graph."""
    wanted = [name for name in dict.fromkeys(names) if name not in graph.constants]
    values = run_graph(dataclasses.replace(graph, outputs=wanted), feeds)
    return {**graph.constants, **values}


def _task_inputs(task: Task, values: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """What a runtime feeds a task: graph values, or the task's own constants (folded weights)."""
    return [task.constants[name] if name in task.constants else values[name] for name in task.input_names]


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    want = want.astype(np.float64)
    return float(np.linalg.norm(got.astype(np.float64) - want)) / max(float(np.linalg.norm(want)), 1e-30)


def _run_with_references(graph: Graph, tasks: Sequence[Task], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model with every task replaced by its reference, the way the runtime swaps in kernels."""
    overrides = {}
    for task in tasks:
        for node in task.nodes[:-1]:
            overrides[node.name] = lambda env: None

        def run_task(env: dict[str, np.ndarray], task: Task = task) -> None:
            outputs = task.reference(_task_inputs(task, {**graph.constants, **env}))
            for name, spec, value in zip(task.output_names, task.outputs, outputs):
                env[name] = value.astype(spec.dtype)
        overrides[task.nodes[-1].name] = run_task
    return run_graph(graph, feeds, overrides)


def _glue_ops(graph: Graph, tasks: Sequence[Task]) -> set[str]:
    covered = {node.name for task in tasks for node in task.nodes}
    return {node.op_type for node in graph.nodes if node.name not in covered}


def _by_kind(tasks: Sequence[Task], kind: str) -> list[Task]:
    return [task for task in tasks if task.kind == kind]


# ----------------------------------------------------------------------------- BERT


def test_bert_tasks_per_layer(bert: dict[int, Graph]) -> None:
    graph = bert[14]
    tasks = partition(graph)
    layer = ["gemm", "gemm", "gemm", "attention", "gemm", "layernorm", "gemm", "gemm", "layernorm"]
    kernels = [task.kind for task in tasks if task.kind != "elementwise"]
    assert kernels == ["layernorm"] + layer * LAYERS + ["gemm"]  # embeddings norm ... pooler
    gemms = _by_kind(tasks, "gemm")
    assert sum(task.attr("activation") == "gelu" for task in gemms) == LAYERS
    assert sum(task.attr("residual") for task in gemms) == 2 * LAYERS  # attention out, FFN out
    assert all(task.attr("bias") for task in gemms)
    assert gemms[-1].attr("activation") == "tanh" and gemms[-1].attr("trans_b")  # the pooler's Gemm
    for attention in _by_kind(tasks, "attention"):
        assert dict(attention.attrs) == {"scale": canonical_float(1 / math.sqrt(HIDDEN // HEADS)),
                                         "k_transposed": True, "mask": True, "causal": False}
    assert not _glue_ops(graph, tasks) & COMPUTE_OPS


def test_bert_gemm_flops_by_hand_and_synthetic_keys(bert: dict[int, Graph]) -> None:
    tasks = partition(bert[14])
    ffn_in = next(task for task in tasks if task.attr("activation") == "gelu")
    m, n, k = BATCH * SEQ, FFN, HIDDEN
    assert ffn_in.flops == 2 * m * n * k + m * n * (1 + ACTIVATION_FLOPS["gelu"])
    assert ffn_in.min_bytes == 4 * (m * k + k * n + n + m * n)
    twin = synthetic.gemm_task(SEQ, FFN, HIDDEN, batch=(BATCH,), bias=True, activation="gelu")
    assert ffn_in.key == twin.key and ffn_in == twin
    query = _by_kind(tasks, "gemm")[0]
    assert query.flops == 2 * m * HIDDEN * HIDDEN + m * HIDDEN
    assert query.key == synthetic.gemm_task(SEQ, HIDDEN, HIDDEN, batch=(BATCH,), bias=True).key
    attention = _by_kind(tasks, "attention")[0]
    assert attention.flops == 4 * BATCH * HEADS * SEQ * SEQ * (HIDDEN // HEADS)
    assert attention.key == synthetic.attention_task(BATCH, HEADS, SEQ, HIDDEN // HEADS, mask=True,
                                                     k_transposed=True).key


def test_bert_head_transposes_fold_into_attention(bert: dict[int, Graph]) -> None:
    """For a backend whose kernels read strides, the head split of q, k, v and the merge of the
    output are the attention task's: no Transpose is left as glue, the task reads the projections'
    (B, S, H, D) buffers, its key is the synthetic packed twin's, and the model with every task
    run by its reference still equals the plain run."""
    graph = bert[14]
    tasks = partition(graph, fold_attention_transposes=True)
    attentions = _by_kind(tasks, "attention")
    assert len(attentions) == LAYERS and "Transpose" not in _glue_ops(graph, tasks)
    d = HIDDEN // HEADS
    for attention in attentions:
        assert [spec.shape for spec in attention.inputs[:3]] == [(BATCH, SEQ, HEADS, d)] * 3
        assert attention.outputs[0].shape == (BATCH, SEQ, HEADS, d)
        assert attention.attr("perms") == ((0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3), (0, 2, 1, 3))
    assert attentions[0].key == synthetic.attention_task(BATCH, HEADS, SEQ, d, mask=True, k_transposed=True,
                                                         packed_heads=True).key
    assert [task.key for task in tasks if task.kind != "attention"] == \
        [task.key for task in partition(graph) if task.kind != "attention"]
    feeds = random_feeds(graph, seed=4)
    plain = run_graph(graph, feeds)
    swapped = _run_with_references(graph, tasks, feeds)
    for name in graph.outputs:
        np.testing.assert_allclose(swapped[name], plain[name], rtol=1e-5, atol=1e-5)


def test_layernorm_primitive_and_op_forms_are_one_workload(bert: dict[int, Graph]) -> None:
    primitive, op_form = partition(bert[14]), partition(bert[17])
    primitive_norms = _by_kind(primitive, "layernorm")
    assert all(len(task.nodes) == 9 for task in primitive_norms)  # ReduceMean ... Add(beta)
    assert all(len(task.nodes) == 1 for task in _by_kind(op_form, "layernorm"))
    assert [t.key for t in primitive_norms] == [t.key for t in _by_kind(op_form, "layernorm")]
    counts = {task.key: count for task, count in summarize(primitive)}
    assert counts[primitive_norms[0].key] == 2 * LAYERS + 1  # every norm in the model: one kernel
    assert counts[_by_kind(primitive, "attention")[0].key] == LAYERS
    assert sum(counts.values()) == len(primitive)


@pytest.mark.parametrize("opset", [14, 17])
def test_bert_with_task_references_reproduces_the_model(bert: dict[int, Graph], opset: int) -> None:
    graph = bert[opset]
    tasks = partition(graph)
    feeds = random_feeds(graph, seed=0)
    want = run_graph(graph, feeds)
    got = _run_with_references(graph, tasks, feeds)
    for name in graph.outputs:
        assert _relative_error(got[name], want[name]) < 1e-5, name
    values = _graph_values(graph, [n for task in tasks for n in task.input_names], feeds)
    for task in _by_kind(tasks, "elementwise"):  # the expression means what the nodes compute
        inputs = _task_inputs(task, values)
        # scalars are inlined as their shortest float32 decimal: exact in float32, 1e-8 off in float64
        np.testing.assert_allclose(evaluate_expr(task.attr("expr"), inputs).astype(np.float64),
                                   task.reference(inputs)[0].astype(np.float64), rtol=1e-7)


# ----------------------------------------------------------------------------- ResNet-50


def test_resnet50_tasks(resnet50: Graph) -> None:
    tasks = partition(resnet50)
    convs = _by_kind(tasks, "conv2d")
    assert len(convs) == sum(node.op_type == "Conv" for node in resnet50.nodes) == 53
    assert all(task.attr("bias") and task.input_names[1] in task.constants for task in convs)  # BN folded
    assert Counter(task.attr("activation") for task in convs) == {"relu": 49, "none": 4}  # 4 shortcuts
    assert sum(task.attr("residual") for task in convs) == 16  # one per bottleneck block
    assert all(task.attr("activation") == "relu" for task in convs if task.attr("residual"))
    pools = _by_kind(tasks, "pool")
    assert [pool.attr("op") for pool in pools] == ["max", "avg"]
    assert [task.kind for task in tasks[-2:]] == ["gemm", "softmax"]
    assert not _by_kind(tasks, "elementwise")
    assert not _glue_ops(resnet50, tasks) & COMPUTE_OPS
    assert tasks[-2].key == synthetic.gemm_task(1, 1000, 2048, trans_b=True, bias=True).key
    stem = tasks[0]
    assert stem.flops == 2 * 64 * 112 * 112 * 3 * 7 * 7 + 64 * 112 * 112 * 2  # + bias, relu
    assert stem.key == synthetic.conv2d_task(1, 3, 224, 224, 64, 7, 7, stride=2, pad=3, activation="relu").key


def test_resnet50_folded_tasks_match_the_graph(resnet50: Graph) -> None:
    tasks = partition(resnet50)
    convs = _by_kind(tasks, "conv2d")
    chosen = [convs[0], next(t for t in convs if t.attr("residual")), next(t for t in convs if t.attr("activation") == "none"),
              *_by_kind(tasks, "pool"), _by_kind(tasks, "gemm")[0]]
    feeds = random_feeds(resnet50, seed=1)
    names = [name for task in chosen for name in (*task.input_names, *task.output_names)]
    values = _graph_values(resnet50, [*(name for name in names if name in resnet50.values), *resnet50.outputs],
                           feeds)
    for task in chosen:
        got = task.reference(_task_inputs(task, values))[0]
        assert _relative_error(got, values[task.output_names[0]]) < 1e-5, task.label
    replaced = _run_with_references(resnet50, tasks, feeds)
    output = resnet50.outputs[0]
    assert _relative_error(replaced[output], values[output]) < 1e-4


# ----------------------------------------------------------------------------- exporter spellings


def _sdpa_attention(builder: GraphBuilder, causal: bool) -> str:
    """torch's SDPA export: Q and K^T each scaled by sqrt(scale), K transposed by a Transpose."""
    b, h, s, d = 1, 2, 6, 8
    root_scale = builder.constant(math.sqrt(1 / math.sqrt(d)))
    q = builder.op("Mul", [builder.input("q", (b, h, s, d)), root_scale], (b, h, s, d))
    kt = builder.op("Transpose", [builder.input("k", (b, h, s, d))], (b, h, d, s), perm=[0, 1, 3, 2])
    kt = builder.op("Mul", [kt, root_scale], (b, h, d, s))
    scores = builder.op("MatMul", [q, kt], (b, h, s, s))
    if causal:
        upper = np.triu(np.full((s, s), -np.inf, dtype=np.float32), 1)
        scores = builder.op("Add", [scores, builder.constant(upper)], (b, h, s, s))
    probs = builder.op("Softmax", [scores], (b, h, s, s), axis=-1)
    return builder.op("MatMul", [probs, builder.input("v", (b, h, s, d))], (b, h, s, d))


def test_sdpa_export_is_the_same_attention() -> None:
    """Same kernel problem; the scale is the float32 product of the two root scales, which may sit
    one ulp away from 1/sqrt(D) (then the key differs: the kernel must use the model's number)."""
    builder = GraphBuilder("sdpa", "float32")
    task = builder.task(_sdpa_attention(builder, causal=True))
    eager = synthetic.attention_task(1, 2, 6, 8, causal=True)
    assert task.inputs == eager.inputs and task.input_names == ("q", "k", "v")
    attrs, eager_attrs = dict(task.attrs), dict(eager.attrs)
    assert attrs.pop("scale") == pytest.approx(eager_attrs.pop("scale"), rel=1e-6)
    assert attrs == eager_attrs
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(spec.shape) for spec in task.inputs)
    np.testing.assert_allclose(task.reference([q, k, v])[0], eager.reference([q, k, v])[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cast_to", ["float32", "float16"])
def test_attention_sees_past_a_cast_that_keeps_the_dtype(cast_to: str) -> None:
    """transformers' eager attention (GPT-2, ViT) casts softmax's float32 probabilities to the
    query's dtype: a no-op in a float32 model, so still one attention task; a real cast is not."""
    b, h, s, d = 1, 2, 6, 8
    builder = GraphBuilder("cast_probs", "float32")
    kt = builder.op("Transpose", [builder.input("k", (b, h, s, d))], (b, h, d, s), perm=[0, 1, 3, 2])
    scores = builder.op("MatMul", [builder.input("q", (b, h, s, d)), kt], (b, h, s, s))
    scaled = builder.op("Mul", [scores, builder.constant(np.float32(1 / math.sqrt(d)))], (b, h, s, s))
    probs = builder.op("Softmax", [scaled], (b, h, s, s), axis=-1)
    cast = builder.op("Cast", [probs], (b, h, s, s), cast_to,
                      to=helper.np_dtype_to_tensor_dtype(np.dtype(cast_to)))
    v = builder.input("v", (b, h, s, d), cast_to)
    out = builder.op("MatMul", [cast, v], (b, h, s, d), cast_to)
    kinds = [task.kind for task in partition(builder.graph([out]))]
    if cast_to == "float32":
        assert kinds == ["attention"]
        task = builder.task(out)
        rng = np.random.default_rng(0)
        q, k, v_value = (rng.standard_normal(spec.shape) for spec in task.inputs)
        eager = synthetic.attention_task(b, h, s, d)
        want = eager.reference([q, k, v_value])[0]
        np.testing.assert_allclose(task.reference([q, k, v_value])[0], want, rtol=1e-12, atol=1e-12)
        # device glue (torch) computes the same float64 reference: the cast keeps float64 there
        glue = get_backend(load_target("h200")).reference(task, [q, k, v_value])[0]
        np.testing.assert_allclose(glue, want, rtol=1e-12, atol=1e-12)
    else:
        assert "attention" not in kinds


def _merged_heads_attention(builder: GraphBuilder, b: int, h: int, s: int, d: int, bias_shape: tuple[int, ...],
                            causal_where: bool) -> str:
    """BLOOM's and DeBERTa's spelling: heads merged into the batch by Reshapes, the scores scaled,
    an additive bias (ALiBi) on the merged scores, a masked fill by Where on the (B, H) view."""
    def reshape(value: str, shape: tuple[int, ...]) -> str:
        return builder.op("Reshape", [value, builder.constant(np.array(shape, np.int64), "int64")], shape)

    q3 = reshape(builder.input("q", (b, h, s, d)), (b * h, s, d))
    k3 = reshape(builder.input("k", (b, h, s, d)), (b * h, s, d))
    v3 = reshape(builder.input("v", (b, h, s, d)), (b * h, s, d))
    kt = builder.op("Transpose", [k3], (b * h, d, s), perm=[0, 2, 1])
    scores = builder.op("MatMul", [q3, kt], (b * h, s, s))
    scores = builder.op("Mul", [scores, builder.constant(np.float32(1 / math.sqrt(d)))], (b * h, s, s))
    scores = builder.op("Add", [scores, builder.input("bias", bias_shape)], (b * h, s, s))
    scores = reshape(scores, (b, h, s, s))
    hidden = np.triu(np.ones((s, s), bool), 1) if causal_where else np.zeros((1, 1, s, s), bool)
    lowest = builder.constant(np.float32(np.finfo(np.float32).min))
    scores = builder.op("Where", [builder.constant(hidden, "bool"), lowest, scores], (b, h, s, s))
    probs = reshape(builder.op("Softmax", [scores], (b, h, s, s), axis=-1), (b * h, s, s))
    return reshape(builder.op("MatMul", [probs, v3], (b * h, s, d)), (b, h, s, d))


@pytest.mark.parametrize("causal_where", [True, False])
def test_attention_with_heads_merged_into_the_batch(causal_where: bool) -> None:
    """The merged-heads form is one attention task over the (B, H, S, D) values: the Reshapes are
    views, the bias on the merged scores is its mask, a Where that hides the future is causal (one
    that hides nothing is dropped), and its reference is the graph's own computation."""
    b, h, s, d = 1, 3, 7, 8
    builder = GraphBuilder("merged_heads", "float32")
    out = _merged_heads_attention(builder, b, h, s, d, (b * h, 1, s), causal_where)
    task = builder.task(out)
    assert task.kind == "attention" and task.input_names == ("q", "k", "v", "bias")
    assert task.attr("causal") == causal_where and task.attr("mask") and not task.attr("k_transposed")
    rng = np.random.default_rng(0)
    q, k, v, bias = (rng.standard_normal(spec.shape) for spec in task.inputs)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + bias.reshape(b, h, 1, s)
    if causal_where:
        scores = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, scores)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = (probs / probs.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(task.reference([q, k, v, bias])[0], want, rtol=1e-6, atol=1e-7)  # float32 scale


def test_a_merged_scores_bias_that_differs_per_batch_is_not_folded() -> None:
    """With B > 1, a bias over the merged (B*H) axis would broadcast differently over (B, H, S, Sk):
    no attention task (its parts are tasks of their own)."""
    b, h, s, d = 2, 3, 7, 8
    builder = GraphBuilder("merged_heads_batch", "float32")
    out = _merged_heads_attention(builder, b, h, s, d, (b * h, 1, s), causal_where=False)
    assert "attention" not in [task.kind for task in partition(builder.graph([out]))]
    builder = GraphBuilder("merged_heads_batch_shared_bias", "float32")
    out = _merged_heads_attention(builder, b, h, s, d, (1, 1, s), causal_where=False)
    assert [task.kind for task in partition(builder.graph([out]))] == ["attention"]


@pytest.mark.parametrize("floor, one_task", [(float(np.finfo(np.float32).min), True), (-1e4, False)])
def test_attention_clamped_at_the_lowest_value_is_one_task(floor: float, one_task: bool) -> None:
    """XGLM's (fairseq's) spelling: merged-heads scores viewed as (B, H, S, S) for the mask, clamped
    by Max at float32's lowest value (which changes only -inf), the probabilities viewed there and
    back before their product. One attention task (the two probability Reshapes collapse to one view);
    a clamp at any other floor changes scores, and is left out of it."""
    b, h, s, d = 1, 2, 5, 8
    builder = GraphBuilder("clamped_scores", "float32")

    def reshape(value: str, shape: tuple[int, ...]) -> str:
        return builder.op("Reshape", [value, builder.constant(np.array(shape, np.int64), "int64")], shape)

    q3, k3, v3 = (reshape(builder.input(name, (b, h, s, d)), (b * h, s, d)) for name in "qkv")
    scores = builder.op("MatMul", [q3, builder.op("Transpose", [k3], (b * h, d, s), perm=[0, 2, 1])], (b * h, s, s))
    scores = builder.op("Add", [reshape(scores, (b, h, s, s)), builder.input("mask", (b, 1, s, s))], (b, h, s, s))
    scores = builder.op("Max", [scores, builder.constant(np.float32(floor))], (b, h, s, s))
    probs = builder.op("Softmax", [reshape(scores, (b * h, s, s))], (b * h, s, s), axis=-1)
    probs = reshape(reshape(probs, (b, h, s, s)), (b * h, s, s))
    out = reshape(builder.op("MatMul", [probs, v3], (b * h, s, d)), (b, h, s, d))
    _, tasks = backend_tasks(builder.graph([out]), get_backend(load_target("h200")))
    kinds = [task.kind for task in tasks]
    if one_task:
        assert kinds == ["attention"] and tasks[0].attr("mask"), kinds
    else:
        assert "attention" not in kinds, kinds


def test_hard_activations_fuse_into_a_conv_or_an_elementwise_task() -> None:
    """MobileNetV3's HardSwish after a conv is the conv's epilogue; its squeeze-excite gate (HardSigmoid
    with torch's alpha of 1/6, times the features) is one elementwise task of steps every backend has."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("hard", "float32")
    x = b.input("x", (1, 4, 6, 6))
    conv = b.op("Conv", [x, b.constant(rng.standard_normal((4, 4, 3, 3)))], (1, 4, 6, 6), kernel_shape=[3, 3],
                pads=[1, 1, 1, 1])
    features = b.op("HardSwish", [conv], (1, 4, 6, 6))
    gate = b.op("HardSigmoid", [b.input("se", (1, 4, 1, 1))], (1, 4, 1, 1), alpha=1 / 6, beta=0.5)
    out = b.op("Mul", [features, gate], (1, 4, 6, 6))
    graph = b.graph([out])
    tasks = partition(graph)
    assert [(task.kind, task.attr("activation")) for task in tasks] == [("conv2d", "hardswish"), ("elementwise", None)]
    values = {**graph.constants, "x": rng.standard_normal((1, 4, 6, 6)).astype(np.float32),
              "se": (4 * rng.standard_normal((1, 4, 1, 1))).astype(np.float32)}
    run_nodes(graph.nodes, values, graph.opset)
    for task in tasks:
        got = task.reference([values.get(name, task.constants.get(name)) for name in task.input_names])[0]
        np.testing.assert_allclose(got, values[task.output_names[0]], rtol=1e-5, atol=1e-6)


def test_squared_relu_after_a_projection_is_its_epilogue() -> None:
    """Nemotron's and Persimmon's MLP: relu(x W + b)^2, the square a Mul of the ReLU by itself (the
    Pow spelling is synthetic.gemm_task's). Both fold into the GEMM; the down projection reads it."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("relu2", "float32")
    x = b.input("x", (2, 3, 8))
    up = b.op("MatMul", [x, b.constant(rng.standard_normal((8, 16)))], (2, 3, 16))
    up = b.op("Add", [up, b.constant(rng.standard_normal(16))], (2, 3, 16))
    relu = b.op("Relu", [up], (2, 3, 16))
    squared = b.op("Mul", [relu, relu], (2, 3, 16))
    out = b.op("MatMul", [squared, b.constant(rng.standard_normal((16, 8)))], (2, 3, 8))
    graph = b.graph([out])
    tasks = partition(graph)
    assert [(task.kind, task.attr("activation"), task.attr("bias")) for task in tasks] == [
        ("gemm", "relu_squared", True), ("gemm", "none", False)]
    values = {**graph.constants, "x": rng.standard_normal((2, 3, 8)).astype(np.float32)}
    run_nodes(graph.nodes, values, graph.opset)
    up_task = tasks[0]
    got = up_task.reference([values.get(name, up_task.constants.get(name)) for name in up_task.input_names])[0]
    np.testing.assert_allclose(got, values[up_task.output_names[0]], rtol=1e-5, atol=1e-5)


def _group_norm_graph(form: str, opset: int, rng: np.random.Generator) -> Graph:
    """GroupNorm of (2, 6, 5, 5) in 3 groups then SiLU, as `form` writes it: torch's export (a
    Reshape to (N, G, C/G * H * W), InstanceNormalization with scale 1 and bias 0, a Reshape back,
    the affine as a Mul and an Add by (C, 1, 1) weights), the GroupNormalization op (its opset-18
    scale per group, its opset-21 scale per channel), or an InstanceNormalization of 6 groups with
    its own scale and a second per-channel Mul after it."""
    b = GraphBuilder("group_norm", "float32")
    shape = (2, 6, 5, 5)
    x = b.input("x", shape)
    if form == "torch":
        grouped = b.op("Reshape", [x, b.constant(np.array([2, 3, -1]), "int64")], (2, 3, 50))
        normed = b.op("InstanceNormalization", [grouped, b.constant(np.ones(3)), b.constant(np.zeros(3))],
                      (2, 3, 50), epsilon=1e-5)
        back = b.op("Reshape", [normed, b.constant(np.array(shape), "int64")], shape)
        y = b.op("Add", [b.op("Mul", [back, b.constant(rng.standard_normal((6, 1, 1)))], shape),
                         b.constant(rng.standard_normal((6, 1, 1)))], shape)
    elif form == "op":
        per = 3 if opset < 21 else 6
        y = b.op("GroupNormalization", [x, b.constant(rng.standard_normal(per)), b.constant(rng.standard_normal(per))],
                 shape, num_groups=3, epsilon=1e-5)
    else:
        normed = b.op("InstanceNormalization", [x, b.constant(rng.standard_normal(6)), b.constant(rng.standard_normal(6))],
                      shape, epsilon=1e-5)
        y = b.op("Mul", [b.constant(rng.standard_normal((1, 6, 1, 1))), normed], shape)
    out = b.op("Mul", [y, b.op("Sigmoid", [y], shape)], shape)
    return b.graph([out], opset)


@pytest.mark.parametrize("form, opset", [("torch", 13), ("torch", 17), ("op", 18), ("op", 21), ("instance", 17)])
def test_group_norm_is_one_task_with_its_affine_and_activation(form: str, opset: int) -> None:
    """Each way a graph writes GroupNorm (_group_norm_graph) is one groupnorm task: statistics per
    sample and group, the affine per channel (C,), the SiLU after it; its reference (opset-13 ops,
    under the replaced nodes' names) computes what the graph computes."""
    rng = np.random.default_rng(4)
    graph = _group_norm_graph(form, opset, rng)
    (task,) = partition(graph)
    groups = 6 if form == "instance" else 3
    assert (task.kind, task.attr("groups"), task.attr("activation")) == ("groupnorm", groups, "silu")
    assert [spec.shape for spec in task.inputs] == [(2, 6, 5, 5), (6,), (6,)]
    assert {node.name for node in task.nodes} == {node.name for node in graph.nodes}
    values = {**graph.constants, "x": (3 * rng.standard_normal((2, 6, 5, 5)) + 1).astype(np.float32)}
    run_nodes(graph.nodes, values, graph.opset)
    got = task.reference([values.get(name, task.constants.get(name)) for name in task.input_names])[0]
    np.testing.assert_allclose(got, values[task.output_names[0]], rtol=1e-5, atol=1e-5)


def test_instance_norm_of_groups_alone_normalizes_each_group() -> None:
    """torch's Reshape to groups and InstanceNormalization with no Reshape back after it (the
    grouped value is the graph's output): an instance norm of that (N, G, L) value, a group per row."""
    b = GraphBuilder("groups_alone", "float32")
    grouped = b.op("Reshape", [b.input("x", (2, 6, 5, 5)), b.constant(np.array([2, 3, -1]), "int64")], (2, 3, 50))
    normed = b.op("InstanceNormalization", [grouped, b.constant(np.ones(3)), b.constant(np.zeros(3))], (2, 3, 50))
    (task,) = partition(b.graph([normed]))
    assert (task.kind, task.inputs[0].shape, task.attr("groups")) == ("groupnorm", (2, 3, 50), 3)


def test_a_written_out_activation_is_its_one_step() -> None:
    """GPT-2's export spells GELU (tanh form) in eight ops: the elementwise task is the activation
    itself, the same task as ONNX's Gelu op, and still computes what the eight ops compute."""
    builder = GraphBuilder("gpt2_gelu", "float32")
    x = builder.input("x", (4, 64))
    cube = builder.op("Pow", [x, builder.constant(np.float32(3.0))], (4, 64))
    inner = builder.op("Add", [x, builder.op("Mul", [cube, builder.constant(np.float32(0.044715))], (4, 64))],
                       (4, 64))
    scaled = builder.op("Mul", [inner, builder.constant(np.float32(math.sqrt(2 / math.pi)))], (4, 64))
    one_plus = builder.op("Add", [builder.op("Tanh", [scaled], (4, 64)), builder.constant(np.float32(1.0))],
                          (4, 64))
    out = builder.op("Mul", [builder.op("Mul", [x, builder.constant(np.float32(0.5))], (4, 64)), one_plus],
                     (4, 64))
    task = builder.task(out)
    assert task.attr("expr") == (("gelu_tanh", "in0"),)
    assert task.key == synthetic.elementwise_task((4, 64), "float32", [("gelu_tanh", "in0")]).key
    value = np.random.default_rng(0).standard_normal((4, 64))
    want = 0.5 * value * (1 + np.tanh(math.sqrt(2 / math.pi) * (value + 0.044715 * value ** 3)))
    np.testing.assert_allclose(task.reference([value])[0], want, rtol=1e-6, atol=1e-7)  # float32 constants
    # x * tanh(x): no activation of the list, so its steps stay
    builder = GraphBuilder("x_tanh_x", "float32")
    x = builder.input("x", (4, 64))
    assert builder.task(builder.op("Mul", [x, builder.op("Tanh", [x], (4, 64))], (4, 64))).attr("expr") == (
        ("tanh", "in0"), ("mul", "in0", "t0"))


def test_activation_spellings_share_a_key() -> None:
    builder = GraphBuilder("gelu_op", "float32")
    y = builder.op("MatMul", [builder.input("a", (4, 8)), builder.input("b", (8, 5))], (4, 5))
    gelu_op = builder.task(builder.op("Gelu", [y], (4, 5)), opset=20)
    assert gelu_op.key == synthetic.gemm_task(4, 5, 8, activation="gelu").key
    builder = GraphBuilder("silu_reversed", "float32")
    y = builder.op("MatMul", [builder.input("a", (4, 8)), builder.input("b", (8, 5))], (4, 5))
    silu = builder.task(builder.op("Mul", [builder.op("Sigmoid", [y], (4, 5)), y], (4, 5)))
    assert silu.attr("activation") == "silu"


def _assert_is_the_rmsnorm_task(task: Task, rows: int, cols: int) -> None:
    """The same workload as RMSNorm written plainly, and the same reference values."""
    plain = synthetic.rmsnorm_task(rows, cols)
    assert task.key == plain.key
    rng = np.random.default_rng(0)
    x_value, gamma = rng.standard_normal((rows, cols)), rng.standard_normal(cols)
    np.testing.assert_allclose(task.reference([x_value, gamma])[0], plain.reference([x_value, gamma])[0], rtol=1e-12)


def test_rmsnorm_reciprocal_spelling() -> None:
    builder = GraphBuilder("rms", "float32")
    x = builder.input("x", (3, 16))
    square = builder.op("Mul", [x, x], (3, 16))
    mean = builder.op("ReduceMean", [square], (3, 1), axes=[-1], keepdims=1)
    std = builder.op("Sqrt", [builder.op("Add", [builder.constant(1e-6), mean], (3, 1))], (3, 1))
    inverse = builder.op("Reciprocal", [std], (3, 1))
    scaled = builder.op("Mul", [x, inverse], (3, 16))
    task = builder.task(builder.op("Mul", [scaled, builder.input("gamma", (16,))], (3, 16)))
    _assert_is_the_rmsnorm_task(task, 3, 16)


def test_rmsnorm_as_transformers_writes_it() -> None:
    """LlamaRMSNorm: Pow 2, mean, 1 / Sqrt, x times that, a Cast back to the input's dtype (a
    no-op in float32), then the weight on the left: one rmsnorm task, the reference unchanged."""
    builder = GraphBuilder("llama_rms", "float32")
    x = builder.input("x", (3, 16))
    mean = builder.op("ReduceMean", [builder.op("Pow", [x, builder.constant(np.float32(2.0))], (3, 16))], (3, 1),
                      axes=[-1], keepdims=1)
    std = builder.op("Sqrt", [builder.op("Add", [mean, builder.constant(np.float32(1e-6))], (3, 1))], (3, 1))
    inverse = builder.op("Div", [builder.constant(np.float32(1.0)), std], (3, 1))
    normalized = builder.op("Mul", [x, inverse], (3, 16))
    cast = builder.op("Cast", [normalized], (3, 16), to=helper.np_dtype_to_tensor_dtype(np.dtype("float32")))
    out = builder.op("Mul", [builder.input("gamma", (16,)), cast], (3, 16))
    assert [t.kind for t in partition(builder.graph([out]))] == ["rmsnorm"]
    task = builder.task(out)
    _assert_is_the_rmsnorm_task(task, 3, 16)


def _cast(builder: GraphBuilder, value: str, shape: tuple[int, ...], dtype: str) -> str:
    return builder.op("Cast", [value], shape, dtype, to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


@pytest.mark.parametrize("back_to", ["float16", None])
def test_attention_sees_past_float32_and_back_in_a_float16_model(back_to: str | None) -> None:
    """transformers' eager attention in a float16 export (ViT, LLaMA): the float16 probabilities
    cast to float32 and straight back, an exact round trip: one attention task on float16. Cast
    up only (the product then in float32) is a real change of dtype: no attention task."""
    b, h, s, d = 1, 2, 6, 8
    builder = GraphBuilder("round_trip_probs", "float16")
    kt = builder.op("Transpose", [builder.input("k", (b, h, s, d))], (b, h, d, s), perm=[0, 1, 3, 2])
    scores = builder.op("MatMul", [builder.input("q", (b, h, s, d)), kt], (b, h, s, s))
    scaled = builder.op("Mul", [scores, builder.constant(np.float16(1 / math.sqrt(d)))], (b, h, s, s))
    probs = _cast(builder, builder.op("Softmax", [scaled], (b, h, s, s), axis=-1), (b, h, s, s), "float32")
    if back_to:
        probs = _cast(builder, probs, (b, h, s, s), back_to)
    dtype = back_to or "float32"
    out = builder.op("MatMul", [probs, builder.input("v", (b, h, s, d), dtype)], (b, h, s, d), dtype)
    tasks = partition(builder.graph([out]))
    if back_to is None:
        assert "attention" not in [task.kind for task in tasks]
        return
    task = builder.task(out)
    eager = synthetic.attention_task(b, h, s, d, "float16")
    assert task.kind == "attention" and task.inputs == eager.inputs and task.outputs == eager.outputs
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(spec.shape) for spec in task.inputs)
    np.testing.assert_allclose(task.reference([q, k, v])[0], eager.reference([q, k, v])[0], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("widened", ["q and k", "q"])
def test_attention_scored_in_float32_from_float16_operands_is_a_float16_task(widened: str) -> None:
    """GPT-J's float16 attention: q and k cast to float32, the scores, causal mask and softmax in
    float32, the probabilities cast back to float16 for the product with v: the computation of a
    float16 kernel (products of float16 values are exact in float32), so one float16 attention
    task. Only q widened, the product mixes dtypes: no attention task."""
    b, h, s, d = 1, 2, 6, 8
    builder = GraphBuilder("wide_scores", "float16")
    q, k = (builder.input(name, (b, h, s, d)) for name in ("q", "k"))
    q = _cast(builder, q, (b, h, s, d), "float32")
    if widened == "q and k":
        k = _cast(builder, k, (b, h, s, d), "float32")
    kt = builder.op("Transpose", [k], (b, h, d, s), "float32" if widened == "q and k" else "float16",
                    perm=[0, 1, 3, 2])
    scores = builder.op("MatMul", [q, kt], (b, h, s, s), "float32")
    scaled = builder.op("Mul", [scores, builder.constant(1 / math.sqrt(d), "float32")], (b, h, s, s), "float32")
    causal = np.where(np.tril(np.ones((s, s), bool)), 0.0, np.finfo(np.float32).min)
    masked = builder.op("Add", [scaled, builder.constant(causal, "float32")], (b, h, s, s), "float32")
    probs = _cast(builder, builder.op("Softmax", [masked], (b, h, s, s), "float32", axis=-1), (b, h, s, s), "float16")
    out = builder.op("MatMul", [probs, builder.input("v", (b, h, s, d))], (b, h, s, d))
    tasks = partition(builder.graph([out]))
    if widened == "q":
        assert "attention" not in [task.kind for task in tasks]
        return
    task = builder.task(out)
    plain = synthetic.attention_task(b, h, s, d, "float16", causal=True)
    assert task.kind == "attention" and task.inputs == plain.inputs and task.attr("causal")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(spec.shape) for spec in task.inputs]
    np.testing.assert_allclose(task.reference(inputs)[0], plain.reference(inputs)[0], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("cast_back", [True, False])
def test_a_norm_computed_in_float32_is_a_task_on_the_models_float16(kind: str, cast_back: bool) -> None:
    """LlamaRMSNorm (and layer norms written the same way) in a float16 export: the input cast to
    float32, normalized there, cast back to float16, then the weight: one norm task reading and
    writing float16, the same workload as the plain float16 norm. Without the cast back the
    normalized value stays float32: the task is the float32 norm after the cast, as before."""
    rows, cols = 3, 16
    builder = GraphBuilder("wide_norm", "float16")
    x16 = builder.input("x", (rows, cols))
    x = wide = _cast(builder, x16, (rows, cols), "float32")
    if kind == "layernorm":
        mean = builder.op("ReduceMean", [x], (rows, 1), "float32", axes=[-1], keepdims=1)
        x = builder.op("Sub", [x, mean], (rows, cols), "float32")
    square = builder.op("Pow", [x, builder.constant(2.0, "float32")], (rows, cols), "float32")
    variance = builder.op("ReduceMean", [square], (rows, 1), "float32", axes=[-1], keepdims=1)
    eps = 1e-5 if kind == "layernorm" else 1e-6
    std = builder.op("Sqrt", [builder.op("Add", [variance, builder.constant(eps, "float32")], (rows, 1), "float32")],
                     (rows, 1), "float32")
    normalized = builder.op("Div", [x, std], (rows, cols), "float32")
    dtype = "float16" if cast_back else "float32"
    if cast_back:
        normalized = _cast(builder, normalized, (rows, cols), "float16")
    out = builder.op("Mul", [normalized, builder.input("gamma", (cols,), dtype)], (rows, cols), dtype)
    params = ["gamma"]
    if kind == "layernorm":
        params.append("beta")
        out = builder.op("Add", [out, builder.input("beta", (cols,), dtype)], (rows, cols), dtype)
    task = next(t for t in partition(builder.graph([out])) if t.kind == kind)
    plain = getattr(synthetic, f"{kind}_task")(rows, cols, dtype, eps=eps)
    assert (task.inputs, task.outputs) == (plain.inputs, plain.outputs)
    assert task.attr("eps") == pytest.approx(eps, rel=1e-6)
    assert task.input_names == ("x" if cast_back else wide, *params)
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(spec.shape) for spec in task.inputs]
    np.testing.assert_allclose(task.reference(values)[0], plain.reference(values)[0], rtol=1e-6, atol=1e-6)


def test_a_layernormalization_op_between_casts_is_a_float16_task() -> None:
    """OLMo's parameter-free LayerNorm in a float16 export: the input cast to float32, a
    LayerNormalization op there (its float32 weights of ones and zeros), the result cast back: one
    layernorm task reading and writing float16 with float32 weights, no elementwise cast tasks."""
    rows, cols = 3, 16
    builder = GraphBuilder("olmo_norm", "float16")
    wide = _cast(builder, builder.input("x", (rows, cols)), (rows, cols), "float32")
    normed = builder.op("LayerNormalization", [wide, builder.constant(np.ones(cols), "float32"),
                                               builder.constant(np.zeros(cols), "float32")],
                        (rows, cols), "float32", axis=-1, epsilon=1e-5)
    tasks = partition(builder.graph([_cast(builder, normed, (rows, cols), "float16")]))
    assert [task.kind for task in tasks] == ["layernorm"]
    assert [spec.dtype for spec in (*tasks[0].inputs, *tasks[0].outputs)] == ["float16", "float32", "float32",
                                                                              "float16"]
    x = np.random.default_rng(1).standard_normal((rows, cols))
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    got = tasks[0].reference([x, np.ones(cols), np.zeros(cols)])[0]
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("spelling", ["div", "reciprocal"])
def test_t5_rmsnorm_casts_its_input_twice_in_float16(spelling: str) -> None:
    """T5's RMSNorm in a float16 export: the input cast to float32 once for the mean square and once
    more for the product (two Cast nodes of one source), the result cast back, then the weight: one
    rmsnorm task on the float16 input, both casts inside it."""
    rows, cols = 3, 16
    builder = GraphBuilder("t5_norm", "float16")
    x16 = builder.input("x", (rows, cols))
    squared_input, product_input = (_cast(builder, x16, (rows, cols), "float32") for _ in range(2))
    square = builder.op("Pow", [squared_input, builder.constant(2.0, "float32")], (rows, cols), "float32")
    variance = builder.op("ReduceMean", [square], (rows, 1), "float32", axes=[-1], keepdims=1)
    std = builder.op("Sqrt", [builder.op("Add", [variance, builder.constant(1e-6, "float32")], (rows, 1), "float32")],
                     (rows, 1), "float32")
    if spelling == "div":
        normalized = builder.op("Div", [product_input, std], (rows, cols), "float32")
    else:
        inverse = builder.op("Div", [builder.constant(1.0, "float32"), std], (rows, 1), "float32")
        normalized = builder.op("Mul", [product_input, inverse], (rows, cols), "float32")
    back = _cast(builder, normalized, (rows, cols), "float16")
    out = builder.op("Mul", [builder.input("gamma", (cols,)), back], (rows, cols))
    tasks = partition(builder.graph([out]))
    assert [task.kind for task in tasks] == ["rmsnorm"] and tasks[0].input_names == ("x", "gamma")
    plain = synthetic.rmsnorm_task(rows, cols, "float16", eps=1e-6)
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(spec.shape) for spec in tasks[0].inputs]
    np.testing.assert_allclose(tasks[0].reference(values)[0], plain.reference(values)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("packed_heads", [False, True])
def test_values_wider_than_the_keys_are_one_attention_task_on_the_baseline(packed_heads: bool) -> None:
    """LeViT's attention (values twice as wide as keys and queries; DeepSeek's MLA has the same
    shape of problem): one attention task with a (B, H, S, Dv) output, whose flops count both
    products. Triton's flash kernels take the two widths (test_triton_matrix runs them); the NPU's
    kernel refuses them with the reason, and the torch baseline (SDPA) passes the gate."""
    task = synthetic.attention_task(2, 3, 19, 16, "float32", mask=True, value_dim=32, packed_heads=packed_heads)
    b, h, s, d, dv = 2, 3, 19, 16, 32
    assert task.kind == "attention" and task.outputs[0].shape == ((b, s, h, dv) if packed_heads else (b, h, s, dv))
    assert task.flops == 2 * b * h * s * s * (d + dv)
    backend = get_backend(load_target("h200"))
    assert {"attention_flash", "attention_splitkv"} <= {variant.name for variant in backend.variants(task)}
    npu = get_backend(load_target("ascend910b"))
    refusals = [npu.check(Candidate.of(v, v.default), task) for v in npu.variants(task)]
    assert refusals and all(reason and "values 32 wide, keys 16" in reason for reason in refusals), refusals
    assert verify(backend, backend.baseline(task), task, "fp32", GateOptions(seeds=(3,))).passed


@pytest.mark.parametrize("post_norm", [False, True])
def test_gemma_rmsnorm_weights_in_float32_and_casts_the_result_back(post_norm: bool) -> None:
    """GemmaRMSNorm in a float16 export: x cast to float32, normalized and scaled by 1 + weight (a
    float32 constant) there, only the result cast back: one rmsnorm task reading and writing
    float16, its weight float32; Triton's rmsnorm kernels and the baseline pass the gate on it.
    Gemma 2's post-norms add the block's input after the cast back: the task's residual."""
    rows, cols = 3, 16
    builder = GraphBuilder("gemma_norm", "float16")
    x = _cast(builder, builder.input("x", (rows, cols)), (rows, cols), "float32")
    square = builder.op("Pow", [x, builder.constant(2.0, "float32")], (rows, cols), "float32")
    variance = builder.op("ReduceMean", [square], (rows, 1), "float32", axes=[-1], keepdims=1)
    std = builder.op("Sqrt", [builder.op("Add", [variance, builder.constant(1e-6, "float32")], (rows, 1), "float32")],
                     (rows, 1), "float32")
    normalized = builder.op("Div", [x, std], (rows, cols), "float32")
    scaled = builder.op("Mul", [normalized, builder.input("weight", (cols,), "float32")], (rows, cols), "float32")
    out = _cast(builder, scaled, (rows, cols), "float16")
    if post_norm:
        out = builder.op("Add", [builder.input("residual", (rows, cols)), out], (rows, cols))
    tasks = partition(builder.graph([out]))
    assert [(task.kind, task.attr("residual", False)) for task in tasks] == [("rmsnorm", post_norm)]
    task = tasks[0]
    assert task.input_names == ("x", "weight", *(["residual"] if post_norm else [])) and [
        spec.dtype for spec in (*task.inputs, *task.outputs)] == ["float16", "float32", *(["float16"] * (1 + post_norm))]
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(spec.shape) for spec in task.inputs]
    want = values[0] / np.sqrt(np.mean(values[0] ** 2, axis=-1, keepdims=True) + 1e-6) * values[1] + (
        values[2] if post_norm else 0.0)
    np.testing.assert_allclose(task.reference(values)[0], want, rtol=1e-6, atol=1e-6)
    backend = get_backend(load_target("h200"))
    programs = [backend.load(backend.compile(Candidate.of(v, v.default), task), task) for v in backend.variants(task)]
    assert programs and all(verify(backend, program, task, "fp32", GateOptions(seeds=(3,))).passed
                            for program in [*programs, backend.baseline(task)])


def test_a_cast_to_the_same_dtype_is_no_step_and_alone_no_task() -> None:
    """transformers casts a float32 residual to float32 before each LlamaRMSNorm: a copy, no kernel
    of its own (a kernel that only copies costs a launch for nothing), and no step inside a chain
    (a backend with a short expression, the NPU's, would spend one of its steps on it)."""
    float32 = helper.np_dtype_to_tensor_dtype(np.dtype("float32"))
    builder = GraphBuilder("copies", "float32")
    x, y = builder.input("x", (4, 8)), builder.input("y", (4, 8))
    copy = builder.op("Cast", [builder.op("Add", [x, y], (4, 8))], (4, 8), to=float32)
    chained = builder.op("Mul", [copy, builder.constant(np.float32(0.5))], (4, 8))
    alone = builder.op("Cast", [builder.input("z", (4, 8))], (4, 8), to=float32)
    tasks = partition(builder.graph([chained, alone]))
    assert [(t.kind, t.attr("expr")) for t in tasks] == [("elementwise", (("add", "in0", "in1"), ("mul", "t0", 0.5)))]
    rng = np.random.default_rng(0)
    x_value, y_value = rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    np.testing.assert_allclose(tasks[0].reference([x_value, y_value])[0], (x_value + y_value) * 0.5, rtol=1e-12)


def test_shared_intermediates_stop_fusion() -> None:
    """A value read twice is a task boundary: a gemm whose output is also a graph output has no
    epilogue, and elementwise trees split where a value has two consumers."""
    builder = GraphBuilder("shared", "float32")
    y = builder.op("MatMul", [builder.input("a", (4, 8)), builder.input("b", (8, 5))], (4, 5))
    biased = builder.op("Add", [y, builder.input("bias", (5,))], (4, 5))
    shifted = builder.op("Sub", [biased, builder.constant(1.0)], (4, 5))
    doubled = builder.op("Mul", [shifted, builder.constant(2.0)], (4, 5))
    squared = builder.op("Mul", [shifted, shifted], (4, 5))
    out = builder.op("Add", [builder.op("Exp", [doubled], (4, 5)), squared], (4, 5))
    tasks = partition(builder.graph([y, out]))
    assert [task.kind for task in tasks] == ["gemm", "elementwise", "elementwise"]
    gemm, first, second = tasks
    assert dict(gemm.attrs)["bias"] is False and gemm.output_names == (y,)
    assert first.attr("expr") == (("add", "in0", "in1"), ("sub", "t0", 1.0))
    assert second.attr("expr") == (("mul", "in0", 2.0), ("mul", "in0", "in0"), ("exp", "t0"), ("add", "t2", "t1"))
    assert second.input_names == (shifted,)


def _conv_bn(builder: GraphBuilder, rng: np.random.Generator, constant_weights: bool = True) -> tuple[str, str]:
    """Conv (no bias) -> BatchNormalization with constant, non-trivial parameters: (conv, bn)."""
    shape = (1, 4, 6, 6)
    x = builder.input("x", (1, 3, 6, 6))
    w = builder.constant(rng.standard_normal((4, 3, 3, 3))) if constant_weights else builder.input("w", (4, 3, 3, 3))
    conv = builder.op("Conv", [x, w], shape, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    params = [builder.constant(rng.standard_normal(4)), builder.constant(rng.standard_normal(4)),
              builder.constant(rng.standard_normal(4)), builder.constant(rng.random(4) + 0.5)]
    return conv, builder.op("BatchNormalization", [conv, *params], shape, epsilon=1e-3)


def test_batchnorm_and_channel_affines_fold_only_when_safe() -> None:
    rng = np.random.default_rng(0)
    builder = GraphBuilder("conv_bn", "float32")
    conv, bn = _conv_bn(builder, rng)
    shape = (1, 4, 6, 6)
    scaled = builder.op("Mul", [bn, builder.constant(rng.standard_normal((4, 1, 1)))], shape)  # inception_v2
    shifted = builder.op("Sub", [scaled, builder.constant(0.25)], shape)
    graph = builder.graph([builder.op("Relu", [shifted], shape)])
    (task,) = partition(graph)
    assert [node.op_type for node in task.nodes] == ["Conv", "Identity", "Identity", "Identity", "Relu"]
    assert [node.name for node in task.nodes] == [node.name for node in graph.nodes]  # a runtime skips them all
    assert task.attr("bias") and task.attr("activation") == "relu" and len(task.inputs) == 3
    feeds = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)}
    want = run_graph(graph, feeds)[graph.outputs[0]]
    assert _relative_error(task.reference(_task_inputs(task, feeds))[0], want) < 1e-6

    builder = GraphBuilder("last_axis_add", "float32")
    conv, bn = _conv_bn(builder, rng)
    graph = builder.graph([builder.op("Add", [bn, builder.constant(rng.standard_normal(6))], shape)])
    assert [task.kind for task in partition(graph)] == ["conv2d", "elementwise"]  # (6,) is per column

    for conv_is_read_twice, constant_weights in ((True, True), (False, False)):
        builder = GraphBuilder("conv_bn_unsafe", "float32")
        conv, bn = _conv_bn(builder, rng, constant_weights)
        graph = builder.graph([bn, conv] if conv_is_read_twice else [bn])
        (task,) = partition(graph)  # the conv alone; the BN stays glue
        assert [node.op_type for node in task.nodes] == ["Conv"] and not task.attr("bias")
        assert not task.constants


def test_gemm_with_trans_a_is_glue() -> None:
    builder = GraphBuilder("trans_a", "float32")
    a, b = builder.input("a", (8, 4)), builder.input("b", (8, 5))
    graph = builder.graph([builder.op("Gemm", [a, b], (4, 5), transA=1)])
    assert partition(graph) == []


@pytest.mark.parametrize("split_back", [True, False])
def test_gemm_between_row_views_is_the_gemm_on_the_unmerged_operand(split_back: bool) -> None:
    """GPT-2's Conv1D: x viewed as rows, addmm, the rows split back, then the written-out tanh GELU:
    one gemm task on the 3-D x with the bias and the activation fused, the same workload and
    reference as the MatMul form. A Reshape that does not restore x's leading axes is no view of
    the rows: the gemm stays on the 2-D operand and the activation outside it."""
    b, s, k, n = 2, 5, 8, 16
    builder = GraphBuilder("conv1d", "float32")
    x = builder.input("x", (b, s, k))
    rows = builder.op("Reshape", [x, builder.constant(np.array([-1, k], np.int64))], (b * s, k))
    product = builder.op("Gemm", [rows, builder.input("w", (k, n)), builder.input("bias", (n,))], (b * s, n))
    shape = (b, s, n) if split_back else (s, b, n)
    split = builder.op("Reshape", [product, builder.constant(np.array(shape, np.int64))], shape)
    cube = builder.op("Pow", [split, builder.constant(3.0)], shape)
    inner = builder.op("Mul", [builder.op("Add", [split, builder.op("Mul", [cube, builder.constant(0.044715)], shape)],
                                          shape), builder.constant(math.sqrt(2 / math.pi))], shape)
    half = builder.op("Mul", [split, builder.constant(0.5)], shape)
    out = builder.op("Mul", [half, builder.op("Add", [builder.op("Tanh", [inner], shape), builder.constant(1.0)],
                                              shape)], shape)
    tasks = partition(builder.graph([out]))
    gemm = _by_kind(tasks, "gemm")[0]
    if not split_back:
        assert gemm.input_names[0] == rows and gemm.attr("activation") == "none"
        return
    assert len(tasks) == 1 and gemm.input_names == ("x", "w", "bias")
    plain = synthetic.gemm_task(s, n, k, bias=True, activation="gelu_tanh", batch=(b,))
    assert (gemm.inputs, gemm.outputs, gemm.attr("activation")) == (plain.inputs, plain.outputs, "gelu_tanh")
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(spec.shape) for spec in gemm.inputs]
    np.testing.assert_allclose(gemm.reference(values)[0], plain.reference(values)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mask_kind", ["causal", "padded", "zeros"])
def test_a_constant_mask_folded_per_example(mask_kind: str) -> None:
    """GPT-2 or LLaMA fed token ids alone (an attention mask of ones) fold their mask to one causal
    plane per example, (B, 1, S, S): attention is causal with no mask to read. A mask whose examples
    differ (padding in one) is read as a mask; one of zeros (an encoder's "no padding") adds nothing
    and is not read."""
    b, h, s, d = 2, 2, 6, 8
    plane = np.where(np.arange(s)[None, :] <= np.arange(s)[:, None], 0.0, -65504.0)
    mask = np.repeat(plane[None, None], b, axis=0).astype(np.float16)
    if mask_kind == "padded":
        mask[1, :, :, 0] = -65504.0
    if mask_kind == "zeros":
        mask[:] = 0.0
    builder = GraphBuilder("folded_causal", "float16")
    kt = builder.op("Transpose", [builder.input("k", (b, h, s, d))], (b, h, d, s), perm=[0, 1, 3, 2])
    scores = builder.op("MatMul", [builder.input("q", (b, h, s, d)), kt], (b, h, s, s))
    scaled = builder.op("Mul", [scores, builder.constant(np.float16(1 / math.sqrt(d)))], (b, h, s, s))
    masked = builder.op("Add", [scaled, builder.constant(mask)], (b, h, s, s))
    probs = builder.op("Softmax", [masked], (b, h, s, s), axis=-1)
    task = builder.task(builder.op("MatMul", [probs, builder.input("v", (b, h, s, d))], (b, h, s, d)))
    assert (task.attr("causal"), task.attr("mask")) == (mask_kind == "causal", mask_kind == "padded")
    assert len(task.inputs) == (4 if mask_kind == "padded" else 3)
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(spec.shape) for spec in task.inputs]
    plain = synthetic.attention_task(b, h, s, d, "float16", causal=mask_kind == "causal")
    if mask_kind != "padded":  # the same values as the attention it is, with nothing read for the mask
        np.testing.assert_allclose(task.reference(values)[0], plain.reference(values)[0], rtol=1e-3, atol=1e-3)


def test_soft_capped_logits_are_one_attention_task() -> None:
    """Gemma 2's scores: scale, Div by the cap, Tanh, Mul by the cap, then the causal mask: one
    attention task with attrs softcap and the scale before the cap's division; its reference is
    cap * tanh(scale q k^T / cap) masked, softmaxed and applied to v, key/value heads shared."""
    task = synthetic.attention_task(2, 4, 6, 8, "float32", kv_heads=2, causal=True, softcap=5.0)
    assert task.kind == "attention" and task.attr("softcap") == 5.0 and task.attr("scale") == canonical_float(8 ** -0.5)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(spec.shape) * 4 for spec in task.inputs)  # scores well past the cap
    k, v = (np.repeat(x, 2, axis=1) for x in (k, v))
    scores = 5.0 * np.tanh(q @ k.transpose(0, 1, 3, 2) / math.sqrt(8) / 5.0)
    scores = np.where(np.tril(np.ones((6, 6), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = probs / probs.sum(-1, keepdims=True) @ v
    # the graph's scale and cap are float32 constants
    np.testing.assert_allclose(task.reference([q, k[:, ::2], v[:, ::2]])[0], want, rtol=1e-6, atol=1e-8)
    assert "softcap" not in dict(synthetic.attention_task(2, 4, 6, 8, "float32").attrs)


def _swin_v2_attention(shifted: bool) -> Graph:
    """Swin V2's window attention on (B, H, S, D) = (4, 2, 6, 8), two windows an image: cosine
    scores (q and k divided by their norms) scaled by one constant a head, a constant position bias
    (1, H, S, S), and in a shifted block the windows' mask added in the (B / 2, 2, H, S, S) view."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("swin_v2", "float32")
    shape, scores_shape = (4, 2, 6, 8), (4, 2, 6, 6)

    def unit(x: str) -> str:
        norm = b.op("ReduceL2", [x], (4, 2, 6, 1), axes=[-1], keepdims=1)
        return b.op("Div", [x, b.op("Clip", [norm, b.constant(1e-12)], (4, 2, 6, 1))], shape)

    q, k, v = (b.input(name, shape) for name in "qkv")
    kt = b.op("Transpose", [unit(k)], (4, 2, 8, 6), perm=[0, 1, 3, 2])
    scores = b.op("Mul", [b.op("MatMul", [unit(q), kt], scores_shape), b.constant(np.exp(rng.random((2, 1, 1))))],
                  scores_shape)
    scores = b.op("Add", [scores, b.constant(rng.standard_normal((1, 2, 6, 6)))], scores_shape)
    if shifted:
        windows = b.op("Reshape", [scores, b.constant(np.array([2, 2, 2, 6, 6]), "int64")], (2, 2, 2, 6, 6))
        hidden = np.where(rng.random((1, 2, 1, 6, 6)) < 0.3, -100.0, 0.0)
        windows = b.op("Add", [windows, b.constant(hidden)], (2, 2, 2, 6, 6))
        scores = b.op("Reshape", [windows, b.constant(np.array(scores_shape), "int64")], scores_shape)
    probs = b.op("Softmax", [scores], scores_shape, axis=-1)
    return b.graph([b.op("MatMul", [probs, v], shape)])


@pytest.mark.parametrize("shifted", [False, True])
def test_swin_v2_window_attention_is_one_attention_task(shifted: bool) -> None:
    """Its per-head scale moves onto the queries (rewrites.query_scales), and its biases -- the
    position bias, the shifted windows' mask added in a batch-split view -- fold into one constant
    (B, H, S, S) mask: one attention task, scale 1, whose reference computes what the graph does."""
    graph = _swin_v2_attention(shifted)
    rewritten, tasks = backend_tasks(graph, get_backend(load_target("h200")))
    attention = [task for task in tasks if task.kind == "attention"]
    assert len(attention) == 1 and [task.kind for task in tasks].count("bmm") == 0
    (task,) = attention
    assert task.attr("scale") == 1.0 and task.attr("mask")
    assert task.inputs[3].shape == ((4, 2, 6, 6) if shifted else (1, 2, 6, 6))
    rng = np.random.default_rng(6)
    feeds = {name: rng.standard_normal((4, 2, 6, 8)).astype(np.float32) for name in "qkv"}
    values = {**rewritten.constants, **feeds}
    run_nodes(rewritten.nodes, values, rewritten.opset)
    got = task.reference([values.get(name, task.constants.get(name)) for name in task.input_names])[0]
    np.testing.assert_allclose(got, values[task.output_names[0]], rtol=1e-5, atol=1e-6)
    (out,) = graph.outputs
    np.testing.assert_allclose(values[out], run_graph(graph, feeds)[out], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("share", [True, False])
def test_grouped_query_attention_reads_the_key_value_heads_before_their_repeat(share: bool) -> None:
    """LLaMA's repeat_kv (Unsqueeze, Expand, Reshape) before attention: a backend that shares
    key/value heads gets k and v with their own 2 heads, the repeat inside the task (no repeated
    copy); one that does not gets them repeated to 4 heads, the repeat left to glue."""
    b, h, kv, s, d = 2, 4, 2, 6, 8
    builder = GraphBuilder("gqa", "float32")

    def repeated(name: str) -> str:
        shared = builder.input(name, (b, kv, s, d))
        lifted = builder.op("Unsqueeze", [shared, builder.constant(np.array([2]), "int64")], (b, kv, 1, s, d))
        expanded = builder.op("Expand", [lifted, builder.constant(np.array([b, kv, h // kv, s, d]), "int64")],
                              (b, kv, h // kv, s, d))
        return builder.op("Reshape", [expanded, builder.constant(np.array([b, h, s, d]), "int64")], (b, h, s, d))

    k, v = repeated("k"), repeated("v")
    kt = builder.op("Transpose", [k], (b, h, d, s), perm=[0, 1, 3, 2])
    scores = builder.op("Mul", [builder.op("MatMul", [builder.input("q", (b, h, s, d)), kt], (b, h, s, s)),
                                builder.constant(1 / math.sqrt(d))], (b, h, s, s))
    probs = builder.op("Softmax", [scores], (b, h, s, s), axis=-1)
    out = builder.op("MatMul", [probs, v], (b, h, s, d))
    tasks = partition(builder.graph([out]), share_kv_heads=share)
    attention = _by_kind(tasks, "attention")[0]
    heads = kv if share else h
    assert [spec.shape for spec in attention.inputs] == [(b, h, s, d), (b, heads, s, d), (b, heads, s, d)]
    if share:
        assert attention.input_names == ("q", "k", "v") and len(tasks) == 1
        rng = np.random.default_rng(0)
        q_value, k_value, v_value = (rng.standard_normal(spec.shape) for spec in attention.inputs)
        want = synthetic.attention_task(b, h, s, d).reference(
            [q_value, np.repeat(k_value, h // kv, axis=1), np.repeat(v_value, h // kv, axis=1)])[0]
        np.testing.assert_allclose(attention.reference([q_value, k_value, v_value])[0], want, rtol=1e-12)


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "pairs"])
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("rotary_dims", [None, 4], ids=["whole_heads", "partial"])
def test_rotary_embedding_is_one_task_where_the_backend_fuses_it(fuse: bool, rotary_dims: int | None,
                                                                 interleaved: bool) -> None:
    """transformers' apply_rotary_pos_emb after the head split (Transpose, two Slices of the last
    axis, Neg, Concat, two Muls, Add): with a rotary kernel and folded transposes one rotary task
    reading the (B, S, H, D) projection buffer through its perm; without one, as before, the Slices,
    Neg and Concat stay glue and elementwise tasks. A partial rotary (GPT-NeoX: the first R columns
    sliced, rotated and concatenated with the rest) is the same one task, its Slices and Concat in it.
    GPT-J's rotate_every_two (strided Slices, Unsqueezes, a Concat of pairs, a Reshape) likewise,
    marked interleaved."""
    graph = synthetic.rotary_graph(2, 3, 5, 8, "float32", packed_heads=True, rotary_dims=rotary_dims,
                                   interleaved=interleaved)
    tasks = partition(graph, fold_attention_transposes=True, fuse_rotary=fuse)
    if not fuse:
        assert "rotary" not in [task.kind for task in tasks]
        return
    assert [task.kind for task in tasks] == ["rotary"]
    task = tasks[0]
    assert task.input_names == ("x", "cos", "sin") and task.attr("perm") == (0, 2, 1, 3)
    assert task.attr("rotary_dims") == rotary_dims and task.outputs[0].shape == (2, 3, 5, 8)
    assert task.attr("interleaved", False) == interleaved
    rng = np.random.default_rng(0)
    x, cos, sin = (rng.standard_normal(spec.shape) for spec in task.inputs)
    heads = x.transpose(0, 2, 1, 3)
    rotated = rotary_dims or heads.shape[-1]
    part, half = heads[..., :rotated], rotated // 2
    if interleaved:
        pairs = part.reshape(*part.shape[:-1], half, 2)
        swapped = np.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(part.shape)
    else:
        swapped = np.concatenate([-part[..., half:], part[..., :half]], axis=-1)
    turned = part * cos + swapped * sin
    want = np.concatenate([turned, heads[..., rotated:]], axis=-1)
    np.testing.assert_allclose(task.reference([x, cos, sin])[0], want, rtol=1e-12)


@pytest.mark.parametrize("up_first", [False, True])
def test_swiglu_multiplies_in_a_gemm_epilogue(up_first: bool) -> None:
    """LLaMA's MLP, down(silu(x @ W_gate) * (x @ W_up)) + x: the product of the two projections is
    one GEMM's epilogue (the other GEMM's output its gate operand), whichever projection comes first
    in the graph; no elementwise task is left, and the model's outputs do not change."""
    builder = GraphBuilder("swiglu", "float32")
    x = builder.input("x", (6, 16))
    projections = {name: builder.op("MatMul", [x, builder.input(f"w_{name}", (16, 40))], (6, 40))
                   for name in (("up", "gate") if up_first else ("gate", "up"))}
    silu = builder.op("Mul", [projections["gate"], builder.op("Sigmoid", [projections["gate"]], (6, 40))], (6, 40))
    product = builder.op("Mul", [silu, projections["up"]], (6, 40))
    down = builder.op("MatMul", [product, builder.input("w_down", (40, 16))], (6, 16))
    graph = builder.graph([builder.op("Add", [down, x], (6, 16))])
    tasks = partition(graph)
    assert [task.kind for task in tasks] == ["gemm"] * 3
    gated = [task for task in tasks if task.attr("residual_op") == "mul"]
    assert len(gated) == 1 and gated[0].attr("residual")
    assert [task.attr("residual_op", "add") for task in tasks if task.attr("residual")].count("add") == 1
    rng = np.random.default_rng(3)
    feeds = {name: rng.standard_normal(graph.values[name].shape).astype(np.float32) for name in graph.inputs}
    values = dict(feeds)
    for task in tasks:  # in order: each task's inputs are the graph's or an earlier task's
        values.update(zip(task.output_names, task.reference([values[name] for name in task.input_names])))
    want = run_graph(graph, feeds)[graph.outputs[0]]  # in float32; the references in float64
    np.testing.assert_allclose(values[graph.outputs[0]], want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("scale_conv_inputs", [True, False])
def test_a_squeeze_excite_gate_is_read_by_the_conv_after_it(scale_conv_inputs: bool) -> None:
    """EfficientNet's block: x * sigmoid(gate) with the gate (N, C, 1, 1), then the projection conv.
    On a backend whose convs scale their input (scales_conv_inputs) the product is part of the conv
    task (its gate the last input, attrs input_scale), whose reference computes what the graph does;
    elsewhere it stays an elementwise task."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("squeeze_excite", "float32")
    x = b.input("x", (2, 8, 5, 5))
    pooled = b.op("GlobalAveragePool", [x], (2, 8, 1, 1))
    gate = b.op("Sigmoid", [b.op("Conv", [pooled, b.constant(rng.standard_normal((8, 8, 1, 1)))], (2, 8, 1, 1),
                                 kernel_shape=[1, 1])], (2, 8, 1, 1))
    scaled = b.op("Mul", [x, gate], (2, 8, 5, 5))
    out = b.op("Conv", [scaled, b.constant(rng.standard_normal((4, 8, 3, 3)))], (2, 4, 5, 5), kernel_shape=[3, 3],
               pads=[1, 1, 1, 1])
    graph = b.graph([out])
    tasks = partition(graph, scale_conv_inputs=scale_conv_inputs)
    kinds = [(task.kind, task.attr("input_scale", False)) for task in tasks]
    if not scale_conv_inputs:
        assert kinds == [("pool", False), ("conv2d", False), ("elementwise", False), ("conv2d", False)]
        return
    assert kinds == [("pool", False), ("conv2d", False), ("conv2d", True)]
    projection = tasks[-1]
    assert projection.input_names[0] == "x" and projection.input_names[-1] == gate
    values = {**graph.constants, "x": rng.standard_normal((2, 8, 5, 5)).astype(np.float32)}
    run_nodes(graph.nodes, values, graph.opset)
    got = projection.reference([values.get(name, projection.constants.get(name)) for name in projection.input_names])[0]
    np.testing.assert_allclose(got, values[out], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask, causal, kv_heads, softcap", [
    (True, False, 4, 0.0), (False, True, 2, 0.0), (True, True, 4, 3.0)])
def test_opset23_attention_and_rms_norm_ops_are_tasks(mask: bool, causal: bool, kv_heads: int, softcap: float) -> None:
    """torch's exporter at opset 23 writes F.rms_norm and scaled_dot_product_attention as the
    RMSNormalization and Attention ops: an rmsnorm and an attention task (a float mask, the causal
    flag, the soft cap, grouped key/value heads where the backend shares them), and the Triton
    kernel passes the gate against the op's own semantics (the executor's)."""
    b = GraphBuilder("opset23", "float32")
    x = b.input("x", (2, 4, 6, 8))
    normed = b.op("RMSNormalization", [x, b.input("gamma", (8,))], (2, 4, 6, 8), epsilon=1e-6)
    k, v = b.input("k", (2, kv_heads, 6, 8)), b.input("v", (2, kv_heads, 6, 8))
    operands = [normed, k, v] + ([b.input("mask", (1, 1, 6, 6))] if mask else [])
    out = b.op("Attention", operands, (2, 4, 6, 8), is_causal=int(causal), softcap=softcap, scale=0.3)
    backend = get_backend(load_target("h200"))
    _, tasks = backend_tasks(b.graph([out], opset=23), backend)
    assert [task.kind for task in tasks] == ["rmsnorm", "attention"]
    attention = tasks[1]
    assert (attention.attr("causal"), attention.attr("mask"), attention.attr("scale")) == (causal, mask, 0.3)
    assert attention.attr("softcap", 0.0) == softcap and attention.inputs[1].shape[1] == kv_heads
    variant = next(v for v in backend.variants(attention) if v.name == "attention_flash")
    program = backend.load(backend.compile(Candidate.of(variant, dict(variant.default)), attention), attention)
    gate = GateOptions(seeds=(5,), distributions=("normal", "negative"))
    verdict = verify(backend, program, attention, variant.precision, gate)
    assert verdict.passed, verdict.reason


@pytest.mark.parametrize("mask_kind", ["causal", "window"])
def test_opset23_attention_with_a_boolean_mask_and_repeated_heads(mask_kind: str) -> None:
    """transformers' SDPA path at opset 23: a constant boolean mask (True: attended) and key/value
    heads repeated (Unsqueeze, Expand, Reshape) before the Attention op. A causal mask is the task's
    causal flag, another (a window) an additive constant; k and v are read before their repeat; the
    task's reference computes what the graph does."""
    b = GraphBuilder("sdpa23", "float32")
    q = b.input("q", (1, 4, 6, 8))

    def repeated(name: str) -> str:
        x = b.input(name, (1, 2, 6, 8))
        x = b.op("Unsqueeze", [x, b.constant(np.array([2]), "int64")], (1, 2, 1, 6, 8))
        x = b.op("Expand", [x, b.constant(np.array([1, 2, 2, 6, 8]), "int64")], (1, 2, 2, 6, 8))
        return b.op("Reshape", [x, b.constant(np.array([1, 4, 6, 8]), "int64")], (1, 4, 6, 8))

    rows, cols = np.arange(6)[:, None], np.arange(6)[None, :]
    allowed = cols <= rows if mask_kind == "causal" else abs(rows - cols) <= 2
    out = b.op("Attention", [q, repeated("k"), repeated("v"), b.constant(allowed[None, None], "bool")], (1, 4, 6, 8))
    graph = b.graph([out], opset=23)
    (task,) = partition(graph, share_kv_heads=True)
    assert task.kind == "attention" and task.input_names[1:3] == ("k", "v") and task.inputs[1].shape == (1, 2, 6, 8)
    assert (task.attr("causal"), task.attr("mask")) == (mask_kind == "causal", mask_kind == "window")
    rng = np.random.default_rng(8)
    feeds = {"q": rng.standard_normal((1, 4, 6, 8)), "k": rng.standard_normal((1, 2, 6, 8)),
             "v": rng.standard_normal((1, 2, 6, 8))}
    want = run_graph(graph, {name: value.astype(np.float32) for name, value in feeds.items()})[out]
    got = task.reference([feeds.get(name, task.constants.get(name)) for name in task.input_names])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_layer_norm_op_without_a_bias_is_a_layernorm_task() -> None:
    """MPT's and OLMo's LayerNorm as torch's dynamo exporter writes it: LayerNormalization with no
    bias input. The task's bias is zeros; its reference computes what the op does."""
    b = GraphBuilder("ln_no_bias", "float32")
    out = b.op("LayerNormalization", [b.input("x", (3, 16)), b.constant(np.linspace(0.5, 1.5, 16))], (3, 16),
               axis=-1, epsilon=1e-5)
    graph = b.graph([out])
    (task,) = partition(graph)
    assert task.kind == "layernorm" and [spec.shape for spec in task.inputs] == [(3, 16), (16,), (16,)]
    x = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
    params = [task.constants.get(name, graph.constants.get(name)) for name in task.input_names[1:]]
    got = task.reference([x, *params])[0]
    np.testing.assert_allclose(got, run_graph(graph, {"x": x})[out], rtol=1e-6, atol=1e-6)
