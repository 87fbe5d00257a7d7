"""The CLI: user mistakes are one line and exit code 2, never a traceback; inspect lists tasks."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from portkern.cli import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def softmax_model(tmp_path_factory) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=-1)], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("m") / "softmax.onnx"
    onnx.save(model, path)
    return path


def test_targets_lists_every_profile(capsys) -> None:
    code, out, _ = _run(capsys, "targets")
    assert code == 0
    for name in ("h200", "h100", "a100", "l4", "mi300x", "cpu", "ascend910b"):
        assert name in out
    code, out, _ = _run(capsys, "targets", "--json")
    assert {p["name"] for p in json.loads(out)} >= {"h200", "cpu", "ascend910b"}


@pytest.mark.parametrize("argv, message", [
    (["inspect", "missing.onnx"], "not found"),
    (["inspect", "{model}", "--target", "tpu9"], "unknown target 'tpu9'"),
    (["inspect", "{model}", "--shape", "x=1by64"], "shape"),
    (["inspect", "{model}"], "batch"),  # dynamic dim not bound: names the input's dim
    (["inspect", "{model}", "--shape", "nope=1x64"], "nope"),
])
def test_user_mistakes_are_one_line(capsys, softmax_model: Path, argv: list[str], message: str) -> None:
    code, _, err = _run(capsys, *[a.replace("{model}", str(softmax_model)) for a in argv])
    assert code == 2
    assert err.startswith("portkern: error: ") and err.count("\n") == 1
    assert message in err


def test_not_an_onnx_file(capsys, tmp_path: Path, softmax_model: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01garbage" * 10)
    code, _, err = _run(capsys, "inspect", str(junk))
    assert code == 2 and "portkern: error:" in err
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(softmax_model.read_bytes()[:-7])
    code, _, err = _run(capsys, "inspect", str(truncated))
    assert code == 2 and "portkern: error:" in err


def test_unsupported_op_names_op_and_node(capsys, tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    node = helper.make_node("FancyAttention", ["x"], ["y"], name="the_fancy_node", domain="com.example")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "hardmax.onnx"
    onnx.save(model, path)
    code, _, err = _run(capsys, "inspect", str(path))
    assert code == 2 and "FancyAttention" in err and "the_fancy_node" in err


def test_inspect_table_and_json(capsys, softmax_model: Path) -> None:
    code, out, _ = _run(capsys, "inspect", str(softmax_model), "--shape", "x=32x64", "--target", "h200")
    assert code == 0 and "softmax" in out and "glue between the tasks: none" in out
    code, out, _ = _run(capsys, "inspect", str(softmax_model), "--shape", "x=32x64", "--json")
    data = json.loads(out)
    (task,) = data["tasks"]
    assert data["glue"] == {}
    assert task["kind"] == "softmax" and task["min_bytes"] == 2 * 32 * 64 * 4
    # memory-bound: the floor is the bytes over the H200's measured bandwidth
    assert task["floor_seconds"] == pytest.approx(2 * 32 * 64 * 4 / 4.2e12)


def test_no_traceback_from_the_console_script(softmax_model: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "portkern", "inspect", str(softmax_model)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "portkern: error:" in proc.stderr


def test_profile_table_and_trace(capsys, softmax_model: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    code, out, _ = _run(capsys, "profile", str(softmax_model), "--shape", "x=16x64", "--target", "h200",
                        "--trace", str(trace))
    assert code == 0 and "softmax" in out and "headroom" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert len(events) == 1 and events[0]["ph"] == "X" and events[0]["dur"] > 0
    code, out, _ = _run(capsys, "profile", str(softmax_model), "--shape", "x=16x64", "--target", "h200", "--json")
    (row,) = json.loads(out)
    assert row["baseline_seconds"] > 0 and row["floor_seconds"] > 0 and row["count"] == 1


def test_profile_on_the_cpu_times_the_baseline_inside_the_model_too(capsys, softmax_model: Path) -> None:
    code, out, _ = _run(capsys, "profile", str(softmax_model), "--shape", "x=16x64", "--target", "cpu", "--json")
    (row,) = json.loads(out)
    assert code == 0 and row["baseline_in_model_seconds"] > 0
    assert row["baseline_seconds"] == min(row["baseline_in_model_seconds"], row["baseline"]["median"])


def test_bench_times_its_runners_with_numpy_blas_on_one_thread(capsys, softmax_model: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference executor is numpy: its BLAS threads would spin after each of its runs and slow
    the runner timed next (onnxruntime), flattering whatever it is compared with."""
    from threadpoolctl import threadpool_info

    import portkern.runtime

    seen: list[list[int]] = []
    real = portkern.runtime.interleaved_latency

    def spy(*args, **kwargs):
        seen.append([lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"])
        return real(*args, **kwargs)

    monkeypatch.setattr(portkern.runtime, "interleaved_latency", spy)
    code, out, _ = _run(capsys, "bench", str(softmax_model), "--shape", "x=4x64", "--repeats", "3", "--json")
    assert code == 0
    assert set(json.loads(out)["latency_seconds"]) == {"reference executor", "onnxruntime (CPU)"}
    assert seen and all(threads and set(threads) == {1} for threads in seen)


def test_inspect_names_the_glue_between_tasks(capsys, tmp_path: Path) -> None:
    """A Transpose between two softmaxes is no task's: inspect lists it as glue (copies a kernel
    could read in place are where a model's time goes that no kernel tuning wins back)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 8])
    nodes = [helper.make_node("Softmax", ["x"], ["a"], axis=-1), helper.make_node("Transpose", ["a"], ["t"]),
             helper.make_node("Softmax", ["t"], ["y"], axis=-1)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "glued.onnx"
    onnx.save(model, path)
    code, out, _ = _run(capsys, "inspect", str(path), "--target", "h200")
    assert code == 0 and "glue between the tasks: Transpose x1" in out
    code, out, _ = _run(capsys, "inspect", str(path), "--target", "h200", "--json")
    assert json.loads(out)["glue"] == {"Transpose": 1}


def test_inspect_counts_a_folded_batch_norm_as_its_convs(capsys, tmp_path: Path) -> None:
    """A BatchNormalization folded into its conv runs inside the conv's task (as the runtime skips
    it, by name): it is no glue, nor is the conv the task runs with folded weights."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])
    weights = [helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], rng.standard_normal(108).tolist())] + [
        helper.make_tensor(name, TensorProto.FLOAT, [4], values)
        for name, values in (("gamma", [1.0, 2.0, 0.5, 1.5]), ("beta", [0.1, 0.0, -0.2, 0.3]),
                             ("mean", [0.0, 0.5, -0.5, 0.2]), ("var", [1.0, 2.0, 0.5, 1.5]))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], weights),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "conv_bn.onnx"
    onnx.save(model, path)
    code, out, _ = _run(capsys, "inspect", str(path), "--target", "cpu")  # NCHW: no layout Transposes either
    assert code == 0 and "glue between the tasks: none" in out, out
