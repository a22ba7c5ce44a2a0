"""The paged form's steps that are not decode-only (prefill chunks, prefill beside decodes,
verified drafts) replayed piecewise (vLLM's and TensorRT-LLM AutoDeploy's piecewise CUDA
graphs): the step's graph is split (torch.fx's `split_module`) at the ops that read the
sequences' metadata, whose sizes and values change from step to step however many tokens it
feeds (the cached mixers: attention, MLA, convolutions and scans over `query_starts`,
`cache_starts`, `block_tables`, `state_slots`; and the gather of the rows whose logits are
wanted, `logits_indices`, with what follows it, the LM head); those run eagerly, the pieces
between them (embedding, norms, GEMMs, rotary, activations, MoE) as one CUDA graph each per
bucket of tokens. A step is padded to its bucket by dummy sequences of one token each, as
`pad_flat_decode` pads a decode step: token 0 at position 0 of a block table that is the
scratch page throughout (and the scratch state slot), so the mixers see one consistent step
whose padding writes and reads nothing of the sequences'."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.fx.passes.split_module import split_module

if TYPE_CHECKING:
    from ad_mlir.llm.llm import LLM

SEQUENCE_INPUTS = frozenset({"query_starts", "cache_starts", "block_tables", "state_slots"})
"""The paged step's inputs sized by its sequences, not its tokens: an op that reads one is a cached mixer."""
LOGITS_INPUT = "logits_indices"
"""The rows whose logits are wanted: the gather of them, and what follows it, run eagerly."""
MAX_PIECEWISE_TOKENS = 512
"""The largest bucket of tokens (vLLM's default largest capture size): a larger step is bound by
its GEMMs, not by launches, and runs eagerly; every bucket holds its pieces' outputs."""


def pad_flat_step(input_ids: torch.Tensor, position_ids: torch.Tensor, query_starts: torch.Tensor,
                  cache_starts: torch.Tensor, block_tables: torch.Tensor, logits_indices: torch.Tensor,
                  bucket: int, scratch_page: int, state_slots: torch.Tensor | None = None,
                  scratch_state_slot: int | None = None) -> tuple[torch.Tensor, ...]:
    """A step's `forward_flat` inputs padded to `bucket` tokens by dummy sequences of one token
    each after the step's: token 0 at position 0 (cache start 0) of a block table that is
    `scratch_page` throughout, a page no sequence holds; with per-sequence states each in
    `scratch_state_slot`, a slot no sequence holds, from a zero state (start 0). Their rows are
    nobody's logits (`logits_indices` is the step's). The padding's writes race with one another
    in the scratch page and slot only, and nothing but the padding reads them."""
    tokens = input_ids.shape[1]
    pad, on = bucket - tokens, {"dtype": torch.int64, "device": input_ids.device}
    if pad < 0:
        raise ValueError(f"a step of {tokens} tokens does not fit a bucket of {bucket}")
    zeros = torch.zeros(pad, **on)
    padded = (torch.cat([input_ids, zeros[None]], 1), torch.cat([position_ids, zeros[None]], 1),
              torch.cat([query_starts, tokens + torch.arange(1, pad + 1, **on)]), torch.cat([cache_starts, zeros]),
              torch.cat([block_tables, torch.full((pad, block_tables.shape[1]), scratch_page, **on)]), logits_indices)
    if state_slots is None:
        return padded
    if scratch_state_slot is None:
        raise ValueError("pad_flat_step: state_slots given without a scratch_state_slot for the padding rows")
    return (*padded, torch.cat([state_slots, torch.full((pad,), scratch_state_slot, **on)]))


def _is_split_point(node: torch.fx.Node) -> bool:
    """A node that reads a sequence-sized input: a cached mixer (its getitems follow it)."""
    return any(i.op == "placeholder" and i.name in SEQUENCE_INPUTS for i in node.all_input_nodes)


def partition_at_mixers(graph: torch.fx.Graph) -> dict[torch.fx.Node, tuple[int, bool]]:
    """Each computing node's partition and whether it is captured: the nodes between two split
    points one captured partition, each split point (with the getitems of its results) one
    eager partition, and the nodes that depend on `logits_indices` the last eager one."""
    tail: set[torch.fx.Node] = set()
    partitions: dict[torch.fx.Node, tuple[int, bool]] = {}
    current = 0
    for node in graph.nodes:
        if node.op == "placeholder":
            if node.name == LOGITS_INPUT:
                tail.add(node)
            continue
        if node.op in ("get_attr", "output"):
            continue
        source = node.args[0] if node.target is operator.getitem else None
        if any(i in tail for i in node.all_input_nodes):
            tail.add(node)
        elif _is_split_point(node):
            current += 1
            partitions[node] = (current, False)
            current += 1
        elif isinstance(source, torch.fx.Node) and source in partitions and not partitions[source][1]:
            partitions[node] = partitions[source]
        else:
            partitions[node] = (current, True)
    end = current + 1
    for node in tail - {n for n in graph.nodes if n.op == "placeholder"}:
        partitions[node] = (end, False)
    return partitions


def split_at_mixers(graph: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, dict[str, bool]]:
    """`graph` split by `partition_at_mixers` (torch.fx's `split_module`, the order of the
    original kept) and its partitions' submodules by name, each with whether it is captured
    (the split holds the weights' modules too)."""
    partitions = partition_at_mixers(graph.graph)
    split = split_module(graph, None, lambda node: partitions[node][0], keep_original_order=True)
    return split, {f"submod_{p}": captured for p, captured in partitions.values()}


class Capture(Protocol):
    """How a piece is captured: on CUDA, into a CUDA graph (`CudaGraphCapture`)."""

    def warm_up(self, run: Callable[[], Any]) -> None:
        """Run `run` once before any capture (lazy initialisation, kernel compilation)."""
        ...

    def capture(self, run: Callable[[], Any]) -> tuple[Any, Any]:
        """`run` captured: a graph whose `replay()` reruns it, and its outputs, which every
        replay writes again."""
        ...


class CudaGraphCapture:
    """Pieces captured into CUDA graphs that share one memory pool, on one side stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def warm_up(self, run: Callable[[], Any]) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            run()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def capture(self, run: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            outputs = run()
        return graph, outputs


@dataclass
class _BucketGraph:
    """One piece's graph for one bucket: its outputs, and which of its arguments a replay copies
    into its static buffers (those an eager partition made afresh) or must find unchanged."""

    graph: Any
    outputs: Any
    copied: list[tuple[int, torch.Tensor]]
    """(argument, its static buffer) for the arguments made afresh by an eager partition."""
    kept: list[tuple[int, Any]]
    """(argument, what it was at the capture) for the others: the same tensor (a placeholder,
    a cache, a weight, a captured piece's output) or the same scalar."""


class _EagerPiece:
    """An eager partition (a mixer, or the logits' gather and LM head): run as it is; while its
    runner captures, its outputs are noted as fresh (each step makes them anew)."""

    def __init__(self, runner: CudaGraphPiecewise, module: torch.fx.GraphModule) -> None:
        self.runner, self.module = runner, module

    def __call__(self, *args: Any) -> Any:
        outputs = self.module(*args)
        if self.runner.capturing:
            for t in outputs if isinstance(outputs, tuple) else (outputs,):
                self.runner.fresh[id(t)] = t
        return outputs


class _CapturedPiece:
    """A partition between mixers: eager outside a bucket, captured once per bucket, replayed."""

    def __init__(self, runner: CudaGraphPiecewise, name: str, module: torch.fx.GraphModule) -> None:
        self.runner, self.name, self.module = runner, name, module
        self.replays: dict[int, _BucketGraph] = {}

    def __call__(self, *args: Any) -> Any:
        bucket = self.runner.bucket
        if bucket is None:
            return self.module(*args)
        replay = self.replays.get(bucket)
        if replay is None:
            if not self.runner.capturing:
                raise RuntimeError(f"piece {self.name} has no graph for a bucket of {bucket} tokens")
            replay = self.replays[bucket] = self._capture(args)
            return replay.outputs
        for i, was in replay.kept:
            if args[i] is not was and not (not isinstance(was, torch.Tensor) and args[i] == was):
                raise RuntimeError(f"piece {self.name}, argument {i}: not what its graph was captured with")
        for i, static in replay.copied:
            static.copy_(args[i], non_blocking=True)
        replay.graph.replay()
        return replay.outputs

    def _capture(self, args: Sequence[Any]) -> _BucketGraph:
        fresh = self.runner.fresh
        copied = [(i, torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a))
                  for i, a in enumerate(args) if id(a) in fresh]
        static = list(args)
        for i, buffer in copied:
            static[i] = buffer
        graph, outputs = self.runner.graphs.capture(lambda: self.module(*static))
        taken = {i for i, _ in copied}
        return _BucketGraph(graph, outputs, copied, [(i, a) for i, a in enumerate(args) if i not in taken])


class CudaGraphPiecewise:
    """The paged form's steps of up to `buckets[-1]` tokens, piecewise: `llm.runner` split at
    its mixers (`split_at_mixers`), each piece between them captured once per bucket of tokens
    (largest first, from one pool) after an eager warm-up of the bucket, on a step of padding
    alone. A step is padded to its bucket (`pad_flat_step`), its tokens and positions copied
    into the bucket's static buffers, its metadata given to the eager mixers as they are; a
    mixer's output is copied into the next piece's static buffer, a piece's output is read in
    place by the pieces after it. The logits are the eager tail's, a tensor of their own. Every
    bucket holds its pieces' outputs (its tokens' activations at each mixer: counted for
    Llama-3-8B in bf16, q, k, v, the residual and the attention's output, 28 KB a token and
    layer, about 0.9 GB for buckets up to 512; not measured). Never run on a GPU yet:
    `tests/gpu/test_cuda.py` generates with it where one is, the CPU tests replay its pieces
    eagerly (`tests/models/test_piecewise.py`)."""

    def __init__(self, llm: LLM, buckets: Sequence[int], scratch_page: int, scratch_state_slot: int | None = None,
                 graphs: Capture | None = None) -> None:
        self.llm = llm
        self.buckets = tuple(sorted(buckets))
        self.scratch_page, self.scratch_state_slot = scratch_page, scratch_state_slot
        self.graphs = graphs or CudaGraphCapture(llm.device)
        self.split, partitions = split_at_mixers(llm.runner)
        self.pieces = {name: _CapturedPiece(self, name, getattr(self.split, name))
                       for name, captured in partitions.items() if captured}
        """The captured partitions, by submodule name."""
        for name, captured in partitions.items():  # found before the submodules: the split's forward calls them
            self.split.__dict__[name] = self.pieces[name] if captured else _EagerPiece(self, getattr(self.split, name))
        self.bucket: int | None = None
        """The bucket of the step running now (None: every piece eager)."""
        self.capturing = False
        self.fresh: dict[int, torch.Tensor] = {}
        """While capturing: the eager partitions' outputs, by id (held, so no id is reused)."""
        on = {"dtype": torch.int64, "device": llm.device}
        self.static = {b: (torch.zeros(1, b, **on), torch.zeros(1, b, **on)) for b in self.buckets}
        """Each bucket's token ids and positions [1, bucket], the first piece's inputs."""
        for bucket in reversed(self.buckets):  # largest first: the smaller reuse its pool's memory
            self._capture(bucket)

    def takes(self, input_ids: torch.Tensor) -> bool:
        """A step a bucket holds."""
        return input_ids.shape[1] <= self.buckets[-1]

    def _capture(self, bucket: int) -> None:
        empty = torch.zeros(0, dtype=torch.int64)
        states = {} if self.scratch_state_slot is None else {"state_slots": empty,
                                                              "scratch_state_slot": self.scratch_state_slot}
        padding = pad_flat_step(empty[None], empty[None], torch.zeros(1, dtype=torch.int64), empty,
                                torch.zeros(0, 1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), bucket,
                                self.scratch_page, **states)
        self.graphs.warm_up(lambda: self._run(bucket, padding))
        self.bucket, self.capturing = bucket, True
        try:
            self._run(bucket, padding)
        finally:
            self.bucket, self.capturing = None, False
            self.fresh.clear()

    def run(self, flat: Sequence[torch.Tensor], state_slots: torch.Tensor | None = None) -> torch.Tensor:
        """The logits [len(logits_indices), vocab] of a step `takes` holds (`forward_flat`'s
        inputs; with per-sequence states, its `state_slots`)."""
        bucket = min(b for b in self.buckets if b >= flat[0].shape[1])
        padded = pad_flat_step(*flat, bucket, self.scratch_page, state_slots, self.scratch_state_slot)
        self.bucket = bucket
        try:
            return self._run(bucket, padded)
        finally:
            self.bucket = None

    def _run(self, bucket: int, padded: Sequence[torch.Tensor]) -> torch.Tensor:
        """The split graph on a step padded to `bucket` (its tokens and positions through the
        bucket's static buffers)."""
        llm = self.llm
        ids, positions = self.static[bucket]
        ids.copy_(padded[0], non_blocking=True)
        positions.copy_(padded[1], non_blocking=True)
        names = ("query_starts", "cache_starts", "block_tables", "logits_indices", "state_slots")
        given = {"input_ids": ids, "position_ids": positions, "use_cache": False, **llm.caches,
                 **{n: t.to(llm.device, torch.int64) for n, t in zip(names, padded[2:], strict=False)}}
        with torch.no_grad():
            logits = self.split(*(given[name] for name in llm.inputs))[0]
        return logits.reshape(padded[5].shape[0], logits.shape[-1])
