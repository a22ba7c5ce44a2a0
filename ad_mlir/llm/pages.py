"""The page allocator of a paged K/V cache: which pages each sequence holds, which are free, and
which full pages a later request may share (prefix caching).

A page holds `page_size` consecutive tokens of one sequence; a sequence's block table lists its
pages in token order, grown as tokens are added. A page is reference-counted: a full page is
keyed by a chained hash of every token up to its end (the hash of its own tokens and of the page
before it), so two sequences that begin with the same tokens share their full pages (a common
system prompt is prefilled once). A page whose count drops to 0 goes to the free queue: a page
that was never full first (reused before any cached page), a cached one last, still findable by
its hash until it is taken for new tokens (evicted least recently used). Only full pages are
shared, and a sharer never writes into them: its own tokens go to pages of its own.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold `tokens` tokens."""
    return -(-tokens // page_size)


def chained_hashes(tokens: Sequence[int], page_size: int, parent: bytes = b"") -> Iterator[bytes]:
    """The key of each full page of `tokens` in order: a digest of the previous page's key and
    the page's own tokens, so a key stands for every token up to the page's end. A 128-bit
    cryptographic digest, not Python's `hash`: two prefixes that collide would share K/V that
    belongs to other tokens, a silent wrong answer."""
    for start in range(0, len(tokens) - page_size + 1, page_size):
        parent = hashlib.blake2b(parent + array("q", tokens[start: start + page_size]).tobytes(),
                                 digest_size=16).digest()
        yield parent


class PagePool:
    """Pages `0 .. num_pages - 1`: reference counts, the free queue and the prefix cache (see the
    module's docstring). Counters for metrics: `evictions` (cached pages taken for new tokens)."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"a page pool needs at least one page of at least one token, got {num_pages} pages "
                             f"of {page_size}")
        self.num_pages, self.page_size = num_pages, page_size
        self.refs = [0] * num_pages
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_pages))
        """Pages nobody holds, the next to be taken first; a cached one stays findable until taken."""
        self.key_of: dict[int, bytes] = {}
        self.page_of: dict[bytes, int] = {}
        """The prefix cache: full pages by key (`chained_hashes`), held or free."""
        self.evictions = 0

    @property
    def num_free(self) -> int:
        """Pages that can be taken now (free, cached or not)."""
        return len(self.free)

    @property
    def num_in_use(self) -> int:
        """Pages held by at least one sequence."""
        return self.num_pages - len(self.free)

    @property
    def num_cached(self) -> int:
        """Full pages findable by their key (held or free)."""
        return len(self.page_of)

    def take(self, n: int) -> list[int]:
        """`n` pages, each held once; a cached page taken is evicted from the prefix cache."""
        if n > len(self.free):
            raise ValueError(f"{n} pages asked, {len(self.free)} free")
        pages = []
        for _ in range(n):
            page, _ = self.free.popitem(last=False)
            key = self.key_of.pop(page, None)
            if key is not None:
                del self.page_of[key]
                self.evictions += 1
            self.refs[page] = 1
            pages.append(page)
        return pages

    def share(self, pages: Iterable[int]) -> None:
        """Hold cached `pages` once more (a free one leaves the free queue)."""
        for page in pages:
            if self.refs[page] == 0:
                del self.free[page]
            self.refs[page] += 1

    def release(self, pages: Sequence[int]) -> None:
        """Let go of `pages` (a sequence's, in token order). Last pages first, so that of a
        sequence's cached pages its first ones (the likeliest to be shared: a common prompt)
        are evicted last; a page never cached goes to the front, to be reused before any."""
        for page in reversed(pages):
            if self.refs[page] <= 0:
                raise ValueError(f"page {page} released more often than it was held")
            self.refs[page] -= 1
            if self.refs[page] == 0:
                self.free[page] = None
                if page not in self.key_of:
                    self.free.move_to_end(page, last=False)

    def cached_prefix(self, keys: Iterable[bytes]) -> list[int]:
        """The cached pages of the longest run of `keys` from the first."""
        pages = []
        for key in keys:
            page = self.page_of.get(key)
            if page is None:
                break
            pages.append(page)
        return pages

    def cache(self, page: int, key: bytes) -> None:
        """Make the full, held `page` findable by `key`; a key already cached keeps its page
        (two sequences that computed the same page at once: the second's stays private)."""
        if key not in self.page_of and page not in self.key_of:
            self.page_of[key] = page
            self.key_of[page] = key


@dataclass
class _Table:
    pages: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)
    """Keys of the first full pages, each cached (or its key taken by an equal page) when written."""


class BlockManager:
    """Block tables over a `PagePool`, one per sequence id. `prefix_caching` shares full pages
    between sequences; counters for metrics: `prefix_queries` (tokens looked up when a sequence
    starts) and `prefix_hits` (of them, found cached)."""

    def __init__(self, num_pages: int, page_size: int, prefix_caching: bool = True) -> None:
        self.pool = PagePool(num_pages, page_size)
        self.page_size = page_size
        self.prefix_caching = prefix_caching
        self.tables: dict[str, _Table] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens found cached over those looked up (0 before any)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def block_table(self, seq: str) -> list[int]:
        return self.tables[seq].pages

    def cached_prefix(self, tokens: Sequence[int]) -> list[int]:
        """Cached pages `tokens` may start with: full pages only and never the last token's (its
        logits are wanted, so it is computed). Looks, holds nothing."""
        if not self.prefix_caching:
            return []
        usable = (len(tokens) - 1) // self.page_size
        return self.pool.cached_prefix(chained_hashes(tokens[: usable * self.page_size], self.page_size))

    def start(self, seq: str, tokens: Sequence[int], shared: Sequence[int], num_tokens: int) -> bool:
        """Give `seq` (holding nothing) the `shared` pages (`cached_prefix(tokens)`) and pages
        for `num_tokens` tokens in all; False, holding nothing, if the pool has too few free."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq} already holds pages")
        taken_from_free = sum(self.pool.refs[p] == 0 for p in shared)
        if pages_for(num_tokens, self.page_size) - len(shared) > self.pool.num_free - taken_from_free:
            return False
        self.pool.share(shared)
        keys = list(chained_hashes(tokens[: len(shared) * self.page_size], self.page_size))
        self.tables[seq] = _Table(list(shared), keys)
        self.grow(seq, num_tokens)
        self.prefix_queries += len(tokens)
        self.prefix_hits += len(shared) * self.page_size
        return True

    def grow(self, seq: str, num_tokens: int) -> bool:
        """Make `seq`'s table hold `num_tokens` tokens; False, taking nothing, if too few pages are free."""
        table = self.tables[seq]
        more = pages_for(num_tokens, self.page_size) - len(table.pages)
        if more > self.pool.num_free:
            return False
        if more > 0:
            table.pages += self.pool.take(more)
        return True

    def written(self, seq: str, tokens: Sequence[int], num_written: int) -> None:
        """`tokens[:num_written]` of `seq` are now in its pages: its full pages become shareable."""
        table = self.tables[seq]
        full = num_written // self.page_size
        if not self.prefix_caching or full <= len(table.keys):
            return
        done = len(table.keys) * self.page_size
        parent = table.keys[-1] if table.keys else b""
        for key in chained_hashes(tokens[done: full * self.page_size], self.page_size, parent):
            self.pool.cache(table.pages[len(table.keys)], key)
            table.keys.append(key)

    def free(self, seq: str) -> None:
        """Release every page of `seq` (finished, aborted or preempted)."""
        table = self.tables.pop(seq, None)
        if table is not None:
            self.pool.release(table.pages)
