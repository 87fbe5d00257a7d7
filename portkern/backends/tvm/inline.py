"""TVM kernels inside onnxruntime's graph: one session for the whole model, no cut at a kernel.

A pack's kernel used to run as a step of its own between onnxruntime sessions, and each cut cost
the model ~100-200 us on a 2-core host (a session's run, its pool's wake-up; split_cost_probe.py)
against 10-150 us that a kernel saves. Here each kernel task's nodes are replaced by one node of
the custom op `ai.portkern::TvmKernel` (kernel_op.c, compiled here with the host's C compiler
once per source and cached), which calls the kernel's shared library on onnxruntime's own buffers.
The kernel's parallel loops run on the session's intra-op pool (KernelContext_ParallelFor through
the library's `__TVMBackendParallelLaunch` slot), so no second pool competes for the cores.

The node's attributes say everything the op needs: the library's path (kernels are cached by the
hash of their bytes), each argument's shape as the kernel takes it (a GEMM's (B, S, K) input is
its (B*S, K) matrix: same memory, another shape), each output's shape in the graph, and the
thread count for a loop launched with "as many as you have". A kernel the op cannot host (an output that is not float32, a library
needing a TVM runtime service the op does not provide) keeps the whole model on the old path.
"""
from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...errors import PortkernError
from ...ir import Graph, Node
from ...onnx_import import node_names, read_model
from ...ort_subgraph import node_proto, subgraph_model
from ...tasks import Task
from ..base import Artifact

log = logging.getLogger("portkern.tvm")

DOMAIN = "ai.portkern"
OP_TYPE = "TvmKernel"
SOURCE = Path(__file__).with_name("kernel_op.c")
# what the op gives a kernel library: other runtime services (a parallel barrier, packed-function
# calls) are refused when the model is built, not discovered in a run
PROVIDED = (b"__TVMBackendParallelLaunch", b"__TVMBackendAllocWorkspace", b"__TVMBackendFreeWorkspace")
REFUSED = (b"__TVMBackendParallelBarrier", b"__TVMFFIFunctionCall", b"__TVMFFIEnvModLookupFromImports",
           b"__tvm_ffi__library_ctx")


class InlineUnavailable(PortkernError):
    """The kernels cannot run inside onnxruntime here (no C compiler, a kernel the op cannot host)."""


def cache_dir() -> Path:
    root = os.environ.get("PORTKERN_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "portkern"


def _include_dirs() -> list[str]:
    """TVM's and tvm-ffi's installed headers (c_backend_api.h, c_api.h, dlpack.h)."""
    import tvm
    import tvm_ffi

    dirs = [Path(tvm.__file__).parent / "include", Path(tvm_ffi.__file__).parent / "include"]
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise InlineUnavailable(f"TVM's C headers are not installed ({', '.join(missing)})")
    return [str(d) for d in dirs]


@lru_cache(maxsize=None)
def op_library() -> Path:
    """The custom-op library, built once per source text and compiler flags, then cached."""
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    flags = ["-O2", "-shared", "-fPIC", "-std=c11", "-Wall", *(f"-I{d}" for d in _include_dirs())]
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
    target = cache_dir() / "ort_ops" / f"portkern_tvm_op-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    command = [*compiler.split(), *flags, "-o", str(partial), str(SOURCE), "-ldl", "-lpthread"]
    try:
        built = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InlineUnavailable(f"no C compiler for the onnxruntime op ({command[0]}: {exc})") from None
    if built.returncode != 0:
        raise InlineUnavailable(f"the onnxruntime op did not compile: {built.stderr.strip()[-400:]}")
    partial.replace(target)  # atomic: a concurrent build finds a whole file or none
    return target


def kernel_library(artifact: Artifact) -> Path:
    """The kernel's shared library in the cache (by the hash of its bytes), checked for the
    runtime services it needs."""
    binary = artifact.binary or b""
    if not binary:
        raise InlineUnavailable(f"{artifact.variant}: the artifact carries no shared library")
    refused = [name.decode() for name in REFUSED if name in binary]
    if refused:
        raise InlineUnavailable(f"{artifact.variant}: the kernel needs {', '.join(refused)}, which the op does not provide")
    path = cache_dir() / "kernels" / f"{hashlib.sha256(binary).hexdigest()[:24]}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(binary)
        partial.replace(path)
    return path


def kernel_node(task: Task, artifact: Artifact, threads: int) -> Node:
    """The node that runs one kernel task in onnxruntime's graph, named after the task's last node."""
    not_float = [f"{name} ({spec.dtype})" for name, spec in zip(task.output_names, task.outputs) if spec.dtype != "float32"]
    if not_float:
        raise InlineUnavailable(f"{task.label}: the op writes float32 outputs only, not {', '.join(not_float)}")
    shapes = [tuple(int(d) for d in shape) for shape in artifact.meta["arg_shapes"]]
    specs = [*task.inputs, *task.outputs]
    if len(shapes) != len(specs) or any(int(np.prod(s)) != spec.numel for s, spec in zip(shapes, specs)):
        raise InlineUnavailable(f"{task.label}: the kernel's argument shapes {shapes} do not view its buffers")
    outputs = [spec.shape for spec in task.outputs]
    attrs = {"library": str(kernel_library(artifact)), "threads": threads,
             "arg_ranks": [len(s) for s in shapes], "arg_dims": [d for s in shapes for d in s] or [1],
             "out_ranks": [len(s) for s in outputs], "out_dims": [d for s in outputs for d in s] or [1]}
    return Node(f"{task.nodes[-1].name}::tvm", OP_TYPE, list(task.input_names), list(task.output_names), attrs, DOMAIN)


def _kernel_nodes(graph: Graph, kernels: Sequence[tuple[Task, Artifact]], threads: int
                  ) -> tuple[dict[str, Node], set[str], dict[str, np.ndarray]]:
    """Each kernel's node by the name of its task's last node, the names of every node the
    kernels replace, and the folded weights they read (constants of no node of the model)."""
    replacing: dict[str, Node] = {}
    replaced: set[str] = set()
    weights: dict[str, np.ndarray] = {}
    for task, artifact in kernels:
        replacing[task.nodes[-1].name] = kernel_node(task, artifact, threads)
        replaced.update(node.name for node in task.nodes)
        weights.update((name, value) for name, value in task.constants.items() if name not in graph.constants)
    return replacing, replaced, weights


def inline_model(graph: Graph, kernels: Sequence[tuple[Task, Artifact]], threads: int,
                 source: str | Path | bytes | None = None) -> onnx.ModelProto:
    """The model with each kernel task's nodes replaced by its kernel node, placed where the
    task's last node was (its outputs exist from there on, as before).

    From the model file where there is one: everything but the kernels stays as the exporter
    wrote it, so onnxruntime optimizes it as it does the file alone. Rebuilt from the graph (all
    shapes static) onnxruntime fuses differently: the demo BERT ran 15% slower rebuilt (MatMul and
    Add became Gemm between Reshapes, BiasGelu a Gelu). The rebuilt graph serves where the file
    cannot be edited so: a node the kernels replace computes a value that a node of the file the
    import folded away (a Shape, say) still reads."""
    replacing, replaced, weights = _kernel_nodes(graph, kernels, threads)
    if source is not None:
        edited = _edited_file(source, graph, replacing, replaced, weights)
        if isinstance(edited, onnx.ModelProto):
            return edited
        log.info("kernels go into a rebuilt graph, not the model file: %s", edited)
    nodes = [replacing.get(node.name, node) for node in graph.nodes
             if node.name in replacing or node.name not in replaced]
    values = graph.values
    return subgraph_model(nodes, {name: values[name] for name in graph.inputs},
                          {name: values[name] for name in graph.outputs if name not in graph.constants},
                          {**graph.constants, **weights}, graph.opset, f"{graph.name}_with_kernels")


def _shape_constant(node: onnx.NodeProto, graph: Graph) -> onnx.NodeProto | None:
    """A Shape or Size node as the constant it is at the graph's static shapes; None for any
    other node. (The import folded these away; in the file they still read the value.)"""
    spec = graph.values.get(node.input[0]) if node.input else None
    if node.op_type not in ("Shape", "Size") or spec is None:
        return None
    if node.op_type == "Size":
        value = np.array(spec.numel, dtype=np.int64)
    else:
        attrs = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
        value = np.array(spec.shape, dtype=np.int64)[attrs.get("start", 0):attrs.get("end", len(spec.shape))]
    return helper.make_node("Constant", [], [node.output[0]], name=node.name,
                            value=numpy_helper.from_array(value, node.output[0]))


def _drop_unread_initializers(graph: onnx.GraphProto) -> None:
    """Weights only the replaced nodes read (a conv's own, before BN folding) go, and so do their
    entries among the graph inputs where an old model (IR < 4) lists initializers there too:
    onnxruntime refuses such a model with an initializer nothing reads."""
    read = {name for node in graph.node for name in node.input} | {value.name for value in graph.output}
    unread = {tensor.name for tensor in graph.initializer} - read
    if not unread:
        return
    kept_initializers = [tensor for tensor in graph.initializer if tensor.name not in unread]
    kept_inputs = [value for value in graph.input if value.name not in unread]
    del graph.initializer[:], graph.input[:]
    graph.initializer.extend(kept_initializers)
    graph.input.extend(kept_inputs)


def _edited_file(source: str | Path | bytes, graph: Graph, replacing: dict[str, Node], replaced: set[str],
                 weights: dict[str, np.ndarray]) -> onnx.ModelProto | str:
    """The file with the kernels in place of their tasks' nodes; or why it cannot be edited so."""
    proto, _ = read_model(source)
    names = node_names(proto)
    missing = replaced - set(names)
    if missing:
        return f"nodes {sorted(missing)[:3]} are not the file's"
    computed_inside = {value for name, node in zip(names, proto.graph.node) if name in replaced
                       for value in node.output if value} - {value for node in replacing.values() for value in node.outputs}
    kept = []
    for name, node in zip(names, proto.graph.node):
        if name in replacing:
            kept.append(node_proto(replacing[name]))
        elif name not in replaced:
            if computed_inside.intersection(node.input):
                node = _shape_constant(node, graph)
                if node is None:
                    return f"{name} reads a value computed inside a kernel's task"
            kept.append(node)
    del proto.graph.node[:]
    proto.graph.node.extend(kept)
    _drop_unread_initializers(proto.graph)
    proto.graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in weights.items())
    if not any(opset.domain == DOMAIN for opset in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return proto


def named_model(graph: Graph, source: str | Path | bytes | None) -> onnx.ModelProto:
    """The model as onnxruntime should run it for a profile: the file with every node under its
    IR name (a profiler reports nodes by name; an exporter may leave them unnamed), or the graph
    rebuilt where there is no file."""
    if source is None:
        return inline_model(graph, [], 1)
    proto, _ = read_model(source)
    for name, node in zip(node_names(proto), proto.graph.node):
        node.name = name
    return proto

