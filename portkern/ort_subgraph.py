"""A task's own subgraph as an ONNX model, run by onnxruntime: the CPU baseline a kernel must beat.

`task_model(task)` rebuilds the task's nodes as a standalone model (constants as initializers, the
task's inputs and outputs, its opset). `OrtProgram(task, threads)` runs it on the caller's buffers
through IO binding: inputs are read and outputs written in place, by pointer, so its time is
onnxruntime's run time (its own per-call overhead included, ~6 us) without conversions. Any buffer
that exposes DLPack (numpy arrays, TVM tensors) is bound without a copy, which is how the TVM
backend times it on its own buffers.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import PortkernError
from .ir import Node, TensorSpec
from .tasks import Task


class OrtSubgraphError(PortkernError):
    """A task's subgraph cannot be expressed as a model onnxruntime accepts."""


def _attribute(name: str, value: Any) -> onnx.AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value, name))
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and not value:
        raise OrtSubgraphError(f"attribute '{name}' is an empty list: its ONNX type is unknown")
    return helper.make_attribute(name, value)


def node_proto(node: Node) -> onnx.NodeProto:
    proto = helper.make_node(node.op_type, list(node.inputs), list(node.outputs), name=node.name,
                             domain=node.domain or None)
    proto.attribute.extend(_attribute(key, value) for key, value in node.attrs.items())
    return proto


def _value_info(name: str, spec: TensorSpec) -> onnx.ValueInfoProto:
    try:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
    except (TypeError, KeyError):
        raise OrtSubgraphError(f"dtype {spec.dtype} of '{name}' has no ONNX tensor type here") from None
    return helper.make_tensor_value_info(name, elem, list(spec.shape))


def subgraph_model(nodes: Sequence[Node], inputs: Mapping[str, TensorSpec], outputs: Mapping[str, TensorSpec],
                   constants: Mapping[str, np.ndarray], opset: int, name: str) -> onnx.ModelProto:
    """Nodes of a graph as a standalone model: constants they read become initializers."""
    if not nodes:
        raise OrtSubgraphError(f"{name}: no nodes to rebuild a model from")
    read = {value for node in nodes for value in node.inputs if value}
    initializers = [numpy_helper.from_array(np.asarray(value), key)
                    for key, value in constants.items() if key in read and key not in inputs]
    protos = [node_proto(node) for node in nodes]
    seen: Counter[str] = Counter()
    for proto in protos:  # a reference of several steps under one node's name (partition.py): unique here
        seen[proto.name] += 1
        if seen[proto.name] > 1:
            proto.name = f"{proto.name}#{seen[proto.name] - 1}"
    graph = helper.make_graph(
        protos, name,
        [_value_info(key, spec) for key, spec in inputs.items()],
        [_value_info(key, spec) for key, spec in outputs.items()],
        initializer=initializers,
    )
    domains = {node.domain for node in nodes if node.domain and node.domain != "ai.onnx"}
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in sorted(domains)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="portkern")
    model.ir_version = min(model.ir_version, 10)  # what onnxruntime 1.18+ reads
    return model


def task_model(task: Task) -> onnx.ModelProto:
    """The task's subgraph as a model: its nodes, its constants, its inputs and outputs."""
    if not task.nodes:
        raise OrtSubgraphError(f"task {task.label} carries no nodes to rebuild a model from")
    return subgraph_model(task.nodes, dict(zip(task.input_names, task.inputs, strict=True)),
                          dict(zip(task.output_names, task.outputs, strict=True)), task.constants,
                          task.opset, f"portkern_{task.key}")


def session_options(threads: int, stop_spinning: bool = True, custom_ops: Path | None = None) -> Any:
    """onnxruntime options for portkern's sessions. Pool threads spin between the ops of one run
    (waking a sleeping thread per op costs more than small ops take) and, with stop_spinning, stop
    when the run ends, so the kernels that run between portkern's sessions get the cores.
    custom_ops: a custom-op library the session's graph uses (backends/tvm/kernel_op.c)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if custom_ops is not None:
        options.register_custom_ops_library(str(custom_ops))
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.force_spinning_stop", "1" if stop_spinning else "0")
    return options


class OrtGraphPiece:
    """A run of graph nodes in one onnxruntime session, on host arrays: the runtime's baseline for
    the stretches of a model that the pack does not cover (glue ops and untuned tasks together)."""

    def __init__(self, model: onnx.ModelProto | str | Path | bytes, threads: int, stop_spinning: bool = True,
                 custom_ops: Path | None = None) -> None:
        """model: a rebuilt stretch, or the model file itself (a path keeps its external weights);
        stop_spinning=False where nothing of portkern's runs between two runs of this session;
        custom_ops: the library of the custom ops the model's nodes use."""
        import onnxruntime as ort

        loadable = model.SerializeToString() if isinstance(model, onnx.ModelProto) else \
            str(model) if isinstance(model, Path) else model
        name = model.graph.name if isinstance(model, onnx.ModelProto) else "the model file"
        try:
            self.session = ort.InferenceSession(loadable, session_options(threads, stop_spinning, custom_ops),
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own types for bad graphs
            raise OrtSubgraphError(f"onnxruntime rejects {name}: {str(exc).splitlines()[0]}") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {name: values[name] for name in self.input_names}
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds)))


def host_array(buffer: Any) -> np.ndarray:
    """A numpy view of a host buffer (numpy itself, or anything exposing DLPack) without a copy."""
    return buffer if isinstance(buffer, np.ndarray) else np.from_dlpack(buffer)


class OrtProgram:
    """The task's subgraph in an onnxruntime session, called like any Program on host buffers."""

    def __init__(self, task: Task, threads: int) -> None:
        import onnxruntime as ort

        try:
            self.session = ort.InferenceSession(task_model(task).SerializeToString(), session_options(threads),
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own types for bad graphs
            raise OrtSubgraphError(f"onnxruntime rejects the subgraph of {task.label}: "
                                   f"{str(exc).splitlines()[0]}") from None
        self.task = task
        self.threads = threads
        self._binding: Any = None
        self._bound_to: tuple[Any, ...] = ()
        self._copies: list[np.ndarray] = []

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        # Creating a binding costs more than a small kernel's run (~8 us vs ~6 us), so a binding
        # made for these very buffer objects is reused: an array's memory never moves, and
        # onnxruntime reads and writes it afresh on every run. Holding the objects keeps them alive.
        buffers = (*inputs, *outputs)
        same = len(buffers) == len(self._bound_to) and all(a is b for a, b in zip(buffers, self._bound_to))
        if not same:
            self._binding, copied = self._bind(inputs, outputs)
            self._bound_to = () if copied else buffers  # a copied input must be copied again next run
        self.session.run_with_iobinding(self._binding)

    def _bind(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> tuple[Any, bool]:
        """A binding to the buffers' memory, and whether an input had to be copied to bind it."""
        binding = self.session.io_binding()
        views = [host_array(buffer) for buffer in inputs]
        arrays = [np.ascontiguousarray(view) for view in views]
        for name, array in zip(self.task.input_names, arrays, strict=True):
            binding.bind_input(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        for name, buffer in zip(self.task.output_names, outputs, strict=True):
            result = host_array(buffer)
            if not result.flags.c_contiguous:
                raise OrtSubgraphError(f"output buffer for '{name}' is not contiguous")
            binding.bind_output(name, "cpu", 0, result.dtype, result.shape, result.ctypes.data)
        self._copies = arrays  # bound by pointer: copies must outlive the run
        return binding, any(a is not v for a, v in zip(arrays, views))


def node_seconds(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], runs: int, threads: int,
                 custom_ops: Path | None = None) -> dict[str, float]:
    """Each node's own time inside the whole model, by name, from onnxruntime's profiler: the
    median of the last `runs` of 2 x `runs` runs. A node that onnxruntime fused into another shows
    under the survivor's name (its time in the survivor's); a node moved to its blocked conv
    layout shows as NAME_nchwc, reported here as NAME."""
    import json
    import statistics
    import tempfile

    import onnxruntime as ort

    options = session_options(threads, stop_spinning=False, custom_ops=custom_ops)
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="portkern_profile_") as scratch:
        options.profile_file_prefix = str(Path(scratch) / "trace")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for _ in range(2 * runs):
            session.run(None, dict(feeds))
        events = json.loads(Path(session.end_profiling()).read_text())
    durations: dict[str, list[float]] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            name = event["name"].removesuffix("_kernel_time").removesuffix("_nchwc")
            durations.setdefault(name, []).append(float(event["dur"]) * 1e-6)
    return {name: statistics.median(times[len(times) // 2:]) for name, times in durations.items()}

