"""Synthetic task builders: documented signatures, and references that match numpy formulas."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pytest

from portkern import synthetic
from portkern.errors import PortkernError
from portkern.ir import TensorSpec
from portkern.partition import ACTIVATION_FUNCS, EPILOGUE_ACTIVATIONS, evaluate_expr
from portkern.tasks import Task

RNG_SEED = 1234


def _inputs(task: Task, seed: int = RNG_SEED) -> list[np.ndarray]:
    """Random float64 inputs of the task's shapes (booleans for where-conditions)."""
    rng = np.random.default_rng(seed)
    return [rng.random(spec.shape) < 0.5 if spec.dtype == "bool" else rng.standard_normal(spec.shape)
            for spec in task.inputs]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """float64 results; the tolerance only absorbs the model's float32 constants (sqrt 2, eps)."""
    assert got.shape == want.shape
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def _specs(task: Task) -> list[tuple[tuple[int, ...], str]]:
    return [(spec.shape, spec.dtype) for spec in task.inputs]


def _softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _conv2d(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dilation: int, group: int) -> np.ndarray:
    """Direct convolution: every output pixel as a dot product over its window."""
    n, c, h, width = x.shape
    oc, cg, kh, kw = w.shape
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (width + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, oc, oh, ow))
    per_group = oc // group
    for o in range(oc):
        g = o // per_group
        for i in range(oh):
            for j in range(ow):
                rows = i * stride + dilation * np.arange(kh)
                cols = j * stride + dilation * np.arange(kw)
                window = padded[:, g * cg:(g + 1) * cg][:, :, rows][:, :, :, cols]
                out[:, o, i, j] = np.einsum("nchw,chw->n", window, w[o])
    return out


@pytest.mark.parametrize("activation", ["none", *EPILOGUE_ACTIVATIONS])
def test_gemm_bias_activation_residual(activation: str) -> None:
    task = synthetic.gemm_task(6, 10, 12, activation=activation, bias=True, residual=True, batch=(2,))
    assert task.kind == "gemm"
    assert _specs(task) == [((2, 6, 12), "float32"), ((12, 10), "float32"), ((10,), "float32"),
                            ((2, 6, 10), "float32")]
    assert task.outputs == (TensorSpec((2, 6, 10), "float32"),)
    assert dict(task.attrs) == {"activation": activation, "bias": True, "residual": True, "trans_b": False}
    a, b, bias, residual = _inputs(task)
    act = ACTIVATION_FUNCS.get(activation, lambda x: x)
    _close(task.reference([a, b, bias, residual])[0], act(a @ b + bias) + residual)


def test_gemm_trans_b_is_a_gemm_op_and_counts_flops_and_bytes() -> None:
    task = synthetic.gemm_task(8, 16, 32, activation="relu", bias=True, trans_b=True)
    assert _specs(task) == [((8, 32), "float32"), ((16, 32), "float32"), ((16,), "float32")]
    assert [node.op_type for node in task.nodes] == ["Gemm", "Relu"]
    assert task.attr("trans_b") is True
    assert task.flops == 2 * 8 * 16 * 32 + 8 * 16 * 2  # bias add + relu per output element
    assert task.min_bytes == 4 * (8 * 32 + 16 * 32 + 16 + 8 * 16)
    a, b, bias = _inputs(task)
    _close(task.reference([a, b, bias])[0], np.maximum(a @ b.T + bias, 0.0))
    with pytest.raises(PortkernError, match="trans_b"):
        synthetic.gemm_task(8, 16, 32, trans_b=True, batch=(2,))
    with pytest.raises(PortkernError, match="unknown activation 'swish'"):
        synthetic.gemm_task(8, 16, 32, activation="swish")


def test_gemm_key_depends_on_what_the_kernel_sees() -> None:
    base = synthetic.gemm_task(64, 64, 64)
    assert base == synthetic.gemm_task(64, 64, 64)
    assert base.key == synthetic.gemm_task(64, 64, 64).key
    others = [synthetic.gemm_task(64, 64, 64, "float16"), synthetic.gemm_task(64, 64, 32),
              synthetic.gemm_task(64, 64, 64, bias=True), synthetic.gemm_task(64, 64, 64, activation="relu")]
    assert len({base.key, *(task.key for task in others)}) == 5
    assert others[0].dtype == "float16" and others[0].inputs[1] == TensorSpec((64, 64), "float16")


def test_bmm() -> None:
    task = synthetic.bmm_task(3, 4, 5, 6)
    assert task.kind == "bmm" and dict(task.attrs) == {"scale": 1.0}
    assert _specs(task) == [((3, 4, 6), "float32"), ((3, 6, 5), "float32")]
    assert task.flops == 2 * 3 * 4 * 5 * 6
    a, b = _inputs(task)
    _close(task.reference([a, b])[0], a @ b)


@pytest.mark.parametrize("k_transposed", [False, True])
def test_attention_with_mask_and_causal(k_transposed: bool) -> None:
    b, h, s, sk, d = 2, 3, 5, 7, 4
    task = synthetic.attention_task(b, h, s, d, seq_kv=sk, mask=True, causal=True, k_transposed=k_transposed)
    k_shape = (b, h, d, sk) if k_transposed else (b, h, sk, d)
    assert _specs(task) == [((b, h, s, d), "float32"), (k_shape, "float32"), ((b, h, sk, d), "float32"),
                            ((b, 1, s, sk), "float32")]
    assert dict(task.attrs) == {"scale": 0.5, "k_transposed": k_transposed, "mask": True, "causal": True}
    # causal, bottom-right aligned: query row i scores keys 0..i+(sk-s), i.e. 3+4+5+6+7 pairs
    assert task.flops == 4 * b * h * (3 + 4 + 5 + 6 + 7) * d
    q, k, v, mask = _inputs(task)
    keys_t = k if k_transposed else np.swapaxes(k, -1, -2)
    allowed = np.arange(sk)[None, :] <= np.arange(s)[:, None] + (sk - s)
    scores = q @ keys_t / math.sqrt(d) + mask + np.where(allowed, 0.0, -np.inf)
    want = _softmax(scores) @ v
    _close(task.reference([q, k, v, mask])[0], want)
    # the causal mask is a constant of the task, not an input a kernel reads
    assert len(task.inputs) == 4 and any(c.shape[-2:] == (s, sk) for c in task.constants.values())


def test_attention_plain() -> None:
    task = synthetic.attention_task(1, 2, 8, 16)
    assert dict(task.attrs) == {"scale": 0.25, "k_transposed": False, "mask": False, "causal": False}
    q, k, v = _inputs(task)
    _close(task.reference([q, k, v])[0], _softmax(q @ np.swapaxes(k, -1, -2) / 4.0) @ v)


def test_softmax_layernorm_rmsnorm() -> None:
    softmax = synthetic.softmax_task(6, 9)
    (x,) = _inputs(softmax)
    assert softmax.kind == "softmax" and softmax.flops == 5 * 54
    _close(softmax.reference([x])[0], _softmax(x))

    layernorm = synthetic.layernorm_task(6, 9, eps=1e-5)
    assert _specs(layernorm) == [((6, 9), "float32"), ((9,), "float32"), ((9,), "float32")]
    assert dict(layernorm.attrs) == {"eps": 1e-5}
    x, gamma, beta = _inputs(layernorm)
    centered = x - x.mean(-1, keepdims=True)
    want = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(layernorm.reference([x, gamma, beta])[0], want, rtol=1e-6)

    rmsnorm = synthetic.rmsnorm_task(6, 9, eps=1e-6)
    assert _specs(rmsnorm) == [((6, 9), "float32"), ((9,), "float32")]
    assert dict(rmsnorm.attrs) == {"eps": 1e-6}
    x, gamma = _inputs(rmsnorm)
    want = x / np.sqrt((x**2).mean(-1, keepdims=True) + np.float32(1e-6)) * gamma
    _close(rmsnorm.reference([x, gamma])[0], want)


def test_elementwise_expression_roundtrip() -> None:
    expr = (("sub", "in0", "in1"), ("mul", "t0", 0.5), ("max", "t1", 0.0), ("exp", "t2"),
            ("where", "in2", "t3", "in1"))
    task = synthetic.elementwise_task((4, 5), "float32", expr)
    assert task.kind == "elementwise" and task.attr("expr") == expr
    assert _specs(task) == [((4, 5), "float32"), ((4, 5), "float32"), ((4, 5), "bool")]
    assert task.flops == len(expr) * 20
    a, b, cond = _inputs(task)
    want = np.where(cond, np.exp(np.maximum((a - b) * 0.5, 0.0)), b)
    _close(task.reference([a, b, cond])[0], want)
    _close(evaluate_expr(expr, [a, b, cond]), want)


def test_elementwise_scalars_read_back_at_the_dtype() -> None:
    task = synthetic.elementwise_task((8,), "float32", (("mul", "in0", 0.1), ("gelu", "t0")))
    assert task.attr("expr") == (("mul", "in0", 0.1), ("gelu", "t0"))
    (x,) = _inputs(task)
    _close(task.reference([x])[0], ACTIVATION_FUNCS["gelu"](x * float(np.float32(0.1))))
    with pytest.raises(PortkernError, match="unknown expression step"):
        synthetic.elementwise_task((8,), "float32", (("frobnicate", "in0"),))
    with pytest.raises(PortkernError, match="not defined"):
        synthetic.elementwise_task((8,), "float32", (("add", "in0", "t5"),))


@pytest.mark.parametrize("op,func", [("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min)])
@pytest.mark.parametrize("axes,keepdims", [((1,), False), ((-1,), True), ((0, 2), True)])
def test_reduce(op: str, func: Callable[..., np.ndarray], axes: tuple[int, ...], keepdims: bool) -> None:
    task = synthetic.reduce_task((3, 4, 5), "float32", op, axes, keepdims)
    assert dict(task.attrs) == {"op": op, "axes": tuple(sorted(a % 3 for a in axes)), "keepdims": keepdims}
    (x,) = _inputs(task)
    _close(task.reference([x])[0], func(x, axis=axes, keepdims=keepdims))


@pytest.mark.parametrize("stride,pad,dilation,group", [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1)])
def test_conv2d(stride: int, pad: int, dilation: int, group: int) -> None:
    task = synthetic.conv2d_task(2, 4, 7, 6, 6, 3, 3, stride=stride, pad=pad, dilation=dilation,
                                 group=group, activation="relu6", residual=True)
    x, w, bias, residual = _inputs(task)
    assert _specs(task)[:3] == [((2, 4, 7, 6), "float32"), ((6, 4 // group, 3, 3), "float32"), ((6,), "float32")]
    assert dict(task.attrs) == {"strides": (stride, stride), "pads": (pad,) * 4, "dilations": (dilation, dilation),
                                "group": group, "activation": "relu6", "bias": True, "residual": True}
    conv = _conv2d(x, w, stride, pad, dilation, group)
    n, oc, oh, ow = conv.shape
    assert task.flops == 2 * n * oc * oh * ow * (4 // group) * 9 + n * oc * oh * ow * (1 + 1 + 2)
    _close(task.reference([x, w, bias, residual])[0], np.clip(conv + bias[:, None, None] + residual, 0, 6))


def test_pool() -> None:
    max_pool = synthetic.pool_task(1, 2, 6, 6, "max", kernel=3, stride=2, pad=1)
    assert dict(max_pool.attrs) == {"op": "max", "kernel": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}
    (x,) = _inputs(max_pool)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.array([[[[padded[n, c, i * 2:i * 2 + 3, j * 2:j * 2 + 3].max() for j in range(3)]
                       for i in range(3)] for c in range(2)] for n in range(1)])
    _close(max_pool.reference([x])[0], want)

    avg_pool = synthetic.pool_task(1, 2, 6, 6, "avg", kernel=2, stride=2)
    assert avg_pool.attr("count_include_pad") is False
    _close(avg_pool.reference([x])[0], x.reshape(1, 2, 3, 2, 3, 2).mean(axis=(3, 5)))

    global_pool = synthetic.pool_task(1, 2, 6, 6, "global_avg")
    assert global_pool.attr("kernel") == (6, 6)
    _close(global_pool.reference([x])[0], x.mean(axis=(2, 3), keepdims=True))
    with pytest.raises(PortkernError, match="unknown pool"):
        synthetic.pool_task(1, 2, 6, 6, "median")
