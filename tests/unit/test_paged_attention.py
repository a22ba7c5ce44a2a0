"""`ad.paged_attention`'s torch reference (`torch_ops.paged_attention`) and its kernel template,
against the slot form: each sequence of a flattened step is, on its own, an
`ad.cached_attention` row whose slot holds what its pages hold (that op's reference is checked
against eager torch and HF in test_cached_attention_kernel.py and the generation tests). Pages
are filled with random values (stale tokens), the block tables list each sequence's pages out
of order in the pool, and the sequences of one call mix chunked prefill, prefill from 0 and
decode, across page boundaries, with GQA."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from ad_mlir.semantics import torch_ops

PAGE = 4


@dataclass
class Step:
    """One flattened step: sequence s holds `starts[s]` tokens and brings `news[s]` new ones."""

    starts: list[int]
    news: list[int]
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    v_head_dim: int | None = None
    dtype: torch.dtype = torch.float32
    rope: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        g = torch.Generator().manual_seed(self.seed)
        tokens, d, vd = sum(self.news), self.head_dim, self.v_head_dim or self.head_dim
        self.q = torch.randn(1, self.heads, tokens, d, generator=g).to(self.dtype)
        self.k = torch.randn(1, self.kv_heads, tokens, d, generator=g).to(self.dtype)
        self.v = torch.randn(1, self.kv_heads, tokens, vd, generator=g).to(self.dtype)
        self.query_starts = torch.tensor([0, *torch.tensor(self.news).cumsum(0).tolist()])
        self.cache_starts = torch.tensor(self.starts)
        need = [-(-(s + n) // PAGE) for s, n in zip(self.starts, self.news, strict=True)]
        width = max(need) + 1  # one entry past every sequence's pages: never read
        pool = sum(need) + 3
        order = torch.randperm(pool, generator=g)  # pages in no order, some never used
        self.block_tables = torch.full((len(self.starts), width), pool + 100)  # unused entries out of range
        used = 0
        for s, n in enumerate(need):
            self.block_tables[s, :n] = order[used:used + n]
            used += n
        self.k_pages = torch.randn(pool, PAGE, self.kv_heads, d, generator=g).to(self.dtype)
        self.v_pages = torch.randn(pool, PAGE, self.kv_heads, vd, generator=g).to(self.dtype)
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(self.starts, self.news, strict=True)])
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2) / d))
        angles = positions[:, None].float() * inv_freq
        emb = torch.cat([angles, angles], -1)[None]
        self.tables = [emb.cos().to(self.dtype), emb.sin().to(self.dtype)] if self.rope else [None, None]

    def paged_arguments(self) -> list:
        return [self.q, self.k, self.v, *self.tables, self.k_pages, self.v_pages, self.query_starts,
                self.cache_starts, self.block_tables]

    def slot_form(self, window: int | None = None) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """What `cached_attention` gives, sequence by sequence, from a slot holding what the
        sequence's pages hold: the output [1, heads, T, vd], and each sequence's K and V after the
        step ([positions, kv_heads, d])."""
        out, keys, values = torch.empty(1, self.heads, sum(self.news), self.v.shape[3], dtype=self.dtype), [], []
        for s, (start, n) in enumerate(zip(self.starts, self.news, strict=True)):
            first = int(self.query_starts[s])
            rows = slice(first, first + n)
            pages = self.block_tables[s, :-(-(start + n) // PAGE)]
            k_cache = self.k_pages[pages].flatten(0, 1)[None].clone()
            v_cache = self.v_pages[pages].flatten(0, 1)[None].clone()
            tables = [t[:, rows] if t is not None else None for t in self.tables]
            out[:, :, rows] = torch_ops.cached_attention(
                self.q[:, :, rows], self.k[:, :, rows], self.v[:, :, rows], *tables, k_cache, v_cache,
                torch.tensor([0]), torch.tensor([start]), self.head_dim**-0.5, window)
            keys.append(k_cache[0, :start + n])
            values.append(v_cache[0, :start + n])
        return out, keys, values

    def held(self, pages: torch.Tensor, s: int) -> torch.Tensor:
        """Sequence s's positions as `pages` hold them after the step."""
        end = self.starts[s] + self.news[s]
        return pages[self.block_tables[s, :-(-end // PAGE)]].flatten(0, 1)[:end]


STEPS = {
    # a prefill from 0 over 2.5 pages, a chunk after 5 cached tokens, a decode at a page's last row
    "mixed": Step(starts=[0, 5, 7], news=[10, 6, 1]),
    # decodes only: at a page boundary, in the middle of a page, at position 0
    "decode": Step(starts=[8, 13, 0], news=[1, 1, 1]),
    # MLA-like value head dim, no RoPE
    "value_dim": Step(starts=[3, 0], news=[2, 9], v_head_dim=8, rope=False),
}


@pytest.mark.parametrize("name", STEPS)
@pytest.mark.parametrize("window", [None, 3])
def test_reference_is_the_slot_form_per_sequence(name: str, window: int | None) -> None:
    step = STEPS[name]
    expected, keys, values = step.slot_form(window)
    k_pages, v_pages = step.k_pages.clone(), step.v_pages.clone()
    args = step.paged_arguments()
    args[5:7] = k_pages, v_pages
    got = torch_ops.paged_attention(*args, step.head_dim**-0.5, window)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for s in range(len(step.starts)):
        torch.testing.assert_close(step.held(k_pages, s), keys[s], rtol=0, atol=0)
        torch.testing.assert_close(step.held(v_pages, s), values[s], rtol=0, atol=0)
    untouched = torch.ones(k_pages.shape[0], dtype=torch.bool)
    untouched[step.block_tables[step.block_tables < k_pages.shape[0]]] = False
    assert torch.equal(k_pages[untouched], step.k_pages[untouched])
