"""Tiny HuggingFace causal LMs of the five built-in families, built from their config classes
(random weights, no download)."""

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
    hf_overrides: tuple[tuple[str, Any], ...] = ()
    """HF config fields set after the sizes, e.g. `(("initializer_range", 0.5),)`: random weights
    that wide give varied greedy tokens (the default init often repeats one token)."""

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
    config = hf_config(cfg.family, shape, cfg.layers)
    for name, value in cfg.hf_overrides:
        setattr(config, name, value)
    model = getattr(transformers, FAMILIES[cfg.family][1])(config)
    with torch.no_grad():  # HF initializes biases (Qwen2's Q/K/V) to zero: a wrong bias would go unseen
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(std=0.02)
    return model.eval().to(getattr(torch, cfg.dtype))


def meta_model(family: str, shape: ModelShape, layers: int, dtype: str = "bfloat16") -> torch.nn.Module:
    """A model of real sizes on the meta device: no memory, no initialization. Its graph
    exports and compiles (shapes drive compile time, not values); `to_empty` makes it runnable.
    A built-in family has `shape`'s sizes; any other transformers causal-LM model type has its
    config class's default sizes (for most, those of a released model: Mixtral-8x7B's,
    GPT-2's, Phi-2's)."""
    import torch
    import transformers

    if family in FAMILIES:
        config = hf_config(family, shape, layers)
        model_class = getattr(transformers, FAMILIES[family][1])
    else:
        config = transformers.AutoConfig.for_model(family, num_hidden_layers=layers, use_cache=False)
        model_class = transformers.AutoModelForCausalLM.from_config
    with torch.device("meta"):
        model = model_class(config)
    return model.eval().to(getattr(torch, dtype))


def example_input_ids(cfg: TinyConfig, seq_len: int, seed: int = 1) -> torch.Tensor:
    import torch

    return torch.randint(0, cfg.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(seed))


def random_input_ids(model: torch.nn.Module, seq_len: int, seed: int = 1) -> torch.Tensor:
    """[1, seq_len] token ids within `model`'s vocabulary."""
    import torch

    vocab = model.get_input_embeddings().num_embeddings
    return torch.randint(0, vocab, (1, seq_len), generator=torch.Generator().manual_seed(seed))
