"""Tiny HuggingFace causal LMs built from their config classes (random weights, no
download), and their `torch.export` with a dynamic sequence length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads lazily: `ad-opt file.mlir` should not pay 1.7 s for it
    import torch

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


def build_model(cfg: TinyConfig) -> torch.nn.Module:
    import torch
    import transformers

    config_name, model_name = FAMILIES[cfg.family]
    heads = cfg.hidden_size // cfg.head_dim
    config = getattr(transformers, config_name)(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=2 * cfg.hidden_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        head_dim=cfg.head_dim,
        max_position_embeddings=4096,
        use_cache=False,
    )
    torch.manual_seed(cfg.seed)
    model = getattr(transformers, model_name)(config)
    with torch.no_grad():  # HF initializes biases (Qwen2's Q/K/V) to zero: a wrong bias would go unseen
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(std=0.02)
    return model.eval().to(getattr(torch, cfg.dtype))


def example_input_ids(cfg: TinyConfig, seq_len: int, seed: int = 1) -> torch.Tensor:
    import torch

    return torch.randint(0, cfg.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(seed))


def export_model(
    model: torch.nn.Module, cfg: TinyConfig, seq_len: int = 8, decompose: bool = False
) -> torch.export.ExportedProgram:
    """Export `model(input_ids=...)` with a dynamic sequence length, under no_grad
    (inference graphs; no grad-mode wrappers)."""
    import torch

    seq = torch.export.Dim("seq", min=2, max=4096)
    with torch.no_grad():
        ep = torch.export.export(
            model,
            (),
            {"input_ids": example_input_ids(cfg, seq_len)},
            dynamic_shapes={"input_ids": {1: seq}},
            strict=False,
        )
        return ep.run_decompositions() if decompose else ep
