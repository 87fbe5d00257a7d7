"""The channels-last rewrite (layout.py): the graph means the same, stretches end in one Transpose
each way, and the NHWC graph partitions into the same tasks with layout "nhwc"."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import pytest

from portkern import synthetic
from portkern.backends import get_backend
from portkern.executor import run_graph, run_nodes
from portkern.hwprofile import load_target
from portkern.ir import Graph
from portkern.layout import LAYOUT_DOMAIN, NHWC_OPS, channels_last, conv1d_as_2d
from portkern.models import random_feeds, randomize_weights, zoo_model_path
from portkern.onnx_import import load_model
from portkern.partition import backend_tasks, partition
from portkern.synthetic import GraphBuilder


def _zoo(name: str) -> Graph:
    return load_model(randomize_weights(onnx.load(zoo_model_path(name)), seed=0))


def _same_outputs(graph: Graph, rewritten: Graph, rtol: float = 1e-6) -> None:
    feeds = random_feeds(graph, seed=3)
    want, got = run_graph(graph, feeds), run_graph(rewritten, feeds)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=rtol * float(np.abs(want[name]).max()))


def _onnx_layout_ops(graph: Graph) -> list[str]:
    return [node.op_type for node in graph.nodes if node.op_type in NHWC_OPS and node.domain != LAYOUT_DOMAIN]


def test_resnet50_runs_in_nhwc_with_two_transposes_and_the_same_tasks() -> None:
    graph = _zoo("resnet50")
    nhwc = channels_last(graph)
    assert not _onnx_layout_ops(nhwc)
    transposes = [node for node in nhwc.nodes if node.op_type == "Transpose"]
    assert [node.inputs[0] for node in transposes][0] == graph.inputs[0]  # in once, out once before Reshape
    assert len(transposes) == 2
    _same_outputs(graph, nhwc)
    before, after = partition(graph), partition(nhwc)
    assert [task.kind for task in after] == [task.kind for task in before]
    convs = [task for task in after if task.kind == "conv2d"]
    assert all(task.attr("layout") == "nhwc" and task.attr("bias") and task.input_names[1] in task.constants
               for task in convs)  # BatchNormalization still folds, now along the last axis
    assert Counter(task.attr("activation") for task in convs) == {"relu": 49, "none": 4}
    assert sum(task.attr("residual") for task in convs) == 16
    assert [task.attr("layout") for task in after if task.kind == "pool"] == ["nhwc", "nhwc"]
    stem = convs[0]
    assert stem.inputs[0].shape == (1, 224, 224, 3) and stem.inputs[1].shape == (64, 7, 7, 3)
    assert stem.key == synthetic.conv2d_task(1, 3, 224, 224, 64, 7, 7, stride=2, pad=3, activation="relu",
                                             nhwc=True).key
    assert stem.key != before[0].key  # NCHW tasks keep their old keys: packs for other backends still match
    values = {**nhwc.constants, **random_feeds(nhwc, seed=4)}
    run_nodes(nhwc.nodes, values, nhwc.opset)  # every intermediate value, by name
    for task in (stem, next(t for t in convs if t.attr("residual"))):
        got = task.reference([values.get(name, task.constants.get(name)) for name in task.input_names])
        want = values[task.output_names[0]]  # fp32 graph vs the float64 reference with folded weights
        assert np.linalg.norm(got[0] - want) / np.linalg.norm(want) < 1e-5, task.label


def test_squeezenet_concats_move_their_axis_instead_of_transposing() -> None:
    graph = _zoo("squeezenet")
    nhwc = channels_last(graph)
    concats = [node for node in nhwc.nodes if node.op_type == "Concat"]
    assert concats and all(node.attrs["axis"] == 3 for node in concats)
    assert sum(node.op_type == "Transpose" for node in nhwc.nodes) <= 4
    _same_outputs(graph, nhwc)


def test_stretch_boundaries_constants_and_untouched_branches() -> None:
    """Conv -> Mul by a per-channel constant -> Add a per-column constant -> Relu, read both as a
    graph output and by a Reshape; a MaxPool on another input, with no conv, stays NCHW."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("mixed", "float32")
    x, z = b.input("x", (2, 3, 6, 5)), b.input("z", (1, 2, 4, 4))
    w = b.constant(rng.standard_normal((4, 3, 3, 3)))
    conv = b.op("Conv", [x, w], (2, 4, 6, 5), kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    scaled = b.op("Mul", [conv, b.constant(rng.standard_normal((4, 1, 1)))], (2, 4, 6, 5))
    shifted = b.op("Add", [scaled, b.constant(rng.standard_normal(5))], (2, 4, 6, 5))
    act = b.op("Relu", [shifted], (2, 4, 6, 5))
    flat = b.op("Reshape", [act, b.constant(np.array([2, -1]), "int64")], (2, 120))
    pooled = b.op("MaxPool", [z], (1, 2, 2, 2), kernel_shape=[2, 2], strides=[2, 2])
    graph = b.graph([act, flat, pooled])
    nhwc = channels_last(graph)
    assert [node.op_type for node in nhwc.nodes].count("Transpose") == 2  # x in, act out (read twice)
    assert _onnx_layout_ops(nhwc) == ["MaxPool"]
    _same_outputs(graph, nhwc)
    assert channels_last(nhwc).nodes == nhwc.nodes  # a second pass finds nothing left to do


def test_squeeze_excite_stays_channels_last() -> None:
    """EfficientNet's and RegNet's squeeze-excite: a per-channel scale (N, C, 1, 1) computed from the
    conv's own output by pooling, two 1x1 convs and a sigmoid multiplies it: both operands are 4-D,
    so the product broadcasts the same once both are NHWC, and the block is one stretch. A runtime
    operand of lower rank would broadcast over other axes in NHWC: that product is left out."""
    rng = np.random.default_rng(1)
    b = GraphBuilder("squeeze_excite", "float32")
    x = b.input("x", (2, 8, 6, 5))
    conv = b.op("Conv", [x, b.constant(rng.standard_normal((8, 8, 1, 1)))], (2, 8, 6, 5), kernel_shape=[1, 1])
    pooled = b.op("GlobalAveragePool", [conv], (2, 8, 1, 1))
    squeezed = b.op("Conv", [pooled, b.constant(rng.standard_normal((2, 8, 1, 1)))], (2, 2, 1, 1), kernel_shape=[1, 1])
    excited = b.op("Conv", [b.op("Relu", [squeezed], (2, 2, 1, 1)), b.constant(rng.standard_normal((8, 2, 1, 1)))],
                   (2, 8, 1, 1), kernel_shape=[1, 1])
    scaled = b.op("Mul", [conv, b.op("Sigmoid", [excited], (2, 8, 1, 1))], (2, 8, 6, 5))
    out = b.op("Conv", [scaled, b.constant(rng.standard_normal((4, 8, 1, 1)))], (2, 4, 6, 5), kernel_shape=[1, 1])
    per_row = b.op("Mul", [out, b.input("row_scale", (6, 5))], (2, 4, 6, 5))
    graph = b.graph([per_row])
    nhwc = channels_last(graph)
    assert not _onnx_layout_ops(nhwc)
    assert [node.op_type for node in nhwc.nodes].count("Transpose") == 2  # x in, out back for the 2-D product
    assert next(node for node in nhwc.nodes if node.outputs == [per_row]).inputs[0] == out
    _same_outputs(graph, nhwc)


def test_group_norms_run_channels_last_between_convolutions() -> None:
    """Stable Diffusion's ResNet block: conv -> GroupNorm (torch's export: Reshape to groups,
    InstanceNormalization, Reshape back, the per-channel Mul and Add) -> SiLU -> conv. On a
    channels-last backend the group norm is one op (rewrites.group_norms_as_ops) the stretch carries:
    one Transpose in and one out, three NHWC tasks, and the graph means the same."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("resnet_block", "float32")
    shape = (2, 8, 6, 5)
    conv = b.op("Conv", [b.input("x", shape), b.constant(rng.standard_normal((8, 8, 3, 3)))], shape,
                kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    grouped = b.op("Reshape", [conv, b.constant(np.array([2, 4, -1]), "int64")], (2, 4, 60))
    normed = b.op("InstanceNormalization", [grouped, b.constant(np.ones(4)), b.constant(np.zeros(4))], (2, 4, 60))
    back = b.op("Reshape", [normed, b.constant(np.array(shape), "int64")], shape)
    affine = b.op("Add", [b.op("Mul", [back, b.constant(rng.standard_normal((8, 1, 1)))], shape),
                          b.constant(rng.standard_normal((8, 1, 1)))], shape)
    silu = b.op("Mul", [affine, b.op("Sigmoid", [affine], shape)], shape)
    out = b.op("Conv", [silu, b.constant(rng.standard_normal((4, 8, 1, 1)))], (2, 4, 6, 5), kernel_shape=[1, 1])
    graph = b.graph([out])
    rewritten, tasks = backend_tasks(graph, get_backend(load_target("h200")))
    assert [(task.kind, task.attr("layout")) for task in tasks] == [
        ("conv2d", "nhwc"), ("groupnorm", "nhwc"), ("conv2d", "nhwc")]
    assert (tasks[1].attr("groups"), tasks[1].attr("activation")) == (4, "silu")
    assert [node.op_type for node in rewritten.nodes].count("Transpose") == 2
    _same_outputs(graph, rewritten, rtol=1e-5)
    _, cpu_tasks = backend_tasks(graph, get_backend(load_target("cpu")))  # NCHW: torch's nodes, one task
    assert [(task.kind, task.attr("layout")) for task in cpu_tasks] == [
        ("conv2d", None), ("groupnorm", None), ("conv2d", None)]


def test_an_upsample_between_convolutions_stays_channels_last() -> None:
    """A UNet's or an FPN's nearest 2x upsampling (Resize) between convs: NhwcResize in the stretch
    (run as Resize on permuted views), one Transpose each way, the same outputs."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("upsample", "float32")
    conv = b.op("Conv", [b.input("x", (1, 4, 5, 6)), b.constant(rng.standard_normal((4, 4, 1, 1)))], (1, 4, 5, 6),
                kernel_shape=[1, 1])
    up = b.op("Resize", [conv, b.constant(np.zeros(0)), b.constant(np.array([1.0, 1.0, 2.0, 2.0]))], (1, 4, 10, 12),
              mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    out = b.op("Conv", [up, b.constant(rng.standard_normal((3, 4, 3, 3)))], (1, 3, 10, 12), kernel_shape=[3, 3],
               pads=[1, 1, 1, 1])
    graph = b.graph([out], opset=13)
    nhwc = channels_last(graph)
    assert [node.op_type for node in nhwc.nodes] == ["Transpose", "NhwcConv", "NhwcResize", "NhwcConv", "Transpose"]
    _same_outputs(graph, nhwc)


def test_a_graph_without_convolutions_is_left_as_it_is() -> None:
    b = GraphBuilder("pool_only", "float32")
    graph = b.graph([b.op("MaxPool", [b.input("x", (1, 2, 4, 4))], (1, 2, 2, 2), kernel_shape=[2, 2],
                          strides=[2, 2])])
    assert channels_last(graph) is graph


@pytest.mark.parametrize("name", ["inception_v2"])  # BN after Mul/Add chains, channel Concats
def test_zoo_models_mean_the_same_in_nhwc(name: str) -> None:
    graph = _zoo(name)
    nhwc = channels_last(graph)
    assert not _onnx_layout_ops(nhwc)
    _same_outputs(graph, nhwc, rtol=1e-5)


@pytest.mark.parametrize("opset", [11, 17])  # Unsqueeze/Squeeze axes: an attribute, then an input
def test_1d_convolutions_run_as_2d_ones_with_the_same_outputs(opset: int) -> None:
    """Whisper/HuBERT-style 1-D convs (pads, stride, dilation, groups, bias; a weight computed at
    run time; one input read by two convs, viewed once) mean the same as unit-height 2-D convs,
    and each becomes a conv2d task of every backend (the CPU's NCHW and the GPU's NHWC graph)."""
    rng = np.random.default_rng(0)
    builder = GraphBuilder("conv1d", "float32")
    x = builder.input("x", (2, 8, 40))
    scale = builder.input("scale", (1, 1, 1))
    w_run = builder.op("Mul", [builder.constant(rng.standard_normal((8, 8, 3)).astype(np.float32)), scale], (8, 8, 3))
    a = builder.op("Conv", [x, builder.constant(rng.standard_normal((16, 4, 5)).astype(np.float32)),
                            builder.constant(rng.standard_normal(16).astype(np.float32))], (2, 16, 18),
                   kernel_shape=[5], strides=[2], pads=[2, 1], dilations=[2], group=2)
    b = builder.op("Conv", [x, w_run], (2, 8, 40), kernel_shape=[3], pads=[1, 1])
    out = builder.op("Gelu", [a], (2, 16, 18)), b
    graph = builder.graph(list(out), opset=opset)
    wide = conv1d_as_2d(graph)
    ops = [node.op_type for node in wide.nodes]
    assert ops.count("Unsqueeze") == 2  # x once, the computed weight once
    # the Gelu follows its conv in 4-D: only the graph's two outputs are squeezed back
    assert ops.count("Squeeze") == 2 and ops.index("Gelu") < ops.index("Squeeze")
    assert all(len(wide.values[node.inputs[0]].shape) == 4 for node in wide.nodes if node.op_type == "Conv")
    _same_outputs(graph, wide)
    for target in ("cpu", "h200"):
        _, tasks = backend_tasks(graph, get_backend(load_target(target)))
        convs = [task for task in tasks if task.kind == "conv2d"]
        assert len(convs) == 2 and all(task.inputs[0].shape[1:3] in ((8, 1), (1, 40)) for task in convs)
        assert {(task.attr("strides"), task.attr("activation")) for task in convs} == {((1, 2), "gelu"),
                                                                                       ((1, 1), "none")}


def test_stacked_1d_convolutions_stay_in_4d_between_them() -> None:
    """Whisper's stem: conv -> GELU (written out, erf) -> conv -> GELU. The second conv reads the
    first GELU's 4-D value (no Squeeze and Unsqueeze between them) and each conv fuses its GELU."""
    rng = np.random.default_rng(1)
    builder = GraphBuilder("whisper_stem", "float32")

    def conv_gelu(x: str, c: int, o: int, length: int, stride: int) -> str:
        y = builder.op("Conv", [x, builder.constant(rng.standard_normal((o, c, 3)).astype(np.float32) / 4),
                                builder.constant(rng.standard_normal(o).astype(np.float32))], (1, o, length),
                       kernel_shape=[3], strides=[stride], pads=[1, 1])
        erf = builder.op("Erf", [builder.op("Div", [y, builder.constant(np.float32(math.sqrt(2)))], (1, o, length))],
                         (1, o, length))
        half = builder.op("Mul", [y, builder.op("Add", [erf, builder.constant(np.float32(1))], (1, o, length))],
                          (1, o, length))
        return builder.op("Mul", [half, builder.constant(np.float32(0.5))], (1, o, length))

    out = conv_gelu(conv_gelu(builder.input("mel", (1, 6, 30)), 6, 8, 30, 1), 8, 8, 15, 2)
    graph = builder.graph([out])
    wide = conv1d_as_2d(graph)
    assert [node.op_type for node in wide.nodes].count("Squeeze") == 1
    assert [node.op_type for node in wide.nodes].count("Unsqueeze") == 1
    _same_outputs(graph, wide, rtol=1e-5)
    _, tasks = backend_tasks(graph, get_backend(load_target("cpu")))
    assert [(task.kind, task.attr("activation")) for task in tasks] == [("conv2d", "gelu"), ("conv2d", "gelu")]
