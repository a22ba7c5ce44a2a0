"""`LLM`: a causal LM compiled with K/V caches, answering prompts (in the shape of vLLM's and
TensorRT-LLM's `LLM`).

The model is exported with `input_ids` and `position_ids` [batch, seq] (both dynamic), compiled
with `insert-cached-attention` in the pipeline, and the one compiled graph serves both phases:

- prefill: one prompt at a time (batch 1, seq = its length, start 0) in the slot it was given,
  so ragged prompts cost no padding;
- decode: every running sequence at once (batch = running, seq 1), each row with its own slot and
  cached length, position = cached length.

The caches are allocated once ([max_batch slots, max_seq_len tokens, kv_heads, head_dim] per layer
and role). A finished sequence (EOS or max_new_tokens) frees its slot for the next prompt in the
queue; a slot is only read up to what its current sequence wrote, so a reused slot starts clean.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from xdsl.dialects import func

from ad_mlir.dialects import ad

log = logging.getLogger(__name__)


@dataclass
class GenerationOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    """The new tokens only."""
    text: str | None = None
    """The new tokens decoded (None without a tokenizer)."""
    finish_reason: str = ""
    """"stop" (EOS) or "length" (max_new_tokens)."""


@dataclass
class _Running:
    index: int
    slot: int
    output: GenerationOutput
    cached: int
    """Tokens the slot holds for this sequence."""


@dataclass(frozen=True)
class CacheArgument:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def cached_pipeline(pipeline: str, max_batch: int, max_seq_len: int) -> str:
    """`pipeline` with `insert-cached-attention`: in `default`, after the LLM fusions and before
    the elementwise fusion (the dropped mask's ops are then gone before regions form)."""
    from ad_mlir.passes.pipeline import resolve_pipeline

    spec = resolve_pipeline(pipeline)
    insert = f"insert-cached-attention{{max-batch={max_batch} max-seq-len={max_seq_len}}}"
    if spec == resolve_pipeline("default"):
        return spec.replace("decompose,", f"{insert},decompose,")
    return f"{spec},{insert}" if spec else insert


def export_for_cache(model: torch.nn.Module, max_batch: int, max_seq_len: int) -> torch.export.ExportedProgram:
    """`model(input_ids=, position_ids=, use_cache=False)` with batch and sequence dynamic, under
    no_grad (HF's own cache off: the compiled graph has ours), with inputs on the model's device."""
    from ad_mlir.models import export_inference

    device = model_device(model)
    ids = torch.zeros(2, 3, dtype=torch.int64, device=device)
    positions = torch.arange(3, device=device).expand(2, 3)
    batch = torch.export.Dim("batch", min=1, max=max(max_batch, 2))
    seq = torch.export.Dim("seq", min=1, max=max_seq_len)
    dims = {0: batch, 1: seq}
    return export_inference(model, {"input_ids": ids, "position_ids": positions, "use_cache": False},
                            {"input_ids": dims, "position_ids": dims, "use_cache": None})


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's weights are (its inputs and caches go there too)."""
    return next(model.parameters()).device


def cache_arguments(fn: func.FuncOp) -> list[CacheArgument]:
    """The K/V cache arguments of a cached function, in order."""
    from ad_mlir.frontends.op_table import torch_dtype

    caches = []
    for arg, attrs in zip(fn.body.block.args, fn.arg_attrs.data, strict=True):
        if ad.KV_CACHE_ATTR in attrs.data:
            caches.append(CacheArgument(attrs.data[ad.INPUT_ATTR].data, tuple(arg.type.get_shape()),
                                        torch_dtype(arg.type.element_type)))
    return caches


class LLM:
    """A causal LM compiled by ad-mlir with K/V caches.

    `model`: an HF causal-LM module, a built-in tiny family name (`llama`, ...), `smollm2`
    (the packaged SmolLM2-135M-Instruct) or a checkpoint path (a directory with config.json, or a
    .gguf file); see `ad_mlir.models.load_causal_lm`."""

    def __init__(self, model: torch.nn.Module | str, max_batch: int = 4, max_seq_len: int = 512,
                 pipeline: str = "default", tokenizer: Any = None) -> None:
        from ad_mlir.compiler import compile_program
        from ad_mlir.models import load_causal_lm

        if isinstance(model, str):
            model, loaded_tokenizer = load_causal_lm(model)
            tokenizer = tokenizer or loaded_tokenizer
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        start = time.perf_counter()
        ep = export_for_cache(self.model, max_batch, max_seq_len)
        self.graph, program = compile_program(ep, pipeline=cached_pipeline(pipeline, max_batch, max_seq_len))
        self.compile_seconds = time.perf_counter() - start
        fn = next(op for op in program.module.ops if isinstance(op, func.FuncOp))
        self.device = model_device(self.model)
        self.caches = {c.name: torch.zeros(c.shape, dtype=c.dtype, device=self.device) for c in cache_arguments(fn)}
        if not self.caches:
            raise ValueError("the compiled model has no attention to cache (see the insert-cached-attention log)")
        self.inputs = [n.name for n in self.graph.graph.nodes if n.op == "placeholder"]
        self.eos = _eos_ids(self.model, tokenizer)
        log.info("LLM: compiled in %.1f s; %d caches of %s, %.1f MiB in all (%d slots x %d tokens)",
                 self.compile_seconds, len(self.caches), next(iter(self.caches.values())).shape,
                 sum(c.numel() * c.element_size() for c in self.caches.values()) / 2**20, max_batch, max_seq_len)

    # -- one step of the compiled graph ------------------------------------------------

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, slots: Sequence[int],
             starts: Sequence[int]) -> torch.Tensor:
        """Run the graph on `tokens`/`positions` [batch, seq] for sequences in `slots` whose
        caches hold `starts` tokens; returns the logits [batch, seq, vocab]."""
        metadata = {"cache_slots": slots, "cache_starts": starts}
        given = {"input_ids": tokens.to(self.device), "position_ids": positions.to(self.device),
                 **{name: torch.tensor(list(v), dtype=torch.int64, device=self.device) for name, v in metadata.items()},
                 "use_cache": False, **self.caches}
        with torch.no_grad():
            return self.graph(*(given[name] for name in self.inputs))[0]

    # -- generation ----------------------------------------------------------------------

    def generate(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 32, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, chat: bool = False,
                 ignore_eos: bool = False) -> list[GenerationOutput]:
        """One output per prompt (a string, tokenized with the model's tokenizer, under its chat
        template with `chat`; or token ids). Greedy when `temperature` is 0, else sampled with
        `top_p` nucleus filtering from a generator seeded with `seed`. With `ignore_eos` every
        sequence runs to `max_new_tokens` (benchmarks)."""
        token_lists = [self._tokenize(p, chat) for p in prompts]
        for i, ids in enumerate(token_lists):
            if not ids:
                raise ValueError(f"prompt {i} is empty")
            if len(ids) + max_new_tokens > self.max_seq_len:
                raise ValueError(f"prompt {i} has {len(ids)} tokens: with max_new_tokens={max_new_tokens} it needs "
                                 f"{len(ids) + max_new_tokens} > max_seq_len={self.max_seq_len} cache positions")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        stop = set() if ignore_eos else self.eos
        outputs = [GenerationOutput(list(ids)) for ids in token_lists]
        queue = deque(range(len(token_lists)))
        free = list(range(self.max_batch))
        running: list[_Running] = []
        while queue or running:
            while queue and free:  # prefill the next prompt in a free slot
                index = queue.popleft()
                seq = _Running(index, free.pop(0), outputs[index], len(outputs[index].prompt_token_ids))
                ids = torch.tensor([seq.output.prompt_token_ids])
                logits = self.step(ids, torch.arange(seq.cached)[None], [seq.slot], [0])
                self._append(seq, logits[0, -1], temperature, top_p, generator, max_new_tokens, stop)
                if seq.output.finish_reason:
                    free.insert(0, seq.slot)
                else:
                    running.append(seq)
            if not running:
                continue
            last = torch.tensor([[s.output.token_ids[-1]] for s in running])
            positions = torch.tensor([[s.cached] for s in running])
            logits = self.step(last, positions, [s.slot for s in running], [s.cached for s in running])
            for i, seq in enumerate(running):
                seq.cached += 1
                self._append(seq, logits[i, -1], temperature, top_p, generator, max_new_tokens, stop)
            free += [s.slot for s in running if s.output.finish_reason]
            running = [s for s in running if not s.output.finish_reason]
        if self.tokenizer is not None:
            for out in outputs:
                out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        return outputs

    def _append(self, seq: _Running, logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None, max_new_tokens: int, stop: set[int]) -> None:
        token = sample(logits, temperature, top_p, generator)
        seq.output.token_ids.append(token)
        if token in stop:
            seq.output.finish_reason = "stop"
        elif len(seq.output.token_ids) >= max_new_tokens:
            seq.output.finish_reason = "length"

    def _tokenize(self, prompt: str | Sequence[int], chat: bool) -> list[int]:
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: give prompts as lists of token ids")
        if chat:
            return list(self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                           add_generation_prompt=True, tokenize=True,
                                                           return_dict=False))
        return list(self.tokenizer(prompt)["input_ids"])


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    """Greedy (argmax) at temperature 0; else from softmax(logits / temperature), keeping the
    smallest set of most likely tokens whose probability reaches `top_p`. Runs on the CPU (the
    generator is a CPU one; the token is read on the host anyway)."""
    logits = logits.cpu()
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for source in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids
