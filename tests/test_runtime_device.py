"""The device-resident runtime: glue ops against the numpy executor, whole models through a Triton
Session (torch on CPU tensors and the Triton interpreter here) against onnxruntime, the executor
fallback for ops glue does not cover, and the CUDA-graph control flow on a stand-in for the GPU."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from portkern.backends import get_backend
from portkern.layout import LAYOUT_DOMAIN, ONNX_OF
from portkern.backends.base import Artifact, Candidate, ProducingProgram
from portkern.backends.triton import TritonBackend
from portkern.backends.triton.glue import stretch_piece, unsupported_reason
from portkern.errors import ModelError
from portkern.executor import run_nodes
from portkern.hwprofile import load_target
from portkern.ir import Node
from portkern.measure import MeasureOptions, time_program
from portkern.models import export_bert, random_feeds
from portkern.onnx_import import load_model
from portkern.pack import Pack, PackEntry
from portkern.partition import partition
from portkern import runtime
from portkern.runtime import Session
from portkern.search.records import Measurement, Verdict
from portkern.tasks import Task
from portkern.synthetic import (GraphBuilder, attention_task, conv2d_task, elementwise_task, gemm_task,
                                layernorm_task, pool_task, reduce_task, softmax_task)
from portkern.verify import make_inputs

INT64_MAX = np.iinfo(np.int64).max


@pytest.fixture(scope="module")
def backend() -> TritonBackend:
    found = get_backend(load_target("h200"))
    assert isinstance(found, TritonBackend)
    return found


# --- glue ops vs the numpy executor --------------------------------------------------------------

def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _f32s(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def _cases() -> list[Any]:
    """(op, attrs, data inputs, constant inputs, number of outputs, opset, tolerance); a name ''
    in the input order marks an omitted optional input. Data inputs are device tensors, constants
    go in as the graph's constants (host arrays where the op reads shapes or axes)."""
    rng = np.random.default_rng(0)
    x3 = _f32(rng, 2, 3, 4)
    x4 = _f32(rng, 2, 4, 9, 7)
    nhwc = np.ascontiguousarray(x4.transpose(0, 2, 3, 1))
    cases: list[tuple[str, str, dict[str, Any], dict[str, Any], dict[str, Any], int, int, float]] = [
        ("reshape-zero-copies", "Reshape", {}, {"x": x3}, {"shape": _ints(0, -1)}, 1, 17, 0),
        ("reshape-allowzero", "Reshape", {"allowzero": 1}, {"x": np.zeros((0, 2, 2), np.float32)},
         {"shape": _ints(0, 4)}, 1, 17, 0),
        ("flatten-negative-axis", "Flatten", {"axis": -1}, {"x": x3}, {}, 1, 17, 0),
        ("flatten-axis-0", "Flatten", {"axis": 0}, {"x": x3}, {}, 1, 17, 0),
        ("transpose-perm", "Transpose", {"perm": [2, 0, 1]}, {"x": x3}, {}, 1, 17, 0),
        ("transpose-reversed", "Transpose", {}, {"x": x4}, {}, 1, 17, 0),
        ("squeeze-negative-axis", "Squeeze", {}, {"x": _f32(rng, 3, 1, 4, 1)}, {"axes": _ints(-1)}, 1, 17, 0),
        ("squeeze-attr-opset11", "Squeeze", {"axes": [1]}, {"x": _f32(rng, 3, 1, 4, 1)}, {}, 1, 11, 0),
        ("squeeze-all-ones", "Squeeze", {}, {"x": _f32(rng, 1, 3, 1)}, {}, 1, 17, 0),
        ("unsqueeze-negative-axes", "Unsqueeze", {}, {"x": x3}, {"axes": _ints(-1, 0)}, 1, 17, 0),
        ("unsqueeze-attr-opset11", "Unsqueeze", {"axes": [1, 4]}, {"x": x3}, {}, 1, 11, 0),
        ("concat-negative-axis", "Concat", {"axis": -2}, {"a": x3, "b": _f32(rng, 2, 5, 4), "c": x3}, {}, 1, 17, 0),
        ("split-sizes-input", "Split", {"axis": -1}, {"x": x3}, {"split": _ints(1, 3)}, 2, 17, 0),
        ("split-uneven-num-outputs", "Split", {"axis": 2, "num_outputs": 3}, {"x": x4}, {}, 3, 18, 0),
        ("split-attr-opset11", "Split", {"axis": 1, "split": [1, 2]}, {"x": x3}, {}, 2, 11, 0),
        ("slice-negative-sentinels", "Slice", {}, {"x": x4},
         {"starts": _ints(-5, 0), "ends": _ints(INT64_MAX, -1), "axes": _ints(-2, 1), "steps": _ints(1, 2)},
         1, 17, 0),
        ("slice-negative-step", "Slice", {}, {"x": x4},
         {"starts": _ints(-1, 5), "ends": _ints(-INT64_MAX, 0), "axes": _ints(3, 2), "steps": _ints(-2, -3)},
         1, 17, 0),
        ("slice-attrs-opset9", "Slice", {"starts": [1, -3], "ends": [3, 1000], "axes": [0, 2]}, {"x": x3}, {},
         1, 9, 0),
        ("gather-negative-indices", "Gather", {"axis": -1}, {"x": x3}, {"i": np.array([[-1, 0], [2, -4]])},
         1, 17, 0),
        ("gather-scalar-index", "Gather", {"axis": 0}, {"x": x3}, {"i": np.array(1, np.int64)}, 1, 17, 0),
        ("cast-float-to-int-truncates", "Cast", {"to": TensorProto.INT32}, {"x": x3 * 5}, {}, 1, 17, 0),
        ("cast-to-float16", "Cast", {"to": TensorProto.FLOAT16}, {"x": x3}, {}, 1, 17, 0),
        ("castlike-int-to-float", "CastLike", {}, {"x": _ints(-3, 7), "like": x3}, {}, 1, 17, 0),
        ("add-broadcast", "Add", {}, {"a": x3, "b": _f32(rng, 3, 1)}, {}, 1, 17, 1e-6),
        ("sub-constant", "Sub", {}, {"a": x3}, {"b": np.float32(0.5)}, 1, 17, 1e-6),
        ("mul-fp16", "Mul", {}, {"a": x3.astype(np.float16), "b": x3.astype(np.float16)}, {}, 1, 17, 1e-3),
        ("div", "Div", {}, {"a": x3, "b": x3 + 3}, {}, 1, 17, 1e-6),
        ("div-int-truncates", "Div", {}, {"a": _ints(-7, 7, -8, 9), "b": _ints(2, -2, 3, 4)}, {}, 1, 17, 0),
        ("pow-float-exponent", "Pow", {}, {"a": np.abs(x3) + 0.1}, {"b": np.float32(1.5)}, 1, 17, 1e-5),
        ("pow-int-exponent", "Pow", {}, {"a": x3}, {"b": np.int64(3)}, 1, 17, 1e-5),
        ("sqrt", "Sqrt", {}, {"x": np.abs(x3)}, {}, 1, 17, 1e-6),
        ("erf", "Erf", {}, {"x": x3 * 2}, {}, 1, 17, 1e-6),
        ("tanh", "Tanh", {}, {"x": x3 * 3}, {}, 1, 17, 1e-6),
        ("relu", "Relu", {}, {"x": x3}, {}, 1, 17, 0),
        ("sigmoid", "Sigmoid", {}, {"x": x3 * 4}, {}, 1, 17, 1e-6),
        ("where", "Where", {}, {"c": x3 > 0, "a": x3}, {"b": np.float32(-3.4e38)}, 1, 17, 0),
        ("equal-int", "Equal", {}, {"a": _ints(1, 2, 3, 4), "b": _ints(1, 0, 3, 0)}, {}, 1, 17, 0),
        ("not", "Not", {}, {"x": x3 > 0}, {}, 1, 17, 0),
        ("and", "And", {}, {"a": x3 > 0, "b": x3 < 0.5}, {}, 1, 17, 0),
        ("expand", "Expand", {}, {"x": _f32(rng, 1, 5, 1)}, {"shape": _ints(3, 1, 4)}, 1, 17, 0),
        ("tile", "Tile", {}, {"x": x3}, {"repeats": _ints(1, 2, 3)}, 1, 17, 0),
        ("clip-inputs", "Clip", {}, {"x": x3}, {"low": np.float32(-0.5), "high": np.float32(0.7)}, 1, 17, 0),
        ("clip-max-only", "Clip", {}, {"x": x3, "": None}, {"high": np.float32(0.1)}, 1, 17, 0),
        ("clip-attrs-opset6", "Clip", {"min": -0.2, "max": 0.3}, {"x": x3}, {}, 1, 6, 0),
        ("matmul-batched", "MatMul", {}, {"a": x3, "b": _f32(rng, 4, 5)}, {}, 1, 17, 1e-5),
        ("matmul-fp16", "MatMul", {}, {"a": x3.astype(np.float16)}, {"b": _f32(rng, 4, 6).astype(np.float16)},
         1, 17, 2e-3),
        ("gemm-transposes-alpha-beta", "Gemm", {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0},
         {"a": _f32(rng, 4, 3)}, {"b": _f32(rng, 5, 4), "c": _f32(rng, 5)}, 1, 17, 1e-5),
        ("gemm-no-c", "Gemm", {"alpha": 3.0}, {"a": _f32(rng, 3, 4)}, {"b": _f32(rng, 4, 5)}, 1, 17, 1e-5),
        ("softmax-last-axis", "Softmax", {"axis": -1}, {"x": x4 * 10}, {}, 1, 17, 1e-5),
        ("softmax-coerced-opset11", "Softmax", {"axis": 1}, {"x": x4}, {}, 1, 11, 1e-5),
        ("softmax-fp16", "Softmax", {"axis": 2}, {"x": x4.astype(np.float16)}, {}, 1, 17, 2e-3),
        ("logsoftmax", "LogSoftmax", {"axis": 0}, {"x": x3}, {}, 1, 17, 1e-5),
        ("reducemean-negative-axis", "ReduceMean", {"keepdims": 0}, {"x": x4}, {"axes": _ints(-1)}, 1, 18, 1e-5),
        ("reducemean-attr-opset13", "ReduceMean", {"axes": [1, 2]}, {"x": x4}, {}, 1, 13, 1e-5),
        ("reducemean-all", "ReduceMean", {"keepdims": 1}, {"x": x3}, {}, 1, 18, 1e-5),
        ("reducesum-noop", "ReduceSum", {"noop_with_empty_axes": 1}, {"x": x3}, {}, 1, 18, 0),
        ("layernorm", "LayerNormalization", {"axis": -1, "epsilon": 1e-3}, {"x": x4},
         {"scale": _f32(rng, 7), "bias": _f32(rng, 7)}, 1, 17, 1e-5),
        ("layernorm-stats", "LayerNormalization", {"axis": 2}, {"x": x4}, {"scale": _f32(rng, 9, 7)}, 3, 17, 1e-5),
        ("layernorm-fp16", "LayerNormalization", {}, {"x": x4.astype(np.float16)},
         {"scale": _f32(rng, 7).astype(np.float16), "bias": _f32(rng, 7).astype(np.float16)}, 1, 17, 2e-3),
        ("batchnorm", "BatchNormalization", {"epsilon": 1e-3}, {"x": x4},
         {"scale": _f32(rng, 4), "bias": _f32(rng, 4), "mean": _f32(rng, 4), "var": np.abs(_f32(rng, 4)) + 0.5},
         1, 17, 1e-5),
        ("conv-asymmetric-pads-groups", "Conv",
         {"pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2], "group": 2},
         {"x": x4}, {"w": _f32(rng, 6, 2, 3, 2), "b": _f32(rng, 6)}, 1, 17, 1e-5),
        ("conv-same-upper", "Conv", {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, {"x": x4},
         {"w": _f32(rng, 3, 4, 3, 3)}, 1, 17, 1e-5),
        ("conv-1d", "Conv", {"pads": [1, 1]}, {"x": _f32(rng, 2, 3, 11)}, {"w": _f32(rng, 5, 3, 3)}, 1, 17, 1e-5),
        ("maxpool-ceil-pads-dilations", "MaxPool",
         {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1, "dilations": [1, 2]},
         {"x": x4}, {}, 1, 17, 0),
        ("averagepool-count-pad", "AveragePool",
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1, "ceil_mode": 1},
         {"x": x4}, {}, 1, 17, 1e-5),
        ("averagepool-exclude-pad", "AveragePool",
         {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 1], "ceil_mode": 1},
         {"x": x4}, {}, 1, 17, 1e-5),
        ("globalaveragepool", "GlobalAveragePool", {}, {"x": x4}, {}, 1, 17, 1e-5),
        # HF EfficientNet's pooler: a window far past the input (only the padded input is read)
        ("averagepool-kernel-past-input", "AveragePool",
         {"kernel_shape": [100000, 100000], "strides": [100000, 100000], "pads": [1, 0, 0, 1], "ceil_mode": 1,
          "count_include_pad": 1}, {"x": x4}, {}, 1, 17, 1e-5),
        ("maxpool-kernel-past-input", "MaxPool", {"kernel_shape": [100000, 3], "strides": [100000, 2], "ceil_mode": 1},
         {"x": x4}, {}, 1, 17, 0),
        # the channels-last graph's ops (layout.py): NHWC data, OHWI weights
        ("nhwc-conv-groups", "NhwcConv", {"pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2], "group": 2},
         {"x": nhwc}, {"w": _f32(rng, 6, 3, 2, 2), "b": _f32(rng, 6)}, 1, 17, 1e-5),
        ("nhwc-batchnorm", "NhwcBatchNormalization", {"epsilon": 1e-3}, {"x": nhwc},
         {"scale": _f32(rng, 4), "bias": _f32(rng, 4), "mean": _f32(rng, 4), "var": np.abs(_f32(rng, 4)) + 0.5},
         1, 17, 1e-5),
        ("nhwc-maxpool-ceil", "NhwcMaxPool", {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1],
                                              "ceil_mode": 1}, {"x": nhwc}, {}, 1, 17, 0),
        ("nhwc-averagepool", "NhwcAveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
         {"x": nhwc}, {}, 1, 17, 1e-5),
        ("nhwc-globalaveragepool", "NhwcGlobalAveragePool", {}, {"x": nhwc}, {}, 1, 17, 1e-5),
        ("identity", "Identity", {}, {"x": x3}, {}, 1, 17, 0),
        ("dropout-inference", "Dropout", {}, {"x": x3}, {}, 2, 17, 0),
        ("constant", "Constant", {"value": _f32(rng, 2, 3)}, {}, {}, 1, 17, 0),
        ("constant-of-shape", "ConstantOfShape", {"value": np.array([2.5], np.float16)}, {},
         {"shape": _ints(2, 3)}, 1, 17, 0),
        ("range", "Range", {}, {}, {"start": np.float32(1), "limit": np.float32(-2), "delta": np.float32(-0.5)},
         1, 17, 0),
        ("shape-start", "Shape", {"start": -2}, {"x": x4}, {}, 1, 17, 0),
        *_activation_cases(rng, x3),
        *_data_movement_cases(rng, x3, x4),
        *_reduction_and_normalization_cases(rng, x3, x4),
        *_resize_cases(rng, x4, nhwc),
        *_gather_scatter_and_more_cases(rng, x3, x4),
    ]
    return [pytest.param(*rest, id=case_id) for case_id, *rest in cases]


def _activation_cases(rng: np.random.Generator, x3: np.ndarray) -> list[Any]:
    """The unary activations (attribute defaults and set values), the variadic ops."""
    half = (x3 * 3).astype(np.float16)
    small_ints = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    large_ints = np.array([-(2**40) - 3, -5, -1, 0, 2, 7, 2**40 + 3], np.int64)  # float32 would round them
    past_softplus_cutoff = np.linspace(19.0, 40.0, 12)  # float64: F.softplus returns x above 20
    return [
        ("leakyrelu", "LeakyRelu", {"alpha": 0.2}, {"x": x3}, {}, 1, 17, 1e-6),
        ("leakyrelu-default-fp16", "LeakyRelu", {}, {"x": half}, {}, 1, 17, 1e-3),
        ("elu", "Elu", {"alpha": 0.7}, {"x": x3 * 3}, {}, 1, 17, 1e-6),
        ("selu-defaults", "Selu", {}, {"x": x3 * 3}, {}, 1, 17, 1e-6),
        ("selu-fp16", "Selu", {"alpha": 1.5, "gamma": 1.2}, {"x": half}, {}, 1, 17, 5e-3),
        ("celu", "Celu", {"alpha": 2.0}, {"x": x3 * 3}, {}, 1, 17, 1e-6),
        ("hardsigmoid", "HardSigmoid", {"alpha": 0.3, "beta": 0.4}, {"x": x3 * 3}, {}, 1, 17, 1e-6),
        ("hardswish", "HardSwish", {}, {"x": x3 * 4}, {}, 1, 17, 1e-6),
        ("softplus-large-inputs", "Softplus", {}, {"x": x3 * 30}, {}, 1, 17, 1e-6),
        ("softplus-float64-large-inputs", "Softplus", {}, {"x": past_softplus_cutoff}, {}, 1, 17, 1e-14),
        ("softsign", "Softsign", {}, {"x": x3 * 3}, {}, 1, 17, 1e-6),
        ("mish", "Mish", {}, {"x": x3 * 3}, {}, 1, 17, 1e-6),
        ("mish-fp16", "Mish", {}, {"x": half}, {}, 1, 17, 5e-3),
        ("thresholdedrelu", "ThresholdedRelu", {"alpha": 0.3}, {"x": x3}, {}, 1, 17, 0),
        ("shrink", "Shrink", {"bias": 0.3, "lambd": 0.6}, {"x": x3}, {}, 1, 17, 1e-6),
        ("shrink-int-truncates", "Shrink", {"bias": 1.5, "lambd": 2.0}, {"x": large_ints}, {}, 1, 17, 0),
        ("gelu-erf-opset20", "Gelu", {}, {"x": x3 * 3}, {}, 1, 20, 1e-6),
        ("gelu-tanh", "Gelu", {"approximate": "tanh"}, {"x": x3 * 3}, {}, 1, 20, 1e-6),
        ("gelu-fp16", "Gelu", {}, {"x": half}, {}, 1, 20, 5e-3),
        ("swish", "Swish", {"alpha": 1.7}, {"x": x3 * 3}, {}, 1, 24, 1e-6),
        ("max-three-broadcast", "Max", {}, {"a": x3, "b": _f32(rng, 3, 1), "c": _f32(rng, 4)}, {}, 1, 17, 0),
        ("min-int", "Min", {}, {"a": small_ints, "b": small_ints[::-1].copy()}, {}, 1, 17, 0),
        ("sum-constant-broadcast", "Sum", {}, {"a": x3}, {"b": _f32(rng, 4)}, 1, 17, 1e-6),
        ("sum-single-input", "Sum", {}, {"a": x3}, {}, 1, 17, 0),
        ("mean-fp16", "Mean", {}, {"a": half, "b": half * 2, "c": _f32(rng, 3, 4).astype(np.float16)}, {},
         1, 17, 2e-3),
    ]


def _data_movement_cases(rng: np.random.Generator, x3: np.ndarray, x4: np.ndarray) -> list[Any]:
    """Pad in each mode (crops, pads wider than the axis, axes, the attribute form), Trilu,
    DepthToSpace/SpaceToDepth, CumSum/CumProd."""
    x2 = _f32(rng, 2, 3)
    return [
        ("pad-constant-value-input", "Pad", {}, {"x": x4}, {"pads": _ints(0, 1, 2, 0, 0, 0, 1, 3),
                                                            "value": np.float32(1.5)}, 1, 18, 0),
        ("pad-constant-crops", "Pad", {}, {"x": x4}, {"pads": _ints(0, 0, -2, 1, 0, 0, 3, -1)}, 1, 18, 0),
        ("pad-constant-int", "Pad", {}, {"x": _ints(1, 2, 3)}, {"pads": _ints(2, 1), "value": np.int64(-7)},
         1, 18, 0),
        ("pad-constant-axes-no-value", "Pad", {}, {"x": x4}, {"pads": _ints(1, 2, 3, 0), "": None,
                                                              "axes": _ints(-1, 1)}, 1, 18, 0),
        ("pad-attrs-opset2", "Pad", {"pads": [0, 1, 1, 2], "value": 2.0}, {"x": x2}, {}, 1, 2, 0),
        ("pad-reflect-wider-than-axis", "Pad", {"mode": "reflect"}, {"x": x2}, {"pads": _ints(1, 5, 2, 7)},
         1, 18, 0),
        ("pad-reflect-negative-axes", "Pad", {"mode": "reflect"}, {"x": x4},
         {"pads": _ints(2, -1, 1, 3), "": None, "axes": _ints(-1, -2)}, 1, 18, 0),
        ("pad-edge-crop-beside-pad", "Pad", {"mode": "edge"}, {"x": x4}, {"pads": _ints(0, 0, -2, 4, 0, 0, 3, -3)},
         1, 18, 0),
        ("pad-edge-fp16", "Pad", {"mode": "edge"}, {"x": x3.astype(np.float16)}, {"pads": _ints(1, 0, 2, 0, 3, 1)},
         1, 13, 0),
        ("pad-wrap", "Pad", {"mode": "wrap"}, {"x": x2}, {"pads": _ints(4, -1, 1, 5)}, 1, 19, 0),
        ("trilu-upper-negative-k", "Trilu", {}, {"x": x4}, {"k": np.int64(-2)}, 1, 14, 0),
        ("trilu-lower-default-k", "Trilu", {"upper": 0}, {"x": x3}, {}, 1, 14, 0),
        ("trilu-lower-k-past-the-end", "Trilu", {"upper": 0}, {"x": x3}, {"k": np.int64(5)}, 1, 14, 0),
        ("depthtospace-dcr", "DepthToSpace", {"blocksize": 2}, {"x": _f32(rng, 2, 8, 3, 5)}, {}, 1, 13, 0),
        ("depthtospace-crd", "DepthToSpace", {"blocksize": 2, "mode": "CRD"}, {"x": _f32(rng, 2, 8, 3, 5)}, {},
         1, 13, 0),
        ("spacetodepth", "SpaceToDepth", {"blocksize": 3}, {"x": _f32(rng, 2, 2, 6, 9)}, {}, 1, 13, 0),
        ("cumsum-exclusive-reverse", "CumSum", {"exclusive": 1, "reverse": 1}, {"x": x4}, {"axis": np.int64(-2)},
         1, 14, 1e-5),
        ("cumsum-int32", "CumSum", {"exclusive": 1}, {"x": np.arange(12, dtype=np.int32).reshape(3, 4)},
         {"axis": np.int32(1)}, 1, 14, 0),
        ("cumsum-fp16", "CumSum", {}, {"x": x4.astype(np.float16)}, {"axis": np.int64(3)}, 1, 14, 5e-3),
        ("cumsum-axis-computed", "CumSum", {"reverse": 1}, {"x": x3, "axis": np.array([0], np.int64)}, {},
         1, 14, 1e-5),
        ("cumprod-exclusive", "CumProd", {"exclusive": 1}, {"x": 1 + x3 / 4}, {"axis": np.int64(-1)}, 1, 26, 1e-5),
    ]


def _gather_scatter_and_more_cases(rng: np.random.Generator, x3: np.ndarray, x4: np.ndarray) -> list[Any]:
    """ConvTranspose (pads, output_padding, groups, output_shape, auto_pad, 1-D), the gathers and
    scatters (negative indices, batch_dims, reductions), TopK on ties, Mod both ways, IsInf and the
    inverse and hyperbolic trigonometry: ops real models use that ran on the host before."""
    ties = np.round(x3 * 1.5)
    ints = np.arange(-7, 5, dtype=np.int32).reshape(3, 4)
    signs = np.array([-7.5, -3.0, 2.5, 7.0], np.float32)
    infinite = np.array([[np.inf, -np.inf, 1.0, np.nan]], np.float32)
    updates = _f32(rng, 2, 3, 2)
    return [
        ("convtranspose-pads-output-padding-groups", "ConvTranspose",
         {"strides": [2, 2], "pads": [1, 0, 0, 2], "output_padding": [1, 1], "group": 2},
         {"x": x4}, {"w": _f32(rng, 4, 3, 3, 3), "b": _f32(rng, 6)}, 1, 17, 1e-5),
        ("convtranspose-output-shape", "ConvTranspose", {"strides": [2, 2], "output_shape": [19, 16]},
         {"x": x4}, {"w": _f32(rng, 4, 5, 2, 3)}, 1, 17, 1e-5),
        ("convtranspose-same-upper-dilated", "ConvTranspose", {"strides": [2, 1], "dilations": [1, 2],
                                                               "auto_pad": "SAME_UPPER"},
         {"x": x4}, {"w": _f32(rng, 4, 2, 3, 3)}, 1, 17, 1e-5),
        ("convtranspose-1d", "ConvTranspose", {"strides": [3], "pads": [1, 1]}, {"x": x3},
         {"w": _f32(rng, 3, 2, 4), "b": _f32(rng, 2)}, 1, 17, 1e-5),
        ("gatherelements-negative", "GatherElements", {"axis": 1}, {"x": x3},
         {"indices": np.array([[[0, -1, 2, 1]], [[-3, 1, 0, 2]]], np.int64)}, 1, 17, 0),
        ("gathernd-batch-dims", "GatherND", {"batch_dims": 1}, {"x": x3},
         {"indices": np.array([[[0, 1], [2, 3]], [[1, 0], [0, 2]]], np.int64)}, 1, 17, 0),
        ("gathernd-slices", "GatherND", {}, {"x": x4}, {"indices": np.array([[1, 3], [0, 2]], np.int64)}, 1, 17, 0),
        ("scatterelements-add", "ScatterElements", {"axis": 2, "reduction": "add"}, {"x": x3},
         {"indices": np.array([[[0, 0], [3, 1], [2, 2]], [[1, 3], [0, 0], [-1, 1]]], np.int64), "updates": updates},
         1, 18, 1e-6),
        ("scatterelements-max", "ScatterElements", {"axis": 2, "reduction": "max"}, {"x": x3},
         {"indices": np.array([[[0, 0], [3, 1], [2, 2]], [[1, 3], [0, 0], [-1, 1]]], np.int64), "updates": updates},
         1, 18, 0),
        ("scatternd-none", "ScatterND", {}, {"x": x3},
         {"indices": np.array([[1, 2], [0, 0]], np.int64), "updates": _f32(rng, 2, 4)}, 1, 18, 0),
        ("scatternd-add-repeated", "ScatterND", {"reduction": "add"}, {"x": x3},
         {"indices": np.array([[0], [1], [0]], np.int64), "updates": _f32(rng, 3, 3, 4)}, 1, 18, 1e-6),
        ("topk-largest-ties", "TopK", {"axis": -1}, {"x": ties}, {"k": _ints(3)}, 2, 11, 0),
        ("topk-smallest-ties-axis1", "TopK", {"axis": 1, "largest": 0}, {"x": ties}, {"k": _ints(2)}, 2, 11, 0),
        ("mod-python-int", "Mod", {}, {"a": ints, "b": np.full((4,), 3, np.int32)}, {}, 1, 13, 0),
        ("mod-fmod-float", "Mod", {"fmod": 1}, {"a": signs, "b": np.float32([2.0, -2.0, 2.0, -2.0])}, {}, 1, 13, 0),
        ("isinf-positive-only", "IsInf", {"detect_negative": 0}, {"x": infinite}, {}, 1, 10, 0),
        ("dequantize-per-axis", "DequantizeLinear", {"axis": 1}, {"x": (x4 * 40).astype(np.int8)},
         {"scale": _f32s(0.1, 0.2, 0.05, 0.3), "zero": np.array([0, 3, -2, 1], np.int8)}, 1, 13, 1e-6),
        ("quantize-uint8-ties", "QuantizeLinear", {}, {"x": np.float32([[-1.0, 0.25, 0.75, 1.25, 300.0, -5.0]])},
         {"scale": np.float32(0.5), "zero": np.uint8(10)}, 1, 13, 0),
        ("quantize-per-axis-uint8-clamped", "QuantizeLinear", {"axis": 0}, {"x": x3 * 50},
         {"scale": _f32s(0.5, 0.25)}, 1, 13, 0),
        ("hardmax-ties", "Hardmax", {"axis": 1}, {"x": ties}, {}, 1, 13, 0),
        ("rmsnormalization-two-axes-fp16", "RMSNormalization", {"axis": -2, "epsilon": 1e-3},
         {"x": (x3 * 2).astype(np.float16)}, {"scale": _f32(rng, 3, 4).astype(np.float16)}, 1, 23, 3e-3),
        ("lpnormalization-l1-with-zero-row", "LpNormalization", {"axis": 1, "p": 1},
         {"x": np.concatenate([x3, np.zeros((2, 1, 4), np.float32)], axis=1)}, {}, 1, 17, 1e-6),
        ("meanvariancenormalization", "MeanVarianceNormalization", {"axes": [0, 2]}, {"x": x3 * 3 + 1}, {},
         1, 13, 1e-5),
        ("einsum-three-operands-ellipsis", "Einsum", {"equation": "...ij,jk,...k->...i"},
         {"a": x3, "b": _f32(rng, 4, 5), "c": _f32(rng, 2, 1, 5)}, {}, 1, 12, 1e-5),
        ("einsum-trace-implicit", "Einsum", {"equation": "ii"}, {"a": _f32(rng, 5, 5)}, {}, 1, 12, 1e-6),
        ("onehot-negative-axis0", "OneHot", {"axis": 0}, {}, {"indices": np.array([[0, -1], [2, 1]], np.int64),
                                                                 "depth": np.int64(3),
                                                                 "values": _f32s(-1.0, 4.0)}, 1, 11, 0),
        ("bitwise-and-xor-not", "BitwiseXor", {}, {"a": ints, "b": np.full((4,), 6, np.int32)}, {}, 1, 18, 0),
        ("bitwise-not", "BitwiseNot", {}, {"x": ints}, {}, 1, 18, 0),
        ("atan", "Atan", {}, {"x": x3 * 3}, {}, 1, 17, 1e-6),
        ("asinh", "Asinh", {}, {"x": x3 * 3}, {}, 1, 17, 1e-6),
        ("tanh-of-cosh", "Cosh", {}, {"x": x3}, {}, 1, 17, 1e-6),
        ("acos", "Acos", {}, {"x": np.tanh(x3)}, {}, 1, 17, 1e-6),
    ]


def _resize_cases(rng: np.random.Generator, x4: np.ndarray, nhwc: np.ndarray) -> list[Any]:
    """Resize as models use it (torch's nearest and bilinear upsampling, sizes, downscaling, cubic,
    float16, integers, the NHWC op of a channels-last graph) and Upsample (opset 9)."""
    empty = np.zeros(0, np.float32)
    nearest = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    return [
        ("resize-nearest-2x", "Resize", nearest, {"x": x4}, {"roi": empty, "scales": _f32s(1, 1, 2, 2)}, 1, 13, 0),
        ("resize-linear-sizes", "Resize", {"mode": "linear"}, {"x": x4},
         {"roi": empty, "scales": empty, "sizes": _ints(2, 4, 13, 5)}, 1, 13, 1e-5),
        ("resize-linear-align-corners-down", "Resize",
         {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, {"x": x4},
         {"roi": empty, "scales": _f32s(1, 1, 0.5, 0.75)}, 1, 13, 1e-5),
        ("resize-cubic-pytorch-half-pixel", "Resize", {"mode": "cubic", "coordinate_transformation_mode":
                                                       "pytorch_half_pixel"}, {"x": x4},
         {"roi": empty, "scales": _f32s(1, 1, 1.5, 2)}, 1, 13, 1e-5),
        ("resize-nearest-fp16", "Resize", {}, {"x": x4.astype(np.float16)}, {"roi": empty, "scales": _f32s(1, 1, 2, 3)},
         1, 13, 0),
        ("resize-linear-int", "Resize", {"mode": "linear"}, {"x": np.arange(24, dtype=np.int32).reshape(1, 2, 3, 4)},
         {"roi": empty, "scales": _f32s(1, 1, 2, 2)}, 1, 13, 0),
        ("nhwc-resize-nearest", "NhwcResize", nearest, {"x": nhwc}, {"roi": empty, "scales": _f32s(1, 1, 2, 2)},
         1, 13, 0),
        ("upsample-opset9", "Upsample", {"mode": "nearest"}, {"x": x4}, {"scales": _f32s(1, 1, 2, 2)}, 1, 9, 0),
    ]


def _reduction_and_normalization_cases(rng: np.random.Generator, x3: np.ndarray, x4: np.ndarray) -> list[Any]:
    """The reductions (negative axes, keepdims=0, the attribute form, integers, infinities),
    ArgMax/ArgMin on ties, InstanceNormalization, GroupNormalization and LRN (odd and even sizes)."""
    ties = np.round(x4 * 1.5)
    with_infinities = x3.copy()
    with_infinities[0, 1, :], with_infinities[1, 2, 0] = -np.inf, np.inf
    ints = np.arange(-5, 7, dtype=np.int32).reshape(3, 4)
    channels7 = _f32(rng, 2, 7, 5, 3)
    return [
        ("reducel1-negative-axes", "ReduceL1", {"keepdims": 0}, {"x": x4}, {"axes": _ints(-1, 1)}, 1, 18, 1e-5),
        ("reducel2-attr-opset13", "ReduceL2", {"axes": [2]}, {"x": x4}, {}, 1, 13, 1e-5),
        ("reducel2-int", "ReduceL2", {"keepdims": 0}, {"x": ints}, {"axes": _ints(0)}, 1, 18, 0),
        ("reducesumsquare-fp16", "ReduceSumSquare", {"keepdims": 0}, {"x": x4.astype(np.float16)},
         {"axes": _ints(2, 3)}, 1, 18, 3e-3),
        ("reducelogsumexp", "ReduceLogSumExp", {}, {"x": x4 * 10}, {"axes": _ints(1, 3)}, 1, 18, 1e-5),
        ("reducelogsumexp-infinities", "ReduceLogSumExp", {"keepdims": 0}, {"x": with_infinities},
         {"axes": _ints(-1)}, 1, 18, 1e-5),
        ("reducelogsum", "ReduceLogSum", {}, {"x": np.abs(x4) + 0.1}, {"axes": _ints(0)}, 1, 18, 1e-5),
        ("reduceprod-two-axes", "ReduceProd", {"keepdims": 0}, {"x": 1 + x4 / 10}, {"axes": _ints(0, -1)},
         1, 18, 1e-5),
        ("reduceprod-int-all", "ReduceProd", {}, {"x": ints[:, 1:]}, {}, 1, 18, 0),
        ("argmax-ties-keepdims0", "ArgMax", {"axis": -1, "keepdims": 0}, {"x": ties}, {}, 1, 13, 0),
        ("argmax-select-last", "ArgMax", {"axis": 1, "select_last_index": 1}, {"x": ties}, {}, 1, 13, 0),
        ("argmin-select-last-keepdims0", "ArgMin", {"axis": 2, "keepdims": 0, "select_last_index": 1},
         {"x": ties}, {}, 1, 13, 0),
        ("argmin-fp16-default-axis", "ArgMin", {}, {"x": ties.astype(np.float16)}, {}, 1, 13, 0),
        ("instancenorm", "InstanceNormalization", {"epsilon": 1e-3}, {"x": x4},
         {"scale": _f32(rng, 4), "bias": _f32(rng, 4)}, 1, 17, 1e-5),
        ("instancenorm-fp16", "InstanceNormalization", {}, {"x": x4.astype(np.float16)},
         {"scale": _f32(rng, 4).astype(np.float16), "bias": _f32(rng, 4).astype(np.float16)}, 1, 17, 5e-3),
        ("groupnorm-per-group-opset18", "GroupNormalization", {"num_groups": 2}, {"x": x4},
         {"scale": _f32(rng, 2), "bias": _f32(rng, 2)}, 1, 18, 1e-5),
        ("groupnorm-per-channel-opset21", "GroupNormalization", {"num_groups": 2}, {"x": x4},
         {"scale": _f32(rng, 4), "bias": _f32(rng, 4)}, 1, 21, 1e-5),
        ("lrn-odd-size", "LRN", {"size": 5, "alpha": 0.5, "beta": 0.75, "bias": 2.0}, {"x": channels7 * 2}, {},
         1, 13, 1e-5),
        ("lrn-even-size", "LRN", {"size": 4, "alpha": 0.5, "beta": 0.6, "bias": 1.5}, {"x": channels7 * 2}, {},
         1, 13, 1e-5),
        ("lrn-even-size-rank3", "LRN", {"size": 2, "alpha": 1.0}, {"x": _f32(rng, 2, 6, 5)}, {}, 1, 13, 1e-5),
        ("lrn-fp16-defaults", "LRN", {"size": 3}, {"x": channels7.astype(np.float16)}, {}, 1, 13, 2e-3),
    ]


@pytest.mark.parametrize("op, attrs, data, constants, outputs, opset, tolerance", _cases())
def test_glue_op_matches_the_executor(backend: TritonBackend, op: str, attrs: dict[str, Any],
                                      data: dict[str, np.ndarray], constants: dict[str, np.ndarray],
                                      outputs: int, opset: int, tolerance: float) -> None:
    inputs = [*data, *constants]
    node = Node(f"the_{op}", op, inputs, [f"y{i}" for i in range(outputs)], attrs,
                LAYOUT_DOMAIN if op in ONNX_OF else "")
    data = {name: value for name, value in data.items() if name}
    constants = {name: np.asarray(value) for name, value in constants.items() if name}
    want: dict[str, np.ndarray] = {**data, **constants}
    run_nodes([node], want, opset)
    assert unsupported_reason(node) is None
    piece = stretch_piece(backend, [node], list(data), node.outputs, constants, opset)
    assert not piece.host_nodes
    got = piece.run({name: backend.to_device(value) for name, value in data.items()})
    for name in node.outputs:
        tensor, expected = got[name], want[name]
        assert tensor.is_contiguous()
        result = backend.to_host(tensor)
        assert result.dtype == expected.dtype and result.shape == expected.shape, (result.dtype, result.shape)
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(result.astype(np.float64), expected.astype(np.float64),
                                       rtol=tolerance, atol=tolerance)
        else:
            np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("node, words", [
    (Node("g", "GridSample", ["x", "grid"], ["y"]), "no device glue for GridSample"),
    (Node("c", "Relu", ["x"], ["y"], domain="com.example"), "no device glue for Relu"),
    (Node("d", "Dropout", ["x", "r", "t"], ["y"]), "training_mode"),
    (Node("p", "MaxPool", ["x"], ["y", "i"], {"kernel_shape": [2, 2]}), "Indices"),
    (Node("c", "Cast", ["x"], ["y"], {"to": TensorProto.FLOAT8E4M3FN}), "float8"),
])
def test_forms_glue_does_not_cover_are_named(node: Node, words: str) -> None:
    assert words in (unsupported_reason(node) or "")


# --- whole models through a Triton session -----------------------------------------------------------

def _empty_pack(backend: TritonBackend, entries: dict[str, PackEntry] | None = None) -> Pack:
    target = backend.target
    return Pack(target={"name": target.name, "backend": target.backend}, fingerprint=backend.fingerprint(),
                entries=entries or {})


def _untuned_entry(backend: TritonBackend, task: Any) -> PackEntry:
    """The task's first built-in variant at a valid default config, as a pack entry (not tuned)."""
    variant = next(v for v in backend.variants(task) if backend.check(Candidate.of(v, v.default), task) is None)
    artifact = Artifact(backend=backend.name, variant=variant.name, config=dict(variant.default), source=variant.source)
    return PackEntry(key=task.key, task=task.describe(), backend=backend.name, variant=variant.name, origin="builtin",
                     config=dict(variant.default), artifact=artifact,
                     verdict=Verdict(True, "", variant.precision, {}), measurement=Measurement([1e-3], "test"),
                     baseline_seconds=None, floor_seconds=0.0)


def _rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def test_bert_on_the_device_matches_onnxruntime(backend: TritonBackend, tmp_path: Path) -> None:
    """Kernels (one layernorm in the interpreter), torch baselines and device glue, values kept on
    the device between steps; two runs with different inputs through the same static buffers."""
    path = export_bert(layers=1, hidden=32, heads=2, intermediate=64, seq=16, vocab=100)
    graph = load_model(path, {"input_ids": (2, 16)})
    layernorm = next(task for task in partition(graph) if task.kind == "layernorm")
    session = Session(graph, _empty_pack(backend, {layernorm.key: _untuned_entry(backend, layernorm)}))
    assert session.kernels and session.baselines and session.pieces
    assert not session.host_fallbacks and session.cuda_graph_error is None
    glue_ops = {node.op_type for stretch, _ in session.pieces for node in stretch}
    # the head split/merge Transposes are the attention task's (its baseline reads them as views)
    assert glue_ops >= {"Reshape", "Gather"} and "Transpose" not in glue_ops
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for seed in (1, 2):
        feeds = random_feeds(graph, seed=seed)
        got = session.run(feeds)
        want = dict(zip(graph.outputs, reference.run(graph.outputs, feeds)))
        for name in graph.outputs:
            assert got[name].dtype == want[name].dtype
            assert _rel_error(got[name], want[name]) < 1e-5, name
    assert all(t > 0 for t in session.latency(feeds, repeats=2, warmup=1))


def _model_with(path: Path, middle: onnx.NodeProto) -> Path:
    """x @ w -> `middle` -> + b: glue on both sides of one node."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"), middle,
             helper.make_node("Add", ["mid", "b"], ["y"], name="add")]
    inits = [numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_an_op_without_glue_runs_in_the_executor_and_is_listed(backend: TritonBackend, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    path = _model_with(tmp_path / "eyelike.onnx", helper.make_node("EyeLike", ["mm"], ["mid"], name="odd", k=1))
    with caplog.at_level(logging.WARNING, logger="portkern.runtime"):
        session = Session(path, _empty_pack(backend))
        feeds = {"x": np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)}
        got = session.run(feeds)["y"]
        session.run(feeds)
    assert [(node.name, reason) for node, reason in session.host_fallbacks] == [("odd", "no device glue for EyeLike")]
    notes = [r.getMessage() for r in caplog.records if "reference executor on the host" in r.getMessage()]
    assert len(notes) == 1 and "EyeLike" in notes[0]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# --- CUDA graphs: the Session's control flow, with a stand-in for the capture ------------------------------

class _GraphStandIn:
    """runtime._CudaGraph's interface on the CPU: warm-up and replay run the steps, capture counts
    (or fails as told)."""

    instances: list["_GraphStandIn"] = []
    fail_with: Exception | None = None

    def __init__(self, run: Any) -> None:
        self.run, self.captures, self.replays = run, 0, 0
        self.captured = False
        _GraphStandIn.instances.append(self)

    def warm_up(self) -> Any:
        return self.run()

    def capture(self) -> None:
        self.captures += 1
        if _GraphStandIn.fail_with is not None:
            raise _GraphStandIn.fail_with
        self.captured = True

    def replay(self) -> Any:
        self.replays += 1
        return self.run()


@pytest.fixture
def session_on_gpu_stand_in(backend: TritonBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Session:
    """A Triton session whose backend says it is on a GPU; CUDA graphs stood in for."""
    path = _model_with(tmp_path / "relu.onnx", helper.make_node("Relu", ["mm"], ["mid"], name="relu"))
    session = Session(path, _empty_pack(backend))
    monkeypatch.setattr(session.backend, "on_gpu", True)
    monkeypatch.setattr(runtime, "_CudaGraph", _GraphStandIn)
    _GraphStandIn.instances, _GraphStandIn.fail_with = [], None
    return session


def _check_runs(session: Session, path: Path, seeds: range) -> None:
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for seed in seeds:
        feeds = {"x": np.random.default_rng(seed).standard_normal((4, 6)).astype(np.float32)}
        np.testing.assert_allclose(session.run(feeds)["y"], reference.run(None, feeds)[0], rtol=1e-6, atol=1e-6)


def test_warm_up_then_capture_once_then_replay(session_on_gpu_stand_in: Session, tmp_path: Path) -> None:
    session = session_on_gpu_stand_in
    _check_runs(session, tmp_path / "relu.onnx", range(1))  # the warm-up run
    (graph,) = _GraphStandIn.instances
    assert (graph.captures, graph.replays, session.replays_cuda_graph) == (0, 0, False)
    _check_runs(session, tmp_path / "relu.onnx", range(1, 4))
    assert (graph.captures, graph.replays, session.replays_cuda_graph) == (1, 3, True)
    assert session.cuda_graph_error is None


def test_device_feeds_and_outputs_never_cross_to_the_host(session_on_gpu_stand_in: Session, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Feeds that are device buffers (torch tensors) are copied on the device into the static
    input buffers a CUDA graph replays; outputs_on_device hands back copies of the static
    outputs, which the next run does not overwrite, and nothing goes through to_host."""
    import torch

    session = session_on_gpu_stand_in
    reference = ort.InferenceSession(str(tmp_path / "relu.onnx"), providers=["CPUExecutionProvider"])
    arrays = [np.random.default_rng(seed).standard_normal((4, 6)).astype(np.float32) for seed in range(4)]
    session.run({"x": arrays[0]})  # warm-up from a host array, as before
    monkeypatch.setattr(session.backend, "to_host", _no_host_copy)
    outputs = [session.run({"x": torch.from_numpy(array.copy())}, outputs_on_device=True)["y"] for array in arrays]
    assert session.replays_cuda_graph
    for array, out in zip(arrays, outputs):
        assert isinstance(out, torch.Tensor)
        np.testing.assert_allclose(out.numpy(), reference.run(None, {"x": array})[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(ModelError, match="float16"):
        session.run({"x": torch.zeros((4, 6), dtype=torch.float16)})
    with pytest.raises(ModelError, match="4x7"):
        session.run({"x": torch.zeros((4, 7))})


def test_baselines_hand_on_their_own_results_uncopied(backend: TritonBackend, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A run takes a baseline's tensor as torch made it (produce): the copy into a preallocated
    output (the program's __call__, which the gate uses) never runs; the harness times it the
    same way."""
    path = _model_with(tmp_path / "relu.onnx", helper.make_node("Relu", ["mm"], ["mid"], name="relu"))
    session = Session(path, _empty_pack(backend))
    assert session.baselines and all(isinstance(b.program, ProducingProgram) for b in session.baselines)

    def copy_into_outputs(self: Any, inputs: Any, outputs: Any) -> None:
        raise AssertionError("a run copied a baseline's result into a preallocated output")
    monkeypatch.setattr(type(session.baselines[0].program), "__call__", copy_into_outputs)
    _check_runs(session, path, range(2))
    bound = session.baselines[0]
    assert time_program(backend, bound.program, bound.task, MeasureOptions(warmup=1, repeats=2)).median > 0


def _no_host_copy(buffer: Any) -> np.ndarray:
    raise AssertionError("a device run copied a value to the host")


def test_failed_capture_is_logged_and_runs_step_by_step(session_on_gpu_stand_in: Session, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    session = session_on_gpu_stand_in
    _GraphStandIn.fail_with = RuntimeError("operation not permitted when stream is capturing")
    with caplog.at_level(logging.WARNING, logger="portkern.runtime"):
        _check_runs(session, tmp_path / "relu.onnx", range(4))
    (graph,) = _GraphStandIn.instances  # tried once, never again
    assert (graph.captures, graph.replays, session.replays_cuda_graph) == (1, 0, False)
    assert "not permitted" in (session.cuda_graph_error or "")
    assert sum("step by step" in r.getMessage() for r in caplog.records) == 1


def test_host_fallbacks_keep_the_run_out_of_a_cuda_graph(backend: TritonBackend, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    path = _model_with(tmp_path / "eyelike.onnx", helper.make_node("EyeLike", ["mm"], ["mid"], name="odd", k=1))
    session = Session(path, _empty_pack(backend))
    monkeypatch.setattr(session.backend, "on_gpu", True)
    monkeypatch.setattr(runtime, "_CudaGraph", _GraphStandIn)
    _GraphStandIn.instances = []
    _check_runs(session, path, range(2))
    assert not _GraphStandIn.instances and "1 nodes run on the host" in (session.cuda_graph_error or "")


# --- a host-memory backend keeps its onnxruntime stretches --------------------------------------------------

def test_tvm_session_runs_stretches_in_onnxruntime_on_host_arrays(tmp_path: Path) -> None:
    pytest.importorskip("tvm")
    path = _model_with(tmp_path / "eyelike.onnx", helper.make_node("EyeLike", ["mm"], ["mid"], name="odd", k=1))
    tvm_backend = get_backend(load_target("cpu"))
    session = Session(path, Pack(target={"name": "cpu", "backend": "tvm"}, fingerprint=tvm_backend.fingerprint(),
                                 entries={}))
    assert [len(stretch) for stretch, _ in session.pieces] == [3]  # the untuned GEMM and the glue, one session
    assert not session.baselines and not session.host_fallbacks
    feeds = {"x": np.random.default_rng(4).standard_normal((4, 6)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(session.run(feeds)["y"], want, rtol=1e-6, atol=1e-6)


def _conv_with_folded_batchnorm() -> Task:
    """Conv -> BatchNormalization -> Relu as partition folds it: the folded weight and bias are
    both the task's constants and its inputs, which the gate fills with values of its own."""
    rng = np.random.default_rng(3)
    builder = GraphBuilder("conv_bn_relu", "float32")
    shape = (2, 6, 7, 7)
    conv = builder.op("Conv", [builder.input("x", (2, 4, 7, 7)), builder.constant(rng.standard_normal((6, 4, 1, 1)))],
                      shape, kernel_shape=[1, 1])
    params = [builder.constant(rng.standard_normal(6)) for _ in range(3)] + [builder.constant(rng.random(6) + 0.5)]
    task = builder.task(builder.op("Relu", [builder.op("BatchNormalization", [conv, *params], shape)], shape))
    assert set(task.input_names[1:]) <= set(task.constants)
    return task


@pytest.mark.parametrize("make", [
    lambda: conv2d_task(2, 5, 9, 11, 7, 3, 3, "float16", stride=2, pad=1, activation="relu", residual=True,
                        nhwc=True),
    _conv_with_folded_batchnorm,
    lambda: conv2d_task(2, 4, 8, 8, 8, 3, 3, "float32", pad=1, group=2),
    lambda: pool_task(2, 6, 9, 9, "max", kernel=3, stride=2, pad=1, dtype="float16", nhwc=True),
    lambda: pool_task(2, 6, 8, 8, "avg", dtype="float32"),
    lambda: gemm_task(37, 24, 40, "float16", bias=True, activation="gelu", residual=True),
    lambda: attention_task(2, 3, 17, 8, "float16", mask=True),
    lambda: softmax_task(5, 33, "float16"),
    lambda: layernorm_task(6, 40, "float32"),
    lambda: reduce_task((4, 9, 5), "float32", "mean", axes=[1]),
    lambda: elementwise_task((3, 17), "float16", [("mul", "in0", 0.5), ("erf", "t0"), ("add", "t1", "in1")]),
], ids=["conv-nhwc-residual", "conv-folded-bn", "conv-grouped", "maxpool-nhwc", "avgpool", "gemm-gelu-residual", "attention-mask",
        "softmax", "layernorm", "reduce-mean", "elementwise-erf"])
def test_the_triton_backends_float64_reference_is_the_executors(backend: TritonBackend, make: Any) -> None:
    """The gate's ground truth on the Triton backend is its device glue in float64 (cuDNN/cuBLAS
    doubles on a GPU): it must be the host executor's reference, to float64 rounding."""
    task = make()
    inputs = make_inputs(task, 5, "normal")
    want, got = task.reference(inputs), backend.reference(task, inputs)
    assert [g.dtype for g in got] == [w.dtype for w in want] == [np.float64] * len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * float(np.abs(w).max()))
