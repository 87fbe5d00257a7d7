"""Graph rewrites that make a model's tasks cheaper to run, the same arithmetic.

split_projections: a projection (MatMul or Gemm by a constant weight, a constant bias, a Reshape
that keeps the last axis) whose output is Split along its last axis becomes one projection per
part. GPT-2 computes q, k and v as one 768 x 2304 GEMM and splits the result: on a device every
split part is a strided view that the glue copies to a dense buffer before attention reads it (36
copies a run, 293 us of GPT-2 small's 2.1 ms on an H100). One GEMM per part writes each part dense
where attention reads it: three 768-wide GEMMs (12.2 us each, one wave of 192 x 128 tiles at
M = 4096) against one 2304-wide GEMM and three copies (29.8 + 3 x 8.1 us); the model's device time
fell from 2123 to 1916 us a run (results/h100-gpu-models-gpt2-2026-12-07-split-projections.json).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from .ir import Graph, Node, TensorSpec
from .layout import used_names

MIN_PART = 128  # narrower parts make GEMMs whose tiles idle more than the copies they save


@dataclass
class _Projection:
    """The chain a Split reads: rows view -> MatMul | Gemm -> [Add bias] -> [Reshape] -> Split."""

    merge: Node | None  # a Reshape feeding the product its rows (GPT-2's Conv1D), read by nothing else
    product: Node
    bias_add: Node | None
    view: Node | None
    split: Node


def _sole_consumer(graph: Graph, consumers: dict[str, list[Node]], value: str) -> Node | None:
    users = consumers.get(value, [])
    return users[0] if len(users) == 1 and value not in graph.outputs else None


def _projection(graph: Graph, consumers: dict[str, list[Node]], producer: dict[str, Node],
                split: Node) -> _Projection | None:
    """The projection chain a last-axis Split reads, or None."""
    x = split.inputs[0]
    shape = graph.values[x].shape
    if split.domain not in ("", "ai.onnx") or int(split.attrs.get("axis", 0)) % len(shape) != len(shape) - 1 \
            or not all(split.outputs) or any(graph.values[out].shape[-1] < MIN_PART for out in split.outputs):
        return None
    node, view, bias_add = producer.get(x), None, None
    if node is not None and node.op_type == "Reshape" and _sole_consumer(graph, consumers, node.outputs[0]) \
            and graph.values[node.inputs[0]].shape[-1] == shape[-1]:
        view, node = node, producer.get(node.inputs[0])
    if node is not None and node.op_type == "Add" and _sole_consumer(graph, consumers, node.outputs[0]):
        bias = [name for name in node.inputs if name in graph.constants and graph.values[name].shape == (shape[-1],)]
        if len(bias) == 1:
            bias_add, node = node, producer.get(next(name for name in node.inputs if name != bias[0]))
    if node is None or not _sole_consumer(graph, consumers, node.outputs[0]) or not _is_projection(graph, node):
        return None
    merge = producer.get(node.inputs[0])
    if merge is None or merge.op_type != "Reshape" or _sole_consumer(graph, consumers, merge.outputs[0]) is None:
        merge = None
    return _Projection(merge, node, bias_add, view, split)


def _is_projection(graph: Graph, node: Node) -> bool:
    """MatMul or Gemm (alpha = beta = 1, a not transposed) by a constant 2-D weight, a Gemm's bias
    a constant too."""
    if node.op_type not in ("MatMul", "Gemm") or node.domain not in ("", "ai.onnx") \
            or node.inputs[1] not in graph.constants or len(graph.values[node.inputs[1]].shape) != 2:
        return False
    if node.op_type == "MatMul":
        return True
    attrs = node.attrs
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    return attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and not attrs.get("transA", 0) \
        and (not bias or (bias in graph.constants and len(graph.values[bias].shape) == 1))


def split_projections(graph: Graph) -> Graph:
    """Every projection whose output a last-axis Split divides (see the module docstring) as one
    projection per part, each writing its part under the Split output's name; the weight and bias
    are sliced once here, and a rows view (Reshape) before the projection is repeated for each part,
    so each part is a GEMM task on its own (partition's row views). The graph itself where there is
    none."""
    consumers, producer = graph.consumers(), graph.producer()
    chains = {id(split): chain for split in graph.nodes if split.op_type == "Split"
              if (chain := _projection(graph, consumers, producer, split)) is not None}
    if not chains:
        return graph
    replaced = {id(node) for chain in chains.values()
                for node in (chain.merge, chain.product, chain.bias_add, chain.view) if node is not None}
    values, constants = dict(graph.values), dict(graph.constants)
    nodes: list[Node] = []

    def declare(name: str, spec: TensorSpec, value: np.ndarray | None = None) -> str:
        values[name] = spec
        if value is not None:
            constants[name] = value
        return name

    for node in graph.nodes:
        if id(node) in replaced:
            continue
        chain = chains.get(id(node))
        if chain is None:
            nodes.append(node)
            continue
        nodes += _parts(graph, chain, declare)
    used = used_names(nodes, graph.inputs, graph.outputs)
    return replace(graph, nodes=nodes, values={k: v for k, v in values.items() if k in used},
                   constants={k: v for k, v in constants.items() if k in used})


def _parts(graph: Graph, chain: _Projection, declare: Callable[..., str]) -> list[Node]:
    """The nodes computing each part of the Split of `chain`, under the Split outputs' names."""
    product, split = chain.product, chain.split
    columns_first = product.op_type == "Gemm" and bool(product.attrs.get("transB", 0))  # b is (N, K)
    gemm_bias = product.inputs[2] if len(product.inputs) > 2 and product.inputs[2] else None
    add_bias = next((name for name in chain.bias_add.inputs if name in graph.constants), None) \
        if chain.bias_add is not None else None
    nodes: list[Node] = []
    lo = 0
    for index, out in enumerate(split.outputs):
        hi = lo + graph.values[out].shape[-1]
        tag = f"::part{index}"

        def sliced(name: str, axis: int) -> str:
            """The constant's columns [lo, hi) along `axis`, under a name of this projection's part
            (a weight two projections share, split differently, gets one constant for each)."""
            part = np.take(graph.constants[name], np.arange(lo, hi), axis=axis)
            return declare(f"{name}::{product.name}{tag}", TensorSpec(part.shape, graph.values[name].dtype), part)

        def made(node: Node, inputs: list[str], last: bool) -> str:
            """The node for this part; its output the Split's when it is the last of the chain."""
            spec = graph.values[node.outputs[0]]
            output = out if last else declare(node.outputs[0] + tag,
                                              TensorSpec((*spec.shape[:-1], hi - lo), spec.dtype))
            nodes.append(replace(node, name=node.name + tag, inputs=inputs, outputs=[output]))
            return output

        rows = product.inputs[0]
        if chain.merge is not None:  # each part's GEMM reads its own rows view
            rows = declare(rows + tag, graph.values[rows])
            nodes.append(replace(chain.merge, name=chain.merge.name + tag, outputs=[rows]))
        inputs = [rows, sliced(product.inputs[1], 0 if columns_first else 1)]
        if gemm_bias is not None:
            inputs.append(sliced(gemm_bias, 0))
        value = made(product, inputs, chain.bias_add is None and chain.view is None)
        if chain.bias_add is not None:
            value = made(chain.bias_add, [sliced(name, 0) if name == add_bias else value
                                          for name in chain.bias_add.inputs], chain.view is None)
        if chain.view is not None:
            shape = np.array(graph.values[out].shape, np.int64)
            target = declare(f"{chain.view.inputs[1]}::{chain.view.name}{tag}", TensorSpec(shape.shape, "int64"), shape)
            nodes.append(replace(chain.view, name=chain.view.name + tag, inputs=[value, target], outputs=[out]))
        lo = hi
    return nodes
