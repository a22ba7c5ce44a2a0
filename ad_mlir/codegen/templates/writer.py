"""A small indented source writer (Inductor's `IndentedBuffer`, reduced to what we use)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class IndentedWriter:
    def __init__(self, indent: str = "    "):
        self._lines: list[str] = []
        self._depth = 0
        self._indent = indent

    def line(self, text: str = "") -> None:
        self._lines.append(f"{self._indent * self._depth}{text}" if text else "")

    @contextmanager
    def indent(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"
