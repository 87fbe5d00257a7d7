"""Torch eager implementations of each task kind: the vendor baseline a kernel must beat.

torch.matmul is cuBLAS, scaled_dot_product_attention is cuDNN/flash, conv2d is cuDNN on a GPU (with
cuDNN's fused bias, residual and ReLU epilogue where the activation is ReLU).
Each function maps the task's inputs (tasks.py order) to its single output, with the same epilogue
order as partition.py: gemm act(x@W + bias) + residual, conv2d act(conv + bias + residual).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ...tasks import Task, residual_join
from .modules import float32_contractions, torch_dtype

Compute = Callable[[Sequence[torch.Tensor]], torch.Tensor]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda x: x,
    "relu": F.relu,
    "relu6": lambda x: torch.clamp(x, 0.0, 6.0),
    "hardswish": F.hardswish,
    "relu_squared": lambda x: torch.square(F.relu(x)),
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def for_task(task: Task) -> Compute | None:
    """The baseline for a task, or None for a kind without one."""
    builder = _BUILDERS.get(task.kind)
    if builder is None:
        return None
    compute = _channels_last(builder(task)) if task.attr("layout") == "nhwc" else builder(task)
    return _in_fp32(compute) if task.dtype == "float32" and task.kind in _CONTRACTIONS else compute


# kinds whose torch ops reach cuBLAS or cuDNN, where TF32 can round float32 (the switch costs ~4 us
# of host time a call, so the other kinds go without it)
_CONTRACTIONS = frozenset({"gemm", "bmm", "attention", "conv2d"})


def _in_fp32(compute: Compute) -> Compute:
    """A float32 contraction's baseline computes in float32 (no TF32 rounding in cuDNN or cuBLAS)."""
    def run(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        with float32_contractions():
            return compute(inputs)
    return run


def _channels_last(compute: Compute) -> Compute:
    """An NHWC task's baseline: the NCHW op on permuted views (channels-last strides, so cuDNN
    runs its NHWC kernels, as a torch user with channels_last tensors gets) and its result
    permuted back into the buffers' layout."""
    def run(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        return compute([x.permute(0, 3, 1, 2) if x.ndim == 4 else x for x in inputs]).permute(0, 2, 3, 1)
    return run


def _gemm(task: Task) -> Compute:
    activation = _ACTIVATIONS[task.attr("activation", "none")]
    has_bias, join = task.attr("bias", False), residual_join(task)
    trans_b = task.attr("trans_b", False)
    residual_only = join == "add" and not has_bias and task.attr("activation", "none") == "none"

    def compute(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        a, b, *rest = inputs
        weight = b if trans_b else b.t()  # F.linear's (N, K) weight; a (K, N) b as a transposed view
        if residual_only:  # the residual is cuBLAS's C (beta 1): no add kernel after the GEMM
            rows = torch.addmm(rest[-1].reshape(-1, weight.shape[0]), a.reshape(-1, a.shape[-1]), weight.t())
            return rows.reshape(*a.shape[:-1], weight.shape[0])
        # cuBLAS adds the bias in its epilogue (a broadcast add after matmul was 12 more kernels a
        # run in ViT-B/16's table on an H100, where its FFN's second GEMM stayed on this baseline)
        out = activation(F.linear(a, weight, rest[0] if has_bias else None))
        if join == "none":
            return out
        return out * rest[-1] if join == "mul" else out + rest[-1]
    return compute


def _bmm(task: Task) -> Compute:
    scale = float(task.attr("scale", 1.0))

    def compute(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        out = torch.matmul(inputs[0], inputs[1])
        return out * scale if scale != 1.0 else out
    return compute


def _attention(task: Task) -> Compute:
    scale = float(task.attr("scale", 1.0))
    k_transposed, has_mask = task.attr("k_transposed", False), task.attr("mask", False)
    causal, softcap = task.attr("causal", False), float(task.attr("softcap", 0.0))
    perms = task.attr("perms") or ((),) * 4  # folded head split/merge: views, as a torch user writes
    sdpa = (_capped_attention(scale, k_transposed, has_mask, causal, softcap) if softcap
            else _sdpa(scale, k_transposed, has_mask, causal))

    def compute(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        views = [x.permute(*perm) if perm else x for x, perm in zip(inputs[:3], perms)]
        out = sdpa([*views, *inputs[3:]])
        return out.permute(*[int(axis) for axis in np.argsort(perms[3])]) if perms[3] else out
    return compute


def _causal_bias(q: torch.Tensor, seq_kv: int) -> torch.Tensor:
    """0 where key j is visible to query i (j <= i + seq_kv - seq: bottom-right aligned, as
    partition.py recognises it), -inf elsewhere, in q's dtype."""
    seq = q.shape[-2]
    rows = torch.arange(seq, device=q.device)[:, None] + (seq_kv - seq)
    allowed = torch.arange(seq_kv, device=q.device)[None, :] <= rows
    return torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))


def _sdpa(scale: float, k_transposed: bool, has_mask: bool, causal: bool) -> Compute:
    def compute(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        q, k, v = inputs[:3]
        if k_transposed:
            k = k.transpose(-1, -2)
        mask = inputs[3] if has_mask else None
        if mask is not None and mask.dtype != q.dtype:
            # a float32 mask on float16 scores (MPT): SDPA's fused kernels take the query's dtype;
            # float32's lowest held at float16's (as -inf, a row the mask hides entirely is NaN)
            mask = mask.clamp_min(torch.finfo(q.dtype).min).to(q.dtype)
        seq, seq_kv = q.shape[-2], k.shape[-2]
        grouped = k.shape[-3] != q.shape[-3]  # grouped-query attention: fewer key/value heads
        if causal and mask is None and seq == seq_kv:  # SDPA's own causal path (flash kernels)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=grouped)
        if causal:
            bias = _causal_bias(q, seq_kv)
            mask = bias if mask is None else mask + bias
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=grouped)
    return compute


def _capped_attention(scale: float, k_transposed: bool, has_mask: bool, causal: bool, softcap: float) -> Compute:
    """softmax(softcap * tanh(scale * q k^T / softcap) + mask) v, as Gemma 2 writes it (SDPA has
    no soft cap): the scores in float32, the probabilities in q's dtype for the second product."""
    def compute(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        q, k, v = inputs[:3]
        if k_transposed:
            k = k.transpose(-1, -2)
        group = q.shape[-3] // k.shape[-3]  # grouped-query attention: each key/value head serves a group
        k, v = (x.repeat_interleave(group, dim=-3) if group > 1 else x for x in (k, v))
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * (scale / softcap)
        scores = torch.tanh(scores) * softcap
        if has_mask:
            scores = scores + inputs[3].float()
        if causal:
            scores = scores + _causal_bias(scores, k.shape[-2])
        return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)
    return compute


def _softmax(task: Task) -> Compute:
    return lambda inputs: torch.softmax(inputs[0], dim=-1)


def _in_weight_dtype(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """A norm's input in its weight's dtype: float32 weights on a float16 input (GemmaRMSNorm's,
    partition.py) mean the model normalizes in float32, and torch's fused norms want one dtype."""
    return inputs[0].to(inputs[1].dtype)


def _with_residual(task: Task, norm: Compute) -> Compute:
    """A norm's compute with the residual a post-norm block adds after it, in the output's dtype
    as the model adds it (its last input, where the task has one)."""
    if not task.attr("residual", False):
        return norm
    return lambda inputs: inputs[-1] + norm(inputs).to(inputs[-1].dtype)


def _layernorm(task: Task) -> Compute:
    eps = float(task.attr("eps", 1e-5))
    return _with_residual(task, lambda inputs: F.layer_norm(_in_weight_dtype(inputs), inputs[0].shape[-1:], inputs[1],
                                                           inputs[2], eps))


def _rmsnorm(task: Task) -> Compute:
    eps = float(task.attr("eps", 1e-6))
    return _with_residual(task, lambda inputs: F.rms_norm(_in_weight_dtype(inputs), inputs[0].shape[-1:], inputs[1],
                                                         eps))


def _groupnorm(task: Task) -> Compute:
    groups, eps = int(task.attr("groups")), float(task.attr("eps", 1e-5))
    activation = _ACTIVATIONS[task.attr("activation", "none")]
    return lambda inputs: activation(F.group_norm(inputs[0], groups, inputs[1], inputs[2], eps))


def _reduce(task: Task) -> Compute:
    op = task.attr("op")
    ndim = len(task.inputs[0].shape)
    axes = tuple(task.attr("axes") or range(ndim))
    keepdims = bool(task.attr("keepdims", True))
    reducers: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "sum": lambda x: torch.sum(x, dim=axes, keepdim=keepdims),
        "mean": lambda x: torch.mean(x, dim=axes, keepdim=keepdims),
        "max": lambda x: torch.amax(x, dim=axes, keepdim=keepdims),
        "min": lambda x: torch.amin(x, dim=axes, keepdim=keepdims),
    }
    return lambda inputs: reducers[op](inputs[0])


def _conv2d(task: Task) -> Compute:
    activation = _ACTIVATIONS[task.attr("activation", "none")]
    top, left, bottom, right = task.attr("pads", (0, 0, 0, 0))
    has_bias, has_residual = task.attr("bias", False), task.attr("residual", False)
    input_scale = task.attr("input_scale", False)
    symmetric = top == bottom and left == right

    strides, dilations, group = task.attr("strides", (1, 1)), task.attr("dilations", (1, 1)), task.attr("group", 1)
    cudnn_epilogue = task.attr("activation", "none") == "relu" and symmetric

    def compute(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        x, w, *rest = inputs
        if input_scale:  # squeeze-excite's gate, the task's last input
            x, rest = x * rest[-1], rest[:-1]
        bias = rest[0] if has_bias else None
        if cudnn_epilogue and x.is_cuda:
            # cuDNN's own fused epilogue: bias, residual and ReLU in the conv kernel, where torch's
            # eager path adds three kernels (1.2-2.6x the time on ResNet-50's convs at b32,
            # conv_baseline_probe.py)
            if has_residual:
                return torch.cudnn_convolution_add_relu(x, w, rest[-1], 1.0, bias, strides, (top, left), dilations,
                                                        group)
            return torch.cudnn_convolution_relu(x, w, bias, strides, (top, left), dilations, group)
        if not symmetric:
            x = F.pad(x, (left, right, top, bottom))
        out = F.conv2d(x, w, bias, stride=strides, padding=(top, left) if symmetric else 0, dilation=dilations,
                       groups=group)
        return activation(out + rest[-1] if has_residual else out)
    return compute


def _pool(task: Task) -> Compute:
    op = task.attr("op")
    if op == "global_avg":
        return lambda inputs: torch.mean(inputs[0], dim=(2, 3), keepdim=True)
    kernel, strides = tuple(task.attr("kernel")), tuple(task.attr("strides"))
    top, left, bottom, right = task.attr("pads", (0, 0, 0, 0))
    padding = (left, right, top, bottom)
    if op == "max":
        return lambda inputs: F.max_pool2d(F.pad(inputs[0], padding, value=-math.inf), kernel, strides)
    include_pad = bool(task.attr("count_include_pad", False))

    def average(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        x = inputs[0]
        total = F.avg_pool2d(F.pad(x, padding), kernel, strides) * math.prod(kernel)
        if include_pad:
            return total / math.prod(kernel)
        ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
        return total / (F.avg_pool2d(F.pad(ones, padding), kernel, strides) * math.prod(kernel))
    return average


_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sqrt": torch.sqrt, "exp": torch.exp, "log": torch.log, "erf": torch.erf, "neg": torch.neg,
    "abs": torch.abs, "reciprocal": torch.reciprocal,
    **{name: _ACTIVATIONS[name] for name in ("tanh", "sigmoid", "relu", "gelu", "gelu_tanh")},
}
_BINARY: dict[str, Callable[[Any, Any], torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "max": torch.maximum, "min": torch.minimum,
}


def _elementwise(task: Task) -> Compute:
    """partition.py's expression steps, one torch op each (what eager PyTorch would launch)."""
    expr = task.attr("expr")
    literal_dtype = torch_dtype(task.dtype)  # the task's float type: in0 may be a Where's boolean
    # made on the first call: a host-to-device copy cannot happen inside a CUDA graph capture
    literals: dict[str, torch.Tensor] = {}

    def compute(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        values: dict[str, Any] = {f"in{i}": x for i, x in enumerate(inputs)}

        def operand(ref: Any) -> Any:
            if isinstance(ref, str):
                return values[ref]
            key = repr(ref)  # 0.0 and -0.0 are equal keys otherwise
            if key not in literals:
                literals[key] = torch.tensor(ref, dtype=literal_dtype, device=inputs[0].device)
            return literals[key]

        result: Any = None
        for index, (op, *args) in enumerate(expr):
            if op in _UNARY:
                result = _UNARY[op](operand(args[0]))
            elif op in _BINARY:
                result = _BINARY[op](operand(args[0]), operand(args[1]))
            elif op == "cast":
                result = operand(args[0]).to(torch_dtype(args[1]))
            elif op == "where":
                result = torch.where(operand(args[0]), operand(args[1]), operand(args[2]))
            else:
                raise ValueError(f"unknown expression step {op!r}")
            values[f"t{index}"] = result
        return result
    return compute


def _rotary(task: Task) -> Compute:
    """transformers' apply_rotary_pos_emb in torch ops, on the (B, H, S, D) view of x (a partial
    rotary on its first rotary_dims columns, the rest concatenated back as transformers does;
    interleaved: GPT-J's rotate_every_two)."""
    perm = task.attr("perm")
    rotated = task.attr("rotary_dims")
    interleaved = task.attr("interleaved", False)

    def compute(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        heads, cos, sin = inputs
        heads = heads.permute(*perm) if perm else heads
        x = heads[..., :rotated] if rotated else heads
        if interleaved:
            pairs = x.unflatten(-1, (-1, 2))
            turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        else:
            first, second = x.chunk(2, dim=-1)
            turned = torch.cat((-second, first), dim=-1)
        out = x * cos + turned * sin
        return torch.cat((out, heads[..., rotated:]), dim=-1) if rotated else out
    return compute


_BUILDERS: dict[str, Callable[[Task], Compute]] = {
    "elementwise": _elementwise, "gemm": _gemm, "bmm": _bmm, "attention": _attention, "softmax": _softmax,
    "layernorm": _layernorm, "rmsnorm": _rmsnorm, "groupnorm": _groupnorm, "reduce": _reduce, "conv2d": _conv2d,
    "pool": _pool, "rotary": _rotary,
}
