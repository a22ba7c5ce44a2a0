"""`LLM`'s decode steps replayed from CUDA graphs, one per batch bucket: the slot form's
(`CudaGraphDecode`) and the paged form's decode-only steps (`CudaGraphFlatDecode`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ad_mlir.llm.llm import LLM


def buckets_up_to(limit: int) -> tuple[int, ...]:
    """Sizes graphs are captured for (batch sizes of the decode graphs, token counts of the
    piecewise ones): powers of two below `limit`, and it."""
    return tuple(sorted({1 << i for i in range(limit.bit_length()) if 1 << i < limit} | {limit}))


def pad_to_bucket(tokens: Sequence[int], slots: Sequence[int], starts: Sequence[int], free: Sequence[int],
                  buckets: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """The decode rows padded to the smallest bucket that holds them. A dummy row writes token 0 at
    position 0 of a free slot, each its own (no two rows write one slot): harmless, as a slot is
    only read up to what its current sequence wrote, and the next prefill there starts at 0.
    Buckets are at most max_batch, so free slots always suffice."""
    bucket = min(b for b in buckets if b >= len(tokens))
    pad = bucket - len(tokens)
    if pad > len(free):
        raise ValueError(f"{len(tokens)} decode rows padded to {bucket} need {pad} free slots, have {len(free)}")
    return [*tokens, *[0] * pad], [*slots, *free[:pad]], [*starts, *[0] * pad]


class CudaGraphDecode:
    """The decode step as one CUDA graph per batch bucket (AutoDeploy's `cudagraph` backend, vLLM's
    decode graphs). Each graph is captured once, at construction (the caches are still empty, so
    the capture's writes at position 0 of slots 0..bucket-1 clobber nothing), reading static input
    buffers; a step copies its rows into its bucket's buffers and replays. The caches are the LLM's
    own tensors, written in place by the replay. On an H100 (`tests/gpu`) it was on by default while
    Llama, Qwen2, Mistral and Gemma generated HF's tokens; that it was captured is asserted from the
    next GPU run on."""

    def __init__(self, llm: LLM, buckets: Sequence[int]) -> None:
        self.buckets = tuple(sorted(buckets))
        pool = torch.cuda.graph_pool_handle()
        # largest first: the smaller graphs reuse its memory from the shared pool
        self.graphs = {b: self._capture(llm, b, pool) for b in reversed(self.buckets)}

    @staticmethod
    def _capture(llm: LLM, batch: int, pool: Any) -> tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor], torch.Tensor]:
        device = llm.device
        static = {"tokens": torch.zeros(batch, 1, dtype=torch.int64, device=device),
                  "slots": torch.arange(batch, device=device),
                  "starts": torch.zeros(batch, dtype=torch.int64, device=device)}
        row = torch.zeros(1, dtype=torch.int64, device=device)  # a decode step's one token

        def run() -> torch.Tensor:
            return llm.forward(static["tokens"], static["starts"][:, None], static["slots"], static["starts"], row)

        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside the capture: lazy initialisation, kernel compilation
            run()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = run()
        return graph, static, out

    def run(self, tokens: Sequence[int], slots: Sequence[int], starts: Sequence[int]) -> torch.Tensor:
        """Logits [bucket, 1, vocab] of one padded decode step (valid until the next replay)."""
        graph, static, out = self.graphs[len(tokens)]
        for name, values in (("tokens", tokens), ("slots", slots), ("starts", starts)):
            static[name].copy_(torch.tensor(values).view(static[name].shape), non_blocking=True)
        graph.replay()
        return out


def pad_flat_decode(input_ids: torch.Tensor, position_ids: torch.Tensor, query_starts: torch.Tensor,
                    cache_starts: torch.Tensor, block_tables: torch.Tensor, logits_indices: torch.Tensor,
                    bucket: int, scratch_page: int, state_slots: torch.Tensor | None = None,
                    scratch_state_slot: int | None = None) -> tuple[torch.Tensor, ...]:
    """A decode-only step's `forward_flat` inputs (one new token per sequence, each one's logits
    wanted) padded to `bucket` sequences: each dummy sequence feeds token 0 at position 0 of a
    block table that is `scratch_page` throughout, a page no sequence holds, so it writes and reads
    nothing of theirs; its logits come last. A model with per-sequence states gives `state_slots`
    too, padded with `scratch_state_slot`, a state slot no sequence holds (last in the returned
    inputs): the dummy sequences share it, and start at 0, so the state kernels use nothing of it
    (their writes there race with one another only)."""
    pad, on = bucket - cache_starts.shape[0], {"dtype": torch.int64, "device": input_ids.device}
    zeros = torch.zeros(1, pad, **on)
    padded = (torch.cat([input_ids, zeros], 1), torch.cat([position_ids, zeros], 1), torch.arange(bucket + 1, **on),
              torch.cat([cache_starts, zeros[0]]),
              torch.cat([block_tables, torch.full((pad, block_tables.shape[1]), scratch_page, **on)]),
              torch.arange(bucket, **on))
    if state_slots is None:
        return padded
    if scratch_state_slot is None:
        raise ValueError("pad_flat_decode: state_slots given without a scratch_state_slot for the padding rows")
    return (*padded, torch.cat([state_slots, torch.full((pad,), scratch_state_slot, **on)]))


class CudaGraphFlatDecode:
    """The paged form's decode-only steps (every sequence one new token, each one's logits wanted)
    as one CUDA graph per bucket of sequences, as `CudaGraphDecode` does for the slots: a step is
    padded to its bucket (`pad_flat_decode`, the dummy rows in `scratch_page`, and with
    per-sequence states in `scratch_state_slot`), copied into the bucket's static inputs (with
    states, `state_slots` among them) and replayed; other steps (prefill chunks, more sequences
    than the largest bucket, another block-table width) run eagerly. The paged kernel's decode
    phase reads sizes only from shapes, the state kernels read `query_starts`, slots and starts on
    the device (no host sync). On an H100 (`tests/gpu`) it replayed Llama's decode steps and gave
    HF's tokens; a hybrid's (with states) never ran on a GPU."""

    def __init__(self, llm: LLM, buckets: Sequence[int], scratch_page: int,
                 scratch_state_slot: int | None = None) -> None:
        self.buckets = tuple(sorted(buckets))
        self.scratch_page = scratch_page
        self.scratch_state_slot = scratch_state_slot
        """The state slot the padding rows use, for a model with per-sequence states (else None)."""
        self.width = -(-llm.max_seq_len // llm.page_size)
        """The block tables' width the graphs take (the engine's: `max_seq_len` in pages)."""
        pool = torch.cuda.graph_pool_handle()
        self.graphs = {b: self._capture(llm, b, pool) for b in reversed(self.buckets)}

    def static_inputs(self, llm: LLM, bucket: int) -> list[torch.Tensor]:
        """The buffers a bucket's graph reads, on the device: a step of no sequences padded to
        `bucket` (what the capture runs; a replay's step is copied into them)."""
        empty = torch.zeros(0, dtype=torch.int64)
        states = {} if self.scratch_state_slot is None else {"state_slots": empty,
                                                              "scratch_state_slot": self.scratch_state_slot}
        padded = pad_flat_decode(empty[None], empty[None], torch.zeros(1, dtype=torch.int64), empty,
                                 torch.zeros(0, self.width, dtype=torch.int64), empty, bucket, self.scratch_page,
                                 **states)
        return [t.to(llm.device) for t in padded]

    def _capture(self, llm: LLM, bucket: int, pool: Any) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor], torch.Tensor]:
        static = self.static_inputs(llm, bucket)
        side = torch.cuda.Stream(llm.device)
        side.wait_stream(torch.cuda.current_stream(llm.device))
        with torch.cuda.stream(side):  # warm-up outside the capture: lazy initialisation, kernel compilation
            llm.run_flat(*static)
        torch.cuda.current_stream(llm.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = llm.run_flat(*static)
        return graph, static, out

    def takes(self, input_ids: torch.Tensor, position_ids: torch.Tensor, query_starts: torch.Tensor,
              cache_starts: torch.Tensor, block_tables: torch.Tensor, logits_indices: torch.Tensor) -> bool:
        """A decode-only step a graph holds: one token per sequence, each one's logits in order."""
        seqs = cache_starts.shape[0]
        return (input_ids.shape[1] == logits_indices.shape[0] == seqs <= self.buckets[-1]
                and block_tables.shape[1] == self.width
                and torch.equal(logits_indices.cpu(), torch.arange(seqs))
                and torch.equal(query_starts.cpu(), torch.arange(seqs + 1)))

    def run(self, flat: Sequence[torch.Tensor], state_slots: torch.Tensor | None = None) -> torch.Tensor:
        """The logits [seqs, vocab] of a step `takes` holds (valid until the next replay); a model
        with per-sequence states gives its `state_slots`."""
        seqs = flat[3].shape[0]
        bucket = min(b for b in self.buckets if b >= seqs)
        graph, static, out = self.graphs[bucket]
        padded = pad_flat_decode(*flat, bucket, self.scratch_page, state_slots, self.scratch_state_slot)
        for buffer, values in zip(static, padded, strict=True):
            buffer.copy_(values, non_blocking=True)
        graph.replay()
        return out[:seqs]
