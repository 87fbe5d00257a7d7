"""A task's subgraph rebuilt as a model runs in onnxruntime and computes what the reference does."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from portkern import synthetic
from portkern.ort_subgraph import OrtProgram, OrtSubgraphError, task_model
from portkern.tasks import Task
from portkern.verify import compare, make_inputs

TASKS = {
    "gemm_gelu_residual": lambda: synthetic.gemm_task(9, 12, 7, activation="gelu", bias=True, residual=True,
                                                      batch=(2,)),
    "gemm_trans_b": lambda: synthetic.gemm_task(5, 6, 7, trans_b=True, bias=True),
    "conv2d_relu": lambda: synthetic.conv2d_task(1, 3, 9, 8, 4, 3, 3, pad=1, activation="relu", residual=True),
    "softmax": lambda: synthetic.softmax_task(6, 33),
    "layernorm": lambda: synthetic.layernorm_task(5, 16),
    "attention_mask": lambda: synthetic.attention_task(1, 2, 8, 4, mask=True),
    "pool_max": lambda: synthetic.pool_task(1, 3, 8, 8, "max"),
}


def run_ort(task: Task, seed: int, distribution: str = "normal") -> tuple[np.ndarray, np.ndarray]:
    inputs = make_inputs(task, seed, distribution)
    outputs = [np.full(spec.shape, np.nan, dtype=spec.dtype) for spec in task.outputs]
    OrtProgram(task, threads=1)(inputs, outputs)
    return outputs[0], task.reference(inputs)[0]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_subgraph_matches_reference(name: str) -> None:
    task = TASKS[name]()
    model = task_model(task)
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == list(task.input_names)
    assert [o.name for o in model.graph.output] == list(task.output_names)
    assert any(op.domain == "" and op.version == task.opset for op in model.opset_import)
    got, want = run_ort(task, seed=5, distribution="large" if name == "softmax" else "normal")
    result = compare(got, want, 1e-5)
    assert result["passed"], result["reason"]


def test_constants_become_initializers() -> None:
    """The gelu's 0.5, 1.0 and sqrt(2) scalars are task constants, not runtime inputs."""
    task = TASKS["gemm_gelu_residual"]()
    assert task.constants
    model = task_model(task)
    assert {init.name for init in model.graph.initializer} == set(task.constants) - set(task.input_names)


def test_outputs_written_in_place_and_rerun_with_new_values() -> None:
    """The same buffers, new values written into them: the reused binding reads them afresh."""
    task = TASKS["conv2d_relu"]()
    program = OrtProgram(task, threads=1)
    inputs = make_inputs(task, 1, "normal")
    out = np.full(task.outputs[0].shape, np.nan, dtype=np.float32)
    for seed in (1, 2, 3):
        for buffer, fresh in zip(inputs, make_inputs(task, seed, "normal")):
            np.copyto(buffer, fresh)
        program(inputs, [out])
        assert compare(out, task.reference(inputs)[0], 1e-5)["passed"]


def test_non_contiguous_output_is_refused() -> None:
    task = TASKS["softmax"]()
    wide = np.zeros((task.outputs[0].shape[0], task.outputs[0].shape[1] * 2), dtype=np.float32)
    with pytest.raises(OrtSubgraphError, match="not contiguous"):
        OrtProgram(task, threads=1)(make_inputs(task, 1, "normal"), [wide[:, ::2]])


def test_non_contiguous_input_is_read_afresh_each_run() -> None:
    """A strided input is copied to bind it; the copy must not be reused once values change."""
    task = TASKS["softmax"]()
    program = OrtProgram(task, threads=1)
    rows, cols = task.inputs[0].shape
    wide = np.zeros((rows, cols * 2), dtype=np.float32)
    strided = wide[:, ::2]
    out = np.full((rows, cols), np.nan, dtype=np.float32)
    for seed in (1, 2):
        strided[...] = make_inputs(task, seed, "normal")[0]
        program([strided], [out])
        assert compare(out, task.reference([strided])[0], 1e-5)["passed"]


def test_a_pack_that_covers_nothing_runs_the_model_file_itself(tmp_path) -> None:
    """With no tuned kernel the whole graph is one stretch: onnxruntime runs the user's file (its
    symbolic dims kept), not a rebuilt graph; stretches beside kernels are rebuilt subgraphs."""
    from onnx import TensorProto, helper, numpy_helper

    from portkern.backends import get_backend
    from portkern.hwprofile import load_target
    from portkern.pack import Pack
    from portkern.runtime import Session

    weight = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["out"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(weight, "w")])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    backend = get_backend(load_target("cpu"))
    empty = Pack(target={"name": "cpu", "backend": backend.name}, fingerprint=backend.fingerprint(), entries={})
    session = Session(path, empty, shapes={"x": (3, 8)})
    [(stretch, piece)] = session.pieces
    assert len(stretch) == 2 and piece.run.session.get_inputs()[0].shape == ["batch", 8]
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(session.run({"x": x})["out"], np.maximum(x @ weight, 0), rtol=1e-5, atol=1e-6)
