"""Near misses of the pattern helpers (`passes/patterns/`), on small hand-written IR: ops that
look like the form a helper matches but are not it."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import Operation
from xdsl.parser import Parser

from ad_mlir.dialects import ad
from ad_mlir.passes.patterns.mla_patterns import _copy_into_slice
from ad_mlir.passes.patterns.rope import rotate_every_two_of
from ad_mlir.passes.patterns.step_positions import _meets_rows
from ad_mlir.passes.patterns.token_window import window_reader
from ad_mlir.passes.pipeline import make_context


def _ops(body: str, args: str) -> list[Operation]:
    text = f"func.func @f({args}) {{\n{body}\n  func.return\n}}\n"
    fn = next(op for op in Parser(make_context(), text).parse_module().ops if isinstance(op, func.FuncOp))
    return list(fn.body.block.ops)


def test_mla_a_slice_written_by_another_op_than_copy_is_no_copy_into_it() -> None:
    """DeepSeek's key is built by `copy_` into two slices of an empty tensor; an in-place add
    into the slice is not that."""
    t16, t8 = "tensor<1x2x?x16xf32>", "tensor<1x2x?x8xf32>"
    for target in ("aten.copy_.default", "aten.add_.Tensor"):
        ops = _ops(f'  %s = ad.slice %x dim 3 [0, 8, 1] : {t16} -> {t8}\n'
                   f'  %c = ad.torch_op "{target}"(%s, %y) [#ad.ref<0>, #ad.ref<1>] {{}} : ({t8}, {t8}) -> {t8}',
                   f"%x: {t16}, %y: {t8}")
        found = _copy_into_slice(next(op for op in ops if isinstance(op, ad.SliceOp)))
        assert (found is not None) == (target == "aten.copy_.default"), target


def test_rope_a_stack_along_the_first_dim_is_no_rotate_every_two() -> None:
    """GPT-J's rotate_every_two stacks (-odd, even) along the last dim; torch.stack's default
    dim is 0, which pairs nothing."""
    t, half = "tensor<1x?x4x16xf32>", "tensor<1x?x4x8xf32>"
    for dim, stacked in (("-1 : i64", "tensor<1x?x4x8x2xf32>"), (None, "tensor<2x1x?x4x8xf32>")):
        args = "[#ad.ref<0>, #ad.ref<1>]" + (f", {dim}" if dim else "")
        ops = _ops(f"  %e = ad.slice %x dim 3 [0, 9223372036854775807, 2] : {t} -> {half}\n"
                   f"  %o = ad.slice %x dim 3 [1, 9223372036854775807, 2] : {t} -> {half}\n"
                   f"  %n = ad.neg %o : {half} -> {half}\n"
                   f'  %s = ad.torch_op "aten.stack.default"(%n, %e) [{args}] {{}} : ({half}, {half}) -> {stacked}\n'
                   f'  %r = ad.torch_op "aten.flatten.using_ints"(%s) [#ad.ref<0>, -2 : i64] {{}} : ({stacked}) -> {t}',
                   f"%x: {t}")
        found = rotate_every_two_of(ops[-2].results[0])
        assert (found is not None) == (dim is not None), dim


def test_token_window_an_unfold_in_steps_of_two_is_no_window_of_each_token() -> None:
    """A window reader unfolds the tokens in steps of one (window t ends at token t)."""
    t, windows = "tensor<1x4x?xf32>", "tensor<1x4x?x3xf32>"
    for step in (1, 2):
        ops = _ops(f'  %u = ad.torch_op "aten.unfold.default"(%x) [#ad.ref<0>, 2 : i64, 3 : i64, {step} : i64] {{}} : '
                   f"({t}) -> {windows}", f"%x: {t}")
        found = window_reader(ops[0])
        assert (found is not None) == (step == 1), step
        if found is not None:
            assert found[1] == 2  # each window reads two tokens before its own


def test_step_positions_per_position_values_meet_rows_only_after_a_dynamic_batch() -> None:
    """[seq, 8] broadcast into [batch, seq, 8] takes per-row positions viewed as [batch, seq];
    into [2, seq, 8] (the batch fixed at export) it does not."""
    for batch, meets in (("?", True), ("2", False)):
        rows = f"tensor<{batch}x?x8xf32>"
        ops = _ops(f"  %r = ad.add %b, %v : {rows}, tensor<?x8xf32> -> {rows}", f"%b: {rows}, %v: tensor<?x8xf32>")
        assert _meets_rows(ops[0].operands[1], ops[0].results[0]) == meets, batch
