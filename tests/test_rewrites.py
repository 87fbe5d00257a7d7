"""Graph rewrites (rewrites.py): the same values, cheaper tasks."""
from __future__ import annotations

import math

import numpy as np
import pytest

from portkern.backends import get_backend
from portkern.executor import run_graph
from portkern.hwprofile import load_target
from portkern.ir import Graph, Node, TensorSpec
from portkern.partition import backend_tasks
from portkern.rewrites import (MIN_PART, collapse_layout_chains, drop_identity_arithmetic, einsums_as_matmuls,
                               fold_column_affines, query_scales, spatial_means_as_pools,
                               fold_pads_into_convs, reassociate_residuals, split_projections)
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


def _head_grid_projection(cut: str, heads: int = 2, head_dim: int = MIN_PART // 2) -> Graph:
    """A fused q/k/v projection whose columns a Reshape lays out per head, then cut per head:
    "neox" views (B, S, H, 3D), moves the heads before the positions and Slices q, k and v off the
    last axis (GPT-NeoX); "bloom" views (B, S, H, 3, D) and Gathers index 0, 1 and 2 of axis 3."""
    rng = np.random.default_rng(3)
    b, s, k, n = 2, 5, 16, 3 * heads * head_dim
    builder = GraphBuilder(cut, "float32")
    x = builder.input("x", (b, s, k))
    product = builder.op("MatMul", [x, builder.constant(rng.standard_normal((k, n)))], (b, s, n))
    biased = builder.op("Add", [product, builder.constant(rng.standard_normal(n))], (b, s, n))
    parts = []
    if cut == "neox":
        grid = builder.op("Reshape", [biased, builder.constant(np.array([b, s, heads, 3 * head_dim]), "int64")],
                          (b, s, heads, 3 * head_dim))
        moved = builder.op("Transpose", [grid], (b, heads, s, 3 * head_dim), perm=[0, 2, 1, 3])
        for index in range(3):
            bounds = [builder.constant(np.array([value]), "int64")
                      for value in (index * head_dim, (index + 1) * head_dim, -1)]
            parts.append(builder.op("Slice", [moved, *bounds], (b, heads, s, head_dim)))
    else:
        grid = builder.op("Reshape", [biased, builder.constant(np.array([b, s, heads, 3, head_dim]), "int64")],
                          (b, s, heads, 3, head_dim))
        for index in range(3):
            parts.append(builder.op("Gather", [grid, builder.constant(np.array(index), "int64")],
                                    (b, s, heads, head_dim), axis=3))
    return builder.graph([builder.op("Relu", [part], builder.values[part].shape) for part in parts])


@pytest.mark.parametrize("cut", ["neox", "bloom"])
def test_a_projection_cut_per_head_is_one_projection_per_part(cut: str) -> None:
    """The cut after a per-head view: each part's GEMM reads every head's columns of that part
    (gathered from the weight and bias), then the same view and Transpose; the values do not change
    and no Slice or Gather is left."""
    graph = _head_grid_projection(cut)
    rewritten = split_projections(graph)
    ops = [node.op_type for node in rewritten.nodes]
    assert not {"Slice", "Gather"} & set(ops) and ops.count("MatMul") == 3
    feeds = {"x": np.random.default_rng(4).standard_normal(graph.values["x"].shape).astype(np.float32)}
    want, got = run_graph(graph, feeds), run_graph(rewritten, feeds)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
    _, tasks = backend_tasks(graph, get_backend(load_target("h200")))
    assert [task.inputs[1].shape for task in tasks if task.kind == "gemm"] == [(16, 2 * MIN_PART // 2)] * 3


def test_a_projection_cut_along_its_rows_is_left() -> None:
    """A Slice of the positions (a rows axis) is not a cut of the columns."""
    builder = GraphBuilder("rows", "float32")
    product = builder.op("MatMul", [builder.input("x", (2, 6, 16)), builder.constant(np.ones((16, 2 * MIN_PART)))],
                         (2, 6, 2 * MIN_PART))
    bounds = [builder.constant(np.array([value]), "int64") for value in (0, 3, 1)]
    graph = builder.graph([builder.op("Slice", [product, *bounds], (2, 3, 2 * MIN_PART))])
    assert split_projections(graph) is graph


def _parallel_block(reader_of_attn: bool = False) -> Graph:
    """GPT-NeoX's parallel residual, (mlp + attn) + x, both branches biased projections of x."""
    rng = np.random.default_rng(5)
    builder = GraphBuilder("parallel", "float32")
    x = builder.input("x", (4, 8))

    def projection() -> str:
        product = builder.op("MatMul", [x, builder.constant(rng.standard_normal((8, 8)))], (4, 8))
        return builder.op("Add", [builder.constant(rng.standard_normal(8)), product], (4, 8))

    mlp, attn = builder.op("Gelu", [projection()], (4, 8)), projection()
    mlp = builder.op("MatMul", [mlp, builder.constant(rng.standard_normal((8, 8)))], (4, 8))
    out = builder.op("Add", [builder.op("Add", [mlp, attn], (4, 8)), x], (4, 8))
    return builder.graph([out, builder.op("Relu", [attn], (4, 8))] if reader_of_attn else [out])


def test_a_parallel_blocks_residual_sum_is_two_projection_epilogues() -> None:
    """(mlp + attn) + x regrouped as mlp + (attn + x): both adds fuse into the projections, no
    elementwise task is left, and the values are the same up to rounding."""
    graph = _parallel_block()
    rewritten = reassociate_residuals(graph)
    feeds = {"x": np.random.default_rng(6).standard_normal((4, 8)).astype(np.float32)}
    np.testing.assert_allclose(run_graph(rewritten, feeds)[graph.outputs[0]], run_graph(graph, feeds)[graph.outputs[0]],
                               rtol=1e-5, atol=1e-5)
    _, tasks = backend_tasks(graph, get_backend(load_target("cpu")))
    assert [task.kind for task in tasks] == ["gemm"] * 3
    assert sum(bool(task.attr("residual")) for task in tasks) == 2


def test_a_sum_whose_branch_is_read_elsewhere_is_left() -> None:
    graph = _parallel_block(reader_of_attn=True)
    assert reassociate_residuals(graph) is graph


def _patch_tokens(channels_last_first: bool) -> Graph:
    """ViT's patch embedding output as the channels-last graph hands it on: (B, H, W, C) back to
    NCHW, the positions flattened, then (B, HW, C); or, not channels-last, an NCHW map whose
    flatten + transpose is a real transpose."""
    builder = GraphBuilder("patches", "float32")
    if channels_last_first:
        x = builder.input("x", (2, 3, 4, 5))
        nchw = builder.op("Transpose", [x], (2, 5, 3, 4), perm=[0, 3, 1, 2])
    else:
        nchw = builder.input("x", (2, 5, 3, 4))
    flat = builder.op("Reshape", [nchw, builder.constant(np.array([2, 5, 12]), "int64")], (2, 5, 12))
    tokens = builder.op("Transpose", [flat], (2, 12, 5), perm=[0, 2, 1])
    return builder.graph([builder.op("Relu", [tokens], (2, 12, 5))])


@pytest.mark.parametrize("view", [True, False], ids=["a-view", "a-real-transpose"])
def test_a_layout_chain_that_only_reshapes_is_one_reshape(view: bool) -> None:
    graph = _patch_tokens(channels_last_first=view)
    rewritten = collapse_layout_chains(graph)
    if not view:
        assert rewritten is graph
        return
    assert [node.op_type for node in rewritten.nodes] == ["Reshape", "Relu"]
    feeds = {"x": np.random.default_rng(7).standard_normal(graph.values["x"].shape).astype(np.float32)}
    np.testing.assert_array_equal(run_graph(rewritten, feeds)[graph.outputs[0]], run_graph(graph, feeds)[graph.outputs[0]])


def test_views_that_give_their_input_back_are_no_nodes() -> None:
    """CodeGen views each part of its Split q/k/v as the shape it already has: each Reshape goes,
    and the Split makes the names the Reshapes made (every part's, not only the last one's)."""
    builder = GraphBuilder("identity_views", "float32")
    parts = builder.op("Split", [builder.input("x", (2, 6, 4))], (2, 2, 4), axis=1)
    split = builder.nodes[-1]
    split.outputs = [parts, f"{parts}_1", f"{parts}_2"]
    for name in split.outputs[1:]:
        builder.values[name] = builder.values[parts]
    viewed = [builder.op("Reshape", [part, builder.constant(np.array([2, 2, 4]), "int64")], (2, 2, 4))
              for part in split.outputs]
    graph = builder.graph([builder.op("Relu", [value], (2, 2, 4)) for value in viewed])
    rewritten = collapse_layout_chains(graph)
    assert [node.op_type for node in rewritten.nodes] == ["Split", "Relu", "Relu", "Relu"]
    feeds = {"x": np.random.default_rng(8).standard_normal((2, 6, 4)).astype(np.float32)}
    want, got = run_graph(graph, feeds), run_graph(rewritten, feeds)
    for name in graph.outputs:
        np.testing.assert_array_equal(got[name], want[name])


def test_the_view_rule_agrees_with_running_chains_on_the_indices() -> None:
    """collapse_layout_chains decides by strides, without making an array: on random chains of
    Transposes and Reshapes of small tensors it collapses only chains whose result, run on the
    element indices, is the indices in their own order, and all of those whose every Reshape is a
    view (a chain that copies midway and comes back to the order is left: the rule does not follow
    copies)."""
    rng = np.random.default_rng(11)
    answers = set()
    for case in range(300):
        shape = tuple(int(size) for size in rng.choice([1, 2, 3, 4, 6], size=int(rng.integers(2, 5))))
        builder = GraphBuilder(f"chain{case}", "float32")
        value, current = builder.input("x", shape), shape
        for _ in range(int(rng.integers(2, 5))):
            if rng.random() < 0.5:
                perm = [int(axis) for axis in rng.permutation(len(current))]
                current = tuple(current[axis] for axis in perm)
                value = builder.op("Transpose", [value], current, perm=perm)
            else:
                sizes = [size for size in current for size in _factors(size, rng)]
                cut = int(rng.integers(1, len(sizes) + 1))
                current = (*sizes[:cut - 1], math.prod(sizes[cut - 1:])) if rng.random() < 0.5 else tuple(sizes)
                value = builder.op("Reshape", [value, builder.constant(np.array(current), "int64")], current)
        graph = builder.graph([builder.op("Relu", [value], current)])
        indices = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
        ran = run_graph(graph, {"x": indices})[graph.outputs[0]]
        in_order = bool(np.array_equal(ran.reshape(-1), indices.reshape(-1)))
        collapsed = collapse_layout_chains(graph) is not graph
        chain = (shape, [(node.op_type, node.attrs) for node in graph.nodes])
        assert not collapsed or in_order, chain
        if in_order and not collapsed:
            assert not _every_reshape_a_view(graph, indices), chain
        answers.add(collapsed)
    assert answers == {True, False}


def _every_reshape_a_view(graph: Graph, indices: np.ndarray) -> bool:
    """Whether numpy runs the chain's every Reshape as a view of the input's buffer."""
    value = indices
    for node in graph.nodes[:-1]:
        if node.op_type == "Transpose":
            value = value.transpose(node.attrs["perm"])
        else:
            value = value.reshape(graph.values[node.outputs[0]].shape)
            if not np.shares_memory(value, indices):
                return False
    return True


def _factors(size: int, rng: np.random.Generator) -> list[int]:
    """`size` as one or two factors (a Reshape's split of an axis)."""
    splits = [first for first in range(2, size) if size % first == 0]
    if not splits or rng.random() < 0.5:
        return [size]
    first = int(rng.choice(splits))
    return [first, size // first]


def _padded_conv(opset: int, pads: list[int], fill: float = 0.0, mode: str = "constant",
                 also_read: bool = False) -> tuple[Graph, str]:
    """TensorFlow-style "same" padding spelled as transformers' MobileNetV2 exports it: a Pad of the
    input (more at the end), then a stride-2 depthwise Conv with auto_pad VALID, then a 1x1 Conv with
    pads of its own."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("padded", "float32")
    x = b.input("x", (1, 4, 9, 8))
    padded_shape = tuple(size + pads[axis] + pads[axis + 4] for axis, size in enumerate((1, 4, 9, 8)))
    if opset < 11:
        padded = b.op("Pad", [x], padded_shape, pads=pads, mode=mode, value=fill)
    else:
        padded = b.op("Pad", [x, b.constant(np.array(pads), "int64"), b.constant(np.float32(fill))], padded_shape,
                      mode=mode)
    out_h, out_w = (padded_shape[2] - 3) // 2 + 1, (padded_shape[3] - 3) // 2 + 1
    depthwise = b.op("Conv", [padded, b.constant(rng.standard_normal((4, 1, 3, 3)))], (1, 4, out_h, out_w),
                     kernel_shape=[3, 3], strides=[2, 2], group=4, auto_pad="VALID")
    out = b.op("Conv", [depthwise, b.constant(rng.standard_normal((6, 4, 1, 1)))], (1, 6, out_h + 2, out_w + 2),
               kernel_shape=[1, 1], pads=[1, 1, 1, 1])
    outputs = [out, b.op("Relu", [padded], padded_shape)] if also_read else [out]
    return b.graph(outputs, opset), padded


@pytest.mark.parametrize("opset", [10, 17])
def test_a_zero_pad_in_front_of_a_conv_becomes_its_padding(opset: int) -> None:
    graph, _ = _padded_conv(opset, [0, 0, 0, 0, 0, 0, 1, 1])
    folded = fold_pads_into_convs(graph)
    assert [node.op_type for node in folded.nodes] == ["Conv", "Conv"]
    assert folded.nodes[0].attrs["pads"] == [0, 0, 1, 1] and "auto_pad" not in folded.nodes[0].attrs
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 4, 9, 8)).astype(np.float32)}
    want, got = run_graph(graph, feeds), run_graph(folded, feeds)
    np.testing.assert_allclose(got[graph.outputs[0]], want[graph.outputs[0]], rtol=1e-6, atol=1e-6)
    # on h200, channels-last: the Pad no longer cuts the NHWC stretch (a Transpose in, one out)
    rewritten, tasks = backend_tasks(graph, get_backend(load_target("h200")))
    assert [task.kind for task in tasks] == ["conv2d", "conv2d"]
    assert [node.op_type for node in rewritten.nodes if node not in tasks[0].nodes + tasks[1].nodes] == \
        ["Transpose", "Transpose"]


@pytest.mark.parametrize("why, pads, fill, mode, also_read", [
    ("another value", [0, 0, 0, 0, 0, 0, 1, 1], 1.0, "constant", False),
    ("reflected", [0, 0, 0, 0, 0, 0, 1, 1], 0.0, "reflect", False),
    ("the channels padded", [0, 1, 0, 0, 0, 0, 1, 1], 0.0, "constant", False),
    ("a crop", [0, 0, 0, 0, 0, 0, -1, 1], 0.0, "constant", False),
    ("read by another op", [0, 0, 0, 0, 0, 0, 1, 1], 0.0, "constant", True),
])
def test_a_pad_that_is_not_a_convs_zero_padding_stays(why: str, pads: list[int], fill: float, mode: str,
                                                      also_read: bool) -> None:
    graph, padded = _padded_conv(17, pads, fill, mode, also_read)
    folded = fold_pads_into_convs(graph)
    assert padded in {name for node in folded.nodes for name in node.outputs}, why


def _layer_scaled(scale_shape: tuple[int, ...], gemm: bool = False, read_twice: bool = False) -> tuple[Graph, str]:
    """ConvNeXt's and DINOv2's block end: x + gamma * (h W + b), as MatMul and Add or as one Gemm
    with transB (a 2-D h)."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("layer_scale", "float32")
    rows = (6, 8) if gemm else (2, 6, 8)
    h, x = b.input("h", rows), b.input("x", (*rows[:-1], 4))
    if gemm:
        product = b.op("Gemm", [h, b.constant(rng.standard_normal((4, 8))), b.constant(rng.standard_normal(4))],
                       (6, 4), transB=1)
    else:
        product = b.op("Add", [b.constant(rng.standard_normal(4)),
                               b.op("MatMul", [h, b.constant(rng.standard_normal((8, 4)))], (*rows[:-1], 4))],
                       (*rows[:-1], 4))
    scaled = b.op("Mul", [b.constant(rng.standard_normal(scale_shape)), product], (*rows[:-1], 4))
    outputs = [b.op("Add", [x, scaled], (*rows[:-1], 4))] + ([b.op("Relu", [product], (*rows[:-1], 4))]
                                                             if read_twice else [])
    return b.graph(outputs), scaled


@pytest.mark.parametrize("scale_shape, gemm", [((4,), False), ((1, 1, 4), False), ((), False), ((4,), True)])
def test_a_layer_scale_folds_into_its_projection(scale_shape: tuple[int, ...], gemm: bool) -> None:
    """The Mul goes; the projection's weight columns and bias carry the scale; the residual add is
    then the GEMM's epilogue: one task."""
    graph, _ = _layer_scaled(scale_shape, gemm)
    folded = fold_column_affines(graph)
    assert "Mul" not in [node.op_type for node in folded.nodes]
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(graph.values[name].shape).astype(np.float32) for name in graph.inputs}
    want, got = run_graph(graph, feeds), run_graph(folded, feeds)
    np.testing.assert_allclose(got[graph.outputs[0]], want[graph.outputs[0]], rtol=1e-5, atol=1e-5)
    _, tasks = backend_tasks(graph, get_backend(load_target("h200")))
    assert [(task.kind, task.attr("bias"), task.attr("residual")) for task in tasks] == [("gemm", True, True)]


@pytest.mark.parametrize("why, scale_shape, read_twice", [("a scale per row", (6, 1), False),
                                                          ("the projection read twice", (4,), True)])
def test_a_scale_that_is_not_per_column_or_not_alone_stays(why: str, scale_shape: tuple[int, ...],
                                                           read_twice: bool) -> None:
    graph, _ = _layer_scaled(scale_shape, read_twice=read_twice)
    assert fold_column_affines(graph) is graph, why


def _affine_after_projection(form: str) -> Graph:
    """A projection and then a per-column affine map, as models export them."""
    rng = np.random.default_rng(6)
    b = GraphBuilder("affine", "float32")
    h = b.input("h", (2, 5, 8))
    columns = (2, 5, 4)

    def column(label: str) -> str:
        return b.constant(rng.standard_normal(4) + (3.0 if label == "var" else 0.0))

    if form == "levit":  # Linear without bias -> flatten(0, 1) -> BatchNorm1d -> view back -> HardSwish
        product = b.op("MatMul", [h, b.constant(rng.standard_normal((8, 4)))], columns)
        rows = b.op("Flatten", [product], (10, 4), axis=2)
        normed = b.op("BatchNormalization", [rows, column("gamma"), column("beta"), column("mean"),
                                             b.constant(rng.uniform(0.5, 2.0, 4))], (10, 4), epsilon=1e-5)
        out = b.op("HardSwish", [b.op("Reshape", [normed, b.constant(np.array(columns), "int64")], columns)], columns)
    elif form == "scale_then_shift":  # MobileBERT's NoNorm on a projection: (x W + b) * g + t
        product = b.op("Add", [b.op("MatMul", [h, b.constant(rng.standard_normal((8, 4)))], columns), column("b")],
                       columns)
        out = b.op("Add", [b.op("Mul", [product, column("g")], columns), column("t")], columns)
    else:  # a Gemm with its bias, then a Sub and a Div by constants per column
        rows = b.op("Reshape", [h, b.constant(np.array([10, 8]), "int64")], (10, 8))
        product = b.op("Gemm", [rows, b.constant(rng.standard_normal((4, 8))), column("c")], (10, 4), transB=1)
        out = b.op("Div", [b.op("Sub", [product, column("mean")], (10, 4)), column("var")], (10, 4))
    return b.graph([out])


@pytest.mark.parametrize("form, affine_ops, tasks", [
    ("levit", {"BatchNormalization"}, [("gemm", True, "hardswish")]),
    ("scale_then_shift", {"Mul"}, [("gemm", True, "none")]),
    ("gemm_sub_div", {"Sub", "Div"}, [("gemm", True, "none")]),
])
def test_a_per_column_affine_folds_into_its_projection(form: str, affine_ops: set[str],
                                                       tasks: list[tuple[str, bool, str]]) -> None:
    """LeViT's BatchNorm behind a flatten, a scale and then a shift, a Sub and a Div: each leaves the
    projection's weight and bias scaled and shifted, and the activation after it in its epilogue."""
    graph = _affine_after_projection(form)
    folded = fold_column_affines(graph)
    assert not affine_ops & {node.op_type for node in folded.nodes}
    assert [node.op_type for node in folded.nodes].count("Add") <= 1
    feeds = {"h": np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)}
    np.testing.assert_allclose(run_graph(folded, feeds)[graph.outputs[0]], run_graph(graph, feeds)[graph.outputs[0]],
                               rtol=1e-5, atol=1e-5)
    _, made = backend_tasks(graph, get_backend(load_target("h200")))
    assert [(task.kind, task.attr("bias"), task.attr("activation")) for task in made] == tasks


def test_an_affine_that_is_not_per_column_stays() -> None:
    """A BatchNorm of (N, C, L) normalizes axis 1, not the projection's columns; a Div by a column
    of zeros has no inverse scale."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("not_columns", "float32")
    product = b.op("MatMul", [b.input("h", (2, 4, 8)), b.constant(rng.standard_normal((8, 6)))], (2, 4, 6))
    normed = b.op("BatchNormalization", [product, *(b.constant(np.ones(4)) for _ in range(4))], (2, 4, 6))
    divided = b.op("Div", [b.op("MatMul", [b.input("g", (3, 8)), b.constant(rng.standard_normal((8, 2)))], (3, 2)),
                           b.constant(np.array([1.0, 0.0]))], (3, 2))
    graph = b.graph([normed, divided])
    assert fold_column_affines(graph) is graph


@pytest.mark.parametrize("equation, a_shape, b_shape, b_constant, ops", [
    ("bind,bjnd->bnij", (2, 5, 3, 4), (2, 7, 3, 4), False, ["Transpose", "Transpose", "MatMul"]),
    ("bnij,bjnd->bind", (2, 3, 5, 7), (2, 7, 3, 4), False, ["Transpose", "MatMul", "Transpose"]),
    ("bsd,hd->bsh", (2, 3, 4), (6, 4), True, ["MatMul"]),  # a projection: the weight laid out once
    ("sbd,dhk->sbhk", (3, 2, 4), (4, 2, 5), True, ["MatMul", "Reshape"]),
    ("abc,cb->a", (2, 3, 4), (4, 3), False, ["Reshape", "Transpose", "Reshape", "MatMul", "Reshape"]),
    ("ab,cd->abcd", (2, 3), (4, 5), False, ["Reshape", "Reshape", "MatMul", "Reshape"]),  # an outer product
])
def test_an_einsum_is_a_matmul_between_views(equation: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...],
                                             b_constant: bool, ops: list[str]) -> None:
    rng = np.random.default_rng(9)
    builder = GraphBuilder("einsum", "float32")
    b = builder.constant(rng.standard_normal(b_shape)) if b_constant else builder.input("b", b_shape)
    shape = np.einsum(equation, np.zeros(a_shape), np.zeros(b_shape)).shape
    graph = builder.graph([builder.op("Einsum", [builder.input("a", a_shape), b], shape, equation=equation)])
    lowered = einsums_as_matmuls(graph)
    assert [node.op_type for node in lowered.nodes] == ops
    feeds = {name: rng.standard_normal(graph.values[name].shape).astype(np.float32) for name in graph.inputs}
    np.testing.assert_allclose(run_graph(lowered, feeds)[graph.outputs[0]], run_graph(graph, feeds)[graph.outputs[0]],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("equation, shapes", [("ij,jk", ((2, 3), (3, 4))), ("i...,i...->i", ((2, 3), (2, 3))),
                                              ("ii,ij->ij", ((3, 3), (3, 4))), ("ij,jk->i", ((2, 3), (3, 4)))])
def test_an_einsum_matmul_cannot_express_stays(equation: str, shapes: tuple[tuple[int, ...], ...]) -> None:
    """No output given, an ellipsis, a repeated letter (a diagonal), a letter summed out of one operand."""
    builder = GraphBuilder("einsum", "float32")
    inputs = [builder.input(f"x{index}", shape) for index, shape in enumerate(shapes)]
    graph = builder.graph([builder.op("Einsum", inputs, (2,), equation=equation)])
    assert einsums_as_matmuls(graph) is graph


def test_attention_written_with_einsums_is_one_attention_task() -> None:
    """A hand-written attention block: scores by 'bhqd,bhkd->bhqk', softmax, 'bhqk,bhkd->bhqd'."""
    b, h, s, d = 2, 3, 10, 16
    builder = GraphBuilder("einsum_attention", "float32")
    q, k, v = (builder.input(name, (b, h, s, d)) for name in "qkv")
    scores = builder.op("Einsum", [q, k], (b, h, s, s), equation="bhqd,bhkd->bhqk")
    scaled = builder.op("Mul", [scores, builder.constant(d ** -0.5)], (b, h, s, s))
    probs = builder.op("Softmax", [scaled], (b, h, s, s), axis=-1)
    graph = builder.graph([builder.op("Einsum", [probs, v], (b, h, s, d), equation="bhqk,bhkd->bhqd")])
    _, tasks = backend_tasks(graph, get_backend(load_target("h200")))
    assert [task.kind for task in tasks] == ["attention"]


@pytest.mark.parametrize("softmax", [True, False])
def test_a_per_row_score_scale_moves_onto_the_queries(softmax: bool) -> None:
    """(q k^T) * c with c one constant per head (its last axis 1) is (q * c) k^T: moved where a
    Softmax reads the scores (an attention's), left on a plain product (cheaper after it if N < K)."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("scores", "float32")
    q, k = b.input("q", (2, 3, 5, 4)), b.input("k", (2, 3, 4, 7))
    scores = b.op("Mul", [b.op("MatMul", [q, k], (2, 3, 5, 7)), b.constant(rng.random((3, 1, 1)) + 0.5)], (2, 3, 5, 7))
    out = b.op("Softmax", [scores], (2, 3, 5, 7), axis=-1) if softmax else scores
    graph = b.graph([out])
    moved = query_scales(graph)
    if not softmax:
        assert moved is graph
        return
    assert [node.op_type for node in moved.nodes] == ["Mul", "MatMul", "Softmax"]
    assert moved.nodes[0].inputs[0] == "q" and moved.nodes[1].outputs == [scores]
    feeds = {"q": rng.standard_normal((2, 3, 5, 4)).astype(np.float32),
             "k": rng.standard_normal((2, 3, 4, 7)).astype(np.float32)}
    np.testing.assert_allclose(run_graph(moved, feeds)[out], run_graph(graph, feeds)[out], rtol=1e-5, atol=1e-7)


def test_arithmetic_that_changes_nothing_is_no_node() -> None:
    """Diffusers' ResNet block divides its output by output_scale_factor = 1.0: x / 1, x * 1, 0 + x
    and x - 0 are their input (their readers read it); x / 2, 1 / x, a broadcasting + 0 and an
    identity that is the graph's output stay."""
    b = GraphBuilder("identities", "float32")
    x = b.input("x", (2, 3))
    y = b.op("Div", [x, b.constant(1.0)], (2, 3))
    y = b.op("Mul", [b.constant(np.float32(1.0)), y], (2, 3))
    y = b.op("Sub", [b.op("Add", [b.constant(0.0), y], (2, 3)), b.constant(0.0)], (2, 3))
    kept = [b.op("Div", [y, b.constant(2.0)], (2, 3)), b.op("Div", [b.constant(1.0), y], (2, 3)),
            b.op("Add", [b.input("row", (3,)), b.constant(np.zeros((2, 3)))], (2, 3))]
    last = b.op("Mul", [kept[0], b.constant(1.0)], (2, 3))
    graph = b.graph([*kept[1:], last])
    dropped = drop_identity_arithmetic(graph)
    assert [node.op_type for node in dropped.nodes] == ["Div", "Div", "Add", "Mul"]
    assert dropped.nodes[0].inputs[0] == "x" and dropped.nodes[1].inputs[1] == "x"
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) + 1, "row": np.ones(3, np.float32)}
    for name in graph.outputs:
        np.testing.assert_array_equal(run_graph(dropped, feeds)[name], run_graph(graph, feeds)[name])


def test_unsqueezes_and_a_transpose_that_keep_the_order_are_one_view() -> None:
    """Diffusers' time embedding (N, C) -> Unsqueeze -> Unsqueeze -> (N, C, 1, 1), transposed to
    (N, 1, 1, C) for the channels-last graph: the same elements in the same order, one Reshape."""
    b = GraphBuilder("temb", "float32")
    t = b.input("t", (2, 8))
    u = b.op("Unsqueeze", [b.op("Unsqueeze", [t, b.constant(np.array([2]), "int64")], (2, 8, 1)),
                           b.constant(np.array([3]), "int64")], (2, 8, 1, 1))
    out = b.op("Transpose", [u], (2, 1, 1, 8), perm=[0, 2, 3, 1])
    graph = b.graph([b.op("Relu", [out], (2, 1, 1, 8))])
    collapsed = collapse_layout_chains(graph)
    assert [node.op_type for node in collapsed.nodes] == ["Reshape", "Relu"]
    feeds = {"t": np.arange(16, dtype=np.float32).reshape(2, 8)}
    (out,) = graph.outputs
    np.testing.assert_array_equal(run_graph(collapsed, feeds)[out], run_graph(graph, feeds)[out])


@pytest.mark.parametrize("keepdims, opset", [(1, 13), (0, 18)])
def test_a_mean_over_the_spatial_axes_is_a_global_average_pool(keepdims: int, opset: int) -> None:
    """torch's dynamo exporter writes adaptive_avg_pool2d(x, 1) as ReduceMean over axes 2 and 3
    (an attribute before opset 18, an input from it): a GlobalAveragePool, squeezed by a Reshape
    where the axes go; a mean over other axes stays."""
    b = GraphBuilder("means", "float32")
    x = b.input("x", (2, 3, 4, 5))
    axes = {"axes": [2, -1]} if opset < 18 else {}
    inputs = [x] if opset < 18 else [x, b.constant(np.array([2, 3]), "int64")]
    pooled = b.op("ReduceMean", inputs, (2, 3, 1, 1) if keepdims else (2, 3), keepdims=keepdims, **axes)
    other = b.op("ReduceMean", [x], (2, 1, 4, 5), axes=[1], keepdims=1) if opset < 18 else \
        b.op("ReduceMean", [x, b.constant(np.array([1]), "int64")], (2, 1, 4, 5), keepdims=1)
    graph = b.graph([pooled, other], opset=opset)
    rewritten = spatial_means_as_pools(graph)
    assert [node.op_type for node in rewritten.nodes] == (["GlobalAveragePool"] + ([] if keepdims else ["Reshape"])
                                                          + ["ReduceMean"])
    feeds = {"x": np.random.default_rng(4).standard_normal((2, 3, 4, 5)).astype(np.float32)}
    for name in graph.outputs:
        np.testing.assert_allclose(run_graph(rewritten, feeds)[name], run_graph(graph, feeds)[name], rtol=1e-6)
