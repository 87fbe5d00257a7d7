"""Real architectures that portkern's tests never see: small transformers models (random init)
exported to ONNX the way users export them, for tune_models.py and `portkern tune`.

    python benchmarks/models/export_hf.py --out /tmp/hf-models
    python benchmarks/models/tune_models.py --target cpu --models /tmp/hf-models/gpt2.onnx,...

gpt2: GPT2LMHeadModel, 2 layers, 256 wide, 4 heads, vocab 2000, 1x64 tokens (causal mask built in
the graph, GELU written out with Pow and Tanh). vit: ViTModel, 2 layers, 192 wide, 3 heads, 224 px
in 16 px patches (197 tokens). mobilenet_v2: MobileNetV2Model at depth multiplier 0.5 (depthwise
convs, ReLU6). convnext: ConvNextModel, depths 1-1-2-1, widths 48-384 (7x7 depthwise convs,
channels-last LayerNorm, GELU). llama: LlamaForCausalLM, 2 layers, 256 wide, 4 query heads sharing 2
key/value heads, 1x64 tokens (RMSNorm written out, rotary embeddings, SiLU-gated MLP). whisper:
WhisperModel's encoder, 2 layers, 192 wide, 80 mel bins x 3000 frames (two Conv1d, GELU).
swin: SwinModel, depths 2-2, 48 wide, 224 px (windowed attention with a relative position bias,
shifted windows, patch merging). distilbert: DistilBertModel, 2 layers, 256 wide, 1x128 tokens.
clip_text: CLIPTextModel, 2 layers, 256 wide, 1x77 tokens (causal, quick GELU). efficientnet:
EfficientNetModel at B0's width and depth (depthwise convs, SiLU, squeeze-excite; its pooler is
AvgPool2d(1280, ceil_mode=True) over a 7x7 map). deberta: DebertaV2Model, 2 layers, 256 wide, 1x128
tokens (heads merged into the batch, masked fill by Where). gpt_neox: GPTNeoXForCausalLM, 2 layers,
256 wide, rotary on a quarter of each head, parallel attention and MLP. bloom: BloomForCausalLM, 2
layers, 256 wide (ALiBi added to merged-head scores). qwen2: Qwen2ForCausalLM, 2 layers, 256 wide,
4 query heads sharing 2 key/value heads, biased q/k/v projections. Smaller checks of coverage (2
layers, 256 wide unless said): gemma (one key/value head, GeGLU), phi (partial rotary, parallel
block), mistral (sliding window), gpt_bigcode (multi-query), opt, falcon; dinov2, beit (relative
position bias) at 192 wide; mobilevit (default config, 256 px); hubert (Conv1d feature extractor, 1 s
of audio); albert (shared layers, factorized embedding); t5 (T5EncoderModel: relative position buckets,
RMS-style norm, no biases), bart (encoder and decoder, 1x64 tokens), mpnet (relative position bias),
convbert (span-based dynamic convolution beside attention), squeezebert (1x1 Conv1d projections),
wav2vec2, segformer (attention over a strided-conv reduced sequence, depthwise conv in the MLP) and
swinv2 (scaled cosine attention, log-spaced position MLP) at 224 px, levit (attention with biases,
BatchNorm'd linears), poolformer (pooling as the token mixer, GroupNorm), regnet (grouped convs,
squeeze-excite). Decoders at 2 layers, 256 wide: gptj and codegen (columns rotated in pairs on a
quarter of each head, parallel block), phi3 (fused q/k/v and gate/up projections), qwen3 (RMSNorm of
each head's q and k), gemma2 (tanh soft-capped attention logits), stablelm (a quarter of each head
rotated, LayerNorm); roformer (BERT-like, sinusoidal positions rotated in pairs), funnel (the
sequence pooled between blocks, relative attention), convnextv2 (global response normalization).
More decoders at 2 layers, 256 wide: olmo (LayerNorm without parameters), olmo2 (RMSNorm of q and k
over all heads), starcoder2, granite (embedding, attention, residual and logit multipliers), nemotron
(squared ReLU, LayerNorm with weight + 1), persimmon (LayerNorm of each head's q and k), biogpt, xglm
(scores clamped at float32's lowest by Max, probabilities viewed 4-D and back), mpt (ALiBi); and
mobilebert (bottlenecks, NoNorm), electra, deit at 192 wide, resnet (depths 1-1-1-1), bit (Big
Transfer: GroupNorm of 32 groups then ReLU before each weight-standardized conv, depths 1-1-1-1).
With --models sd_unet (needs diffusers): a small Stable Diffusion UNet (_sd_unet). Cohere's and
Mixtral's exports fail in the legacy exporter itself (a shape assertion; aten::histc), so they are not here.
Each is eager attention, opset 17, the legacy exporter (--dynamo: torch.onnx.export's default exporter, needs
onnxscript; --opset picks its opset, 23 fusing RMSNorm and SDPA into their ops).
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


_SMALL_DECODER = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 688,
                  "vocab_size": 2000}


def _eager(config: Any) -> Any:
    config._attn_implementation = "eager"  # plain ONNX ops, no fused SDPA
    return config


def calibrate_batch_norms(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.nn.Module:
    """The module with each BatchNorm's running statistics those of its own inputs on `inputs` (one
    forward in training mode, cumulative averages), in eval mode, and its affine as a trained
    network's (weight 1 + N(0, 0.1), bias N(0, 0.1)). transformers' random init draws weights with
    std 0.02 (EfficientNet's BatchNorm weights too) and leaves the statistics at mean 0, variance 1:
    without this MobileNetV2's, EfficientNet's, MobileViT's and LeViT's outputs shrink layer by layer
    to 0 (EfficientNet's to 1e-30 with the statistics alone), and a comparison against them is empty."""
    norms = [layer for layer in module.modules() if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        generator = torch.Generator().manual_seed(0)
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None  # a cumulative average
            if norm.affine:
                with torch.no_grad():
                    norm.weight.copy_(1.0 + 0.1 * torch.randn(norm.weight.shape, generator=generator))
                    norm.bias.copy_(0.1 * torch.randn(norm.bias.shape, generator=generator))
        with torch.no_grad():
            module.train()(*inputs)
    return module.eval()


Entry = tuple[torch.nn.Module, tuple[torch.Tensor, ...], str, str]  # module, inputs, input and output names


def _tokens(model: torch.nn.Module, length: int = 128, field: str = "last_hidden_state") -> Entry:
    """A text model's entry: 1 x length token ids in, one output field out."""
    return _Field(model, field), (torch.randint(0, 2000, (1, length)),), "input_ids", field


def _decoder(model: torch.nn.Module) -> Entry:
    return _tokens(model, 64, "logits")


def _pixels(model: torch.nn.Module, field: str = "last_hidden_state", size: int = 224) -> Entry:
    """An image model's entry: one size x size RGB image in; a pooler output is named "pooled"."""
    return (_Field(model, field), (torch.randn(1, 3, size, size),), "pixel_values",
            "pooled" if field == "pooler_output" else field)


def _audio(model: torch.nn.Module) -> Entry:
    """An audio encoder's entry: 1 s of 16 kHz samples in."""
    return _Field(model, "last_hidden_state"), (torch.randn(1, 16000),), "input_values", "last_hidden_state"


class _UNetSample(torch.nn.Module):
    """A diffusers UNet's denoised sample for (sample, timestep, the text encoder's states)."""

    def __init__(self, unet: torch.nn.Module) -> None:
        super().__init__()
        self.unet = unet

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        return self.unet(sample, timestep, encoder_hidden_states=states).sample


def _sd_unet() -> Entry:
    """diffusers' UNet2DConditionModel (Stable Diffusion's), two blocks 64/128 wide, 32 groups, cross-
    attention to 77 states of width 64; batch 2 (classifier-free guidance), 32x32 latents. Needs
    diffusers (pip install diffusers), which portkern does not: not among the default models."""
    try:
        import diffusers
    except ImportError as error:
        raise SystemExit(f"sd_unet needs diffusers ({error}): pip install diffusers") from None
    unet = diffusers.UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(64, 128),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=64, attention_head_dim=8, norm_num_groups=32)
    return (_UNetSample(unet), (torch.randn(2, 4, 32, 32), torch.tensor([10, 10]), torch.randn(2, 77, 64)), "sample",
            "denoised")


OPTIONAL = {"sd_unet": _sd_unet}  # models whose library portkern does not install (--models names them)
MODELS: dict[str, Callable[[], Entry]] = {
    "gpt2": lambda: _decoder(transformers.GPT2LMHeadModel(_eager(transformers.GPT2Config(
        n_layer=2, n_embd=256, n_head=4, vocab_size=2000, n_positions=256)))),
    "vit": lambda: _pixels(transformers.ViTModel(_eager(transformers.ViTConfig(
        hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768)))),
    "mobilenet_v2": lambda: _pixels(transformers.MobileNetV2Model(transformers.MobileNetV2Config(
        depth_multiplier=0.5)), "pooler_output"),
    "convnext": lambda: _pixels(transformers.ConvNextModel(transformers.ConvNextConfig(
        depths=[1, 1, 2, 1], hidden_sizes=[48, 96, 192, 384])), "pooler_output"),
    "llama": lambda: _decoder(transformers.LlamaForCausalLM(_eager(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=688, vocab_size=2000, max_position_embeddings=256)))),
    "whisper": lambda: (_Field(transformers.WhisperModel(_eager(transformers.WhisperConfig(
        d_model=192, encoder_layers=2, decoder_layers=1, encoder_attention_heads=3, decoder_attention_heads=3,
        encoder_ffn_dim=768, decoder_ffn_dim=768, vocab_size=2000, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1))).get_encoder(), "last_hidden_state"),
        (torch.randn(1, 80, 3000),), "input_features", "last_hidden_state"),
    "swin": lambda: _pixels(transformers.SwinModel(_eager(transformers.SwinConfig(
        embed_dim=48, depths=[2, 2], num_heads=[3, 6]))), "pooler_output"),
    "distilbert": lambda: _tokens(transformers.DistilBertModel(_eager(transformers.DistilBertConfig(
        n_layers=2, dim=256, n_heads=4, hidden_dim=1024, vocab_size=2000)))),
    "clip_text": lambda: _tokens(transformers.CLIPTextModel(_eager(transformers.CLIPTextConfig(
        hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, vocab_size=2000,
        max_position_embeddings=77, bos_token_id=0, eos_token_id=2))), 77),
    "efficientnet": lambda: _pixels(transformers.EfficientNetModel(transformers.EfficientNetConfig(
        image_size=224, width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280)), "pooler_output"),
    "deberta": lambda: _tokens(transformers.DebertaV2Model(_eager(transformers.DebertaV2Config(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, vocab_size=2000)))),
    "gpt_neox": lambda: _decoder(transformers.GPTNeoXForCausalLM(_eager(transformers.GPTNeoXConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, vocab_size=2000,
        rotary_pct=0.25)))),
    "bloom": lambda: _decoder(transformers.BloomForCausalLM(_eager(transformers.BloomConfig(
        hidden_size=256, n_layer=2, n_head=4, vocab_size=2000)))),
    "qwen2": lambda: _decoder(transformers.Qwen2ForCausalLM(_eager(transformers.Qwen2Config(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=688,
        vocab_size=2000, max_position_embeddings=256)))),
    "gemma": lambda: _decoder(transformers.GemmaForCausalLM(_eager(transformers.GemmaConfig(
        **_SMALL_DECODER, num_key_value_heads=1, head_dim=64)))),
    "phi": lambda: _decoder(transformers.PhiForCausalLM(_eager(transformers.PhiConfig(**_SMALL_DECODER)))),
    "mistral": lambda: _decoder(transformers.MistralForCausalLM(_eager(transformers.MistralConfig(
        **_SMALL_DECODER, num_key_value_heads=2, sliding_window=32)))),
    "gpt_bigcode": lambda: _decoder(transformers.GPTBigCodeForCausalLM(_eager(transformers.GPTBigCodeConfig(
        n_embd=256, n_layer=2, n_head=4, vocab_size=2000, multi_query=True)))),
    "opt": lambda: _decoder(transformers.OPTForCausalLM(_eager(transformers.OPTConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, ffn_dim=1024, vocab_size=2000,
        word_embed_proj_dim=256)))),
    "falcon": lambda: _decoder(transformers.FalconForCausalLM(_eager(transformers.FalconConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, vocab_size=2000)))),
    "dinov2": lambda: _pixels(transformers.Dinov2Model(_eager(transformers.Dinov2Config(
        hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768)))),
    "beit": lambda: _pixels(transformers.BeitModel(_eager(transformers.BeitConfig(
        hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
        use_relative_position_bias=True)))),
    "mobilevit": lambda: _pixels(transformers.MobileViTModel(_eager(transformers.MobileViTConfig())), "pooler_output",
                                 256),
    "hubert": lambda: _audio(transformers.HubertModel(_eager(transformers.HubertConfig(
        hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768)))),
    "albert": lambda: _tokens(transformers.AlbertModel(_eager(transformers.AlbertConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, vocab_size=2000,
        embedding_size=128)))),
    "t5": lambda: _tokens(transformers.T5EncoderModel(_eager(transformers.T5Config(
        d_model=256, d_kv=64, d_ff=1024, num_layers=2, num_heads=4, vocab_size=2000)))),
    "bart": lambda: _tokens(transformers.BartModel(_eager(transformers.BartConfig(
        d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=2000, max_position_embeddings=256))), 64),
    "mpnet": lambda: _tokens(transformers.MPNetModel(_eager(transformers.MPNetConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, vocab_size=2000)))),
    "convbert": lambda: _tokens(transformers.ConvBertModel(_eager(transformers.ConvBertConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, vocab_size=2000,
        embedding_size=256)))),
    "squeezebert": lambda: _tokens(transformers.SqueezeBertModel(transformers.SqueezeBertConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, vocab_size=2000,
        embedding_size=256))),
    "wav2vec2": lambda: _audio(transformers.Wav2Vec2Model(_eager(transformers.Wav2Vec2Config(
        hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768)))),
    "segformer": lambda: _pixels(transformers.SegformerModel(transformers.SegformerConfig(
        depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 160, 256]))),
    "swinv2": lambda: _pixels(transformers.Swinv2Model(_eager(transformers.Swinv2Config(
        embed_dim=48, depths=[2, 2], num_heads=[2, 4])))),
    "levit": lambda: _pixels(transformers.LevitModel(transformers.LevitConfig())),
    "poolformer": lambda: _pixels(transformers.PoolFormerModel(transformers.PoolFormerConfig(depths=[1, 1, 2, 1]))),
    "regnet": lambda: _pixels(transformers.RegNetModel(transformers.RegNetConfig()), "pooler_output"),
    "gptj": lambda: _decoder(transformers.GPTJForCausalLM(_eager(transformers.GPTJConfig(
        n_embd=256, n_layer=2, n_head=4, rotary_dim=32, vocab_size=2000, n_positions=256)))),
    "codegen": lambda: _decoder(transformers.CodeGenForCausalLM(_eager(transformers.CodeGenConfig(
        n_embd=256, n_layer=2, n_head=4, rotary_dim=32, vocab_size=2000, n_positions=256, n_ctx=256)))),
    "phi3": lambda: _decoder(transformers.Phi3ForCausalLM(_eager(transformers.Phi3Config(
        **_SMALL_DECODER, num_key_value_heads=2, pad_token_id=0)))),
    "qwen3": lambda: _decoder(transformers.Qwen3ForCausalLM(_eager(transformers.Qwen3Config(
        **_SMALL_DECODER, num_key_value_heads=2, head_dim=64)))),
    "gemma2": lambda: _decoder(transformers.Gemma2ForCausalLM(_eager(transformers.Gemma2Config(
        **_SMALL_DECODER, num_key_value_heads=2, head_dim=64)))),
    "stablelm": lambda: _decoder(transformers.StableLmForCausalLM(_eager(transformers.StableLmConfig(
        **_SMALL_DECODER, num_key_value_heads=2)))),
    "roformer": lambda: _tokens(transformers.RoFormerModel(_eager(transformers.RoFormerConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, vocab_size=2000)))),
    "funnel": lambda: _tokens(transformers.FunnelBaseModel(transformers.FunnelConfig(
        block_sizes=[1, 1], d_model=256, n_head=4, d_head=64, d_inner=1024, vocab_size=2000))),
    "convnextv2": lambda: _pixels(transformers.ConvNextV2Model(transformers.ConvNextV2Config(
        depths=[1, 1, 2, 1], hidden_sizes=[48, 96, 192, 384])), "pooler_output"),
    "olmo": lambda: _decoder(transformers.OlmoForCausalLM(_eager(transformers.OlmoConfig(
        **_SMALL_DECODER, num_key_value_heads=2, pad_token_id=0)))),
    "olmo2": lambda: _decoder(transformers.Olmo2ForCausalLM(_eager(transformers.Olmo2Config(
        **_SMALL_DECODER, num_key_value_heads=2, pad_token_id=0)))),
    "starcoder2": lambda: _decoder(transformers.Starcoder2ForCausalLM(_eager(transformers.Starcoder2Config(
        **_SMALL_DECODER, num_key_value_heads=2)))),
    "granite": lambda: _decoder(transformers.GraniteForCausalLM(_eager(transformers.GraniteConfig(
        **_SMALL_DECODER, num_key_value_heads=2, embedding_multiplier=12.0, attention_multiplier=0.015625,
        residual_multiplier=0.22, logits_scaling=8.0)))),
    "nemotron": lambda: _decoder(transformers.NemotronForCausalLM(_eager(transformers.NemotronConfig(
        **_SMALL_DECODER, num_key_value_heads=2, pad_token_id=0)))),
    "persimmon": lambda: _decoder(transformers.PersimmonForCausalLM(_eager(transformers.PersimmonConfig(
        **_SMALL_DECODER, pad_token_id=0)))),
    "biogpt": lambda: _decoder(transformers.BioGptForCausalLM(_eager(transformers.BioGptConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, vocab_size=2000)))),
    "xglm": lambda: _decoder(transformers.XGLMForCausalLM(_eager(transformers.XGLMConfig(
        d_model=256, num_layers=2, attention_heads=4, ffn_dim=1024, vocab_size=2000)))),
    "mobilebert": lambda: _tokens(transformers.MobileBertModel(_eager(transformers.MobileBertConfig(
        num_hidden_layers=2, vocab_size=2000)))),
    "electra": lambda: _tokens(transformers.ElectraModel(_eager(transformers.ElectraConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, vocab_size=2000)))),
    "deit": lambda: _pixels(transformers.DeiTModel(_eager(transformers.DeiTConfig(
        hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768)))),
    "resnet": lambda: _pixels(transformers.ResNetModel(transformers.ResNetConfig(depths=[1, 1, 1, 1])), "pooler_output"),
    "mpt": lambda: _decoder(transformers.MptForCausalLM(_eager(transformers.MptConfig(
        d_model=256, n_layers=2, n_heads=4, vocab_size=2000)))),
    "bit": lambda: _pixels(transformers.BitModel(transformers.BitConfig(depths=[1, 1, 1, 1])), "pooler_output"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for NAME.onnx")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated (default: all but {', '.join(OPTIONAL)})")
    parser.add_argument("--dynamo", action="store_true",
                        help="torch's dynamo exporter (torch.onnx.export's default; needs onnxscript) instead of the "
                             "legacy one: fused ops (opset 23: RMSNormalization, Attention) and its own op forms")
    parser.add_argument("--opset", type=int, default=None, help="opset (default: 17, or the dynamo exporter's own)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16"),
                        help="the weights' and float inputs' dtype (float16: as a GPU user exports; its casts "
                             "around softmax and norms are what partition has to see through)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    for name in args.models.split(","):
        torch.manual_seed(0)
        module, inputs, input_name, output_name = {**MODELS, **OPTIONAL}[name]()
        module = calibrate_batch_norms(module, inputs).to(dtype)
        inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer notes
            try:
                torch.onnx.export(module.eval(), inputs, str(out / f"{name}.onnx"), input_names=[input_name],
                                  output_names=[output_name], dynamo=args.dynamo,
                                  **({"opset_version": args.opset or 17} if not args.dynamo or args.opset else {}))
            except Exception as error:  # an exporter's own failure: say so and go on with the others
                print(f"{name}: the exporter failed: {type(error).__name__}: {str(error)[:300]}")
                continue
        print(f"wrote {out / f'{name}.onnx'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
