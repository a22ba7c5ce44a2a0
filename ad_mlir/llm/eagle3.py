"""`Eagle3Proposer`: speculative decoding with an EAGLE-3 draft head (`ad_mlir.zoo.eagle3`) fed by
the target's hidden states, which the compiled step returns (`capture-hidden-states`).

The head runs in plain torch (eager, one request at a time; it is one decoder layer, small beside
the target's step) with a K/V cache of its own per request. After each target step the engine
hands it the hidden states of the positions each request's cache now holds; when the request
next decodes, the head first runs those positions (position p with the target's state at p
through `fc` and the token at p + 1: these K/V stay), which gives the first drafted token, then
each further drafted token from its own output before the final norm at the position before
(EAGLE's chain). The drafted positions' K/V are dropped after the draft: the next step's target
states replace them. A request the head has no states for (one that started on prefix-cached
pages holds no states of them) drafts from the positions it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ad_mlir.zoo.eagle3 import Eagle3Head, default_layers, load_eagle3


@dataclass
class _Track:
    """One request's head state: K/V of positions `first` .. `first + cached - 1` (run on the
    target's states), and the target's states of the positions after them not yet run."""

    first: int
    kv: tuple[torch.Tensor, torch.Tensor] | None = None
    pending: list[torch.Tensor] = field(default_factory=list)

    @property
    def cached(self) -> int:
        return 0 if self.kv is None else self.kv[0].shape[1]

    @property
    def end(self) -> int:
        """The position after the last one it holds a state of."""
        return self.first + self.cached + sum(len(p) for p in self.pending)


class Eagle3Proposer:
    """Drafts up to `num_tokens` tokens a decode with the EAGLE-3 head in `head` (a directory in
    the checkpoint layout, or a loaded `Eagle3Head`); `LLM(..., speculative=Eagle3Proposer(path))`
    compiles the model to return the hidden states the head reads (module docstring)."""

    def __init__(self, head: Eagle3Head | str | Path, num_tokens: int = 4) -> None:
        if num_tokens < 1:
            raise ValueError(f"speculative num_tokens must be at least 1, got {num_tokens}")
        self.head = head if isinstance(head, Eagle3Head) else load_eagle3(head)
        self.num_tokens = num_tokens
        self.layers: tuple[int, ...] = self.head.layers or ()
        self.tracks: dict[str, _Track] = {}

    @property
    def vocab_size(self) -> int:
        return int(self.head.config.vocab_size)

    def attach(self, model: torch.nn.Module) -> None:
        """Share `model`'s token embedding (the head moves to its device and dtype) and, where the head's config names no layers, take
        vLLM's default for its layer count; a head of another width or vocabulary is refused."""
        config = model.config
        target_hidden = getattr(self.head.config, "target_hidden_size", None) or self.head.config.hidden_size
        if target_hidden != config.hidden_size or self.head.config.vocab_size != config.vocab_size:
            raise ValueError(f"EAGLE-3 head: target_hidden_size = {target_hidden}, vocab_size = "
                             f"{self.head.config.vocab_size}, but the model's hidden_size = {config.hidden_size}, "
                             f"vocab_size = {config.vocab_size}: the head belongs to another model")
        self.layers = self.layers or default_layers(config.num_hidden_layers)
        if len(self.layers) != 3:
            raise ValueError(f"EAGLE-3 head: eagle_aux_hidden_state_layer_ids = {list(self.layers)}: fc reads three")
        embedding = model.get_input_embeddings()
        self.head.share_embedding(embedding)
        self.head.to(embedding.weight.device, embedding.weight.dtype)  # as vLLM runs a draft: in the model's dtype

    def observe(self, request_id: str, start: int, hidden: torch.Tensor) -> None:
        track = self.tracks.get(request_id)
        if track is None or start < track.first or start > track.end:
            track = self.tracks[request_id] = _Track(start)
        elif start < track.end:
            self._cut(track, start)
        if len(hidden):
            track.pending.append(hidden.detach().clone())

    def forget(self, request_id: str) -> None:
        self.tracks.pop(request_id, None)

    def propose_for(self, request_ids: Sequence[str], sequences: Sequence[Sequence[int]],
                    limits: Sequence[int]) -> list[list[int]]:
        return [self._draft(self.tracks.get(r), tokens, min(limit, self.num_tokens))
                for r, tokens, limit in zip(request_ids, sequences, limits, strict=True)]

    @torch.no_grad()
    def _draft(self, track: _Track | None, tokens: Sequence[int], length: int) -> list[int]:
        """`length` tokens to follow `tokens`: the head run on the pending target states (each
        position with the token after it), then on its own outputs."""
        if track is None or length <= 0 or track.end != len(tokens) - 1 or not track.pending:
            return []
        device = self.head.lm_head.weight.device
        start = track.first + track.cached
        states = torch.cat(track.pending).to(device, self.head.fc.weight.dtype)
        ids = torch.tensor(tokens[start + 1:], device=device)
        positions = torch.arange(start, len(tokens) - 1, device=device)
        logits, prenorm, track.kv = self.head(self.head.fc(states), ids, positions, track.kv)
        track.pending = []
        draft = [int(self.head.target_ids(logits[-1].argmax()))]
        position, kv = len(tokens) - 1, track.kv
        while len(draft) < length:
            logits, prenorm, kv = self.head(prenorm[-1:], torch.tensor(draft[-1:], device=device),
                                            torch.tensor([position], device=device), kv)
            draft.append(int(self.head.target_ids(logits[-1].argmax())))
            position += 1
        return draft

    @staticmethod
    def _cut(track: _Track, end: int) -> None:
        """Drop what `track` holds of positions from `end` on (they are fed again)."""
        keep = end - track.first
        if track.kv is not None and track.cached > keep:
            track.kv = (track.kv[0][:, :keep], track.kv[1][:, :keep])
        states = torch.cat(track.pending)[: max(keep - track.cached, 0)] if track.pending else None
        track.pending = [states] if states is not None and len(states) else []
