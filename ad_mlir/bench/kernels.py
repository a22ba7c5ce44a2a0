"""Kernel benchmarks: the graphs our fusions target, each as a small module, timed as compiled by
ad-mlir, in eager torch and under `torch.compile`, with the bandwidth each achieves.

Every tensor is an input of the module (weights and scales included), so the bytes model of a
case is exact and simple: each input read once and each output written once, the least
traffic any implementation needs. Achieved bandwidth is that over the median time, also given
as a percentage of a device-to-device copy's bandwidth measured once per run (`copy_gbps` in
every row): memory-bound kernels should approach 100%.

Before anything is timed, the ad-mlir module must call at least one of our kernels and its
outputs must match eager's, so a benchmark never times a wrong or unfused kernel. On CPU the
kernels run in the Triton interpreter when `TRITON_INTERPRET=1` was set before they were
loaded (else their torch reference runs): useful to run the harness, not to read its numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

import ad_mlir
from ad_mlir.bench.timing import achieved_gbps, copy_bandwidth_gbps, measure
from ad_mlir.passes.pipeline import PIPELINES
from ad_mlir.semantics import torch_ops

FULL_TOKENS = (1, 16, 128, 1024, 4096, 16384)
FULL_HIDDEN = (4096, 8192)
FULL_SHAPES = tuple((tokens, hidden) for hidden in FULL_HIDDEN for tokens in FULL_TOKENS)
IMPLS = ("ad-mlir", "eager", "torch.compile")
DECODE_TOKENS = 16
"""Shapes up to this many tokens are decode steps: on CUDA they are also timed under CUDA graphs,
where launch overhead, not memory, would otherwise dominate."""

COPY_NBYTES = {"cuda": 1 << 30, "cpu": 1 << 25}
"""Copy size of the bandwidth reference: far larger than the GPU's L2 (H100: 50 MB); on CPU
large enough to leave the caches, small enough to be quick."""

FP8 = torch.float8_e4m3fn
STATIC_SCALE = 1 / 16
"""The static FP8 scale: activations here stay below ~25 (products of two standard normals), so
x / scale stays below 448, e4m3's largest value, as with a calibrated scale."""

EPS = 1e-6


class BenchmarkError(RuntimeError):
    """A case that must not be timed: it calls no kernel of ours, or its result is wrong."""


@dataclass(frozen=True)
class Shape:
    """A benchmark shape: `tokens` rows of a model with `hidden` features. The MLP is 3.5x wider
    (Llama-3: 14336 at 4096, 28672 at 8192); attention has hidden / head_dim query heads and
    `kv_heads` key/value heads (Llama-3: 32/8 at 4096, 64/8 at 8192), batch 1, sequence = tokens."""

    tokens: int
    hidden: int
    head_dim: int = 128
    kv_heads: int = 8

    @property
    def intermediate(self) -> int:
        return self.hidden * 7 // 2

    @property
    def q_heads(self) -> int:
        if self.hidden % self.head_dim or self.hidden // self.head_dim % self.kv_heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of head_dim {self.head_dim} x kv_heads "
                             f"{self.kv_heads}: no attention shape")
        return self.hidden // self.head_dim


InputFactory = Callable[[Shape, torch.dtype, torch.device], tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    module: torch.nn.Module
    inputs: InputFactory
    bytes_formula: str
    pipeline: str = "default"


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """HF's `LlamaRMSNorm.forward`, with the weight as an argument."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + EPS)
    return weight * h.to(input_dtype)


class AddRmsNorm(torch.nn.Module):
    def forward(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
        total = x + residual
        return llama_rms_norm(total, weight), total


class RmsNormFp8Static(torch.nn.Module):
    def forward(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.ops.ad_mlir.quantize_fp8(llama_rms_norm(x, weight), scale)


class RmsNormFp8Dynamic(torch.nn.Module):
    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.ops.ad_mlir.quantize_fp8_dynamic(llama_rms_norm(x, weight), per_token=True)


class SiluMul(torch.nn.Module):
    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


class SiluMulFp8Static(torch.nn.Module):
    def forward(self, gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.ops.ad_mlir.quantize_fp8(F.silu(gate) * up, scale)


class RopeQK(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return apply_rotary_pos_emb(q, k, cos, sin)


class RopeAttention(torch.nn.Module):
    """HF Llama attention after the projections: RoPE, `repeat_kv`, causal SDPA."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        groups = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=q.shape[-1] ** -0.5)


class ElementwiseChain(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x * 0.5 + y).exp() * torch.sigmoid(y)


def _randn(dtype: torch.dtype, device: torch.device) -> Callable[..., torch.Tensor]:
    """A seeded standard-normal tensor maker: the same inputs in every run."""
    generator = torch.Generator(device=device).manual_seed(0)
    return lambda *size: torch.randn(size, generator=generator, device=device, dtype=dtype)


def _scale(device: torch.device) -> torch.Tensor:
    return torch.tensor(STATIC_SCALE, dtype=torch.float32, device=device)


def _rope_tables(s: Shape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of Llama's rotary angles (base 10000) for positions 0..tokens-1, [1, T, D]."""
    inv_freq = 10000.0 ** -(torch.arange(0, s.head_dim, 2, device=device, dtype=torch.float32) / s.head_dim)
    angles = torch.outer(torch.arange(s.tokens, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)[None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _norm_inputs(s: Shape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    randn = _randn(dtype, device)
    return randn(s.tokens, s.hidden), randn(s.hidden)


def _add_norm_inputs(s: Shape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    randn = _randn(dtype, device)
    return randn(s.tokens, s.hidden), randn(s.tokens, s.hidden), randn(s.hidden)


def _norm_static_inputs(s: Shape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    return (*_norm_inputs(s, dtype, device), _scale(device))


def _mlp_inputs(s: Shape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    randn = _randn(dtype, device)
    return randn(s.tokens, s.intermediate), randn(s.tokens, s.intermediate)


def _mlp_static_inputs(s: Shape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    return (*_mlp_inputs(s, dtype, device), _scale(device))


def _rope_inputs(s: Shape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    randn = _randn(dtype, device)
    return randn(1, s.q_heads, s.tokens, s.head_dim), randn(1, s.kv_heads, s.tokens, s.head_dim), *_rope_tables(
        s, dtype, device
    )


def _attention_inputs(s: Shape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    q, k, cos, sin = _rope_inputs(s, dtype, device)
    return q, k, _randn(dtype, device)(1, s.kv_heads, s.tokens, s.head_dim), cos, sin


def _pointwise_inputs(s: Shape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    randn = _randn(dtype, device)
    return randn(s.tokens, s.hidden), randn(s.tokens, s.hidden)


def _default_without(pass_name: str) -> str:
    passes = PIPELINES["default"].split(",")
    if pass_name not in passes:
        raise ValueError(f"'{pass_name}' is not in the default pipeline: update the benchmark case that omits it")
    return ",".join(p for p in passes if p != pass_name)


_QUANTIZE_NOTE = (
    " Plain torch has no FP8 quantization that our passes match, so the module calls the "
    "reference op torch.ops.ad_mlir.{op}: eager and torch.compile run its torch implementation."
)
_ATTENTION_BYTES = "2*T*Hq*D*b (q, out) + 2*T*Hkv*D*b (k, v) + 2*T*D*b (cos, sin)"
BYTES_NOTATION = "T tokens, H hidden, I = 7H/2, Hq = H/D query heads, Hkv key/value heads, D head_dim, b bytes/element"
"""The symbols of the `bytes_formula` strings."""

CASES: dict[str, Case] = {
    case.name: case
    for case in (
        Case("add_rmsnorm", "x + residual, then Llama RMSNorm with weight; returns normed and the sum",
             AddRmsNorm(), _add_norm_inputs, "2*T*H*b (x, residual) + H*b (w) + 2*T*H*b (out, sum)"),
        Case("rmsnorm_fp8_static", "Llama RMSNorm, then FP8 e4m3 quantization with a static per-tensor scale."
             + _QUANTIZE_NOTE.format(op="quantize_fp8"),
             RmsNormFp8Static(), _norm_static_inputs, "T*H*b (x) + H*b (w) + 4 (scale) + T*H (fp8 out)"),
        Case("rmsnorm_fp8_dynamic", "Llama RMSNorm, then FP8 e4m3 quantization with per-token scales "
             "(amax / 448 of each row)." + _QUANTIZE_NOTE.format(op="quantize_fp8_dynamic"),
             RmsNormFp8Dynamic(), _norm_inputs, "T*H*b (x) + H*b (w) + T*H (fp8 out) + 4*T (scales)"),
        Case("silu_mul", "silu(gate) * up, the gated MLP's activation (width I)",
             SiluMul(), _mlp_inputs, "2*T*I*b (gate, up) + T*I*b (out)"),
        Case("silu_mul_fp8_static", "silu(gate) * up, then FP8 e4m3 quantization with a static scale."
             + _QUANTIZE_NOTE.format(op="quantize_fp8"),
             SiluMulFp8Static(), _mlp_static_inputs, "2*T*I*b (gate, up) + 4 (scale) + T*I (fp8 out)"),
        Case("rope_qk", "HF apply_rotary_pos_emb on q [1, Hq, T, D] and k [1, Hkv, T, D]",
             RopeQK(), _rope_inputs, "2*T*(Hq+Hkv)*D*b (q, k in and out) + 2*T*D*b (cos, sin)"),
        Case("rope_attention", "HF RoPE + repeat_kv + causal SDPA, compiled with RoPE fused into attention "
             "(one kernel)",
             RopeAttention(), _attention_inputs, _ATTENTION_BYTES),
        Case("attention_separate_rope", "the rope_attention module compiled by the default pipeline without "
             "fuse-rope-attention: "
             "our RoPE kernel, then repeat_kv and torch's SDPA",
             RopeAttention(), _attention_inputs, _ATTENTION_BYTES,
             pipeline=_default_without("fuse-rope-attention")),
        Case("elementwise_chain", "(x * 0.5 + y).exp() * sigmoid(y), one fused elementwise region",
             ElementwiseChain(), _pointwise_inputs, "2*T*H*b (x, y) + T*H*b (out)"),
    )
}


def run_kernel_benchmarks(
    device: torch.device,
    shapes: Sequence[tuple[int, int]],
    dtype: torch.dtype,
    impls: Sequence[str] = IMPLS,
    cases: Sequence[str] | None = None,
    cuda_graphs: bool | None = None,
    progress: Callable[[str], None] | None = None,
    head_dim: int = 128,
    kv_heads: int = 8,
) -> list[dict]:
    """Time every case (all of CASES by default) at every (tokens, hidden) shape with each of
    `impls`, plainly and, for decode shapes on CUDA, under CUDA graphs (`cuda_graphs`: None = on
    CUDA, False = never, True = required). One flat, JSON-serializable row per (case, shape,
    impl, mode); each row carries the run's copy bandwidth (`copy_gbps`) that `pct_of_copy`
    refers to. Raises BenchmarkError when a compiled case calls no kernel or computes wrong."""
    selected = _select(cases, impls)
    if dtype not in FLOAT_TOLERANCE:
        raise ValueError(f"dtype {dtype} is not benchmarked; use one of {', '.join(map(str, FLOAT_TOLERANCE))}")
    graphs = _cuda_graphs(device, cuda_graphs)
    say = progress or (lambda _: None)
    copy_gbps = copy_bandwidth_gbps(device, COPY_NBYTES["cuda" if device.type == "cuda" else "cpu"])
    say(f"copy bandwidth on {device}: {copy_gbps:.1f} GB/s")
    rows = []
    for case in selected:
        for tokens, hidden in shapes:
            shape = Shape(tokens, hidden, head_dim, kv_heads)
            for row in _bench_case(case, shape, dtype, device, impls, graphs and tokens <= DECODE_TOKENS):
                row.update(copy_gbps=copy_gbps, pct_of_copy=100 * row["gbps"] / copy_gbps)
                say(f"{case.name} T={tokens} H={hidden} {row['impl']} ({row['mode']}): {row['median_ms']:.4f} ms, "
                    f"{row['gbps']:.1f} GB/s ({row['pct_of_copy']:.1f}% of copy)")
                rows.append(row)
    return rows


def _select(cases: Sequence[str] | None, impls: Sequence[str]) -> list[Case]:
    if unknown := set(impls) - set(IMPLS):
        raise ValueError(f"unknown implementations {sorted(unknown)}; known: {', '.join(IMPLS)}")
    if unknown := set(cases or ()) - set(CASES):
        raise ValueError(f"unknown cases {sorted(unknown)}; known: {', '.join(CASES)}")
    return [CASES[name] for name in (CASES if cases is None else cases)]


def _cuda_graphs(device: torch.device, requested: bool | None) -> bool:
    if requested and device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
    return device.type == "cuda" if requested is None else requested


def _bench_case(
    case: Case, shape: Shape, dtype: torch.dtype, device: torch.device, impls: Sequence[str], graphs: bool
) -> Iterator[dict]:
    inputs = case.inputs(shape, dtype, device)
    compiled = _compile(case, inputs)
    kernels = count_kernels(compiled)
    if kernels == 0:
        raise BenchmarkError(f"{case.name}: the compiled graph calls no ad-mlir kernel (pipeline '{case.pipeline}')")
    expected = _as_tuple(case.module(*inputs))
    check_outputs(f"{case.name} at {shape}", _as_tuple(compiled(*inputs)), expected, dtype)
    nbytes = sum(t.nbytes for t in (*inputs, *expected))
    modes = ("plain", "cuda-graph") if graphs else ("plain",)
    for impl in impls:
        fn = _implementation(impl, case, compiled)
        fn(*inputs)  # compiles (torch.compile) and warms up outside the timed calls
        for mode in modes:
            t = measure(lambda fn=fn: fn(*inputs), device, cuda_graph=mode == "cuda-graph")
            yield {
                "case": case.name, "impl": impl, "mode": mode, "tokens": shape.tokens, "hidden": shape.hidden,
                "dtype": str(dtype).removeprefix("torch."), "median_ms": t.median_ms, "p20_ms": t.p20_ms,
                "p80_ms": t.p80_ms, "bytes": nbytes, "bytes_formula": case.bytes_formula,
                "gbps": achieved_gbps(nbytes, t), "kernels": kernels if impl == "ad-mlir" else None,
            }


def _compile(case: Case, inputs: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    try:
        return ad_mlir.compile(torch.export.export(case.module, inputs), pipeline=case.pipeline)
    except Exception as e:  # any failure inside export or the compiler: name the case it stopped
        raise BenchmarkError(f"{case.name}: compiling with pipeline '{case.pipeline}' failed: {e}") from e


def _implementation(impl: str, case: Case, compiled: torch.fx.GraphModule) -> Callable[..., object]:
    if impl == "ad-mlir":
        return compiled
    if impl == "eager":
        return case.module
    # One compilation per (case, shape), from scratch: Dynamo's recompile limit (8 per function)
    # would otherwise send later shapes of the same module back to eager, silently.
    torch.compiler.reset()
    return torch.compile(case.module, dynamic=False)


def count_kernels(gm: torch.fx.GraphModule) -> int:
    """Calls of ad-mlir kernels in `gm` (`torch.ops.ad_mlir.*` ops that are not references)."""
    targets = (str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    return sum(1 for t in targets if t.startswith(f"{torch_ops.NAMESPACE}.") and t not in torch_ops.REFERENCE_OPS)


def _as_tuple(out: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


FLOAT_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 4 * 2.0**-7, torch.float16: 4 * 2.0**-10}
"""Relative tolerance of the ad-mlir outputs against eager, by the case's dtype. The kernels
compute in fp32 and round once at the store; eager rounds after each op in the dtype. The cases
chain up to ~4 such roundings of at most one ulp each (the Triton interpreter truncates: a
full ulp), so 16-bit outputs agree within 4 ulps (2^-7 relative per bf16 ulp, 2^-10 per fp16
ulp). The bound is taken relative to the largest output too, because sums that cancel (RoPE's
x*cos + rotate_half(x)*sin, x + residual) keep the rounding errors of their larger terms. In
fp32 only the order of reductions (row sums, softmax over keys) and the transcendental functions
differ: ~1e-6, with margin for long rows. A wrong kernel (wrong row, broadcast or formula) is
off by the order of the values themselves."""


def check_outputs(
    what: str, got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], dtype: torch.dtype
) -> None:
    """Raise BenchmarkError unless the ad-mlir outputs match eager's (see FLOAT_TOLERANCE and
    `_check_fp8`)."""
    if len(got) != len(expected):
        raise BenchmarkError(f"{what}: ad-mlir returns {len(got)} outputs, eager {len(expected)}")
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        try:
            if (g.dtype, g.shape) != (e.dtype, e.shape):
                raise AssertionError(f"{g.dtype}{list(g.shape)} instead of {e.dtype}{list(e.shape)}")
            if e.dtype == FP8:
                _check_fp8(g.float(), e.float())
            else:
                tol = FLOAT_TOLERANCE[dtype]
                peak = e.float().abs().max().item()
                torch.testing.assert_close(g.float(), e.float(), rtol=tol, atol=tol * peak)
        except AssertionError as err:
            raise BenchmarkError(f"{what}: ad-mlir output {i} differs from eager, not timing it:\n{err}") from None


def _check_fp8(got: torch.Tensor, expected: torch.Tensor) -> None:
    """FP8 values, compared as e4m3 values in units of their scale (the static scale is the same
    input; dynamic scales are outputs, checked like any fp32 output). e4m3 has 3 mantissa bits:
    one step is 2^(k-3) for |v| in [2^k, 2^(k+1)), 2^-9 below 2^-6. Kernel and eager may pick
    neighbours: the value before the conversion carries different bf16 roundings (and, with a
    dynamic scale, a scale a few ulps apart), and the Triton interpreter breaks ties to the odd
    neighbour and can drop the carry when a value rounds up into the next binade (31.3 -> 16,
    where torch gives 32; DESIGN.md). So each value must be within one step (at most 1/8 of it)
    of eager's, or be a power of two whose double is; a wrong kernel is off by far more."""
    step = torch.exp2(torch.floor(torch.log2(expected.abs().clamp_min(2.0**-6))) - 3)
    lost_carry = (torch.frexp(got).mantissa.abs() == 0.5) & ((2 * got - expected).abs() <= step)
    far = ~(((got - expected).abs() <= step) | lost_carry)
    if bool(far.any()):
        raise AssertionError(f"{int(far.sum())} of {far.numel()} fp8 values are more than one e4m3 step off")
