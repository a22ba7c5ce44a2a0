"""The Triton interpreter switch (`ad_mlir.codegen.interpreter`): triton builds its own library
functions (tl.sum, ...) in the mode the environment gives at its first import, so a request for
the interpreter after that import must be refused with a message naming the fix, never half
obeyed (interpreted kernels calling compiled library functions fail deep inside a kernel). Each
case runs in a fresh interpreter process with TRITON_INTERPRET unset, as a user's process starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

FUSED = """
import torch, ad_mlir
class M(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2.0, -1)
ep = torch.export.export(M(), (torch.randn(4, 8),))
out, = ad_mlir.compile(ep)(torch.randn(4, 8))
print("ran", type(out).__name__)
"""


def _run(setup: str, tmp_path, compile_a_kernel: bool = True) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    """`setup`, then (with `compile_a_kernel`) a compiled softmax run, in a fresh process."""
    code = textwrap.dedent(setup) + (FUSED if compile_a_kernel else "")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["AD_MLIR_CACHE_DIR"] = str(tmp_path)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)


def test_switch_before_triton_runs_kernels_in_the_interpreter(tmp_path) -> None:  # noqa: ANN001
    run = _run("""
        from ad_mlir.codegen.interpreter import library_interpreted, use_interpreter
        use_interpreter()
        import triton.language
        assert library_interpreted() is True
    """, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ran Tensor" in run.stdout


def test_switch_after_triton_is_refused(tmp_path) -> None:  # noqa: ANN001
    run = _run("""
        import triton
        from ad_mlir.codegen.interpreter import InterpreterSwitchError, use_interpreter
        try:
            use_interpreter()
        except InterpreterSwitchError as e:
            print("refused:", e)
    """, tmp_path, compile_a_kernel=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "refused: the Triton interpreter was requested after triton was imported without it" in run.stdout


@pytest.mark.parametrize("late", ["1", "0"])
def test_variable_set_after_triton_is_an_error_at_kernel_load(tmp_path, late: str) -> None:  # noqa: ANN001
    """Set by hand after triton's import (either way), the variable disagrees with triton's
    library: loading a kernel says so, naming the variable and the fix."""
    first = "0" if late == "1" else "1"
    run = _run(f"""
        import os
        os.environ["TRITON_INTERPRET"] = "{first}"
        import triton
        os.environ["TRITON_INTERPRET"] = "{late}"
    """, tmp_path)
    assert run.returncode != 0
    assert f"TRITON_INTERPRET='{late}' was set after triton was imported" in run.stderr
    assert "Cannot call @triton.jit'd outside of the scope of a kernel" not in run.stderr
