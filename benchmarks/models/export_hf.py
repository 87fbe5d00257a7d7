"""Real architectures that portkern's tests never see: small transformers models (random init)
exported to ONNX the way users export them, for tune_models.py and `portkern tune`.

    python benchmarks/models/export_hf.py --out /tmp/hf-models
    python benchmarks/models/tune_models.py --target cpu --models /tmp/hf-models/gpt2.onnx,...

gpt2: GPT2LMHeadModel, 2 layers, 256 wide, 4 heads, vocab 2000, 1x64 tokens (causal mask built in
the graph, GELU written out with Pow and Tanh). vit: ViTModel, 2 layers, 192 wide, 3 heads, 224 px
in 16 px patches (197 tokens). mobilenet_v2: MobileNetV2Model at depth multiplier 0.5 (depthwise
convs, ReLU6). convnext: ConvNextModel, depths 1-1-2-1, widths 48-384 (7x7 depthwise convs,
channels-last LayerNorm, GELU). Each is eager attention, opset 17, the legacy exporter.
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import transformers


class _Field(torch.nn.Module):
    """One named field of a transformers output, as a plain tensor for the exporter."""

    def __init__(self, model: torch.nn.Module, field: str) -> None:
        super().__init__()
        self.model, self.field = model, field

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(*args), self.field)


def _eager(config: Any) -> Any:
    config._attn_implementation = "eager"  # plain ONNX ops, no fused SDPA
    return config


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...], str, str]]] = {
    "gpt2": lambda: (_Field(transformers.GPT2LMHeadModel(_eager(transformers.GPT2Config(
        n_layer=2, n_embd=256, n_head=4, vocab_size=2000, n_positions=256))), "logits"),
        (torch.randint(0, 2000, (1, 64)),), "input_ids", "logits"),
    "vit": lambda: (_Field(transformers.ViTModel(_eager(transformers.ViTConfig(
        hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768))),
        "last_hidden_state"), (torch.randn(1, 3, 224, 224),), "pixel_values", "last_hidden_state"),
    "mobilenet_v2": lambda: (_Field(transformers.MobileNetV2Model(transformers.MobileNetV2Config(
        depth_multiplier=0.5)), "pooler_output"), (torch.randn(1, 3, 224, 224),), "pixel_values", "pooled"),
    "convnext": lambda: (_Field(transformers.ConvNextModel(transformers.ConvNextConfig(
        depths=[1, 1, 2, 1], hidden_sizes=[48, 96, 192, 384])), "pooler_output"),
        (torch.randn(1, 3, 224, 224),), "pixel_values", "pooled"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for NAME.onnx")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        torch.manual_seed(0)
        module, inputs, input_name, output_name = MODELS[name]()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer notes
            torch.onnx.export(module.eval(), inputs, str(out / f"{name}.onnx"), input_names=[input_name],
                              output_names=[output_name], opset_version=17, dynamo=False)
        print(f"wrote {out / f'{name}.onnx'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
