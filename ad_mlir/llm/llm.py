"""`LLM`: a causal LM compiled with K/V caches, answering prompts (in the shape of vLLM's and
TensorRT-LLM's `LLM`).

The model is exported with `input_ids` and `position_ids` [batch, seq] (both dynamic), compiled
with `insert-cached-attention` in the pipeline, and the one compiled graph serves both phases:

- prefill: one prompt at a time (batch 1, seq = its length, start 0) in the slot it was given,
  so ragged prompts cost no padding;
- decode: every running sequence at once (batch = running, seq 1), each row with its own slot and
  cached length, position = cached length.

The caches are allocated once ([max_batch slots, max_seq_len tokens, kv_heads, head_dim] per layer
and role; MLA's latent [max_batch, max_seq_len, kv_lora_rank + rope_dim] per layer; a short
convolution's state [max_batch slots, channels, kernel - 1] and a recurrent scan's fp32 state
(Mamba2's [max_batch, heads, head_dim, state_size], the gated delta rule's [max_batch, value
heads, key dim, value dim]), whose sizes do not grow with the tokens), their sizes given or
decided by a memory budget (`kv_cache_budget`, which counts the per-slot states apart from the
bytes per token: `token_bytes` by layer, `state_bytes`). A finished sequence (EOS or
max_new_tokens) frees its slot for the next prompt in the
queue; a slot is only read up to what its current sequence wrote, so a reused slot starts clean.

The decode step is fit for CUDA graphs (tests/models/test_llm_runtime.py checks the traced graph:
static shapes per batch, no host sync or data-dependent op, caches written in place); on CUDA it
runs as one replayed graph per batch bucket (`CudaGraphDecode`), a batch padded to its bucket.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from ad_mlir.compiler import CompileOptions, compile_program
from ad_mlir.frontends.export import ModuleExport
from ad_mlir.llm.cache_export import cache_arguments, cache_export, model_device
from ad_mlir.llm.cuda_graphs import CudaGraphDecode, CudaGraphFlatDecode, buckets_up_to, pad_to_bucket
from ad_mlir.llm.engine import GenerationOutput, SamplingParams, make_engine
from ad_mlir.llm.piecewise import MAX_PIECEWISE_TOKENS, CudaGraphPiecewise
from ad_mlir.llm.pipelines import cached_pipeline, paged_pipeline, with_capture
from ad_mlir.llm.speculative import Proposer, ReadsHiddenStates
from ad_mlir.passes.cache.interface import KV_CACHE_DTYPES, PerSequenceState
from ad_mlir.runtime.kernels import call_kernels_directly

log = logging.getLogger(__name__)


def cache_layout(llm: LLM) -> str:
    """How `llm`'s K/V cache is laid out, for a log line: pages, or slots."""
    if llm.page_size is not None:
        return f"{llm.num_pages} pages x {llm.page_size} tokens, sequences up to {llm.max_seq_len}"
    return f"{llm.max_batch} slots x {llm.max_seq_len}"


def paged_where_possible(model: torch.nn.Module | str, page_size: int | None, **kwargs: Any) -> LLM:
    """`LLM(model, page_size=page_size, **kwargs)`, the paged form, where it holds the model
    (attention, MLA, per-sequence states: short convolutions, scans, shifts by tokens, with or
    without attention); a model it refuses (`PerSequenceState`: convolutions over a token window,
    DeepSeek sparse attention's indexer, MLA with sink logits) gets the slot form instead, with
    a warning saying why.
    `page_size` None: the slot form."""
    from ad_mlir.zoo.checkpoints import load_causal_lm

    if page_size is None:
        return LLM(model, **kwargs)
    if isinstance(model, str):
        model, tokenizer = load_causal_lm(model)
        kwargs["tokenizer"] = kwargs.get("tokenizer") or tokenizer
    try:
        return LLM(model, page_size=page_size, **kwargs)
    except PerSequenceState as e:
        if kwargs.get("speculative") is not None:
            raise ValueError(f"speculative decoding needs the paged form, which does not hold this model: {e}") from e
        log.warning("LLM: the slot form, not the paged one: %s", e)
        return LLM(model, **kwargs)


DEFAULT_MAX_SEQ_LEN = 512
PROBE_SEQ_LEN = 64
"""Tokens a slot holds in the probe compile that measures what a `kv_cache_budget` buys."""
PROBE_PAGES = 4
"""Pages of the paged form's probe compile that measures what a `kv_cache_budget` buys."""


class LLM:
    """A causal LM compiled by ad-mlir with K/V caches.

    `model`: an HF causal-LM module, a built-in tiny family name (`llama`, ...), `smollm2`
    (the packaged SmolLM2-135M-Instruct) or a checkpoint path (a directory with config.json, or a
    .gguf file); see `ad_mlir.zoo.checkpoints.load_causal_lm`.

    The caches hold `max_batch` slots of `max_seq_len` tokens (default 512). With
    `kv_cache_budget` (bytes as an int; on CUDA also a float in (0, 1], that fraction of the
    device memory left free after one forward pass) the budget decides `max_seq_len` instead:
    `max_batch` slots are kept (they are the decode batch) and each gets an equal share of the
    tokens that fit, at most `max_seq_len` when it is given, else the model's
    `max_position_embeddings`. The shapes are baked into the compiled graph, so the model is
    compiled once with `PROBE_SEQ_LEN`-token slots to measure bytes per token (and, on CUDA, the
    forward's peak), then again at the final size (AutoDeploy's two-phase `resize_kv_cache`).
    `cache_tokens` says how many tokens fit.

    `cuda_graphs` (default: on when the model is on CUDA) runs each decode step as a replayed
    CUDA graph, one per batch bucket (`CudaGraphDecode`).

    The paged form (`page_size` given, a power of two): the model is exported flattened
    (`cache_export(..., flat=True)`: `input_ids`, `position_ids` [1, tokens]) and compiled with
    `insert-cached-attention{paged=true}` (`paged_pipeline`): per layer and role a pool
    [`num_pages`, `page_size`, kv_heads, head_dim] (`num_pages` given, else bought by
    `kv_cache_budget`, else `max_batch` sequences of `max_seq_len` tokens), and `forward_flat`
    runs one step of prefill chunks and decodes of many sequences through their block tables
    (the caller allocates the pages: `generate` runs on the paged scheduler, `make_engine`).
    Per-sequence states (short convolutions, scans) stay per sequence beside the pages: pools of
    `max_batch` state slots (`num_state_slots`), one per running sequence, given to `forward_flat`
    as `state_slots`; `step` and `decode` are the slot form's. With CUDA graphs its decode-only
    steps are replayed per bucket of sequences (`CudaGraphFlatDecode`), hybrids' too, and its other
    steps (prefill chunks, with decodes or not, verified drafts) piecewise per bucket of tokens
    (`CudaGraphPiecewise`: the pieces between the cached mixers replayed, the mixers eager): the
    pool holds one scratch page more (`scratch_page`), and the state pools one scratch slot more
    (`scratch_state_slot`), for the padding rows.

    Tensor parallel: with `shard` in the pipeline (e.g. `canonicalize,shard{world-size=2},default`)
    each rank compiles the same IR, holds its slice of the weights and caches of its local K/V
    heads, and gets the same logits (the all_reduce after each block); `world_size` and `rank`
    default to the initialized process group's.

    How it compiles is `ad_mlir.compile`'s `CompileOptions` (`pipeline`, `verify`, `cache`,
    `world_size`, `rank`), given as `options=` and/or keywords (`LLM(model, pipeline="none")`);
    `insert-cached-attention` is put into the pipeline as a pass object (`cached_pipeline`).

    `kv_cache_dtype` (vLLM's): `auto`, the caches in the model's dtype; `fp8` (or `fp8_e4m3`),
    attention's K/V caches in float8_e4m3fn, half the bytes of bf16's (a `kv_cache_budget` buys
    twice the tokens), quantized with per-tensor scales of 1.0 (K/V entries beyond +-448
    saturate; `insert-cached-attention{kv-cache-dtype=fp8}`); states per sequence keep their
    dtype, and MLA's latent cache is refused (a ValueError naming `kv_cache_dtype`).

    `speculative` (the paged form only): a proposer (`ad_mlir.llm.speculative`: `NgramProposer`,
    `DraftModelProposer`, `ad_mlir.llm.eagle3.Eagle3Proposer`, which has the model compiled to
    return the hidden states it reads) whose drafted tokens `generate` verifies in its steps: the tokens are
    those plain decoding gives (greedy: the same; sampled: the same distribution), in fewer steps
    where drafts are accepted."""

    def __init__(self, model: torch.nn.Module | str, max_batch: int = 4, max_seq_len: int | None = None,
                 tokenizer: Any = None, kv_cache_budget: int | float | None = None, cuda_graphs: bool | None = None,
                 *, page_size: int | None = None, num_pages: int | None = None, options: CompileOptions | None = None,
                 speculative: Proposer | ReadsHiddenStates | None = None, kv_cache_dtype: str = "auto",
                 **overrides: Any) -> None:
        from ad_mlir.zoo.checkpoints import load_causal_lm

        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is none of {', '.join(KV_CACHE_DTYPES)}")
        if isinstance(model, str):
            model, loaded_tokenizer = load_causal_lm(model)
            tokenizer = tokenizer or loaded_tokenizer
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = model_device(self.model)
        self.eos = _eos_ids(self.model, tokenizer)
        self.vocab_size = _vocab_size(self.model)
        """Token ids the model takes are in [0, vocab_size) (None: unknown, not checked)."""
        _check_sizes(max_batch, max_seq_len)
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs the model on a CUDA device (it is on {self.device})")
        self.options = CompileOptions.of(options, **overrides)
        if speculative is not None and page_size is None:
            raise ValueError("speculative decoding runs on the paged engine: give page_size too")
        self.kv_cache_dtype = kv_cache_dtype
        """What attention's K/V caches hold: `auto` (the model's dtype) or `fp8` (float8_e4m3fn)."""
        self.speculative = speculative
        """What drafts tokens for `generate` to verify (`ad_mlir.llm.speculative`), or None."""
        self.captured_layers = self._capture_for(speculative)
        """The layers after which `forward_flat` also gives the hidden states (`hidden_states`):
        those a proposer that reads them asks for (EAGLE-3); else none."""
        self.hidden_states: torch.Tensor | None = None
        """With `captured_layers`: the last `forward_flat`'s hidden states [tokens, layers * hidden]."""
        if self.captured_layers:
            if cuda_graphs:
                raise ValueError("cuda_graphs=True with a proposer that reads the hidden states: a replayed decode step "
                                 "returns the logits alone; leave cuda_graphs unset")
            cuda_graphs = False
        self.page_size = page_size
        """Tokens a page holds in the paged form (`forward_flat`); None in the slot form."""
        start = time.perf_counter()
        self.decode_graphs: CudaGraphDecode | CudaGraphFlatDecode | None = None
        self.step_graphs: CudaGraphPiecewise | None = None
        """The paged form's other steps, piecewise (`CudaGraphPiecewise`), where its decode steps are captured."""
        self.scratch_page: int | None = None
        """The paged form with CUDA graphs: the pool's last page, which no sequence holds (the
        padding rows of a captured decode step write there); `num_pages` excludes it."""
        if page_size is not None:
            max_seq_len = max_seq_len or DEFAULT_MAX_SEQ_LEN
            scratch = cuda_graphs is not False and self.device.type == "cuda"
            self._compile_paged(max_batch, max_seq_len, page_size, num_pages, kv_cache_budget, scratch)
        elif num_pages is not None:
            raise ValueError("num_pages is for the paged form: give page_size too")
        else:
            if kv_cache_budget is None:
                max_seq_len = max_seq_len or DEFAULT_MAX_SEQ_LEN
                ep = cache_export(self.model, max_batch, max_seq_len)
            else:
                _check_budget(kv_cache_budget, self.device)
                cap = max_seq_len or _max_positions(self.model)
                ep = cache_export(self.model, max_batch, cap)
                max_seq_len = self._seq_len_for_budget(ep, max_batch, cap, kv_cache_budget)
            self._compile(ep, max_batch, max_seq_len)
        self.compile_seconds = time.perf_counter() - start
        shape = (f"{self.num_pages} pages x {page_size} tokens" if page_size is not None
                 else f"{max_batch} slots x {max_seq_len} tokens")
        log.info("LLM: compiled in %.1f s; %d caches (%d per-slot states), %.2f MiB in all: %d tokens fit "
                 "(%s); per token %d bytes (%s), per slot %d bytes of states",
                 self.compile_seconds, len(self.caches), len(self.slot_states), self.cache_bytes / 2**20,
                 self.cache_tokens, shape, sum(self.token_bytes.values()),
                 _per_layer(self.token_bytes), self.state_bytes // (max_batch + (self.scratch_state_slot is not None)))
        self.decode_graphs = self._capture_decode(cuda_graphs)
        self.step_graphs = self._capture_steps(cuda_graphs)
        if speculative is not None and self.num_state_slots:
            raise ValueError("speculative decoding needs a model whose every cache is paged: this one keeps "
                             "per-sequence states (convolutions or recurrent scans), which cannot be rolled back "
                             "past a rejected draft")

    def _capture_for(self, speculative: Proposer | ReadsHiddenStates | None) -> tuple[int, ...]:
        """The layers `speculative` reads the hidden states of (it sees the model first); the
        layers are then compiled whole, since a shortened stack (`CompileOptions.layers_once`)
        holds only some of them."""
        if not isinstance(speculative, ReadsHiddenStates):
            return ()
        speculative.attach(self.model)
        self.options = dataclasses.replace(self.options, layers_once=False)
        return tuple(speculative.layers)

    def _compile(self, ep: ModuleExport, max_batch: int, max_seq_len: int,
                 num_pages: int | None = None, scratch: bool = False) -> None:
        """Compile `ep` with caches of `max_batch` x `max_seq_len` tokens (with `num_pages`, the
        paged form's pools of `num_pages` x `page_size` tokens and per-sequence states in
        `max_batch` slots, one more with `scratch`) and allocate them."""
        self.caches: dict[str, torch.Tensor] = {}  # a probe's caches are freed before the final ones exist
        if num_pages is not None:
            pipeline = paged_pipeline(self.options.pipeline, self.page_size, num_pages, max_seq_len, max_batch + scratch,
                                      self.kv_cache_dtype)
            pipeline = with_capture(pipeline, self.captured_layers)
        else:
            pipeline = cached_pipeline(self.options.pipeline, max_batch, max_seq_len, self.kv_cache_dtype)
        self.graph, program = compile_program(ep, options=self.options, pipeline=pipeline)
        self.runner = call_kernels_directly(self.graph)
        """What runs a step: the graph with its kernels called without torch's dispatch of their
        ops (a step is never traced; `ad-bench --parts launch` measures what that saves)."""
        self.program = program
        """The compiled `ad` module (what the graph runs) and its weights."""
        fn = program.function
        arguments = cache_arguments(fn)
        self.caches = {c.name: torch.zeros(c.shape, dtype=c.dtype, device=self.device) for c in arguments}
        self.slot_states = frozenset(c.name for c in arguments if not c.per_token)
        """The caches that are a state of fixed size per slot (not per token)."""
        self.token_bytes: dict[str, int] = {}
        """Bytes one token takes in each layer's per-token caches (its key and value, or MLA's
        latent and rope key, and DeepSeek sparse attention's index key), by layer (HF module path)."""
        for c in arguments:
            if c.per_token:
                self.token_bytes[c.layer] = self.token_bytes.get(c.layer, 0) + \
                    torch.Size(c.shape[2:]).numel() * c.dtype.itemsize
        if not self.caches:
            raise ValueError("the compiled model has no attention to cache (see the insert-cached-attention log)")
        self.inputs = [n.name for n in self.graph.graph.nodes if n.op == "placeholder"]
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.num_pages = num_pages

    # -- the paged form ------------------------------------------------------------------

    def _compile_paged(self, max_batch: int, max_seq_len: int, page_size: int, num_pages: int | None,
                       budget: int | float | None, scratch: bool = False) -> None:
        """Export the flattened form and compile it over page pools: `num_pages` given, else
        bought by `budget` (measured on a probe compile of `PROBE_PAGES` pages), else enough for
        `max_batch` sequences of `max_seq_len` tokens; with `scratch`, one page more
        (`scratch_page`) and one slot more in the state pools (`scratch_state_slot`), within the
        budget."""
        if page_size < 1 or page_size & (page_size - 1):
            raise ValueError(f"page_size={page_size} must be a power of two")
        if num_pages is not None and budget is not None:
            raise ValueError("give num_pages or kv_cache_budget, not both")
        ep = cache_export(self.model, 1, max_batch * max_seq_len, flat=True)
        if num_pages is None and budget is not None:
            _check_budget(budget, self.device)
            self._compile(ep, max_batch, max_seq_len, PROBE_PAGES, scratch)
            per_page = (self.cache_bytes - self.state_bytes) // PROBE_PAGES
            budget_bytes = budget if isinstance(budget, int) else int(budget * self._free_cuda_memory_after_forward())
            if per_page == 0 and budget_bytes < self.state_bytes:  # states alone: the pages take no memory
                raise ValueError(f"kv_cache_budget of {budget_bytes} bytes does not hold the {self.state_bytes} bytes of "
                                 f"per-sequence states for max_batch={max_batch}; raise the budget or lower max_batch")
            num_pages = (max_batch * -(-max_seq_len // page_size) if per_page == 0
                         else (budget_bytes - self.state_bytes) // per_page - scratch)
            if num_pages < 1:
                raise ValueError(f"kv_cache_budget of {budget_bytes} bytes holds no page of {page_size} tokens "
                                 f"({per_page} bytes in the K and V pools of all layers, after {self.state_bytes} "
                                 "bytes of per-sequence states); raise the budget")
        elif num_pages is None:
            num_pages = max_batch * -(-max_seq_len // page_size)
        if num_pages < 1:
            raise ValueError(f"num_pages={num_pages} must be positive")
        self._compile(ep, max_batch, max_seq_len, num_pages + scratch, scratch)
        if scratch:
            self.num_pages, self.scratch_page = num_pages, num_pages

    def forward_flat(self, input_ids: torch.Tensor, position_ids: torch.Tensor, query_starts: torch.Tensor,
                     cache_starts: torch.Tensor, block_tables: torch.Tensor, logits_indices: torch.Tensor,
                     state_slots: torch.Tensor | None = None) -> torch.Tensor:
        """One step of the paged form (built with `page_size`): `input_ids`, `position_ids` [1, T]
        hold the new tokens of every sequence, each sequence's contiguous; sequence s has tokens
        `query_starts[s]` .. `query_starts[s + 1] - 1` ([seqs + 1]), holds `cache_starts[s]`
        tokens already ([seqs]) and its positions are in the pages `block_tables[s]` ([seqs,
        max_pages_per_seq], page p holding positions p * page_size ..); all int64. Returns the
        logits [n, vocab] of the tokens `logits_indices` [n]. The new K/V are written into the
        LLM's pools (`caches`, [num_pages, page_size, kv_heads, head_dim] per layer and role).
        A model with per-sequence states (`num_state_slots` > 0) takes `state_slots` [seqs] too:
        each sequence's slot in the state pools (its state continues there, from zeros where its
        cache start is 0); a model without takes none."""
        if self.page_size is None:
            raise ValueError("forward_flat runs the paged form: build the LLM with page_size")
        if (state_slots is None) != (self.num_state_slots == 0):
            raise ValueError(f"forward_flat: this model has {self.num_state_slots} per-sequence state slots, and takes "
                             "state_slots [seqs] exactly when it has some")
        flat = (input_ids, position_ids, query_starts, cache_starts, block_tables, logits_indices)
        graphs = self.decode_graphs
        if isinstance(graphs, CudaGraphFlatDecode) and graphs.takes(*flat):
            return graphs.run(flat, state_slots)
        if self.step_graphs is not None and self.step_graphs.takes(input_ids):
            return self.step_graphs.run(flat, state_slots)
        states = () if state_slots is None else (state_slots.to(self.device, torch.int64),)
        return self.run_flat(*(t.to(self.device, torch.int64) for t in flat), *states)

    def run_flat(self, input_ids: torch.Tensor, position_ids: torch.Tensor, query_starts: torch.Tensor,
                 cache_starts: torch.Tensor, block_tables: torch.Tensor, logits_indices: torch.Tensor,
                 state_slots: torch.Tensor | None = None) -> torch.Tensor:
        """`forward_flat` on int64 tensors already on the device, eagerly (what a CUDA graph captures)."""
        given = {"input_ids": input_ids, "position_ids": position_ids, "query_starts": query_starts,
                 "cache_starts": cache_starts, "block_tables": block_tables, "logits_indices": logits_indices,
                 "state_slots": state_slots, "use_cache": False, **self.caches}
        with torch.no_grad():
            logits, *captured = self.runner(*(given[name] for name in self.inputs))
        if self.captured_layers:
            self.hidden_states = captured[0].reshape(input_ids.shape[-1], captured[0].shape[-1])
        return logits.reshape(logits_indices.shape[0], logits.shape[-1])

    @property
    def scratch_state_slot(self) -> int | None:
        """The paged form with CUDA graphs and per-sequence states: the state pools' last slot,
        which no sequence holds (the padding rows of a captured decode step use it);
        `num_state_slots` excludes it. None otherwise."""
        return self.max_batch if self.scratch_page is not None and self.slot_states else None

    @property
    def num_state_slots(self) -> int:
        """The paged form's slots of per-sequence states (convolutions', scans'): `max_batch`
        where the model has such states (at most that many sequences run at once), else 0."""
        return self.max_batch if self.slot_states else 0

    @property
    def cache_bytes(self) -> int:
        """Bytes of all caches: K/V caches and per-slot states."""
        return sum(c.numel() * c.element_size() for c in self.caches.values())

    @property
    def state_bytes(self) -> int:
        """Bytes of the per-slot states (they do not grow with the tokens a slot holds)."""
        return sum(c.numel() * c.element_size() for name, c in self.caches.items() if name in self.slot_states)

    @property
    def cache_tokens(self) -> int:
        """Tokens the caches hold: `max_batch` slots x `max_seq_len` (paged: `num_pages` x
        `page_size`)."""
        if self.num_pages is not None:
            return self.num_pages * self.page_size
        return self.max_batch * self.max_seq_len

    # -- cache size from a memory budget ---------------------------------------------

    def _seq_len_for_budget(self, ep: ModuleExport, max_batch: int, cap: int,
                            budget: int | float) -> int:
        """Tokens per slot that `budget` buys for `max_batch` slots, at most `cap`: measured on a
        probe compile with `PROBE_SEQ_LEN`-token slots."""
        self._compile(ep, max_batch, min(PROBE_SEQ_LEN, cap))
        per_token = (self.cache_bytes - self.state_bytes) // self.cache_tokens
        budget_bytes = budget if isinstance(budget, int) else int(budget * self._free_cuda_memory_after_forward())
        if per_token == 0:  # states alone: their size does not depend on the tokens
            if budget_bytes < self.state_bytes:
                raise ValueError(f"kv_cache_budget of {budget_bytes} bytes does not hold the {self.state_bytes} bytes of "
                                 f"per-slot states for max_batch={max_batch}; raise the budget or lower max_batch")
            return cap
        tokens = (budget_bytes - self.state_bytes) // per_token
        if tokens < max_batch:
            raise ValueError(f"kv_cache_budget of {budget_bytes} bytes holds {tokens} tokens ({per_token} bytes each in "
                             f"the per-token caches of all layers, after {self.state_bytes} bytes of per-slot states): "
                             f"fewer than one per slot for max_batch={max_batch}; raise the budget or lower max_batch")
        seq = min(tokens // max_batch, cap)
        log.info("LLM: kv_cache_budget of %d bytes holds %d tokens of %d bytes beside %d bytes of per-slot states: "
                 "%d slots x %d tokens%s", budget_bytes, tokens, per_token, self.state_bytes, max_batch, seq,
                 f" (capped at {cap})" if seq == cap else "")
        return seq

    def _free_cuda_memory_after_forward(self) -> int:
        """Bytes a cache may take on CUDA, measured as AutoDeploy's resize_kv_cache does: one
        forward pass of a full probe slot (prefill, the largest step the probe graph takes), then
        the device's free memory, counting the probe's caches as free (the final ones replace
        them) and the forward's peak activations as taken (every later step needs them again;
        a prompt longer than the probe's needs more: a fraction below 1 leaves that room)."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        tokens = torch.zeros(1, self.max_seq_len, dtype=torch.int64)
        if self.num_pages is not None:  # one sequence over the probe's pages, as far as they reach
            length = min(self.max_seq_len, self.cache_tokens)
            self.forward_flat(tokens[:, :length], torch.arange(length)[None], torch.tensor([0, length]),
                              torch.tensor([0]), torch.arange(self.num_pages)[None], torch.tensor([length - 1]))
        else:
            self.step(tokens, torch.arange(self.max_seq_len)[None], [0], [0])
        torch.cuda.synchronize(self.device)
        activations = torch.cuda.max_memory_allocated(self.device) - before
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        return max(free + self.cache_bytes - activations, 0)

    # -- one step of the compiled graph ------------------------------------------------

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, slots: Sequence[int],
             starts: Sequence[int], last_only: bool = False) -> torch.Tensor:
        """Run the graph on `tokens`/`positions` [batch, seq] for sequences in `slots` whose
        caches hold `starts` tokens; returns the logits [batch, seq, vocab], with `last_only`
        [batch, 1, vocab] (the LM head runs on the last token alone)."""
        def on_device(values: Sequence[int]) -> torch.Tensor:
            return torch.tensor(list(values), dtype=torch.int64, device=self.device)

        seq = tokens.shape[1]
        rows = on_device([seq - 1] if last_only else range(seq))
        return self.forward(tokens.to(self.device), positions.to(self.device), on_device(slots), on_device(starts), rows)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                starts: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """`step` on tensors already on the device (what a CUDA graph captures); `rows` [n]:
        the token indices whose logits are returned ([batch, n, vocab])."""
        if self.page_size is not None:
            raise ValueError("this LLM is compiled in the paged form: run it with forward_flat")
        given = {"input_ids": tokens, "position_ids": positions, "cache_slots": slots, "cache_starts": starts,
                 "logits_indices": rows, "use_cache": False, **self.caches}
        with torch.no_grad():
            return self.runner(*(given[name] for name in self.inputs))[0]

    def decode(self, tokens: Sequence[int], slots: Sequence[int], starts: Sequence[int],
               free: Sequence[int]) -> torch.Tensor:
        """One decode step: row i feeds `tokens[i]` at position `starts[i]` of slot `slots[i]`;
        returns the logits [rows, vocab]. With CUDA graphs the rows are padded to the graph's
        bucket with dummy rows in `free` slots (`pad_to_bucket`)."""
        if self.decode_graphs is None:
            ids, positions = torch.tensor(tokens)[:, None], torch.tensor(starts)[:, None]
            return self.step(ids, positions, slots, starts, last_only=True)[:, -1]
        return self.decode_graphs.run(*pad_to_bucket(tokens, slots, starts, free, self.decode_graphs.buckets))[
            : len(tokens), -1]

    def _capture_decode(self, cuda_graphs: bool | None) -> CudaGraphDecode | CudaGraphFlatDecode | None:
        """The decode graphs when asked for, or by default on CUDA; a default that fails to
        capture (an op that synchronises with the host) falls back to eager steps, logged."""
        if cuda_graphs is False or self.device.type != "cuda":
            return None
        try:
            if self.page_size is not None:
                return CudaGraphFlatDecode(self, buckets_up_to(self.max_batch), self.scratch_page,
                                           self.scratch_state_slot)
            return CudaGraphDecode(self, buckets_up_to(self.max_batch))
        except RuntimeError as e:
            if cuda_graphs:
                raise ValueError(f"CUDA graph capture of the decode step failed ({e}); use cuda_graphs=False") from e
            log.warning("LLM: decode runs without CUDA graphs: capture failed (%s)", e)
            return None

    def _capture_steps(self, cuda_graphs: bool | None) -> CudaGraphPiecewise | None:
        """The paged form's steps that are not decode-only, piecewise, where its decode steps
        were captured: buckets of tokens up to `MAX_PIECEWISE_TOKENS` (at most the flattened
        export's `max_batch` x `max_seq_len`); a default that fails to capture runs them eagerly,
        logged."""
        if not isinstance(self.decode_graphs, CudaGraphFlatDecode):
            return None
        buckets = buckets_up_to(min(MAX_PIECEWISE_TOKENS, self.max_batch * self.max_seq_len))
        try:
            return CudaGraphPiecewise(self, buckets, self.scratch_page, self.scratch_state_slot)
        except RuntimeError as e:
            if cuda_graphs:
                raise ValueError(f"piecewise CUDA graph capture of the paged steps failed ({e}); "
                                 "use cuda_graphs=False") from e
            log.warning("LLM: prefill and mixed steps run without CUDA graphs: capture failed (%s)", e)
            return None

    # -- generation ----------------------------------------------------------------------

    def generate(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 32, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, chat: bool = False, ignore_eos: bool = False,
                 top_k: int = 0, stop: Sequence[str] = ()) -> list[GenerationOutput]:
        """One output per prompt (a string, tokenized with the model's tokenizer, under its chat
        template with `chat`; or token ids), through the continuous-batching engine (`make_engine`:
        prompts beyond what the cache holds wait). Greedy when `temperature` is 0, else sampled with `top_k`
        and `top_p` filtering, each prompt from its own generator seeded with `seed`. A sequence
        stops at EOS (unless `ignore_eos`, for benchmarks), a `stop` string or `max_new_tokens`. A
        failure in the model's forward or in sampling is raised."""
        params = SamplingParams(max_new_tokens, temperature, top_p, top_k, seed, tuple(stop), ignore_eos)
        token_lists = [self._tokenize(p, chat) for p in prompts]
        for i, ids in enumerate(token_lists):
            if not ids:
                raise ValueError(f"prompt {i} is empty")
            if len(ids) + max_new_tokens > self.max_seq_len:
                raise ValueError(f"prompt {i} has {len(ids)} tokens: with max_new_tokens={max_new_tokens} it needs "
                                 f"{len(ids) + max_new_tokens} > max_seq_len={self.max_seq_len} cache positions")
        engine = make_engine(self, max_step_tokens=self.max_seq_len,  # whole prompts: one prefill call each
                             speculative=self.speculative)
        requests = [engine.add(ids, params) for ids in token_lists]
        while engine.has_work:
            for update in engine.step():
                if update.error is not None:  # the engine ends a failed request alone; here it is the caller's error
                    raise update.error
        for request in requests:
            request.output.text = request.text if self.tokenizer is not None else None
        return [request.output for request in requests]

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


def _per_layer(token_bytes: dict[str, int]) -> str:
    """`2 layers x 96 bytes`, or each layer's bytes where they differ."""
    sizes = set(token_bytes.values())
    if len(sizes) == 1:
        return f"{len(token_bytes)} layers x {sizes.pop()} bytes"
    return ", ".join(f"{layer}: {n}" for layer, n in token_bytes.items()) or "no per-token cache"


def _check_sizes(max_batch: int, max_seq_len: int | None) -> None:
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1 (cache slots), got {max_batch}")
    if max_seq_len is not None and max_seq_len < 1:
        raise ValueError(f"max_seq_len must be at least 1 (tokens a slot holds), got {max_seq_len}")


def _check_budget(budget: object, device: torch.device) -> None:
    """A budget is bytes (a positive int) or, on CUDA, a fraction of free memory in (0, 1]."""
    if isinstance(budget, int) and not isinstance(budget, bool):
        if budget <= 0:
            raise ValueError(f"kv_cache_budget={budget}: bytes must be positive")
        return
    if not isinstance(budget, float) or not 0 < budget <= 1:
        raise ValueError(f"kv_cache_budget={budget!r}: give bytes (an int) or, on CUDA, a fraction of free device "
                         "memory (a float in (0, 1])")
    if device.type != "cuda":
        raise ValueError(f"kv_cache_budget={budget} is a fraction of free CUDA memory, but the model is on {device}: "
                         "give bytes (an int)")


def _max_positions(model: torch.nn.Module) -> int:
    """The most tokens a slot may hold when a budget sizes the cache and max_seq_len is not given."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(positions, int):
        raise ValueError("kv_cache_budget: the model's config has no max_position_embeddings to cap a slot at; "
                         "give max_seq_len")
    return positions


def _vocab_size(model: torch.nn.Module) -> int | None:
    """The rows of the model's input embedding (HF's `get_input_embeddings`), else its config's
    `vocab_size`; None where neither is there (a plain module)."""
    get_embeddings = getattr(model, "get_input_embeddings", None)
    embeddings = get_embeddings() if callable(get_embeddings) else None
    if isinstance(embeddings, torch.nn.Embedding):
        return embeddings.num_embeddings
    return getattr(getattr(model, "config", None), "vocab_size", None)


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for source in (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids
