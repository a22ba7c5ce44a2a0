"""Stepping an engine in tests: the engine ends a request whose forward or sampling failed with
finish reason "error" and goes on (one request never fails another), which in a test of tokens
would only show as a request cut short. `checked_step` raises that error instead."""

from __future__ import annotations

from ad_mlir.llm.engine import BaseEngine, RequestUpdate


def checked_step(engine: BaseEngine) -> list[RequestUpdate]:
    """`engine.step()`, raising the error of a request it ended with one."""
    updates = engine.step()
    for update in updates:
        if update.error is not None:
            raise update.error
    return updates
