"""Graph rewrites (rewrites.py): the same values, cheaper tasks."""
from __future__ import annotations

import numpy as np
import pytest

from portkern.backends import get_backend
from portkern.executor import run_graph
from portkern.hwprofile import load_target
from portkern.ir import Graph, Node, TensorSpec
from portkern.partition import backend_tasks
from portkern.rewrites import MIN_PART, split_projections
from portkern.synthetic import GraphBuilder


def _split(builder: GraphBuilder, value: str, sizes: list[int]) -> list[str]:
    """A Split of `value` along its last axis into `sizes`, its parts each read by a Relu (so
    something other than the graph's outputs reads them)."""
    shape = builder.values[value].shape
    parts = [f"part{index}" for index in range(len(sizes))]
    for name, size in zip(parts, sizes):
        builder.values[name] = TensorSpec((*shape[:-1], size), builder.dtype)
    sizes_input = builder.constant(np.array(sizes), "int64")
    builder.nodes.append(Node("split", "Split", [value, sizes_input], parts, {"axis": len(shape) - 1}))
    return [builder.op("Relu", [part], builder.values[part].shape) for part in parts]


def _conv1d_projection(sizes: list[int], k: int = 16) -> Graph:
    """GPT-2's c_attn: x viewed as rows, addmm by a constant weight and bias, the rows split back, then
    a Split of q, k and v along the last axis."""
    rng = np.random.default_rng(0)
    b, s, n = 2, 5, sum(sizes)
    builder = GraphBuilder("c_attn", "float32")
    x = builder.input("x", (b, s, k))
    rows = builder.op("Reshape", [x, builder.constant(np.array([-1, k]), "int64")], (b * s, k))
    product = builder.op("Gemm", [rows, builder.constant(rng.standard_normal((k, n))),
                                  builder.constant(rng.standard_normal(n))], (b * s, n))
    split_back = builder.op("Reshape", [product, builder.constant(np.array([b, s, n]), "int64")], (b, s, n))
    return builder.graph(_split(builder, split_back, sizes))


def _matmul_bias_projection(sizes: list[int], k: int = 16, extra_reader: bool = False) -> Graph:
    """A MatMul by a constant weight, then a constant bias added on the left, then the Split."""
    rng = np.random.default_rng(1)
    builder = GraphBuilder("qkv", "float32")
    x = builder.input("x", (3, k))
    product = builder.op("MatMul", [x, builder.constant(rng.standard_normal((k, sum(sizes))))], (3, sum(sizes)))
    biased = builder.op("Add", [builder.constant(rng.standard_normal(sum(sizes))), product], (3, sum(sizes)))
    outputs = _split(builder, biased, sizes)
    if extra_reader:
        outputs.append(builder.op("Relu", [biased], (3, sum(sizes))))
    return builder.graph(outputs)


@pytest.mark.parametrize("make, sizes", [(_conv1d_projection, [MIN_PART] * 3),
                                         (_matmul_bias_projection, [2 * MIN_PART, MIN_PART])],
                         ids=["conv1d-three-parts", "matmul-bias-unequal-parts"])
def test_a_split_projection_is_one_projection_per_part(make, sizes: list[int]) -> None:
    graph = make(sizes)
    rewritten = split_projections(graph)
    ops = [node.op_type for node in rewritten.nodes]
    assert "Split" not in ops and sum(op in ("Gemm", "MatMul") for op in ops) == len(sizes)
    feeds = {"x": np.random.default_rng(2).standard_normal(graph.values["x"].shape).astype(np.float32)}
    want, got = run_graph(graph, feeds), run_graph(rewritten, feeds)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
    # every part is a GEMM task of its own with the bias fused, on the unmerged operand (row views)
    _, tasks = backend_tasks(graph, get_backend(load_target("cpu")))
    gemms = [task for task in tasks if task.kind == "gemm"]
    assert [task.inputs[1].shape[-1] for task in gemms] == sizes
    assert all(task.attr("bias") and task.inputs[0] == graph.values["x"] for task in gemms)


@pytest.mark.parametrize("graph", [_matmul_bias_projection([MIN_PART, MIN_PART // 2]),
                                   _matmul_bias_projection([MIN_PART, MIN_PART], extra_reader=True)],
                         ids=["a-part-too-narrow", "the-product-read-elsewhere"])
def test_split_projections_leaves_what_it_cannot_split(graph: Graph) -> None:
    """Parts narrower than MIN_PART stay one GEMM and a Split; so does a product something else
    reads whole."""
    assert split_projections(graph) is graph
