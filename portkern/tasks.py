"""Kernel tasks: one kernel's worth of a model.

A task is a small ONNX subgraph (its nodes) plus the kind of kernel that implements it and the
attributes a kernel needs. Its reference is the subgraph itself, run by the numpy executor in
float64, so a kernel is always checked against the model's own semantics.

Kinds and their kernel signatures (inputs in this order; graph layouts, kernels use strides):
  gemm       a (...,K), b (K,N) or (N,K) if trans_b, [bias (N,)], [residual (...,N)] -> (...,N)
             out = act(a @ b + bias) + residual, or * residual where residual_op is "mul" (a gate:
             SwiGLU's silu(x @ W_gate) * (x @ W_up), the up projection a task of its own)
             attrs: activation (partition.EPILOGUE_ACTIVATIONS or none), trans_b, bias, residual,
             [residual_op "mul"; absent: "add"]
  bmm        a (B...,M,K), b (B...,K,N) -> (B...,M,N)          attrs: scale (float, 1.0 = none)
  attention  q (B,H,S,D), k (B,H,D,Sk) if k_transposed else (B,H,Sk,D), v (B,H,Sk,Dv),
             [mask broadcastable to (B,H,S,Sk), additive] -> (B,H,S,Dv); Dv is D but for a few
             models (LeViT, DeepSeek's MLA), which a backend's kernels may refuse
             attrs: scale, k_transposed, mask, causal, [perms]: where the head-split and merge
             Transposes are folded in (partition.py), q, k, v and the output are the buffers
             around them, and operand i in the shapes above is buffer_i.permute(perms[i])
             (() for none; order q, k, v, out), e.g. q (B,S,H,D) with perm (0,2,1,3).
             Grouped-query attention (a backend with shares_kv_heads): k and v have KVH heads,
             H a multiple of KVH, and query head h reads key/value head h // (H / KVH).
             [softcap]: the scores are softcap * tanh(scale q k^T / softcap) before the mask
  softmax    x (...,N) -> (...,N), over the last axis
  rotary     x (B,H,S,D), cos, sin (broadcastable to (B,H,S,R)) -> (B,H,S,D)
             out = x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., R/2:], x[..., :R/2])
             on the first R columns, the rest of x passed through (the rotary embedding of
             LLaMA-style attention; R < D is GPT-NeoX's and Phi's partial rotary); attrs:
             [rotary_dims R, absent: D], [perm]: x is buffer.permute(perm), the head split folded
             in as for attention, [interleaved]: columns rotate in pairs (GPT-J, RoFormer), the
             rotation being (-x[..., 1], x[..., 0]) of each pair (2i, 2i + 1)
  layernorm  x (...,N), gamma (N,), beta (N,), [residual (...,N)] -> (...,N)     attrs: eps, [residual]
  rmsnorm    x (...,N), gamma (N,), [residual (...,N)] -> (...,N)               attrs: eps, [residual]
             out = norm(x) * gamma [+ beta] [+ residual]: a residual added after the norm (a
             post-norm block, x + norm(f(x))) is read with the output's indices
  groupnorm  x (N,C,...), gamma (C,), beta (C,) -> x's shape     attrs: groups, eps, activation, [layout]
             out = act(norm(x) * gamma + beta), the statistics over each sample's group of C/groups
             channels (and every position), the affine per channel; [layout "nhwc": x (N,H,W,C)]
  elementwise  in0..inK (broadcastable) -> out                 attrs: expr (see partition.py)
  reduce     x -> y                                            attrs: op (sum|mean|max|min), axes, keepdims
  conv2d     x (N,C,H,W), w (OC,C/g,KH,KW), [bias (OC,)], [residual], [gate (N,C,1,1)] -> (N,OC,OH,OW)
             out = act(conv(x [* gate], w) + bias + residual)   (ResNet's order; BN folded into w and bias;
             the gate: squeeze-excite's, attrs["input_scale"], for a backend with scales_conv_inputs)
             attrs: strides, pads (t,l,b,r), dilations, group, activation (as gemm's), bias, residual,
             [layout "nhwc": x (N,H,W,C), w (OC,KH,KW,C/g), gate (N,1,1,C), residual and out (N,OH,OW,OC); the
             channels-last graph of layout.py, for a backend whose conv_layout is NHWC]
  pool       x (N,C,H,W) -> (N,C,OH,OW)   attrs: op (max|avg|global_avg), kernel, strides, pads,
             [layout "nhwc": x (N,H,W,C) -> (N,OH,OW,C)]
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import onnx

from .ir import Node, TensorSpec

KINDS = ("gemm", "bmm", "attention", "softmax", "layernorm", "rmsnorm", "groupnorm", "elementwise",
         "reduce", "conv2d", "pool", "rotary")

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
# the activations an elementwise expression names as one step (the rest are steps of their own)
EXPRESSION_ACTIVATIONS = ("tanh", "sigmoid", "relu", "gelu", "gelu_tanh")


def residual_join(task: Task) -> str:
    """How a gemm task's last operand joins its epilogue: "none", "add" (a residual) or "mul" (a gate)."""
    return task.attr("residual_op", "add") if task.attr("residual", False) else "none"


def upcast_float(value: np.ndarray) -> np.ndarray:
    """Floating values in float64, the rest as they are: how a reference sees its operands."""
    value = np.asarray(value)
    return value.astype(np.float64) if value.dtype.name in FLOAT_DTYPES else value


def _is_float_type(onnx_type: Any) -> bool:
    """An ONNX element type the reference computes in float64: one of upcast_float's."""
    return onnx_type is not None and onnx.helper.tensor_dtype_to_np_dtype(int(onnx_type)).name in FLOAT_DTYPES


def freeze_attrs(attrs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Attributes as a sorted tuple of JSON-able, hashable values."""
    def freeze(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return tuple(freeze(v) for v in value)
        if isinstance(value, np.generic):
            return value.item()
        return value
    return tuple(sorted((k, freeze(v)) for k, v in attrs.items()))


@dataclass(frozen=True)
class Task:
    """A kernel task. Equality and the workload key cover only what a kernel sees."""

    kind: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attrs: tuple[tuple[str, Any], ...]
    flops: int
    min_bytes: int
    # where it came from: the subgraph and the graph values it reads and writes
    nodes: tuple[Node, ...] = field(default=(), compare=False, repr=False)
    input_names: tuple[str, ...] = field(default=(), compare=False, repr=False)
    output_names: tuple[str, ...] = field(default=(), compare=False, repr=False)
    constants: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    opset: int = field(default=17, compare=False, repr=False)

    def attr(self, name: str, default: Any = None) -> Any:
        return dict(self.attrs).get(name, default)

    @property
    def dtype(self) -> str:
        """The compute dtype: the first floating input's (else output's) dtype."""
        for spec in (*self.inputs, *self.outputs):
            if spec.dtype in FLOAT_DTYPES:
                return spec.dtype
        return self.inputs[0].dtype

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "inputs": [[list(s.shape), s.dtype] for s in self.inputs],
            "outputs": [[list(s.shape), s.dtype] for s in self.outputs],
            "attrs": {k: v for k, v in self.attrs},
        }

    @property
    def key(self) -> str:
        """Stable workload key: the same kernel problem in any model gets the same key."""
        blob = json.dumps(self.describe(), sort_keys=True, default=str)
        return f"{self.kind}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"

    @property
    def label(self) -> str:
        shapes = ",".join("x".join(map(str, s.shape)) for s in self.inputs)
        return f"{self.kind}[{shapes}]:{self.dtype}"

    @property
    def reference_nodes(self) -> tuple[Node, ...]:
        """The nodes as a float64 reference runs them: a Cast to any floating type casts to
        float64, since the reference computes every float value in float64 (transformers' cast of
        the softmax probabilities to the query's dtype, inside an attention task, would otherwise
        round them back to float32, and device glue would refuse to mix the two)."""
        return tuple(Node(node.name, node.op_type, node.inputs, node.outputs,
                          {**node.attrs, "to": onnx.TensorProto.DOUBLE}, node.domain)
                     if node.op_type == "Cast" and _is_float_type(node.attrs.get("to")) else node
                     for node in self.nodes)

    def reference(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The subgraph run by the numpy executor in float64 (float inputs upcast)."""
        from .executor import run_nodes

        env = {name: upcast_float(value) for name, value in self.constants.items()}
        for name, value in zip(self.input_names, inputs, strict=True):
            env[name] = upcast_float(value)
        run_nodes(self.reference_nodes, env, self.opset)
        return [np.asarray(env[name]) for name in self.output_names]
