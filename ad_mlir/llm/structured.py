"""Structured output: a request's tokens held to a JSON schema (OpenAI's `response_format`)
through llguidance. Each step the request's matcher gives the tokens its grammar allows next
(a bit mask over the vocabulary); the sampler sets every other token's logit to -inf; the token
chosen advances the matcher. A grammar is compiled once per schema and tokenizer and kept in a
small LRU (`Grammars`), each request getting a copy of the compiled matcher (microseconds).

llguidance rather than xgrammar: it installs as one wheel with no dependencies (xgrammar pulls
apache-tvm-ffi) and computes the mask on the CPU, where our sampler runs anyway.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import torch

MAX_GRAMMARS = 64
"""Compiled grammars kept (least recently used dropped first)."""

JSON_OBJECT = json.dumps({"type": "object"})
"""The schema of OpenAI's `{"type": "json_object"}`: any JSON object."""

_BITS = torch.arange(32, dtype=torch.int32)


class GrammarError(ValueError):
    """A schema that does not compile, or a tokenizer llguidance cannot take."""


JSON_OPTIONS = {"whitespace_flexible": False}
"""Compact JSON (no whitespace between tokens, `,` and `:` as separators): a free whitespace
rule lets a model write blanks until max_tokens (measured: a random-weight model's every token
after `{"age":` was whitespace)."""


def canonical_schema(schema: dict[str, Any]) -> str:
    """The schema as JSON text without spaces, one cache entry per schema. Keys keep their order:
    the properties' order is the output's."""
    return json.dumps(schema, separators=(",", ":"))


class GrammarMatcher:
    """One request's place in its grammar."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def allowed(self, vocab: int) -> torch.Tensor:
        """A bool mask over `vocab` token ids: the tokens the grammar takes next (ids past the
        tokenizer's vocabulary, a padded LM head's, are never allowed)."""
        words = torch.frombuffer(bytearray(self._matcher.compute_bitmask()), dtype=torch.int32)
        allowed = ((words[:, None] >> _BITS) & 1).bool().flatten()
        if allowed.numel() < vocab:
            return torch.cat([allowed, allowed.new_zeros(vocab - allowed.numel())])
        return allowed[:vocab]

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [vocab] with every token the grammar does not take next at -inf."""
        return logits.masked_fill(~self.allowed(logits.numel()).to(logits.device), float("-inf"))

    def advance(self, token: int) -> bool:
        """Take `token` (one the mask allowed); True when the grammar is complete (nothing but
        EOS may follow), which ends the request."""
        if not self._matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token}: {self._matcher.get_error()}")
        return self._matcher.is_stopped()


class Grammars:
    """JSON-schema grammars over the tokenizer of `model` (its `tokenizer` and `vocab_size`,
    read at the first schema, when the tokenizer is converted for llguidance: 0.7 s for
    SmolLM2's 49k tokens), each compiled once (an LRU of `max_grammars`, keyed by the schema's
    canonical JSON text). Thread-safe: the server checks a request's schema in its event loop,
    the engine compiles it again (a cache hit) in its own thread."""

    def __init__(self, model: Any, max_grammars: int = MAX_GRAMMARS) -> None:
        self.model, self.max_grammars = model, max_grammars
        self._ll_tokenizer: Any = None
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, schema: str) -> GrammarMatcher:
        """A fresh matcher of `schema` (canonical JSON text); `GrammarError` if it does not compile."""
        with self._lock:
            compiled = self._compiled.get(schema)
            if compiled is None:
                compiled = self._compile(schema)
                self._compiled[schema] = compiled
                if len(self._compiled) > self.max_grammars:
                    self._compiled.popitem(last=False)
            self._compiled.move_to_end(schema)
        return GrammarMatcher(compiled.deep_copy())

    @property
    def cached(self) -> int:
        """Grammars compiled and kept."""
        return len(self._compiled)

    def _compile(self, schema: str) -> Any:
        import llguidance

        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as e:
            raise GrammarError(f"the JSON schema is not valid: {e}") from None
        matcher = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"the JSON schema does not compile to a grammar: {matcher.get_error()}")
        return matcher

    def _tokenizer(self) -> Any:
        if self._ll_tokenizer is None:
            import llguidance.hf

            tokenizer = getattr(self.model, "tokenizer", None)
            if tokenizer is None:
                raise GrammarError("structured output needs the model's tokenizer, and this model has none")
            try:
                self._ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=self.model.vocab_size)
            except ValueError as e:  # not a fast (Rust) tokenizer, or more tokens than the model's vocabulary
                raise GrammarError(f"llguidance cannot take this model's tokenizer: {e}") from None
        return self._ll_tokenizer
