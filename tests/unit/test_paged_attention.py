"""`ad.cached_attention`'s paged form (one flattened batch, `query_starts`, block tables over
pages of 4 tokens): its torch reference (`torch_ops.cached_attention`) and its kernel template
(in the Triton interpreter on CPU, conftest sets TRITON_INTERPRET=1 where CUDA is absent),
against the slot form: each sequence of a flattened step is, on its own, a batch row whose
slot (one page of every position) holds what its pages hold (that form is checked against
eager torch and HF in test_cached_attention_kernel.py and the generation tests). Pages
are filled with random values (stale tokens), the block tables list each sequence's pages out
of order in the pool, and the sequences of one call mix chunked prefill, prefill from 0 and
decode, across page boundaries, with GQA, two sequences sharing a full first page (prefix
caching's case); a step of decodes alone takes the split-K decode path. The kernel's PTX for
sm_90 compiles without spills at Llama-3-8B and gpt-oss sizes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from template_modules import template_builder

from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.cached_attention_kernel import (
    DECODE,
    PREFILL,
    REDUCE,
    CachedAttentionSpec,
    emit_cached_attention_module,
)
from ad_mlir.dialects.ad import QkNorm
from ad_mlir.semantics import torch_ops

PAGE = 4


@dataclass
class Step:
    """One flattened step: sequence s holds `starts[s]` tokens and brings `news[s]` new ones."""

    starts: list[int]
    news: list[int]
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    v_head_dim: int | None = None
    dtype: torch.dtype = torch.float32
    rope: bool = True
    seed: int = 0
    shared: bool = False
    """Sequences 0 and 1 share their first page (a cached prefix, as prefix caching shares it)."""

    def __post_init__(self) -> None:
        g = torch.Generator().manual_seed(self.seed)
        tokens, d, vd = sum(self.news), self.head_dim, self.v_head_dim or self.head_dim
        self.q = torch.randn(1, self.heads, tokens, d, generator=g).to(self.dtype)
        self.k = torch.randn(1, self.kv_heads, tokens, d, generator=g).to(self.dtype)
        self.v = torch.randn(1, self.kv_heads, tokens, vd, generator=g).to(self.dtype)
        self.query_starts = torch.tensor([0, *torch.tensor(self.news).cumsum(0).tolist()])
        self.cache_starts = torch.tensor(self.starts)
        need = [-(-(s + n) // PAGE) for s, n in zip(self.starts, self.news, strict=True)]
        width = max(need) + 1  # one entry past every sequence's pages: never read
        pool = sum(need) + 3
        order = torch.randperm(pool, generator=g)  # pages in no order, some never used
        self.block_tables = torch.full((len(self.starts), width), pool + 100)  # unused entries out of range
        used = 0
        for s, n in enumerate(need):
            self.block_tables[s, :n] = order[used:used + n]
            used += n
        if self.shared:
            assert min(self.starts[:2]) >= PAGE, "a shared page must be full and before both starts"
            self.block_tables[1, 0] = self.block_tables[0, 0]
        self.k_pages = torch.randn(pool, PAGE, self.kv_heads, d, generator=g).to(self.dtype)
        self.v_pages = torch.randn(pool, PAGE, self.kv_heads, vd, generator=g).to(self.dtype)
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(self.starts, self.news, strict=True)])
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2) / d))
        angles = positions[:, None].float() * inv_freq
        emb = torch.cat([angles, angles], -1)[None]
        self.tables = [emb.cos().to(self.dtype), emb.sin().to(self.dtype)] if self.rope else [None, None]

    def paged_arguments(self) -> list:
        """The op's operands up to `cache_starts` (`query_starts` follows in the op, and is the
        reference's keyword)."""
        return [self.q, self.k, self.v, *self.tables, self.k_pages, self.v_pages, self.block_tables,
                self.cache_starts]

    def slot_form(self, **options: Any) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """What `cached_attention` gives, sequence by sequence, from a slot holding what the
        sequence's pages hold: the output [1, heads, T, vd], and each sequence's K and V after the
        step ([positions, kv_heads, d])."""
        out, keys, values = torch.empty(1, self.heads, sum(self.news), self.v.shape[3], dtype=self.dtype), [], []
        for s, (start, n) in enumerate(zip(self.starts, self.news, strict=True)):
            first = int(self.query_starts[s])
            rows = slice(first, first + n)
            pages = self.block_tables[s, :-(-(start + n) // PAGE)]
            k_cache = self.k_pages[pages].flatten(0, 1)[None].clone()
            v_cache = self.v_pages[pages].flatten(0, 1)[None].clone()
            tables = [t[:, rows] if t is not None else None for t in self.tables]
            per_token = {"distance_bias": options["distance_bias"][:, :, rows]} if "distance_bias" in options else {}
            out[:, :, rows] = torch_ops.cached_attention(
                self.q[:, :, rows], self.k[:, :, rows], self.v[:, :, rows], *tables, k_cache, v_cache,
                torch.tensor([[0]]), torch.tensor([start]), self.head_dim**-0.5, **(options | per_token))
            keys.append(k_cache[0, :start + n])
            values.append(v_cache[0, :start + n])
        return out, keys, values

    def held(self, pages: torch.Tensor, s: int) -> torch.Tensor:
        """Sequence s's positions as `pages` hold them after the step."""
        end = self.starts[s] + self.news[s]
        return pages[self.block_tables[s, :-(-end // PAGE)]].flatten(0, 1)[:end]


STEPS = {
    # a prefill from 0 over 2.5 pages, a chunk after 5 cached tokens, a decode at a page's last row
    "mixed": Step(starts=[0, 5, 7], news=[10, 6, 1]),
    # decodes only: at a page boundary, in the middle of a page, at position 0
    "decode": Step(starts=[8, 13, 0], news=[1, 1, 1]),
    # two sequences on one shared full first page, a chunk and a decode after it
    "shared": Step(starts=[6, 9], news=[3, 1], shared=True),
    # MLA-like value head dim, no RoPE
    "value_dim": Step(starts=[3, 0], news=[2, 9], v_head_dim=8, rope=False),
}


@pytest.mark.parametrize("name", STEPS)
@pytest.mark.parametrize("window", [None, 3])
def test_reference_is_the_slot_form_per_sequence(name: str, window: int | None) -> None:
    step = STEPS[name]
    expected, keys, values = step.slot_form(window=window)
    k_pages, v_pages = step.k_pages.clone(), step.v_pages.clone()
    args = step.paged_arguments()
    args[5:7] = k_pages, v_pages
    got = torch_ops.cached_attention(*args, step.head_dim**-0.5, window, query_starts=step.query_starts)
    # bit for bit where no sequence decodes; a step's decodes run as one attention over every
    # decoding sequence, not the CPU flash kernel per sequence: the same sums in another order
    # (fp32's default tolerance)
    exact = all(n != 1 for n in step.news)
    torch.testing.assert_close(got, expected, **({"rtol": 0, "atol": 0} if exact else {}))
    for s in range(len(step.starts)):
        torch.testing.assert_close(step.held(k_pages, s), keys[s], rtol=0, atol=0)
        torch.testing.assert_close(step.held(v_pages, s), values[s], rtol=0, atol=0)
    untouched = torch.ones(k_pages.shape[0], dtype=torch.bool)
    untouched[step.block_tables[step.block_tables < k_pages.shape[0]]] = False
    assert torch.equal(k_pages[untouched], step.k_pages[untouched])


TOLERANCE = {torch.float32: 16 * 2.0**-23, torch.bfloat16: 3 * 2.0**-7}
"""|kernel - slot form| <= k eps (1 + |slot form|): test_cached_attention_kernel.py's bound, for
the same reasons (the same online softmax and dot roundings against eager attention)."""
CACHE_TOLERANCE = {torch.float32: 0.0, torch.bfloat16: 2.0**-7}
"""The rotated key written: exact in fp32, one bf16 ulp (test_cached_attention_kernel.py's)."""
QK_NORM_CACHE_TOLERANCE = 8 * 2.0**-23
"""The normalized, rotated key written in fp32: Triton's rsqrt and row sum differ from torch's
in the last bits (test_cached_attention_kernel.py's bound; measured 4.8e-7 here)."""


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[CachedAttentionSpec], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("paged_attention_kernels"), "paged_attn",
                            emit_cached_attention_module)


def _spec(step: Step, **options: Any) -> CachedAttentionSpec:
    v_dim = step.v_head_dim if step.v_head_dim != step.head_dim else None
    return CachedAttentionSpec(step.head_dim, step.dtype, step.head_dim**-0.5, step.rope,
                               step.dtype if step.rope else None, v_head_dim=v_dim, flattened=True, **options)


def _close(got: torch.Tensor, expected: torch.Tensor, k_eps: float) -> None:
    err = (got.double() - expected.double()).abs()
    bound = k_eps * (1 + expected.double().abs())
    assert (err <= bound).all(), f"max error {err.max().item():.3g}, excess {(err - bound).max().item():.3g}"


def _check_kernel(build: Callable, step: Step, **options: Any) -> None:  # noqa: ANN001
    """The kernel's output and pages against the slot form; pages of no sequence untouched."""
    norm = QkNorm(options["qk_norm_eps"], 0.0, False) if "qk_norm_eps" in options else None
    module = build(_spec(step, **{k: v for k, v in options.items() if k in ("window", "softcap")},
                         sinks="sinks" in options, alibi="alibi_slopes" in options, qk_norm=norm,
                         distance_extent=options["distance_bias"].shape[3] if "distance_bias" in options else None))
    expected, keys, values = step.slot_form(**options)
    k_pages, v_pages = step.k_pages.clone(), step.v_pages.clone()
    args = step.paged_arguments()
    args[5:7] = k_pages, v_pages
    weights = [options[n] for n in ("q_norm_weight", "k_norm_weight") if n in options]
    tensors = [t for t in args[:5] if t is not None] + weights + args[5:] + [step.query_starts]
    tensors += [options[n] for n in ("sinks", "alibi_slopes", "distance_bias") if n in options]
    out, = module.launch(getattr(module, module.kernel_name), tensors, [])
    _close(out, expected, TOLERANCE[step.dtype])
    for s in range(len(step.starts)):
        _close(step.held(k_pages, s), keys[s], QK_NORM_CACHE_TOLERANCE if norm else CACHE_TOLERANCE[step.dtype])
        _close(step.held(v_pages, s), values[s], 0.0)
    untouched = torch.ones(k_pages.shape[0], dtype=torch.bool)
    untouched[step.block_tables[step.block_tables < k_pages.shape[0]]] = False
    assert torch.equal(k_pages[untouched], step.k_pages[untouched])
    assert torch.equal(v_pages[untouched], step.v_pages[untouched])


@pytest.mark.parametrize("name", STEPS)
@pytest.mark.parametrize("window", [None, 3])
def test_kernel_is_the_slot_form_per_sequence(build, name: str, window: int | None) -> None:  # noqa: ANN001
    """Mixed prefill and decode (the variable-length prefill path), decodes alone (split-K),
    a value head dim of its own; with and without a sliding window shorter than a page."""
    _check_kernel(build, STEPS[name], window=window)


@pytest.mark.parametrize("decode", [False, True], ids=["mixed", "decode"])
def test_kernel_soft_cap_sinks_and_alibi(build, decode: bool) -> None:  # noqa: ANN001
    """Gemma2's soft cap with gpt-oss's sinks and BLOOM's ALiBi slopes, on both paths."""
    step = STEPS["decode" if decode else "mixed"]
    g = torch.Generator().manual_seed(1)
    _check_kernel(build, step, softcap=2.0, sinks=torch.randn(step.heads, generator=g) * 2,
                  alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625]))


@pytest.mark.parametrize("decode", [False, True], ids=["mixed", "decode"])
def test_kernel_qk_norm(build, decode: bool) -> None:  # noqa: ANN001
    """Qwen3's per-head QK-norm before RoPE (the pages hold the normalized, rotated keys):
    weights around 1 but not 1, on both paths; fp32 within the cached kernel's QK-norm bound
    (Triton's rsqrt and row sums differ from torch's in the last bits: a few ulps)."""
    step = STEPS["decode" if decode else "mixed"]
    g = torch.Generator().manual_seed(3)
    weights = [torch.randn(step.head_dim, generator=g) * 0.3 + 1 for _ in range(2)]
    _check_kernel(build, step, q_norm_weight=weights[0], k_norm_weight=weights[1], qk_norm_eps=1e-6)


@pytest.mark.parametrize("decode", [False, True], ids=["mixed", "decode"])
def test_distance_bias(build, decode: bool) -> None:  # noqa: ANN001
    """Inkling's per-token distance bias (extent 5: past a page of 4, short of the longest
    sequence), window 6, on both paths: the kernel and the op's reference against the slot form
    (whose reference is checked against HF's gather form in test_cached_attention_kernel.py);
    the bias of std 2 moves the outputs past the tolerance (checked)."""
    step = STEPS["decode" if decode else "mixed"]
    bias = torch.randn(1, step.heads, sum(step.news), 5, generator=torch.Generator().manual_seed(4)) * 2
    _check_kernel(build, step, window=6, distance_bias=bias)
    expected = step.slot_form(window=6, distance_bias=bias)[0]
    args = step.paged_arguments()
    args[5:7] = step.k_pages.clone(), step.v_pages.clone()
    got = torch_ops.cached_attention(*args, step.head_dim**-0.5, 6, distance_bias=bias, query_starts=step.query_starts)
    torch.testing.assert_close(got, expected)
    assert (expected - step.slot_form(window=6)[0]).abs().max() > 0.1


def test_kernel_in_bf16(build) -> None:  # noqa: ANN001
    _check_kernel(build, Step(starts=[0, 5, 7], news=[10, 6, 1], dtype=torch.bfloat16, seed=2))


def _meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


PTX_FORMS = {
    # Llama-3-8B: 32 query / 8 K/V heads of 128, RoPE, in bf16 and fp32
    "llama3-bf16": (torch.bfloat16, 32, 8, 128, {}),
    "llama3-fp32": (torch.float32, 32, 8, 128, {}),
    # gpt-oss-120b's sliding layers: 64 query / 8 K/V heads of 64, sinks, window 128, RoPE before
    "gpt-oss-bf16": (torch.bfloat16, 64, 8, 64, {"rope": False, "cos_dtype": None, "window": 128, "sinks": True}),
    # Inkling's sliding layers: 64 query / 16 K/V heads of 128, window 512, a relative bias over
    # 512 distances per token (QK-norm and the k/v convolutions before)
    "inkling-bf16": (torch.bfloat16, 64, 16, 128, {"rope": False, "cos_dtype": None, "window": 512,
                                                   "distance_extent": 512}),
}


@pytest.mark.parametrize("form", PTX_FORMS)
def test_ptx_for_sm90_has_no_spills(form: str, tmp_path: Path) -> None:
    """Pages of 16 tokens, a pool of 4096 pages, block tables of 512 pages (8192 positions): a
    step of 1024 tokens of 4 sequences (the prefill path) and a decode step of 8 sequences
    (split kernel + reduce), compiled for sm_90 as the runtime specializes them: no spills."""
    dtype, heads, kv_heads, head_dim, options = PTX_FORMS[form]
    fields = {"rope": True, "cos_dtype": dtype, **options}
    spec = CachedAttentionSpec(head_dim, dtype, head_dim**-0.5, flattened=True, **fields)
    module = template_builder(tmp_path, "paged_attn_ptx", emit_cached_attention_module)(spec)
    launches = []
    for seqs, tokens in ((4, 1024), (8, 8)):
        tables = [_meta(1, tokens, head_dim, dtype=dtype)] * 2 if spec.rope else []
        tensors = [_meta(1, heads, tokens, head_dim, dtype=dtype),
                   *[_meta(1, kv_heads, tokens, head_dim, dtype=dtype)] * 2, *tables,
                   *[_meta(4096, 16, kv_heads, head_dim, dtype=dtype)] * 2,
                   _meta(seqs, 512, dtype=torch.int64), _meta(seqs, dtype=torch.int64),
                   _meta(seqs + 1, dtype=torch.int64), *([_meta(heads, dtype=dtype)] if spec.sinks else []),
                   *([_meta(1, heads, tokens, spec.distance_extent, dtype=dtype)] if spec.distance_extent else [])]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.constexprs["PHASE"] for s in specs] == [PREFILL, DECODE, REDUCE]
    for spec, report in zip(specs, compile_all(specs), strict=True):
        assert report.spills == 0, (spec.constexprs["PHASE"], report)
