"""The page allocator (`ad_mlir.llm.pages`): reference counts, the free queue, the prefix cache
keyed by chained hashes. A random state machine (hypothesis) starts, grows, writes and frees
sequences (some sharing prefixes) on a small pool and checks after each step that every count
is the number of block tables holding the page, the free pages are exactly those nobody holds,
no sequence writes a page another holds, and each sequence reads back, through its block table,
what was written for its own tokens (a page shared by a prefix hit included)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ad_mlir.llm.pages import BlockManager, PagePool, chained_hashes, pages_for

PAGE = 2
PREFIXES = [(), (7, 8, 9), (7, 8, 9, 10, 11)]


class Allocator(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = BlockManager(num_pages=8, page_size=PAGE)
        self.seqs: dict[str, tuple[list[int], int]] = {}
        """Each sequence's tokens and how many of them are written."""
        self.content: dict[tuple[int, int], tuple[int, ...]] = {}
        """(page, offset) -> the tokens of the sequence that wrote it, up to that position."""
        self.count = 0

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 3), min_size=1, max_size=5),
          first=st.integers(1, 8))
    def start(self, prefix: tuple[int, ...], tail: list[int], first: int) -> None:
        tokens = [*prefix, *tail]
        shared = self.blocks.cached_prefix(tokens)
        assert len(shared) * PAGE < len(tokens), "the last token is always computed"
        begin = len(shared) * PAGE
        end = min(len(tokens), begin + first)
        seq, free = f"s{self.count}", self.blocks.pool.num_free
        self.count += 1
        if self.blocks.start(seq, tokens, shared, end):
            self.seqs[seq] = (tokens, begin)
            self._write(seq, end)
        else:
            assert seq not in self.blocks.tables and self.blocks.pool.num_free == free

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), more=st.lists(st.integers(0, 3), max_size=3), feed=st.integers(1, 4))
    def grow(self, data: st.DataObject, more: list[int], feed: int) -> None:
        """A sequence gets new tokens (decoded ones) and feeds up to `feed` of those unwritten."""
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        tokens, done = self.seqs[seq]
        tokens += more
        end = min(len(tokens), done + feed)
        if end > done and self.blocks.grow(seq, end):
            self._write(seq, end)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        self.blocks.free(seq)
        del self.seqs[seq]

    def _write(self, seq: str, end: int) -> None:
        tokens, done = self.seqs[seq]
        table = self.blocks.block_table(seq)
        assert len(table) == pages_for(end, PAGE)
        for p in range(done, end):
            page = table[p // PAGE]
            assert self.blocks.pool.refs[page] == 1, f"{seq} writes page {page}, which others hold"
            self.content[page, p % PAGE] = tuple(tokens[: p + 1])
        self.seqs[seq] = (tokens, end)
        self.blocks.written(seq, tokens, end)

    @invariant()
    def pages_are_consistent(self) -> None:
        pool = self.blocks.pool
        held = [p for seq in self.seqs for p in self.blocks.block_table(seq)]
        assert pool.refs == [held.count(p) for p in range(pool.num_pages)]
        assert set(pool.free) == {p for p in range(pool.num_pages) if pool.refs[p] == 0}
        assert pool.num_in_use + pool.num_free == pool.num_pages
        assert {page: key for key, page in pool.page_of.items()} == pool.key_of

    @invariant()
    def each_sequence_reads_its_own_tokens(self) -> None:
        for seq, (tokens, done) in self.seqs.items():
            table = self.blocks.block_table(seq)
            for p in range(done):
                assert self.content[table[p // PAGE], p % PAGE] == tuple(tokens[: p + 1]), (seq, p)


TestAllocator = Allocator.TestCase
TestAllocator.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_a_full_page_is_shared_and_evicted_last_once_free() -> None:
    blocks = BlockManager(num_pages=4, page_size=PAGE)
    tokens = [1, 2, 3, 4, 5]
    assert blocks.start("a", tokens, [], 5)
    blocks.written("a", tokens, 5)
    a = blocks.block_table("a")
    assert blocks.pool.num_cached == 2 and blocks.pool.num_free == 1
    shared = blocks.cached_prefix([1, 2, 3, 4, 6])
    assert shared == a[:2]
    assert blocks.start("b", [1, 2, 3, 4, 6], shared, 5)
    assert blocks.pool.refs[a[0]] == 2 and blocks.prefix_hits == 4 and blocks.prefix_queries == 10
    blocks.free("a")
    blocks.free("b")
    assert blocks.pool.num_free == 4 and blocks.pool.num_cached == 2
    # the uncached pages are taken first, then the cached ones, the later page of a sequence first
    order = blocks.pool.take(4)
    assert set(order[:2]).isdisjoint(a[:2]) and order[2:] == [a[1], a[0]]
    assert blocks.pool.num_cached == 0 and blocks.pool.evictions == 2


def test_the_last_token_of_a_prompt_is_never_in_a_shared_page() -> None:
    blocks = BlockManager(num_pages=4, page_size=PAGE)
    tokens = [1, 2, 3, 4]
    assert blocks.start("a", tokens, [], 4)
    blocks.written("a", tokens, 4)
    assert len(blocks.cached_prefix(tokens)) == 1, "2 full pages cached; the second holds the last token"
    assert len(blocks.cached_prefix([*tokens, 5])) == 2


def test_keys_are_chained() -> None:
    """A page's key stands for every token up to its end: equal pages after different ones differ."""
    a = list(chained_hashes([1, 2, 3, 4], PAGE))
    b = list(chained_hashes([0, 2, 3, 4], PAGE))
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]
    assert list(chained_hashes([1, 2, 3], PAGE)) == a[:1]


def test_misuse_is_refused() -> None:
    pool = PagePool(2, PAGE)
    with pytest.raises(ValueError, match="3 pages asked, 2 free"):
        pool.take(3)
    with pytest.raises(ValueError, match="page 0 released more often than it was held"):
        pool.release([0])
    with pytest.raises(ValueError, match="at least one page"):
        PagePool(0, PAGE)
    blocks = BlockManager(2, PAGE)
    assert blocks.start("a", [1], [], 1)
    with pytest.raises(ValueError, match="sequence a already holds pages"):
        blocks.start("a", [1], [], 1)
    assert not blocks.grow("a", 5) and len(blocks.block_table("a")) == 1
