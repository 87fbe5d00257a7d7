"""Op-level benchmark: portkern's search tunes each shape, then the winner is timed side by side
with torch eager (cuBLAS / cuDNN / SDPA underneath) and torch.compile, in one run, same inputs.

    python benchmarks/ops/bench_ops.py --suite memory,gemv,gemm,attention,fp32 --trials 16 --out results.json
    python benchmarks/ops/bench_ops.py --smoke      # tiny shapes, Triton interpreter: checks the script on a CPU

Every row reports achieved TB/s (memory-bound) or TFLOP/s (compute-bound) and the % of the
hwprofile's roofline floor, plus the search's trial count and tuning time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from portkern.backends import get_backend
from portkern.backends.triton import baselines
from portkern.hwprofile import load_target
from portkern.measure import MeasureOptions, device_inputs, time_program
from portkern.profile import floor_seconds
from portkern.search.records import RecordLog
from portkern.search.strategy import ArtifactStore, SearchOptions, search_workload
from portkern.search.worker import InProcessRunner
from portkern.synthetic import (attention_task, conv2d_task, gemm_task, groupnorm_task, layernorm_task, rmsnorm_task,
                                softmax_task)
from portkern.tasks import Task
from portkern.priors import priors_for
from portkern.tuner import TaskCatalog, TuneOptions, variant_admitted
from portkern.verify import GateOptions


def suites(smoke: bool) -> dict[str, list[tuple[str, Task]]]:
    if smoke:
        return {"memory": [("softmax 64x300", softmax_task(64, 300, "float16"))],
                "gemv": [("gemv m1 96x80", gemm_task(1, 96, 80, "float16", trans_b=True))],
                "gemm": [("gemm 70x60x50", gemm_task(70, 60, 50, "float16"))],
                "gemm-epilogue": [("ffn 70x60x50 gelu",
                                   gemm_task(70, 60, 50, "float16", bias=True, activation="gelu"))],
                "attention": [("attn b1h2s32d16", attention_task(1, 2, 32, 16, "float16"))],
                "attention-parts": [("attn b1h2s32d16 mask", attention_task(1, 2, 32, 16, "float16", mask=True))],
                "attention-masked": [("attn causal b1h2s32sk40d16 mask",
                                      attention_task(1, 2, 32, 16, "float16", seq_kv=40, causal=True, mask=True))],
                "attention-gqa": [("attn gqa causal b1 h4 kv2 s32 d16",
                                   attention_task(1, 4, 32, 16, "float16", kv_heads=2, causal=True))],
                "conv": [("conv 3x3 b1 c8 10x10", conv2d_task(1, 8, 10, 10, 16, 3, 3, "float16", pad=1, nhwc=True))],
                "groupnorm": [("groupnorm b1 c8 6x6 g2 silu nhwc",
                               groupnorm_task(1, 8, (6, 6), 2, "float16", activation="silu", nhwc=True))],
                "fp32": [("gemm 40x48x32 fp32", gemm_task(40, 48, 32, "float32", trans_b=True))]}
    memory = [("softmax 16384x4096", softmax_task(16384, 4096, "float16")),
              ("layernorm 16384x4096", layernorm_task(16384, 4096, "float16")),
              ("rmsnorm 16384x4096", rmsnorm_task(16384, 4096, "float16"))]
    # decode-size linear layers (weight N x K): M 1/8/16/64 in fp16 and bf16
    gemv = [(f"gemv m{m} {n}x{k} {dt}", gemm_task(m, n, k, dt, trans_b=True))
            for dt in ("float16", "bfloat16") for m in (1, 8, 16, 64)
            for n, k in ((4096, 4096), (11008, 4096), (4096, 11008))]
    gemm = [(f"gemm {m}x{n}x{k}", gemm_task(m, n, k, "float16", trans_b=True))
            for m, n, k in ((4096, 768, 768), (4096, 3072, 768), (4096, 768, 3072),
                            (4096, 4096, 4096), (4096, 11008, 4096), (3000, 1000, 777))]
    # transformer FFNs' first GEMM as their exports give it (not in the default suites): the
    # activation is fused into the epilogue, which runs once per output element after the K loop
    gemm_epilogue = [
        ("ffn bert 4096x3072x768 gelu", gemm_task(128, 3072, 768, "float16", bias=True, activation="gelu",
                                                  batch=(32,))),
        ("ffn gpt2 4096x3072x768 gelu_tanh", gemm_task(128, 3072, 768, "float16", bias=True, activation="gelu_tanh",
                                                       batch=(32,))),
        ("ffn llama gate 4096x11008x4096 silu", gemm_task(4096, 11008, 4096, "float16", activation="silu"))]
    attention = [("attn b32 h12 s128 d64", attention_task(32, 12, 128, 64, "float16")),
                 ("attn b8 h12 s512 d64", attention_task(8, 12, 512, 64, "float16")),
                 ("attn causal b4 h32 s2048 d128", attention_task(4, 32, 2048, 128, "float16", causal=True)),
                 # BERT-base's attention as its ONNX export gives it: heads packed, K^T a view, a mask
                 ("attn bert b32 h12 s128 d64 mask", attention_task(32, 12, 128, 64, "float16", mask=True,
                                                                    k_transposed=True, packed_heads=True))]
    # BERT's attention taken apart (not in the default suites): which of its export's features costs
    # a kernel what over the plain b32 h12 s128 d64 case
    attention_parts = [
        ("attn b32 h12 s128 d64 packed", attention_task(32, 12, 128, 64, "float16", packed_heads=True)),
        ("attn b32 h12 s128 d64 kT packed", attention_task(32, 12, 128, 64, "float16", k_transposed=True,
                                                           packed_heads=True)),
        ("attn b32 h12 s128 d64 mask", attention_task(32, 12, 128, 64, "float16", mask=True))]
    # additive masks where key blocks reach past a mask edge (not in the default suites): a causal
    # prefill that also takes a mask, and keys that end inside a block
    attention_masked = [
        ("attn causal b8 h12 s1024 d64 mask", attention_task(8, 12, 1024, 64, "float16", causal=True, mask=True)),
        ("attn causal b4 h32 s2048 d128 mask", attention_task(4, 32, 2048, 128, "float16", causal=True, mask=True)),
        ("attn b32 h12 s200 d64 mask", attention_task(32, 12, 200, 64, "float16", mask=True)),
        ("attn b8 h12 s512 sk520 d64 mask", attention_task(8, 12, 512, 64, "float16", seq_kv=520, mask=True))]
    # grouped-query attention (not in the default suites): k and v with fewer heads, read before their
    # repeat; the LLaMA of gpu_models.py (TinyLlama's width), a Mistral-7B-like long prompt, and a
    # LLaMA-3-8B-like decoding step at 4096 keys (one query position a head: PACK_GQA's case)
    attention_gqa = [
        ("attn llama gqa causal b4 h32 kv4 s512 d64",
         attention_task(4, 32, 512, 64, "float16", kv_heads=4, causal=True)),
        ("attn gqa causal b1 h32 kv8 s4096 d128", attention_task(1, 32, 4096, 128, "float16", kv_heads=8, causal=True)),
        ("attn gqa decode b8 h32 kv8 s1 sk4096 d128",
         attention_task(8, 32, 1, 128, "float16", seq_kv=4096, kv_heads=8))]
    # ResNet-50's convolutions at batch 32 in NHWC, as portkern's Triton graph has them (BN folded
    # into the bias, ReLU fused as in its blocks); the baseline is cuDNN on channels-last tensors
    conv = [(f"conv {kh}x{kh} s{stride} c{c} oc{oc} {hw}x{hw} nhwc",
             conv2d_task(32, c, hw, hw, oc, kh, kh, "float16", stride=stride, pad=kh // 2, activation="relu",
                         nhwc=True))
            for c, oc, hw, kh, stride in ((3, 64, 224, 7, 2), (64, 64, 56, 3, 1), (64, 256, 56, 1, 1),
                                          (256, 64, 56, 1, 1), (128, 128, 28, 3, 1), (256, 256, 14, 3, 1),
                                          (1024, 256, 14, 1, 1), (512, 512, 7, 3, 1), (512, 2048, 7, 1, 1))]
    # Stable Diffusion's GroupNorm -> SiLU (not in the default suites): the UNet's widths at 64x64
    # latents, batch 2 (classifier-free guidance), channels-last as portkern's graph has them, one
    # NCHW; the VAE decoder's widest; the baseline is F.group_norm and the activation, two kernels
    groupnorm = [
        *((f"groupnorm sd b2 c{c} {hw}x{hw} g32 silu nhwc",
           groupnorm_task(2, c, (hw, hw), 32, "float16", activation="silu", nhwc=True))
          for c, hw in ((320, 64), (640, 32), (1280, 16))),
        ("groupnorm sd b2 c320 64x64 g32 silu", groupnorm_task(2, 320, (64, 64), 32, "float16", activation="silu")),
        ("groupnorm vae b1 c256 256x256 g32 silu nhwc",
         groupnorm_task(1, 256, (256, 256), 32, "float16", activation="silu", nhwc=True))]
    # float32 at float32 accuracy (TF32 off on both sides): BERT-base's GEMMs and attention
    fp32 = [*((f"gemm {m}x{n}x{k} fp32", gemm_task(m, n, k, "float32", trans_b=True))
              for m, n, k in ((4096, 768, 768), (4096, 3072, 768), (4096, 768, 3072))),
            ("attn b8 h12 s512 d64 fp32", attention_task(8, 12, 512, 64, "float32"))]
    return {"memory": memory, "gemv": gemv, "gemm": gemm, "gemm-epilogue": gemm_epilogue, "attention": attention,
            "attention-parts": attention_parts, "attention-masked": attention_masked, "attention-gqa": attention_gqa,
            "conv": conv, "groupnorm": groupnorm, "fp32": fp32}


def time_callable(backend: Any, fn: Callable[[list[Any]], Any], sets: list[list[Any]], repeats: int) -> list[float]:
    for i in range(3):
        fn(sets[i % len(sets)])
    backend.synchronize()
    return [backend.time_once(lambda s=sets[i % len(sets)]: fn(s)) for i in range(repeats)]


def rate(task: Task, seconds: float, target: Any) -> str:
    compute_bound = task.flops / target.profile.peak(task.dtype) >= task.min_bytes / target.profile.mem_bandwidth
    return (f"{task.flops / seconds / 1e12:.1f} TFLOP/s" if compute_bound
            else f"{task.min_bytes / seconds / 1e12:.2f} TB/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--suite", default="memory,gemv,gemm,attention,conv,fp32")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", default="bench_ops.json")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile baselines")
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    parser.add_argument("--priors", action="store_true",
                        help="seed with the target's shipped priors too (a shape measured there is then not "
                             "tuned from scratch: rows say which seeds they had)")
    parser.add_argument("--target", default="h200", help="the hwprofile (h200, h100, ...): its floors and priors")
    parser.add_argument("--case-seconds", type=float, default=45.0, help="search time limit per case")
    parser.add_argument("--budget-seconds", type=float, default=480.0, help="start no case after this")
    args = parser.parse_args()

    target = load_target(args.target)
    backend = get_backend(target)
    fingerprint = backend.fingerprint()
    work = Path(tempfile.mkdtemp(prefix="bench-ops-"))
    runner = InProcessRunner(backend)
    measure = MeasureOptions(warmup=5, repeats=args.repeats if not args.smoke else 3, input_sets=3)
    gate = GateOptions(seeds=(11, 23))
    # seeds each case with the nearest tuned shapes' best; the shipped priors only with --priors
    catalog = TaskCatalog(work / "tasks.jsonl", priors_for(target) if args.priors else ())
    log = RecordLog(work / "records.jsonl")
    rows: list[dict[str, Any]] = []
    chosen = suites(args.smoke)
    run_started = time.time()
    tune_options = TuneOptions(target=target.name)  # a float32 task keeps float32 accuracy, as in a tune
    for suite in args.suite.split(","):
        for name, task in chosen[suite]:
            if args.filter and args.filter not in name:
                continue
            if time.time() - run_started > args.budget_seconds:
                print(f"{name}: skipped (run budget of {args.budget_seconds:.0f} s spent)", flush=True)
                continue
            floor = floor_seconds(task, target)
            started = time.time()
            variants = [v for v in backend.variants(task) if variant_admitted(v, task, tune_options)]
            nearest = catalog.nearest(task, log, {v.name: v for v in variants})
            catalog.add(task)
            result = search_workload(
                task, variants, runner, storage=f"sqlite:///{work / 'study.db'}",
                seeds=nearest, log=log, store=ArtifactStore(work / "artifacts"),
                floor_seconds=floor, backend=backend.name, gate=gate, measure=measure,
                options=SearchOptions(trials=args.trials, patience=max(8, args.trials // 2),
                                      deadline=time.time() + args.case_seconds))
            tune_s = time.time() - started
            statuses: dict[str, int] = {}
            for record in result.records:
                statuses[record.status] = statuses.get(record.status, 0) + 1
            row: dict[str, Any] = {"case": name, "suite": suite, "task": task.describe(), "flops": task.flops,
                                   "seeds_from_nearest_shapes": [[c.variant.name, c.params] for c in nearest],
                                   "min_bytes": task.min_bytes, "floor_seconds": floor, "tune_seconds": tune_s,
                                   "trials": result.measured, "statuses": statuses,
                                   "stop_reason": result.stop_reason, "variants": [v.name for v in variants],
                                   "failures": [[r.variant, r.config, r.status, r.reason[:300]]
                                                for r in result.records if r.status != "ok"]}
            sets = device_inputs(backend, task, 3)
            timings: dict[str, float] = {}
            if result.best is not None and result.artifact is not None:
                program = backend.load(result.artifact, task)
                measured = time_program(backend, program, task, measure, inputs=sets)
                timings["portkern"] = measured.median
                row.update(variant=result.best.variant, config=result.best.config,
                           portkern_spread=measured.spread, registers=result.best.artifact_meta)
            eager = baselines.for_task(task)
            if eager is not None:
                timings["torch_eager"] = statistics.median(time_callable(backend, eager, sets, measure.repeats))
                if not args.no_compile and not args.smoke:
                    try:
                        compiled = torch.compile(eager)
                        timings["torch_compile"] = statistics.median(
                            time_callable(backend, compiled, sets, measure.repeats))
                    except Exception as exc:  # report, do not hide
                        row["torch_compile_error"] = f"{type(exc).__name__}: {exc}"[:300]
            row["seconds"] = timings
            row["rates"] = {k: rate(task, v, target) for k, v in timings.items()}
            row["floor_fraction"] = {k: floor / v for k, v in timings.items()}
            if "portkern" in timings:
                row["speedup"] = {k: v / timings["portkern"] for k, v in timings.items() if k != "portkern"}
            rows.append(row)
            speed = ", ".join(f"{k} {v:.2f}x" for k, v in row.get("speedup", {}).items())
            print(f"{name:34s} " + "  ".join(f"{k}={v * 1e6:9.1f}us ({row['rates'][k]}, {row['floor_fraction'][k]:.0%} floor)"
                                              for k, v in timings.items())
                  + f"  | portkern vs: {speed} | {result.measured} trials {tune_s:.0f}s {statuses}", flush=True)
            document = _document(args, fingerprint, backend.timing_method, rows)
            Path(args.out).write_text(json.dumps(document, indent=1, default=str))
    return 0


def _document(args: argparse.Namespace, fingerprint: dict[str, str], timing: str,
              rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"benchmark": "portkern op-level, tuned by portkern's search per shape",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "command": " ".join(sys.argv), "device": fingerprint, "host": platform.node(),
            "python": platform.python_version(), "torch": torch.__version__,
            "method": f"{timing}; median of N runs after warm-up; 3 rotating input sets; all runners "
                      "timed in the same process, same inputs",
            "rows": rows}


if __name__ == "__main__":
    sys.exit(main())
