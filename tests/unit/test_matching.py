"""The shared matchers' contracts (passes/patterns/matching.py), on small hand-written IR."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import SSAValue
from xdsl.parser import Parser

from ad_mlir.passes.patterns.matching import same_computation
from ad_mlir.passes.pipeline import make_context


def _chains(ops: list[str], other_last: str | None = None) -> tuple[SSAValue, SSAValue]:
    """Two values computed from %x by the same chain of ops (the second chain's last op may
    differ); returns (first, second)."""
    lines = []
    for tag, chain in (("a", ops), ("b", [*ops[:-1], other_last or ops[-1]])):
        value = "%x"
        for i, op in enumerate(chain):
            lines.append(f"  %{tag}{i} = ad.{op} {value} : tensor<4xf32> -> tensor<4xf32>")
            value = f"%{tag}{i}"
    last = len(ops) - 1
    text = ("func.func @f(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {\n" + "\n".join(lines)
            + f"\n  func.return %a{last}, %b{last} : tensor<4xf32>, tensor<4xf32>\n}}\n")
    fn = next(op for op in Parser(make_context(), text).parse_module().ops if isinstance(op, func.FuncOp))
    ret = fn.body.block.last_op
    return ret.operands[0], ret.operands[1]


def test_same_computation_looks_exactly_depth_ops_up() -> None:
    """Equal pure ops on equal operands, four ops up by default (one table computed per use)."""
    assert same_computation(*_chains(["neg", "exp", "sin", "cos"]))
    assert not same_computation(*_chains(["neg", "exp", "sin", "cos", "tanh"]))  # five: past the bound
    assert same_computation(*_chains(["neg", "exp", "sin", "cos", "tanh"]), depth=5)
    assert not same_computation(*_chains(["neg", "exp", "sin"], other_last="cos"))
    assert not same_computation(*_chains(["neg", "exp"]), depth=1)
