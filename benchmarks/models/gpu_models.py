"""Whole models on one GPU, fp16, random init (seed 0), each at its own batch (--batch sets all):
  bert-base  transformers BertModel, 12 layers, 768 wide, 12 heads, batch 32 x seq 128
  resnet50   torchvision resnet50, batch 32 x 3 x 224 x 224
  gpt2       transformers GPT2Model (no LM head) at GPT-2 small: 12 layers, 768 wide, 12 heads,
             1024 positions, vocab 50257; batch 8 x seq 512 (causal mask built in the graph)
  vit-base   transformers ViTModel at ViT-B/16: 12 layers, 768 wide, 12 heads, MLP 3072, 224 px in
             16 px patches (197 tokens), no pooler; batch 32
  llama      transformers LlamaModel (no LM head) at TinyLlama-1.1B's width: 2048 wide, MLP 5632, 32
             query heads sharing 4 key/value heads, vocab 32000, default rotary embeddings, but 4 of its
             22 layers (a 0.5 GB fp16 ONNX file); batch 4 x seq 512 (causal mask built in the graph)
  pythia     transformers GPTNeoXModel at Pythia-160M: 12 layers, 768 wide, 12 heads, MLP 3072, rotary
             on a quarter of each head (partial rotary), parallel attention and MLP; batch 8 x seq 512
  llama-decode  the llama above, one decoding step: batch 8, one new token a sequence after a
             key/value cache of 1023 positions (each layer's past keys and values are inputs, the
             graph concatenates the new ones: attention of 1 query over 1024 keys, skinny GEMMs)
gpt2, vit-base, llama and pythia are built by one builder from their transformers config and model classes
(eager attention, no key/value cache), take their one input (input_ids or pixel_values) and return
last_hidden_state: shapes nobody tuned portkern for. portkern tunes each model within a time budget,
then `portkern.Session(model, pack)` (values on the device, CUDA graph replay) is timed side by side
with torch eager, torch.compile and torch.compile(mode="max-autotune") of the same torch module, in
the same process, on the same inputs; the Session's output is checked against onnxruntime (CPU)
within fp16 tolerance.

    bash benchmarks/gpu_run.sh python3 benchmarks/models/gpu_models.py --models bert-base \\
        --time-budget 240 --out $OUT/gpu-models-bert.json
    bash benchmarks/gpu_run.sh python3 benchmarks/models/gpu_models.py --models resnet50 \\
        --time-budget 240 --out $OUT/gpu-models-resnet50.json
    bash benchmarks/gpu_run.sh python3 benchmarks/models/gpu_models.py --models llama \\
        --time-budget 240 --out $OUT/gpu-models-llama.json
    python benchmarks/models/gpu_models.py --smoke      # tiny fp32 stand-ins on the CPU: checks the script

Every runner is timed the same way, in two io modes: feeds from host memory and outputs back in host
memory (the latency a caller of Session.run with numpy arrays sees; the input's pageable copy is
part of it), and feeds already on the device with the outputs left there (torch tensors; what a
serving stack that keeps its tensors on the GPU sees). The device is synchronized before and after
each run, host clock; rounds of runs alternate between runners so a change in the machine's state
hits all of them.
Besides the module that was exported (eager attention), each transformers model's row also times
torch eager with transformers' SDPA attention (torch_eager_sdpa, where the model takes it), the
faster path a torch user would get by default.
--smoke: tiny stand-ins at batch 2, fp32, the Triton interpreter for portkern's kernels, no
torch.compile: each transformers model at 1 layer, 32 wide, 16 tokens (ViT: a 32 px image in 8 px
patches, 17 tokens; Llama keeps 2 key/value heads for its 4 query heads), vocabulary 128 (BERT's
100, GPT-2's own 50257), and a one-block ResNet-style CNN (torchvision is not needed).

Each model's tuned pack is kept beside --out (<model>.pkpack): `python -m portkern.priors --pack` turns
its kernels into priors for later tunes on the same chip.

Time on the GPU machine, beyond --time-budget: portkern.tune's end-to-end step runs onnxruntime (CPU)
on the full batch a few times, and max-autotune compiles for minutes: run one model per command
where commands are limited to 10 minutes (--batch and --compile-modes trim a run that does not fit).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import functools
import inspect
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import onnxruntime as ort
import torch

import portkern
from portkern.backends import get_backend
from portkern.hwprofile import load_target
from portkern.measure import MeasureOptions, kernel_device_times
from portkern.models import _bert_module, export_bert, random_feeds

sys.path.insert(0, str(Path(__file__).parent))
from export_hf import _eager, _Field, calibrate_batch_norms  # noqa: E402  (eager attention; one output field)

Run = Callable[[], Any]


@dataclass(frozen=True)
class BertSize:
    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int
    batch: int
    seq: int


BERT_BASE = BertSize(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, batch=32, seq=128)
BERT_SMOKE = BertSize(layers=1, hidden=32, heads=2, intermediate=64, vocab=100, batch=2, seq=16)
RESNET_BATCH = 32  # resnet50's (--smoke's TinyResNet: 2)


@dataclass(frozen=True)
class TransformersSpec:
    """A transformers model without a task head, built from its config class (random init, seed 0)
    and fed one input: token ids (an input named *_ids; random_feeds draws them in [0, 100), so the
    vocabulary is at least 100) or floats (pixel values)."""
    config: str  # the config class in transformers, e.g. "GPT2Config"
    model: str  # the model class built from it, e.g. "GPT2Model"
    sizes: dict[str, Any]  # the config's arguments
    input: str  # the one input the exported module takes: "input_ids" or "pixel_values"
    example: tuple[int, ...]  # one example's shape, batch left out: (seq,) or (3, side, side)
    batch: int
    model_args: dict[str, Any] = field(default_factory=dict)  # the model class's own arguments
    output: str = "last_hidden_state"  # the output field exported and timed
    cache: int = 0  # > 0: a decoding step after this many cached positions, each layer's keys and values inputs


# GPT-2 small: 12 layers, 768 wide, 12 heads, the causal mask built in the graph, GELU written out
GPT2_SMALL = TransformersSpec("GPT2Config", "GPT2Model", dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024,
                                                             vocab_size=50257), "input_ids", (512,), batch=8)
GPT2_SMOKE = TransformersSpec("GPT2Config", "GPT2Model", dict(n_layer=1, n_embd=32, n_head=2, n_positions=64),
                              "input_ids", (16,), batch=2)  # GPT-2's vocabulary: its bos/eos token is 50256
# ViT-B/16 at 224 px: 196 patches and the class token; no pooler (its output is not exported)
VIT_B16 = TransformersSpec("ViTConfig", "ViTModel", dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                                                         intermediate_size=3072, image_size=224, patch_size=16),
                           "pixel_values", (3, 224, 224), batch=32, model_args=dict(add_pooling_layer=False))
VIT_SMOKE = TransformersSpec("ViTConfig", "ViTModel", dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                                           intermediate_size=64, image_size=32, patch_size=8),
                             "pixel_values", (3, 32, 32), batch=2, model_args=dict(add_pooling_layer=False))
# TinyLlama-1.1B's width (32 query heads sharing 4 key/value heads, default rotary embeddings, RMSNorm,
# SiLU-gated MLP) at 4 of its 22 layers: the fp16 ONNX file is about 0.5 GB, well under protobuf's 2 GB
LLAMA_4L = TransformersSpec("LlamaConfig", "LlamaModel", dict(num_hidden_layers=4, hidden_size=2048,
                                                              intermediate_size=5632, num_attention_heads=32,
                                                              num_key_value_heads=4, vocab_size=32000,
                                                              max_position_embeddings=2048, rms_norm_eps=1e-5),
                            "input_ids", (512,), batch=4)
LLAMA_SMOKE = TransformersSpec("LlamaConfig", "LlamaModel", dict(num_hidden_layers=1, hidden_size=32,
                                                                 intermediate_size=88, num_attention_heads=4,
                                                                 num_key_value_heads=2, vocab_size=128,
                                                                 max_position_embeddings=64), "input_ids", (16,),
                               batch=2)
# Pythia-160M (GPT-NeoX: rotary on a quarter of each 64-wide head, parallel attention and MLP, fused
# q/k/v projection split per head)
PYTHIA_160M = TransformersSpec("GPTNeoXConfig", "GPTNeoXModel", dict(num_hidden_layers=12, hidden_size=768,
                                                                     num_attention_heads=12, intermediate_size=3072,
                                                                     rotary_pct=0.25, vocab_size=50304,
                                                                     max_position_embeddings=2048),
                               "input_ids", (512,), batch=8)
PYTHIA_SMOKE = TransformersSpec("GPTNeoXConfig", "GPTNeoXModel", dict(num_hidden_layers=1, hidden_size=64,
                                                                      num_attention_heads=2, intermediate_size=128,
                                                                      rotary_pct=0.25, vocab_size=128,
                                                                      max_position_embeddings=64),
                                "input_ids", (16,), batch=2)
# GPT-J-6B's width at 2 of its 28 layers: 16 heads of 256, the first 64 columns of each rotated in pairs,
# attention and MLP in parallel, q and k cast to float32 for the scores (about 1.2 GB of fp16 weights)
GPTJ_2L = TransformersSpec("GPTJConfig", "GPTJModel", dict(n_layer=2, n_embd=4096, n_head=16, rotary_dim=64,
                                                           n_positions=2048, vocab_size=50400), "input_ids", (512,),
                           batch=4)
GPTJ_SMOKE = TransformersSpec("GPTJConfig", "GPTJModel", dict(n_layer=1, n_embd=64, n_head=2, rotary_dim=16,
                                                              n_positions=64, vocab_size=128), "input_ids", (16,),
                              batch=2)
# Gemma-2-2B's width at 4 of its 26 layers: 8 heads of 256 sharing 4 key/value heads, tanh soft-capped
# attention logits, GeGLU; a 32000-token vocabulary (2B's 256000 would take 1.2 GB for the embedding alone)
GEMMA2_4L = TransformersSpec("Gemma2Config", "Gemma2Model", dict(num_hidden_layers=4, hidden_size=2304,
                                                                 intermediate_size=9216, num_attention_heads=8,
                                                                 num_key_value_heads=4, head_dim=256,
                                                                 vocab_size=32000, max_position_embeddings=2048),
                             "input_ids", (512,), batch=4)
GEMMA2_SMOKE = TransformersSpec("Gemma2Config", "Gemma2Model", dict(num_hidden_layers=1, hidden_size=64,
                                                                    intermediate_size=128, num_attention_heads=4,
                                                                    num_key_value_heads=2, head_dim=16,
                                                                    vocab_size=128, max_position_embeddings=64),
                                "input_ids", (16,), batch=2)
# transformers' MobileNetV2 (width 1.0, 224 px): depthwise convs, ReLU6, TensorFlow's "same" padding as Pads
# ahead of the strided convs; and EfficientNet-B0 (SiLU, squeeze-excite): CNNs whose convs, since
# 2026-12-07, stay channels-last end to end (the Pads fold into the convs, the excitation's scale is NHWC)
MOBILENET_V2 = TransformersSpec("MobileNetV2Config", "MobileNetV2Model", {}, "pixel_values", (3, 224, 224), batch=32)
MOBILENET_SMOKE = TransformersSpec("MobileNetV2Config", "MobileNetV2Model", dict(depth_multiplier=0.35, image_size=32),
                                   "pixel_values", (3, 32, 32), batch=2)
EFFICIENTNET_B0 = TransformersSpec("EfficientNetConfig", "EfficientNetModel", {}, "pixel_values", (3, 224, 224),
                                   batch=32)
EFFICIENTNET_SMOKE = TransformersSpec("EfficientNetConfig", "EfficientNetModel",
                                      dict(image_size=32, width_coefficient=0.25, depth_coefficient=0.25,
                                           hidden_dim=320), "pixel_values", (3, 32, 32), batch=2)
TRANSFORMERS_MODELS = {  # name: (full size, --smoke stand-in)
    "gpt2": (GPT2_SMALL, GPT2_SMOKE), "vit-base": (VIT_B16, VIT_SMOKE), "llama": (LLAMA_4L, LLAMA_SMOKE),
    "pythia": (PYTHIA_160M, PYTHIA_SMOKE), "gptj": (GPTJ_2L, GPTJ_SMOKE), "gemma2": (GEMMA2_4L, GEMMA2_SMOKE),
    "llama-decode": (replace(LLAMA_4L, example=(1,), batch=8, cache=1023),
                     replace(LLAMA_SMOKE, example=(1,), cache=15)),
    "mobilenet-v2": (MOBILENET_V2, MOBILENET_SMOKE), "efficientnet-b0": (EFFICIENTNET_B0, EFFICIENTNET_SMOKE)}


@dataclass
class ModelUnderTest:
    name: str
    description: str
    onnx_path: Path
    shapes: dict[str, tuple[int, ...]]
    module: torch.nn.Module  # the module the ONNX file was exported from, on the device
    extra_eager: dict[str, torch.nn.Module]  # other torch eager forms worth timing alongside


def bert(name: str, size: BertSize, dtype: str, device: torch.device, folder: Path) -> ModelUnderTest:
    """transformers' BertModel (random init, seed 0) exported by portkern.models.export_bert; the
    torch side builds the same module from the same seed."""
    args = dict(layers=size.layers, hidden=size.hidden, heads=size.heads, intermediate=size.intermediate,
                vocab=size.vocab, dtype=dtype, seed=0)
    path = export_bert(folder, seq=size.seq, batch=1, **args)  # dynamic batch: bound to size.batch below
    module = _bert_module(**args).to(device)
    sdpa = _bert_module(**args).to(device)
    sdpa.bert.set_attn_implementation("sdpa")
    return ModelUnderTest(name, f"BertModel L{size.layers} H{size.hidden} A{size.heads} I{size.intermediate}, "
                          f"batch {size.batch} x seq {size.seq}, {dtype}, random init",
                          path, {"input_ids": (size.batch, size.seq)}, module, {"torch_eager_sdpa": sdpa})


class _TokensField(_Field):
    """export_hf's _Field for a model fed token ids alone, with an attention mask of ones made from
    them in the graph (no padding): given neither a mask nor a key/value cache, transformers looks
    for packed sequences in the position ids with torch.diff, which the legacy exporter cannot export
    at opset 17 (and which syncs the host in eager torch)."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids, attention_mask=torch.ones_like(input_ids)), self.field)


class _DecodingStep(_Field):
    """One decoding step: token ids of the new position and each layer's cached keys and values in
    (past_key_<i>, past_value_<i>, (batch, key/value heads, cache, head dim)), a transformers
    DynamicCache made of them, so the graph concatenates each layer's new key and value to its
    cache and attends over both, as a decoder with a cache exports."""

    def forward(self, input_ids: torch.Tensor, *past: torch.Tensor) -> torch.Tensor:
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        # transformers renamed past_key_values to cache (the old name deprecated since about 5.2x)
        name = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        return getattr(self.model(input_ids, use_cache=True, **{name: cache}), self.field)


def _cache_inputs(spec: TransformersSpec, config: Any, batch: int) -> dict[str, tuple[int, ...]]:
    """Each layer's past keys and values and their shapes, in the decoding step's input order."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    shape = (batch, heads, spec.cache, config.hidden_size // config.num_attention_heads)
    return {f"past_{kind}_{layer}": shape for layer in range(config.num_hidden_layers) for kind in ("key", "value")}


def transformers_model(name: str, spec: TransformersSpec, dtype: str, device: torch.device,
                       folder: Path) -> ModelUnderTest:
    """spec's transformers model (random init, seed 0) with eager attention (plain ONNX ops; a
    decoder's causal mask and position ids are built in the graph from the token ids alone), no
    key/value cache, wrapped as export_hf does to take its one input and return one output field as a
    plain tensor; exported at batch 1 with a dynamic batch axis from the very module that is timed.
    With spec.cache, a decoding step instead (_DecodingStep), exported at its batch.
    Beside it, a copy of the same weights with transformers' SDPA attention where the model takes it."""
    import transformers

    config = _eager(getattr(transformers, spec.config)(**spec.sizes))
    if hasattr(config, "use_cache"):
        config.use_cache = False  # no key/value cache built or returned
    torch.manual_seed(0)
    model = getattr(transformers, spec.model)(config, **spec.model_args)
    torch_dtype = getattr(torch, dtype)
    tokens = spec.input.endswith("_ids")
    wrapper = _DecodingStep if spec.cache else _TokensField if tokens else _Field
    module = wrapper(model, spec.output).to(device=device)
    batch = spec.batch if spec.cache else 1
    if tokens:
        example = torch.randint(0, min(config.vocab_size, 100), (batch, *spec.example), device=device)
    else:  # BatchNorm statistics from a batch of such inputs, in float32 (export_hf.calibrate_batch_norms)
        module = calibrate_batch_norms(module, (torch.randn(8, *spec.example, device=device),))
        example = torch.randn(1, *spec.example, device=device, dtype=torch_dtype)
    module = module.eval().to(dtype=torch_dtype)
    past = _cache_inputs(spec, config, batch) if spec.cache else {}
    examples = (example, *(torch.randn(shape, device=device, dtype=torch_dtype) for shape in past.values()))
    path = folder / f"{name}-{dtype}.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer notes
        torch.onnx.export(module, examples, str(path), input_names=[spec.input, *past],
                          output_names=[spec.output], opset_version=17, dynamo=False,
                          dynamic_axes={} if spec.cache else {spec.input: {0: "batch"}, spec.output: {0: "batch"}})
    extra: dict[str, torch.nn.Module] = {}
    sdpa = copy.deepcopy(module)  # its own config: the exported module stays eager
    if getattr(sdpa.model, "_supports_sdpa", False):
        sdpa.model.set_attn_implementation("sdpa")
        if sdpa.model.config._attn_implementation == "sdpa":  # a model that cannot switch only warns
            extra["torch_eager_sdpa"] = sdpa
    sizes = ", ".join(f"{key}={value}" for key, value in spec.sizes.items())
    shape = (spec.batch, *spec.example)
    step = f", one decoding step after {spec.cache} cached positions" if spec.cache else ""
    return ModelUnderTest(name, f"{spec.model}({sizes}) {spec.output}, {spec.input} "
                          f"{' x '.join(map(str, shape))}{step}, {dtype}, random init, eager attention",
                          path, {spec.input: shape, **past}, module, extra)


class TinyResNet(torch.nn.Module):
    """The smoke stand-in for ResNet-50 (no torchvision on the CPU box): stem conv, BN, ReLU, max
    pool, one bottleneck block with a projected shortcut, global pooling and the classifier."""

    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.block = nn.Sequential(nn.Conv2d(width, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                   nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                   nn.ReLU(), nn.Conv2d(width, 4 * width, 1, bias=False), nn.BatchNorm2d(4 * width))
        self.shortcut = nn.Sequential(nn.Conv2d(width, 4 * width, 1, bias=False), nn.BatchNorm2d(4 * width))
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(self.block(x) + self.shortcut(x))
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet(name: str, smoke: bool, batch: int, dtype: str, device: torch.device, folder: Path) -> ModelUnderTest:
    """torchvision's resnet50(weights=None) (TinyResNet for --smoke), seed 0, exported at batch 1
    with a dynamic batch axis from the very module that is timed."""
    torch.manual_seed(0)
    if smoke:
        module, side, label = TinyResNet(), 32, "TinyResNet (smoke stand-in)"
    else:
        import torchvision

        module, side, label = torchvision.models.resnet50(weights=None), 224, "resnet50"
    module = module.eval().to(device=device, dtype=getattr(torch, dtype))
    path = folder / f"{label.split()[0].lower()}-{dtype}.onnx"
    example = torch.zeros(1, 3, side, side, dtype=getattr(torch, dtype), device=device)
    with torch.no_grad():
        torch.onnx.export(module, (example,), str(path), input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17,
                          dynamo=False)
    return ModelUnderTest(name, f"{label}, batch {batch} x 3 x {side} x {side}, {dtype}, random init",
                          path, {"input": (batch, 3, side, side)}, module, {})


# --------------------------------------------------------------------------- timing

def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_runs(run: Run, repeats: int) -> list[float]:
    """Seconds per run: host clock, the device synchronized before and after each run."""
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        run()
        synchronize()
        times.append(time.perf_counter() - start)
    return times


IO_MODES = ("host", "device")  # where a run's feeds come from and its outputs go


def torch_run(module: Callable[..., Any], feeds: dict[str, np.ndarray], names: Sequence[str],
              device: torch.device, io: str = "host") -> Run:
    """io "host": host feeds to the device, the module, every output back to host memory.
    io "device": the feeds already on the device, the outputs left there."""
    host = [torch.from_numpy(feeds[name]) for name in names]
    resident = [x.to(device) for x in host] if io == "device" else []

    def run() -> list[torch.Tensor]:
        with torch.inference_mode():
            out = module(*(resident or [x.to(device) for x in host]))
        outs = list(out if isinstance(out, (tuple, list)) else (out,))
        return outs if io == "device" else [o.cpu() for o in outs]
    return run


def session_run(session: portkern.Session, feeds: dict[str, np.ndarray], device: torch.device,
                io: str = "host") -> Run:
    """The same two io modes for portkern.Session: device feeds are torch tensors on the device."""
    if io == "host":
        return lambda: session.run(feeds)
    resident = {name: torch.from_numpy(value).to(device) for name, value in feeds.items()}
    return lambda: session.run(resident, outputs_on_device=True)


def io_name(runner: str, io: str) -> str:
    return runner if io == "host" else f"{runner}@{io}"


def speedups(seconds: dict[str, float]) -> dict[str, float]:
    return {name: t / seconds["portkern"] for name, t in seconds.items() if name != "portkern"}


def first_call_seconds(run: Run) -> float:
    """Wall time of the first call: for torch.compile, the compilation (and autotuning)."""
    synchronize()
    start = time.perf_counter()
    run()
    synchronize()
    return time.perf_counter() - start


def rel_l2(got: Any, want: np.ndarray) -> float:
    got64, want64 = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if not np.all(np.isfinite(got64)):
        return float("inf")
    return float(np.linalg.norm(got64 - want64) / (np.linalg.norm(want64) or 1.0))


# --------------------------------------------------------------------------- one model

def device_kernel_table(run: Run, runs: int = 3, top: int = 30) -> list[dict[str, Any]]:
    """Where one run's device time goes, by kernel, printed and returned (the top ones and the
    total). What is left to win is in this table, not in the task list alone."""
    times = kernel_device_times(run, runs, warmup=0)
    total = sum(time.device_us_per_run for time in times)
    rows = [{"kernel": time.kernel[:160], "calls_per_run": time.calls_per_run,
             "device_us_per_run": time.device_us_per_run} for time in times[:top]]
    for row in rows:
        print(f"    {row['device_us_per_run']:9.1f} us {100 * row['device_us_per_run'] / total:5.1f}%  "
              f"x{row['calls_per_run']:<5g} {row['kernel'][:100]}", flush=True)
    return rows + [{"kernel": "(all kernels)", "device_us_per_run": total}]


def warm_up(name: str, run: Run, runs: int = 3) -> None:
    """A runner's first runs (compiles, captures CUDA graphs), its device work waited for, so a
    fault is pinned on the runner that caused it, not on whichever runs next."""
    try:
        for _ in range(runs):
            run()
        synchronize()
    except Exception as exc:
        raise RuntimeError(f"{name} failed while warming up: {type(exc).__name__}: {exc}") from exc


def bench_model(model: ModelUnderTest, args: argparse.Namespace, device: torch.device, work: Path,
                dtype: str, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    pack_path = work / f"{model.name}.pkpack"
    say = (lambda line: print(f"  [{model.name}] {line}", flush=True))
    extra = {} if not args.smoke else dict(measure=MeasureOptions(warmup=1, repeats=3, input_sets=2),
                                            min_task_trials=1)
    report = portkern.tune(model.onnx_path, target=args.target, shapes=model.shapes, out=pack_path,
                           trials=args.trials, per_task_trials=args.per_task_trials,
                           time_budget_s=args.time_budget, compile_workers=args.compile_workers,
                           skip_variants=tuple(args.skip_variant), progress=say, **extra)
    # the pack, kept beside --out: `python -m portkern.priors --pack` makes the next tune's priors of it
    shutil.copytree(pack_path, Path(args.out).parent / pack_path.name, dirs_exist_ok=True)
    session = portkern.Session(model.onnx_path, pack_path)
    graph = session.graph
    feeds = random_feeds(graph, seed=3)
    # every runner in both io modes; a runner's name ends in @device for feeds already on the device
    modules: dict[str, Callable[..., Any]] = {"torch_eager": model.module, **model.extra_eager}
    runners: dict[str, Run] = {}
    for io in IO_MODES:
        runners[io_name("portkern", io)] = session_run(session, feeds, device, io)
        runners.update({io_name(name, io): torch_run(module, feeds, graph.inputs, device, io)
                        for name, module in modules.items()})
    for name, run in runners.items():
        warm_up(name, run)
    # the same comparison before any torch.compile shares the process: kept if a later runner fails
    before_compile = {name: statistics.median(timed_runs(run, args.repeats)) for name, run in runners.items()}
    say("before torch.compile: " + "  ".join(f"{name} {t * 1e3:.3f} ms" for name, t in before_compile.items()))
    save({"model": model.name, "partial": "torch.compile runners not timed yet",
          "seconds_before_torch_compile": before_compile, "tune_wall_seconds": report.wall_seconds,
          "tasks_tuned": [outcome.to_dict() for outcome in report.outcomes]})
    compile_seconds: dict[str, float] = {}
    errors: dict[str, str] = {}
    for mode in args.compile_modes:
        name = "torch_compile" if mode == "default" else f"torch_compile_{mode.replace('-', '_')}"
        torch._dynamo.reset()
        compiled = torch.compile(model.module, mode=mode)
        run = torch_run(compiled, feeds, graph.inputs, device)
        try:
            compile_seconds[name] = first_call_seconds(run)
        except Exception as exc:  # a compiler failure is a result, not a crash
            errors[name] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        for io in IO_MODES:
            runners[io_name(name, io)] = torch_run(compiled, feeds, graph.inputs, device, io)
            warm_up(io_name(name, io), runners[io_name(name, io)])
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            try:
                times[name] += timed_runs(run, args.repeats)
            except Exception as exc:
                raise RuntimeError(f"{name} failed while timed: {type(exc).__name__}: {exc}") from exc
    medians = {name: statistics.median(values) for name, values in times.items()}
    seconds, seconds_device = ({name.removesuffix("@device"): t for name, t in medians.items()
                                if name.endswith("@device") == (io == "device")} for io in IO_MODES)
    kernels = device_kernel_table(runners[io_name("portkern", "device")]) if torch.cuda.is_available() else []

    reference = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    want = dict(zip(graph.outputs, reference.run(graph.outputs, feeds)))
    tolerance = 1e-2 if dtype in ("float16", "bfloat16") else 1e-4
    got = session.run(feeds)
    got_on_device = runners[io_name("portkern", "device")]()
    eager = runners["torch_eager"]()
    portkern_errors = {name: rel_l2(got[name], want[name]) for name in graph.outputs}
    portkern_errors.update({f"{name}@device": rel_l2(got_on_device[name].float().cpu().numpy(), want[name])
                            for name in graph.outputs})
    row = {
        "model": model.name, "description": model.description,
        "shapes": {k: list(v) for k, v in model.shapes.items()},
        "seconds": seconds, "seconds_device_io": seconds_device, "times": times,
        "seconds_before_torch_compile": before_compile,
        "speedup_of_portkern": speedups(seconds), "speedup_of_portkern_device_io": speedups(seconds_device),
        "compile_wall_seconds": compile_seconds, "errors": errors,
        "portkern": {
            "tune_wall_seconds": report.wall_seconds, "time_budget_seconds": args.time_budget,
            "tasks": len(session.tasks), "kernels_in_pack": len(session.kernels),
            "baseline_tasks": len(session.baselines), "glue_stretches": len(session.pieces),
            "host_fallbacks": [[node.name, node.op_type, reason] for node, reason in session.host_fallbacks],
            "cuda_graph": session.replays_cuda_graph, "cuda_graph_error": session.cuda_graph_error,
            "tune_end_to_end": report.end_to_end,
            "tasks_tuned": [outcome.to_dict() for outcome in report.outcomes],
            "device_kernels_per_run": kernels,
        },
        "check": {"reference": "onnxruntime CPU on the same ONNX file and feeds", "tolerance_rel_l2": tolerance,
                  "portkern_rel_l2": portkern_errors,
                  "torch_eager_rel_l2": {name: rel_l2(value.float().numpy(), want[name])
                                         for name, value in zip(graph.outputs, eager)},
                  "passed": all(error <= tolerance for error in portkern_errors.values())},
    }
    ratios = " | ".join(f"{io} io: " + "  ".join(f"{name} {t * 1e3:.3f} ms ({ratio.get(name, 1.0):.2f}x)"
                                                 for name, t in times_of.items())
                        for io, times_of, ratio in (("host", seconds, row["speedup_of_portkern"]),
                                                    ("device", seconds_device, row["speedup_of_portkern_device_io"])))
    print(f"{model.name}: {ratios} | tuned {report.wall_seconds:.0f} s, {len(session.kernels)}/{len(session.tasks)} "
          f"tasks on pack kernels, cuda graph {session.replays_cuda_graph} | rel L2 vs onnxruntime "
          f"{max(portkern_errors.values()):.2e} (tolerance {tolerance:g})", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert-base,resnet50",
                        help="comma-separated: bert-base (BertModel L12 H768, batch 32 x seq 128), resnet50 "
                             "(batch 32 x 3 x 224 x 224), gpt2 (GPT2Model, GPT-2 small, batch 8 x seq 512), vit-base "
                             "(ViTModel B/16, batch 32 x 3 x 224 x 224), llama (LlamaModel at TinyLlama-1.1B's width, "
                             "4 layers, batch 4 x seq 512), pythia, llama-decode (one decoding step of that "
                             "llama, batch 8, 1023 cached positions), mobilenet-v2, efficientnet-b0 (transformers' "
                             "MobileNetV2 and EfficientNet-B0, batch 32 x 3 x 224 x 224)")
    parser.add_argument("--target", default="h200")
    parser.add_argument("--time-budget", type=float, default=240.0, help="portkern's tuning budget per model, s")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--per-task-trials", type=int, default=24)
    parser.add_argument("--compile-workers", type=int, default=0,
                        help="processes compiling candidates ahead of the measuring worker (portkern tune's flag)")
    parser.add_argument("--skip-variant", action="append", default=[], metavar="NAME",
                        help="leave a built-in variant out of the tune (portkern tune's flag): a model-level A/B")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per runner per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="gpu_models.json")
    parser.add_argument("--batch", type=int, default=None,
                        help="batch size of every model (default: each model's own; 2 for --smoke)")
    parser.add_argument("--compile-modes", default="default,max-autotune",
                        help="torch.compile modes to time, comma-separated ('' for none)")
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 models on the CPU, no torch.compile")
    args = parser.parse_args()
    args.compile_modes = [mode for mode in args.compile_modes.split(",") if mode]
    if args.smoke:
        args.time_budget, args.trials, args.per_task_trials, args.repeats, args.rounds = 20.0, 6, 2, 2, 1
        args.compile_modes = []
    elif not torch.cuda.is_available():
        parser.error("no CUDA device: run on the GPU machine, or use --smoke")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = "float32" if args.smoke else "float16"
    bert_size = BERT_SMOKE if args.smoke else BERT_BASE
    builders: dict[str, Callable[[Path], ModelUnderTest]] = {
        "bert-base": functools.partial(bert, "bert-base", replace(bert_size, batch=args.batch or bert_size.batch),
                                       dtype, device),
        "resnet50": functools.partial(resnet, "resnet50", args.smoke,
                                      args.batch or (2 if args.smoke else RESNET_BATCH), dtype, device),
    }
    for key, (full, smoke) in TRANSFORMERS_MODELS.items():
        spec = smoke if args.smoke else full
        builders[key] = functools.partial(transformers_model, key, replace(spec, batch=args.batch or spec.batch),
                                          dtype, device)
    unknown = set(args.models.split(",")) - set(builders)
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}; known: {', '.join(builders)}")
    import onnx
    import transformers

    try:
        import torchvision
        vision = torchvision.__version__
    except ImportError:
        vision = "not installed"
    document: dict[str, Any] = {
        "benchmark": "whole models: portkern.Session with a tuned pack vs torch eager / torch.compile / "
                     "torch.compile max-autotune, same process, same inputs",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "command": " ".join(sys.argv),
        "smoke": args.smoke, "dtype": dtype,
        "device": get_backend(load_target(args.target)).fingerprint(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__, "onnxruntime": ort.__version__, "torchvision": vision,
                     "portkern": portkern.__version__},
        "method": f"median of {args.rounds} rounds x {args.repeats} runs per runner after 3 warm-up runs, runners "
                  "alternating per round; each run: device synchronized before and after, host clock. "
                  "'seconds': feeds from host memory, outputs to host memory (pageable copies); "
                  "'seconds_device_io': feeds already on the device, outputs left there (runner@device)",
        "rows": [],
    }
    with tempfile.TemporaryDirectory(prefix="pk-gpu-models-") as scratch:
        for name in args.models.split(","):
            folder = Path(scratch) / name
            folder.mkdir()
            print(f"{name}: exporting ...", flush=True)
            def save(row: dict[str, Any]) -> None:
                Path(args.out).write_text(json.dumps({**document, "rows": [*document["rows"], row]},
                                                     indent=1, default=str))
            document["rows"].append(bench_model(builders[name](folder), args, device, folder, dtype, save))
            Path(args.out).write_text(json.dumps(document, indent=1, default=str))
    failed = [row["model"] for row in document["rows"] if not row["check"]["passed"]]
    if failed:
        print(f"output check FAILED for {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
