"""Graph IR: what the rest of portkern sees of a model.

Every value has a concrete shape and dtype (shape inference ran, dynamic dims bound), every
constant is a numpy array (constant folding ran). Nodes keep the ONNX op type and attributes so the
reference executor and the task partitioner read the same thing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, TypeVar

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one tensor; dtype is a numpy dtype name ('float32', 'float16', 'int64')."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"{'x'.join(map(str, self.shape)) or 'scalar'}:{self.dtype}"


@dataclass
class Node:
    name: str
    op_type: str
    inputs: list[str]  # '' marks an omitted optional input, as in ONNX
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""


@dataclass
class Graph:
    """A model bound to concrete shapes: nodes in topological order."""

    name: str
    nodes: list[Node]
    inputs: list[str]  # runtime inputs (initializers excluded)
    outputs: list[str]
    values: dict[str, TensorSpec]  # every value's spec, constants included
    constants: dict[str, np.ndarray]
    opset: int
    model_hash: str  # sha256 of the model file's bytes
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the bound input shapes

    def producer(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    users.setdefault(name, []).append(node)
        return users

    def input_specs(self) -> dict[str, TensorSpec]:
        return {name: self.values[name] for name in self.inputs}


Key = TypeVar("Key", bound=Hashable)


def connected_groups(keys: Iterable[Key], links: Iterable[tuple[Key, Key]]) -> dict[Key, Key]:
    """Each key's group, named by one of its members: union-find over the links (pairs of keys)."""
    root = {key: key for key in keys}

    def find(key: Key) -> Key:
        while root[key] != key:
            root[key] = root[root[key]]
            key = root[key]
        return key

    for a, b in links:
        root[find(a)] = find(b)
    return {key: find(key) for key in root}
