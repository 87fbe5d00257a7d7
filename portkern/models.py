"""Real models for tests, demos and benchmarks: the onnx package's light zoo and a BERT encoder.

The zoo graphs have real shapes but every weight is the same 0.02 fill, which makes an output
check nearly blind; `randomize_weights` swaps in seeded random weights scaled like a real init.
The BERT-style encoder is exported from `transformers` with random init (no download) and cached
by its arguments, so tests pay for the export once.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import ModelError
from .ir import Graph

ZOO_MODELS: tuple[str, ...] = (
    "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
    "squeezenet", "vgg19", "zfnet512",
)

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "portkern" / "models"


def zoo_model_path(name: str) -> Path:
    """The light zoo model shipped inside the onnx package (light_<name>.onnx)."""
    if name not in ZOO_MODELS:
        raise ModelError(f"unknown zoo model '{name}'; known: {', '.join(ZOO_MODELS)}")
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.is_file():
        raise ModelError(f"zoo model {path} is missing from the installed onnx package")
    return path


# --------------------------------------------------------------------------- random weights

# ops through which a weight passes unchanged in role (densenet's BN scales go through Unsqueeze)
_PASS_THROUGH = frozenset({"Unsqueeze", "Reshape", "Identity", "Cast", "Squeeze", "Flatten"})
# (op, input index) whose values must stay near 1 or positive for the network to stay sane
_NEAR_ONE = {("BatchNormalization", 1), ("BatchNormalization", 4), ("Mul", 0), ("Mul", 1),
             ("InstanceNormalization", 1), ("LayerNormalization", 1)}


def _weight_role(name: str, consumers: dict[str, list[tuple[onnx.NodeProto, int]]]
                 ) -> tuple[onnx.NodeProto, int] | None:
    """The first real consumer of a weight (following pass-through ops) and the input slot."""
    current = name
    for _ in range(8):
        users = consumers.get(current, [])
        if not users:
            return None
        node, slot = users[0]
        if node.op_type not in _PASS_THROUGH:
            return node, slot
        current = node.output[0]
    return None


def _fan_in(shape: tuple[int, ...], role: tuple[onnx.NodeProto, int] | None) -> int:
    if role is not None:
        node, slot = role
        if node.op_type == "Gemm" and slot == 1:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            return shape[1] if trans_b else shape[0]
        if node.op_type == "MatMul" and slot == 1:
            return shape[-2]
    return math.prod(shape[1:])


def _random_weight(shape: tuple[int, ...], role: tuple[onnx.NodeProto, int] | None,
                   rng: np.random.Generator) -> np.ndarray:
    """He-scaled normal for matrices and filters; near-one scales/variances; small biases."""
    if role is not None and (role[0].op_type, role[1]) in _NEAR_ONE:
        return rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
    normal = rng.standard_normal(shape, dtype=np.float32)
    if len(shape) >= 2:
        return normal * np.float32(math.sqrt(2.0 / max(_fan_in(shape, role), 1)))
    return normal * np.float32(0.1)


def randomize_weights(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A copy whose float weights (initializers, ConstantOfShape fills) are seeded random values.

    ConstantOfShape weights become initializers of the same name, so the graph computes the same
    function of different numbers. Random weights alone blow deep nets up (resnet50's softmax
    saturates to one-hot, which hides errors as well as the 0.02 fill did), so for models with
    static input shapes the weights are then calibrated on one seeded input, as a trained net
    would be: BatchNormalization gets its input's batch statistics as running mean/variance and
    every Conv/Gemm/MatMul weight is scaled to give unit-variance output (layer-sequential
    unit-variance init).
    """
    randomized = _random_weights(model, seed)
    try:
        return _calibrated(randomized, seed)
    except ModelError:  # dynamic input dims: no input to calibrate on; keep the plain init
        return randomized


def _calibrated(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Run the model once in the executor, fixing BN statistics and weight scales on the way.

    It runs the model's own nodes (not the folded graph) so that a weight reached through a
    Reshape or Transpose of an initializer can be traced back to that initializer and rescaled.
    """
    from .executor import run_nodes
    from .onnx_import import load_model, node_from_proto

    feeds = random_feeds(load_model(model), seed)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    env: dict[str, np.ndarray] = {**initializers, **feeds}
    nodes = [node_from_proto(n) for n in model.graph.node]
    producers = {out: node for node in nodes for out in node.outputs}
    updated: dict[str, np.ndarray] = {}
    for node in nodes:
        if node.op_type == "BatchNormalization" and set(node.inputs[3:5]) <= set(initializers):
            x = env[node.inputs[0]]
            axes = (0,) + tuple(range(2, x.ndim))
            for name, stat in zip(node.inputs[3:5], (x.mean(axis=axes), x.var(axis=axes))):
                env[name] = updated[name] = stat.astype(env[name].dtype)
        run_nodes([node], env, opset)
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        sources = {name: _source_initializer(name, producers, initializers)
                   for name in node.inputs[1:3] if name}
        output = env[node.outputs[0]]
        spread = float(np.std(output))
        if None in sources.values() or spread == 0:  # weight or bias computed, not stored
            continue
        for name, source in sources.items():
            assert source is not None
            # through linear moves only: scaling the source scales the input
            env[name] = env[name] / np.asarray(spread, dtype=env[name].dtype)
            if source != name:
                env[source] = env[source] / np.asarray(spread, dtype=env[source].dtype)
            updated[source] = env[source]
        # the op is linear in (weight, bias): scaling both scales the output the same way
        env[node.outputs[0]] = output / np.asarray(spread, dtype=output.dtype)
    for tensor in model.graph.initializer:
        if tensor.name in updated:
            tensor.CopyFrom(numpy_helper.from_array(updated[tensor.name], tensor.name))
    return model


# ops that only move a weight's elements: a weight read through them is a scaled initializer
_LINEAR_MOVES = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Flatten", "Identity"})


def _source_initializer(name: str, producers: dict[str, Any],
                        initializers: dict[str, np.ndarray]) -> str | None:
    """The initializer a value is a reshaping of, or None when it is computed otherwise."""
    while name not in initializers:
        node = producers.get(name)
        if node is None or node.op_type not in _LINEAR_MOVES:
            return None
        name = node.inputs[0]
    return name


def _random_weights(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Seeded random values for every float weight; ConstantOfShape fills become initializers."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, slot))
    shape_inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    replaced: list[onnx.TensorProto] = []
    kept_nodes = []
    for node in graph.node:
        fill = _fill_dtype(node)
        if node.op_type == "ConstantOfShape" and fill is not None and node.input[0] in shape_inits:
            shape = tuple(int(d) for d in shape_inits[node.input[0]])
            value = _random_weight(shape, _weight_role(node.output[0], consumers), rng)
            replaced.append(numpy_helper.from_array(value.astype(fill), node.output[0]))
        else:
            kept_nodes.append(node)
    for index, tensor in enumerate(graph.initializer):
        array = numpy_helper.to_array(tensor)
        if array.dtype.kind == "f" and array.size > 1:
            value = _random_weight(array.shape, _weight_role(tensor.name, consumers), rng)
            graph.initializer[index].CopyFrom(numpy_helper.from_array(value.astype(array.dtype),
                                                                       tensor.name))
    graph.initializer.extend(replaced)
    del graph.node[:]
    graph.node.extend(kept_nodes)
    # drop what only the removed fills read (their __SHAPE tensors), inputs and initializers both
    read = {name for node in kept_nodes for name in node.input} | {o.name for o in graph.output}
    unused = [t for t in graph.initializer if t.name not in read]
    for tensor in unused:
        graph.initializer.remove(tensor)
    stale = [vi for vi in graph.input if vi.name not in read]
    for vi in stale:
        graph.input.remove(vi)
    return out


def _fill_dtype(node: onnx.NodeProto) -> np.dtype | None:
    """The float dtype a ConstantOfShape fills with, or None when it is not a float fill."""
    if node.op_type != "ConstantOfShape":
        return None
    for attr in node.attribute:
        if attr.name == "value":
            dtype = numpy_helper.to_array(attr.t).dtype
            return dtype if dtype.kind == "f" else None
    return np.dtype(np.float32)


# --------------------------------------------------------------------------- BERT export

def export_bert(path: str | Path = DEFAULT_CACHE_DIR, *, layers: int = 2, hidden: int = 128,
                heads: int = 2, intermediate: int = 512, seq: int = 128, batch: int = 1,
                vocab: int = 1000, dtype: str = "float32", opset: int = 17, seed: int = 0) -> Path:
    """A BERT-style encoder (random init) exported to ONNX in the cache directory `path`.

    Inputs input_ids and attention_mask (int64, dynamic batch x sequence axes); outputs
    last_hidden_state and pooler_output. The file name is a hash of the arguments and the
    torch/transformers versions, so a second call with the same arguments is free.
    """
    args: dict[str, Any] = dict(layers=layers, hidden=hidden, heads=heads,
                                intermediate=intermediate, seq=seq, batch=batch, vocab=vocab,
                                dtype=dtype, opset=opset, seed=seed)
    import torch
    import transformers

    args["versions"] = [torch.__version__, transformers.__version__]
    digest = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:16]
    directory = Path(path)
    target = directory / f"bert-L{layers}-H{hidden}-S{seq}-{dtype}-{digest}.onnx"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = _bert_module(layers, hidden, heads, intermediate, vocab, dtype, seed)
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, min(vocab, 100), (batch, seq), generator=generator)
    attention_mask = torch.ones(batch, seq, dtype=torch.int64)
    dynamic = {0: "batch", 1: "sequence"}
    # write to a private temp file then rename: concurrent test runs never see half a model
    handle, tmp_name = tempfile.mkstemp(suffix=".onnx", dir=directory)
    os.close(handle)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy exporter's deprecation/tracer notes
            torch.onnx.export(
                wrapper, (input_ids, attention_mask), tmp_name,
                input_names=["input_ids", "attention_mask"],
                output_names=["last_hidden_state", "pooler_output"],
                dynamic_axes={"input_ids": dynamic, "attention_mask": dynamic,
                              "last_hidden_state": dynamic, "pooler_output": {0: "batch"}},
                opset_version=opset, dynamo=False)
        os.replace(tmp_name, target)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return target


def _bert_module(layers: int, hidden: int, heads: int, intermediate: int, vocab: int,
                 dtype: str, seed: int) -> Any:
    """BertModel from a BertConfig (eager attention: plain ONNX ops), wrapped to take
    (input_ids, attention_mask) positionally and return a plain tuple for the exporter."""
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    bert = BertModel(config).eval().to(getattr(torch, dtype))

    class EncoderOutputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    return EncoderOutputs()


# --------------------------------------------------------------------------- inputs

def random_feeds(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs that make sense for the model: token ids in [0, 100), a mask of ones with a
    few trailing zeros (padding), token type ids of zero, normal floats."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        spec = graph.values[name]
        dtype = np.dtype(spec.dtype)
        lowered = name.lower()
        if dtype.kind in "iu" and "mask" in lowered:
            value = np.ones(spec.shape, dtype=dtype)
            if value.ndim:
                length = spec.shape[-1]
                value[..., length - min(max(1, length // 16), length - 1):] = 0
        elif dtype.kind in "iu" and "type" in lowered:
            value = np.zeros(spec.shape, dtype=dtype)
        elif dtype.kind in "iu":
            value = rng.integers(0, 100, size=spec.shape).astype(dtype)
        elif dtype.kind == "b":
            value = rng.random(spec.shape) < 0.5
        else:
            value = rng.standard_normal(spec.shape).astype(dtype)
        feeds[name] = value
    return feeds


# --------------------------------------------------------------------------- the models report

def check_models(names: Sequence[str] = ZOO_MODELS, bert_seq: int = 128) -> str:
    """Markdown: each zoo model (random weights) and a fresh BERT export run by the executor
    against onnxruntime (CPU), with the relative L2 error of every output and the times."""
    import time

    import onnxruntime

    from .executor import run_graph
    from .onnx_import import load_model

    onnxruntime.set_default_logger_severity(3)
    rows = []
    runs: list[tuple[str, bytes | str, Graph, float]] = []
    for name in names:
        proto = randomize_weights(onnx.load(zoo_model_path(name)), seed=0)
        runs.append((name, proto.SerializeToString(), load_model(proto), 0.0))
    with tempfile.TemporaryDirectory() as fresh:
        start = time.perf_counter()
        bert_path = export_bert(fresh, seq=bert_seq)
        export_seconds = time.perf_counter() - start
        runs.append((f"bert (L2 H128, 1x{bert_seq})", bert_path.read_bytes(),
                     load_model(bert_path, {"input_ids": (1, bert_seq)}), export_seconds))
    for label, model_bytes, graph, export_seconds in runs:
        feeds = random_feeds(graph, seed=1)
        start = time.perf_counter()
        ours = run_graph(graph, feeds)
        run_seconds = time.perf_counter() - start
        session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
        reference = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        for output in graph.outputs:
            want = reference[output].astype(np.float64)
            error = np.linalg.norm(ours[output].astype(np.float64) - want) / np.linalg.norm(want)
            export_note = f"{export_seconds:.2f}" if export_seconds else ""
            rows.append(f"| {label} | {output} | {error:.2e} | {run_seconds:.2f} | {export_note} |")
    return "\n".join([
        "## Real models against onnxruntime",
        "",
        "Zoo models with `randomize_weights(seed=0)`, inputs from `random_feeds(seed=1)`; the",
        "BERT-style encoder exported fresh (random init, export time includes importing torch",
        f"and transformers) by `export_bert` and bound to 1x{bert_seq}. Error: relative L2 of",
        "the executor's fp32 output against onnxruntime's (CPU). Times on a shared 2-core box.",
        "",
        "| model | output | rel. L2 error | executor run (s) | export (s) |",
        "|---|---|---:|---:|---:|",
        *rows,
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m portkern.models bert --out bert.onnx [--layers N ...]` or
    `python -m portkern.models zoo resnet50 --out resnet50.onnx [--seed S]` (random weights)."""
    import argparse
    import shutil

    parser = argparse.ArgumentParser(prog="python -m portkern.models")
    commands = parser.add_subparsers(dest="command", required=True)
    bert = commands.add_parser("bert", help="export a BERT-style encoder (random init)")
    bert.add_argument("--out", required=True, type=Path)
    defaults = {"layers": 2, "hidden": 128, "heads": 2, "intermediate": 512, "seq": 128,
                "batch": 1, "vocab": 1000, "opset": 17, "seed": 0}
    for name, default in defaults.items():
        bert.add_argument(f"--{name}", type=int, default=default)
    bert.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    zoo = commands.add_parser("zoo", help="a light zoo model with seeded random weights")
    zoo.add_argument("name", choices=ZOO_MODELS)
    zoo.add_argument("--out", required=True, type=Path)
    zoo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.command == "bert":
        options = {name: getattr(args, name) for name in defaults}
        shutil.copyfile(export_bert(DEFAULT_CACHE_DIR, dtype=args.dtype, **options), args.out)
    else:
        onnx.save(randomize_weights(onnx.load(zoo_model_path(args.name)), args.seed), args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
