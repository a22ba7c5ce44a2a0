"""The shell that pattern passes share: their rewrite patterns run in one greedy walk over the
module (not recursively: a rewrite's own results are not matched again), and the pass logs how
many matches each pattern made."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import GreedyRewritePatternApplier, PatternRewriteWalker, RewritePattern


class PatternPass(ModulePass, ABC):
    """A pass made of rewrite patterns, each counting its `matches`. `summary` is the log line
    after the pass name, formatted with `counts` (by default each pattern's matches)."""

    summary: ClassVar[str]

    @abstractmethod
    def patterns(self) -> Sequence[RewritePattern]: ...

    def counts(self, patterns: Sequence[RewritePattern]) -> tuple[int, ...]:
        return tuple(p.matches for p in patterns)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        patterns = list(self.patterns())
        walked = patterns[0] if len(patterns) == 1 else GreedyRewritePatternApplier(patterns)
        PatternRewriteWalker(walked, apply_recursively=False).rewrite_module(op)
        logging.getLogger(type(self).__module__).info(f"{self.name}: {self.summary}", *self.counts(patterns))
