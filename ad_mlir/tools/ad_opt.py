"""`ad-opt`: the mlir-opt of ad-mlir (a thin subclass of xDSL's `xDSLOptMain`).

    ad-opt in.mlir -p 'canonicalize,dce'        parse, verify, run passes, print
    ad-opt --model llama --layers 1             export a tiny HF model, print its `ad` IR
    ad-opt --model qwen3 --hidden-size 128      any transformers causal-LM type, built from its config
    ad-opt --model path/to/checkpoint -p default   a directory with config.json + safetensors, or a .gguf
    ad-opt --model llama | ad-opt -p canonicalize
    ad-opt in.mlir -p default -t triton         print the Triton kernel of every fused region

User errors (bad IR, unknown pass or op, unreadable file) print one line,
`file:line:col: error: message`, and exit with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import IO, TYPE_CHECKING

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import AttributeInvT
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.passes import ModulePass, PassPipeline
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.utils.lexer import Span
from xdsl.xdsl_opt_main import xDSLOptMain

from ad_mlir.passes import get_all_passes
from ad_mlir.passes.pipeline import expand_passes

if TYPE_CHECKING:
    from ad_mlir.passes.verify import NumericVerifier


def _package_version() -> str:
    try:
        return version("ad-mlir")
    except PackageNotFoundError:
        return "unknown (not installed)"


class UserError(DiagnosticException):
    """An error in the user's input, printed as one located line."""


class LocatingParser(Parser):
    """Records where each op starts, so verifier errors can name file:line:col."""

    def __init__(
        self, ctx: Context, input: str | bytes, name: str, spans: dict[Operation, Span], line_offset: int
    ):
        super().__init__(ctx, input, name)
        self.spans = spans
        self.line_offset = line_offset  # of this chunk in the file, with --split-input-file
        self._first_forward_use: dict[str, Span] = {}

    def resolve_operand(self, operand: UnresolvedOperand, type: AttributeInvT) -> SSAValue[AttributeInvT]:
        if operand.operand_name not in self.ssa_values:
            self._first_forward_use.setdefault(operand.operand_name, operand.span)
        return super().resolve_operand(operand, type)

    def parse_module(self, allow_implicit_module: bool = True) -> ModuleOp:
        try:
            return super().parse_module(allow_implicit_module)
        except ParseError as e:
            # xDSL reports never-defined values at the end of the input; point at the first use.
            undefined = [n for n in self.forward_ssa_references if n in self._first_forward_use]
            if not undefined or not e.msg.startswith("values used but not defined"):
                raise
            span = self._first_forward_use[undefined[0]]
            raise ParseError(span, f"use of undefined value %{undefined[0]}") from None

    def parse_operation(self) -> Operation:
        start = self._current_token.span
        op = super().parse_operation()
        self.spans[op] = dataclasses.replace(start, line_offset=self.line_offset)
        return op


def one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def format_parse_error(e: ParseError) -> str:
    return f"{e.span.get_location()}: error: {one_line(e.msg)}"


def verify_located(module: ModuleOp, spans: dict[Operation, Span], source: str) -> None:
    """Verify each op on its own, innermost first, and raise a located UserError."""
    for op in module.walk(reverse=True):
        try:
            op.verify(verify_nested_ops=False)
        except VerifyException as e:
            span = spans.get(op)
            where = str(span.get_location()) if span is not None else source
            message = one_line(str(e)).removeprefix(f"{op.name} ").removeprefix(f"'{op.name}' ")
            raise UserError(f"{where}: error: '{op.name}' {message}") from None


class AdOptMain(xDSLOptMain):
    version_format = f"ad-opt {_package_version()} (xDSL {{xdsl_version}})"

    def __init__(self, args: Sequence[str] | None = None):
        self.spans: dict[Operation, Span] = {}
        self._line_offset = 0
        self._numeric: NumericVerifier | None = None
        """--verify-each's checker (given a --model graph's weights)."""
        super().__init__(description=__doc__.split("\n\n")[0], args=args)

    # registries --------------------------------------------------------------------

    def register_all_dialects(self) -> None:
        from xdsl.dialects import get_all_dialects

        from ad_mlir.universe import AD_UNIVERSE

        for name, factory in {**get_all_dialects(), **AD_UNIVERSE.all_dialects}.items():
            self.ctx.register_dialect(name, factory)

    def parse_chunk(self, chunk: IO[str], file_extension: str, offset: int = 0) -> ModuleOp | None:
        self._line_offset = offset
        return super().parse_chunk(chunk, file_extension, offset)

    def register_all_passes(self) -> None:
        for name, factory in get_all_passes().items():
            self.register_pass(name, factory)

    def register_all_targets(self) -> None:
        from ad_mlir.universe import AD_UNIVERSE

        super().register_all_targets()
        self.available_targets.update(AD_UNIVERSE.all_targets)

    def register_all_frontends(self) -> None:
        def parse_mlir(io: IO[bytes]) -> ModuleOp:
            parser = LocatingParser(self.ctx, io.read(), self.get_input_name(), self.spans, self._line_offset)
            return parser.parse_module(not self.args.no_implicit_module)

        self.available_frontends["mlir"] = parse_mlir

    # arguments ---------------------------------------------------------------------

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        arg_parser.formatter_class = argparse.RawDescriptionHelpFormatter
        arg_parser.epilog = (
            "examples:\n"
            "  ad-opt model.mlir -p 'canonicalize,dce'\n"
            "  ad-opt --model llama --layers 1 --dtype bfloat16\n"
            "  ad-opt --model qwen3 --layers 2 --hidden-size 128 -p default\n"
            "  ad-opt --model ./my-checkpoint -p default      # config.json + safetensors (or a .gguf file)\n"
            "  ad-opt --model qwen2 | ad-opt -p canonicalize --print-op-generic\n"
            "  ad-opt --model llama -p default -t triton      # the Triton kernel of every fused region\n"
        )
        from ad_mlir.zoo.tiny import DTYPES, FAMILIES

        group = arg_parser.add_argument_group(
            "model input (instead of an .mlir file)",
            "--model takes a built-in tiny family (" + ", ".join(FAMILIES) + "; random weights),\n"
            "any transformers causal-LM model type built small from its config (qwen3, phi3, gpt2, ...;\n"
            "random weights, head sizes following --hidden-size), smollm2 (the packaged GGUF checkpoint),\n"
            "a checkpoint directory (config.json + safetensors) or a .gguf file (needs gguf, accelerate).\n"
            "Its torch.export graph (dynamic sequence length) is imported.",
        )
        group.add_argument("--model", metavar="NAME|PATH", help="the model to import (see above)")
        group.add_argument("--layers", type=int, default=None,
                           help="decoder layers of a model built from a config (default 1)")
        group.add_argument("--hidden-size", type=int, default=None, help="hidden size of a model built from a "
                           "config (default: 64 for a built-in family, 128 for a model type)")
        group.add_argument("--head-dim", type=int, default=None, help="head dim of a built-in family (default 32)")
        group.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weight dtype (default float32)")
        group.add_argument("--decompose", action="store_true", help="import the graph after run_decompositions() (core ATen)")
        group.add_argument("--for-generation", action="store_true", help="export as ad_mlir.LLM does: input_ids and "
                           "position_ids, batch and sequence dynamic (what insert-cached-attention needs)")
        group.add_argument("--flat", action="store_true", help="with --for-generation, export as a paged LLM does: "
                           "batch 1, the tokens dynamic (what insert-cached-attention{paged=true} needs)")
        arg_parser.add_argument(
            "--print-ir-after-all", action="store_true", help="print the IR to stderr after every pass"
        )
        arg_parser.add_argument(
            "--verify-each", action="store_true",
            help="after every pass (those of 'default' one by one), run the function before and after it on "
            "the same random inputs through the reference semantics (with --model, its weights) and fail "
            "naming the pass and the first op whose result differs beyond the dtype's tolerance",
        )

    # pipeline ----------------------------------------------------------------------

    def setup_pipeline(self) -> None:
        numeric = None
        if self.args.verify_each:
            from ad_mlir.passes.verify import NumericVerifier

            numeric = self._numeric = NumericVerifier()

        def after_pass(previous: ModulePass | None, module: ModuleOp, next_pass: ModulePass | None) -> None:
            now = time.perf_counter()
            if previous is not None:
                if self.args.time_passes:
                    print(f"Pass {previous.name} took {now - self._started:.4f} s", file=sys.stderr)
                if not self.args.disable_verify:
                    module.verify()
                if numeric is not None:
                    numeric.check_pass(previous.name, module)
                if self.args.print_ir_after_all:
                    print(f"// -----// IR Dump After {previous.name} //----- //", file=sys.stderr)
                    Printer(stream=sys.stderr).print_op(module)
                    print(file=sys.stderr)
            if numeric is not None and next_pass is not None:
                numeric.before_pass(module)
            self._started = time.perf_counter()

        self._started = time.perf_counter()
        passes = PassPipeline.parse_spec(self.available_passes, self.args.passes).passes
        if numeric is not None:
            passes = tuple(expand_passes(passes))
        self.pipeline = PassPipeline(passes, after_pass)

    def apply_passes(self, prog: ModuleOp) -> None:
        if not self.args.disable_verify:
            verify_located(prog, self.spans, self.get_input_name())
        super().apply_passes(prog)

    # running -----------------------------------------------------------------------

    def run(self) -> None:
        if self.args.model is None:
            super().run()
            return
        module = self.model_module()
        self.apply_passes(module)
        out = self.prepare_output()
        out.write(self.output_resulting_program(module))
        if out is not sys.stdout:
            out.close()

    def model_module(self) -> ModuleOp:
        from ad_mlir.frontends.export import export_with_ids
        from ad_mlir.frontends.fx_import import import_program
        from ad_mlir.zoo.checkpoints import built_from_config, named_model
        from ad_mlir.zoo.tiny import random_input_ids

        name, layers = self.args.model, self.args.layers
        if layers is None and built_from_config(name):
            layers = 1  # a built model: one decoder layer shows every op a family has
        model = named_model(name, self.args.dtype, layers, self.args.hidden_size, self.args.head_dim)
        if self.args.for_generation:
            from ad_mlir.llm.cache_export import export_for_cache

            ep = export_for_cache(model, max_batch=8, max_seq_len=4096, flat=self.args.flat)
        else:
            ep = export_with_ids(model, random_input_ids(model, 8), decompose=self.args.decompose)
        program = import_program(ep)
        if self._numeric is not None:
            self._numeric.weights = program.weights
        return program.module


def main(argv: Sequence[str] | None = None) -> None:
    try:
        AdOptMain(args=argv).run()
    except ParseError as e:
        _fail(format_parse_error(e))
    except UserError as e:
        _fail(str(e))
    except DiagnosticException as e:
        _fail(f"error: {one_line(str(e))}")
    except (OSError, ValueError) as e:
        _fail(f"ad-opt: error: {e}")
    except KeyboardInterrupt:
        _fail("ad-opt: interrupted")


def _fail(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()
