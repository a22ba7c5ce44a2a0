"""The attention kernel template (flash attention with RoPE inside and native GQA) against eager
torch as HF runs it (RoPE in the input dtype, `repeat_kv`, then SDPA), in the Triton
interpreter on CPU (conftest sets TRITON_INTERPRET=1 where CUDA is absent) or on the GPU;
and its PTX for sm_90, compiled without a GPU: no spills, shared memory within an H100's.

q, k and v are made as HF makes them, a projection's [B, S, H * D] output viewed as heads and
transposed, so the kernel reads them through non-unit strides; sizes are small because the
interpreter's cost is per program."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
import triton
from template_modules import template_builder
from triton.compiler import make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from ad_mlir.codegen.ptx import (
    TARGET,
    PtxReport,
    Specialization,
    _compile_in_child,
    compile_specialization,
    record_launch,
    specialize_module,
)
from ad_mlir.codegen.templates.attention_kernel import AttentionSpec, attention_blocks, emit_attention_module
from ad_mlir.dialects.ad import QkNorm
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Tolerances against eager: |kernel - eager| <= k eps (1 + |eager|), eps the dtype's machine
# epsilon (bf16 2^-7, fp16 2^-10, fp32 2^-23). The largest k measured over this file's cases
# (outputs reach |4.3|) sets each bound, with room:
# - fp32: both sides compute in fp32 and differ by summation order, exp2 for exp, and FMA
#   contraction: k = 6.7 measured (max |diff| 1.4e-6, at |out| 3.7); bound 16.
# - bf16/fp16: eager applies RoPE in the 16-bit dtype, rounding after each op, while the
#   kernel keeps RoPE, scores and softmax in fp32 and rounds Q, K and P once, for the dots; the
#   interpreter also rounds stores toward zero (up to 1 ulp; eager is within 1/2). k = 1.92 for
#   bf16 (max |diff| 0.031 = 2 ulps at |out| in [2, 4), and 0.0156 at |out| < 0.5) and 1.51
#   for fp16 (max 1.95e-3); bound 3. The error does not shrink with the output: a score's
#   error moves the weights of values of size O(1).
TOLERANCE = {
    dtype: {"atol": k * torch.finfo(dtype).eps, "rtol": k * torch.finfo(dtype).eps}
    for dtype, k in ((torch.float32, 16), (torch.bfloat16, 3), (torch.float16, 3))
}

H100_SHARED_MEMORY = 227 * 1024
"""The most shared memory one program may ask for on sm_90."""


# ------------------------------------------------------------------------ helpers


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[AttentionSpec], ModuleType]:
    """`build(spec) -> module`, each spec emitted and imported once per worker."""
    return template_builder(tmp_path_factory.mktemp("attention_kernels"), "attn", emit_attention_module)


def _run(module: ModuleType, tensors: list[torch.Tensor]) -> torch.Tensor:
    [out] = module.launch(getattr(module, module.kernel_name), tensors, [])
    return out


def _heads(batch: int, seq: int, heads: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, H, S, D] as HF gets it: `proj(x).view(b, s, h, d).transpose(1, 2)` (non-contiguous)."""
    proj = torch.randn(batch, seq, heads * head_dim, dtype=dtype, device=DEVICE)
    return proj.view(batch, seq, heads, head_dim).transpose(1, 2)


def _qkv(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, dtype: torch.dtype) -> list[torch.Tensor]:
    return [_heads(batch, seq, h, head_dim, dtype) for h in (heads, kv_heads, kv_heads)]


def _rope_tables(batch: int, seq: int, head_dim: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """HF's cos and sin [batch, S, D] (emb = cat(freqs, freqs)). Batch b's positions step by
    b + 1, so reading another batch's rows shows (shifting all positions would not: RoPE scores
    depend on position differences only)."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    positions = torch.arange(seq, dtype=torch.float32)[None, :] * (1 + torch.arange(batch)[:, None])
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return [emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)]


def _rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """transformers' rotate_half, or GPT-J's rotate_every_two for interleaved pairs."""
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb, partial rotary as GPT-NeoX's (the first cos.shape[-1]
    dims rotate, the rest pass), in the inputs' dtypes (fp32 tables promote, and the result goes
    back to x's dtype as the attention that follows needs)."""
    rotary = cos.shape[-1]
    rot = x[..., :rotary]
    rot = rot * cos.unsqueeze(1) + _rotate(rot, interleaved) * sin.unsqueeze(1)
    return torch.cat((rot.to(x.dtype), x[..., rotary:]), dim=-1)


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor | None = None,
           sin: torch.Tensor | None = None, mask: torch.Tensor | None = None, causal: bool = False,
           scale: float | None = None, softcap: float | None = None, interleaved: bool = False) -> torch.Tensor:
    if cos is not None:
        q, k = _apply_rope(q, cos, sin, interleaved), _apply_rope(k, cos, sin, interleaved)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    # HF's eager Gemma2 attention (scores in fp32 here: the kernel's), an additive mask
    scores = torch.tanh(q.float() @ k.float().transpose(-1, -2) * scale / softcap) * softcap
    probs = (scores + torch.where(mask, 0.0, float("-inf"))).softmax(-1)
    return (probs.to(q.dtype) @ v).contiguous()


def _spec(head_dim: int, dtype: torch.dtype, rope: bool = True, has_mask: bool = False, causal: bool = True,
          cos_dtype: torch.dtype | None = None, **fields: object) -> AttentionSpec:
    return AttentionSpec(head_dim, dtype, rope, has_mask, causal, head_dim**-0.5,
                         (cos_dtype or dtype) if rope else None, **fields)


def _assert_matches(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert out.shape == expected.shape and out.dtype == expected.dtype and out.is_contiguous()
    torch.testing.assert_close(out, expected, **TOLERANCE[out.dtype])


def _random_mask(shape: tuple[int, ...]) -> torch.Tensor:
    """A random boolean mask with at least one key kept in every row."""
    mask = torch.rand(shape, device=DEVICE) < 0.4
    keep = torch.randint(0, shape[-1], shape[:-1], device=DEVICE)
    return mask.scatter(-1, keep[..., None], True)


# ---------------------------------------------------------------------- numerics


@pytest.mark.parametrize("seq", [1, 5, 17, 40])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 1), (4, 4)], ids=["gqa2", "mqa", "mha"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_rope_causal_gqa_matches_eager(build, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int,  # noqa: ANN001
                                       seq: int) -> None:
    """The Llama prefill: causal, RoPE tables of batch 1 broadcast over a batch of 2, K/V
    shared by groups of q heads; sequences shorter than a block and with partial tails."""
    q, k, v = _qkv(2, heads, kv_heads, seq, head_dim, dtype)
    cos, sin = _rope_tables(1, seq, head_dim, dtype)
    out = _run(build(_spec(head_dim, dtype)), [q, k, v, cos, sin])
    _assert_matches(out, _eager(q, k, v, cos, sin, causal=True, scale=head_dim**-0.5))


@pytest.mark.parametrize("cos_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("cos_batch", [1, 2])
def test_rope_tables_per_batch_and_in_fp32(build, cos_batch: int, cos_dtype: torch.dtype) -> None:  # noqa: ANN001
    q, k, v = _qkv(2, 4, 2, 17, 64, torch.bfloat16)
    cos, sin = _rope_tables(cos_batch, 17, 64, cos_dtype)
    out = _run(build(_spec(64, torch.bfloat16, cos_dtype=cos_dtype)), [q, k, v, cos, sin])
    _assert_matches(out, _eager(q, k, v, cos, sin, causal=True, scale=64**-0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rope_formula_with_arbitrary_tables(build, dtype: torch.dtype) -> None:  # noqa: ANN001
    """`x * cos + rotate_half(x) * sin` for any cos/sin, not only HF's, whose two halves are
    equal (a kernel that read one half's table for both would pass with those)."""
    q, k, v = _qkv(2, 4, 2, 17, 64, dtype)
    cos, sin = (torch.rand(2, 17, 64, device=DEVICE).to(dtype) * 2 - 1 for _ in range(2))
    out = _run(build(_spec(64, dtype)), [q, k, v, cos, sin])
    _assert_matches(out, _eager(q, k, v, cos, sin, causal=True, scale=64**-0.5))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_without_rope(build, dtype: torch.dtype, causal: bool) -> None:  # noqa: ANN001
    q, k, v = _qkv(2, 4, 2, 40, 64, dtype)
    out = _run(build(_spec(64, dtype, rope=False, causal=causal)), [q, k, v])
    _assert_matches(out, _eager(q, k, v, causal=causal, scale=64**-0.5))


def test_contiguous_and_packed_qkv(build) -> None:  # noqa: ANN001
    """Contiguous [B, H, S, D] inputs, and q/k/v sliced out of one packed qkv projection (row
    stride (Hq + 2 Hkv) D)."""
    dtype, (b, s, h, hkv, d) = torch.bfloat16, (2, 17, 4, 2, 64)
    kernel = build(_spec(d, dtype))
    cos, sin = _rope_tables(1, s, d, dtype)
    contiguous = [t.contiguous() for t in _qkv(b, h, hkv, s, d, dtype)]
    qkv = torch.randn(b, s, (h + 2 * hkv) * d, dtype=dtype, device=DEVICE)
    packed = [x.view(b, s, -1, d).transpose(1, 2) for x in qkv.split([h * d, hkv * d, hkv * d], dim=-1)]
    for q, k, v in (contiguous, packed):
        _assert_matches(_run(kernel, [q, k, v, cos, sin]), _eager(q, k, v, cos, sin, causal=True, scale=d**-0.5))


@pytest.mark.parametrize("expand", [False, True], ids=["1x1xSxS", "expanded"])
def test_explicit_causal_mask_equals_is_causal(build, expand: bool) -> None:  # noqa: ANN001
    """HF's boolean causal mask [1, 1, S, S], as is or `.expand`ed to [B, Hq, S, S] (stride 0)."""
    dtype, seq = torch.bfloat16, 40
    q, k, v = _qkv(2, 4, 2, seq, 64, dtype)
    cos, sin = _rope_tables(1, seq, 64, dtype)
    mask = torch.ones(seq, seq, dtype=torch.bool, device=DEVICE).tril()[None, None]
    if expand:
        mask = mask.expand(2, 4, seq, seq)
    out = _run(build(_spec(64, dtype, has_mask=True, causal=False)), [q, k, v, cos, sin, mask])
    _assert_matches(out, _eager(q, k, v, cos, sin, causal=True, scale=64**-0.5))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_shape", [(2, 4), (2, 1), (1, 4)], ids=["BxH", "Bx1", "1xH"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_random_mask(build, dtype: torch.dtype, mask_shape: tuple[int, int], causal: bool) -> None:  # noqa: ANN001
    """A padding-like random mask, alone or with causal (SDPA takes one of them: the reference
    gets their conjunction)."""
    seq = 40
    q, k, v = _qkv(2, 4, 2, seq, 64, dtype)
    cos, sin = _rope_tables(2, seq, 64, dtype)
    mask = _random_mask((*mask_shape, seq, seq))
    if causal:
        mask = mask.tril().scatter(-1, torch.zeros(*mask_shape, seq, 1, dtype=torch.long, device=DEVICE), True)
    out = _run(build(_spec(64, dtype, has_mask=True, causal=causal)), [q, k, v, cos, sin, mask])
    _assert_matches(out, _eager(q, k, v, cos, sin, mask=mask, scale=64**-0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fully_masked_rows_are_zero_as_in_sdpa(build, dtype: torch.dtype) -> None:  # noqa: ANN001
    """Torch 2.13's SDPA returns 0 for a query that may attend to no key (CPU, all backends);
    the kernel stores the same, not NaN. Rows in the first and a later query block, and a whole
    (batch, head) masked out."""
    seq = 40
    q, k, v = _qkv(2, 4, 2, seq, 64, dtype)
    cos, sin = _rope_tables(1, seq, 64, dtype)
    mask = _random_mask((2, 4, seq, seq))
    mask[0, 1, [0, 17, 39]] = False
    mask[1, 3] = False
    out = _run(build(_spec(64, dtype, has_mask=True, causal=False)), [q, k, v, cos, sin, mask])
    expected = _eager(q, k, v, cos, sin, mask=mask, scale=64**-0.5)
    assert not out.isnan().any()
    assert (out[0, 1, [0, 17, 39]] == 0).all() and (out[1, 3] == 0).all()
    assert (expected[0, 1, [0, 17, 39]] == 0).all() and (expected[1, 3] == 0).all()
    _assert_matches(out, expected)


def _sliding_window(seq: int, window: int) -> torch.Tensor:
    """HF's sliding-window causal mask: key j seen by query i when i - window < j <= i."""
    query, key = torch.arange(seq, device=DEVICE)[:, None], torch.arange(seq, device=DEVICE)[None, :]
    return (key <= query) & (key > query - window)


@pytest.mark.parametrize("window", [1, 3, 20, 50, 100, 300])
@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.float32, 64), (torch.bfloat16, 256)], ids=str)
def test_sliding_window_matches_eager(build, dtype: torch.dtype, head_dim: int, window: int) -> None:  # noqa: ANN001
    """Windows inside one key block, across blocks, and longer than the 100-token sequence: 32
    (fp32) or 64 (bf16) query rows per program and 32 or 16 keys per step, so later query blocks
    skip whole key blocks before their window. The op's torch reference computes the same."""
    seq = 100
    q, k, v = _qkv(2, 4, 2, seq, head_dim, dtype)
    cos, sin = _rope_tables(1, seq, head_dim, dtype)
    expected = _eager(q, k, v, cos, sin, mask=_sliding_window(seq, window), scale=head_dim**-0.5)
    _assert_matches(_run(build(_spec(head_dim, dtype, window=window)), [q, k, v, cos, sin]), expected)
    reference = torch_ops.rope_attention(q, k, v, cos, sin, None, head_dim**-0.5, is_causal=True, window=window)
    _assert_matches(reference.contiguous(), expected)


def test_sliding_window_and_mask_combine(build) -> None:  # noqa: ANN001
    """A boolean mask operand with a window: a key is seen where both allow it."""
    dtype, seq = torch.float32, 40
    q, k, v = _qkv(2, 4, 2, seq, 64, dtype)
    cos, sin = _rope_tables(1, seq, 64, dtype)
    mask = _random_mask((2, 1, seq, seq)) | torch.eye(seq, dtype=torch.bool, device=DEVICE)
    out = _run(build(_spec(64, dtype, has_mask=True, window=7)), [q, k, v, cos, sin, mask])
    _assert_matches(out, _eager(q, k, v, cos, sin, mask=mask & _sliding_window(seq, 7), scale=64**-0.5))


def _soft_capped_case(dtype: torch.dtype, heads: int, kv_heads: int, gain: float, softcap: float,
                      window: int | None) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """(inputs, the op's torch reference, eager Gemma2) for q and k scaled by `gain`."""
    seq, head_dim = 40, 64
    q, k, v = _qkv(2, heads, kv_heads, seq, head_dim, dtype)
    q, k = q * gain, k * gain
    cos, sin = _rope_tables(1, seq, head_dim, dtype)
    expected = _eager(q, k, v, cos, sin, mask=_sliding_window(seq, window or seq), scale=head_dim**-0.5,
                      softcap=softcap)
    reference = torch_ops.rope_attention(q, k, v, cos, sin, None, head_dim**-0.5, is_causal=True, window=window,
                                         softcap=softcap)
    return [q, k, v, cos, sin], reference.contiguous(), expected


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize(("dtype", "heads", "kv_heads"), [(torch.float32, 4, 2), (torch.bfloat16, 4, 1)], ids=str)
def test_soft_cap_matches_eager_gemma2(build, dtype: torch.dtype, heads: int, kv_heads: int,  # noqa: ANN001
                                       window: int | None) -> None:
    """Gemma2's soft cap, causal and in a sliding window, GQA and MQA. Scores reach ~4.4, so a
    cap of 2 bends most of them (without the cap the outputs differ by 0.8, measured)."""
    inputs, reference, expected = _soft_capped_case(dtype, heads, kv_heads, 1.0, 2.0, window)
    _assert_matches(_run(build(_spec(64, dtype, window=window, softcap=2.0)), inputs), expected)
    _assert_matches(reference, expected)


def test_soft_cap_of_50_on_large_scores(build) -> None:  # noqa: ANN001
    """Gemma2's cap of 50 bends only large scores: q and k scaled by 3 give scores up to 41.5,
    which the cap moves by up to 7.5. fp32: a score s is computed to a few ulps of s, which
    moves its softmax weight by that much relative: the tolerance is this file's fp32 one times
    the largest |score|, 16 * 42 eps (measured: 5.4e-6, a tenth of it)."""
    inputs, reference, expected = _soft_capped_case(torch.float32, 4, 2, 3.0, 50.0, None)
    out = _run(build(_spec(64, torch.float32, softcap=50.0)), inputs)
    tolerance = 16 * 42 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(reference, expected, atol=tolerance, rtol=tolerance)
    uncapped = _eager(*inputs, causal=True, scale=64**-0.5)
    assert (uncapped - expected).abs().max() > 100 * tolerance, "the cap of 50 changed nothing: the test cannot fail"


def _hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, gemma: bool) -> torch.Tensor:
    """transformers' Qwen3RMSNorm (eps 1e-6: fp32 normalization rounded to x's dtype, times the
    weight in its dtype) or Gemma3RMSNorm (times 1 + the weight in fp32, then rounded)."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (normed * (1.0 + weight.float())).to(x.dtype) if gemma else weight * normed.to(x.dtype)


@pytest.mark.parametrize("gemma", [False, True], ids=["qwen3", "gemma3"])
@pytest.mark.parametrize(("dtype", "head_dim", "kv_heads", "window"),
                         [(torch.float32, 64, 2, None), (torch.bfloat16, 64, 1, None), (torch.bfloat16, 256, 2, 6)],
                         ids=str)
def test_qk_norm_matches_eager(build, dtype: torch.dtype, head_dim: int, kv_heads: int, window: int | None,  # noqa: ANN001
                               gemma: bool) -> None:
    """Per-head RMSNorm of q and k before RoPE, Qwen3's form and Gemma3's `1 + w` form (with a
    sliding window at Gemma3's head_dim 256). q and k have an RMS of ~3 and the weights are
    not 1: without the norm, or with the other form, the outputs differ by far more than the
    tolerance."""
    seq = 40
    q, k, v = _qkv(2, 4, kv_heads, seq, head_dim, dtype)
    q, k = q * 3 + 1, k * 3 - 1
    w_q, w_k = (torch.randn(head_dim, device=DEVICE).mul(0.3).add(0.0 if gemma else 1.0).to(dtype) for _ in range(2))
    cos, sin = _rope_tables(1, seq, head_dim, dtype)
    mask = _sliding_window(seq, window or seq)
    expected = _eager(_hf_rms_norm(q, w_q, gemma), _hf_rms_norm(k, w_k, gemma), v, cos, sin, mask=mask,
                      scale=head_dim**-0.5)
    norm = QkNorm(1e-6, 1.0 if gemma else 0.0, gemma)
    out = _run(build(_spec(head_dim, dtype, window=window, qk_norm=norm)), [q, k, v, cos, sin, w_q, w_k])
    if dtype == torch.float32 or DEVICE == "cuda":
        _assert_matches(out, expected)
    else:
        # The interpreter truncates every f32 -> bf16 cast (1.0 + 1.1 * 2^-8 becomes 1.0, measured),
        # and the norm rounds q and k once or twice more than RoPE alone: each a bias of up to an
        # ulp on the values whose products are the scores (up to ~5 here). Measured k <= 3.8 over
        # 16 random cases of each form (this file's bound is 3); bound 6.
        tolerance = 6 * torch.finfo(dtype).eps
        torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    reference = torch_ops.rope_attention(q, k, v, cos, sin, None, head_dim**-0.5, is_causal=True, window=window,
                                         q_norm_weight=w_q, k_norm_weight=w_k, qk_norm_eps=1e-6,
                                         qk_norm_offset=norm.offset, qk_norm_weight_in_fp32=gemma)
    _assert_matches(reference.contiguous(), expected)


QK_NORM_ROPE_FORMS = [(80, 32, True), (96, None, False), (80, 20, False)]
"""(head_dim, rotary_dim, interleaved): pairs plus passed dims split in two pieces (80 - 32 = 32
+ 16), a head that is no power of two, and a rotary half of 10 with a 60-dim pass (32 + 28)."""


@pytest.mark.parametrize("gemma", [False, True], ids=["qwen3", "gemma3"])
@pytest.mark.parametrize(("head_dim", "rotary_dim", "interleaved"), QK_NORM_ROPE_FORMS,
                         ids=[f"d{d}-r{r or d}" + ("-pairs" if i else "") for d, r, i in QK_NORM_ROPE_FORMS])
def test_qk_norm_over_every_piece_of_the_head(build, head_dim: int, rotary_dim: int | None,  # noqa: ANN001
                                              interleaved: bool, gemma: bool) -> None:
    """QK-norm normalizes over the whole head, every piece the kernel holds it in (rotated pairs,
    passed dims, their tail), and weights each dim by its own weight, then RoPE (partial, in
    pairs); fp32, tight. Without the norm the output is far off (checked: the test can fail)."""
    dtype, seq = torch.float32, 17
    q, k, v = _qkv(2, 4, 2, seq, head_dim, dtype)
    q, k = q * 3 + 1, k * 3 - 1
    w_q, w_k = (torch.randn(head_dim, device=DEVICE).mul(0.3).add(0.0 if gemma else 1.0) for _ in range(2))
    cos, sin = _random_tables(1, seq, rotary_dim or head_dim, dtype)
    norm = QkNorm(1e-6, 1.0 if gemma else 0.0, gemma)
    spec = _spec(head_dim, dtype, rotary_dim=rotary_dim, interleaved=interleaved, qk_norm=norm)
    out = _run(build(spec), [q, k, v, cos, sin, w_q, w_k])
    rope = {"causal": True, "scale": head_dim**-0.5, "interleaved": interleaved}
    _assert_matches(out, _eager(_hf_rms_norm(q, w_q, gemma), _hf_rms_norm(k, w_k, gemma), v, cos, sin, **rope))
    assert (out - _eager(q, k, v, cos, sin, **rope)).abs().max() > 0.1


@pytest.mark.parametrize("head_dim", [16, 32, 256])
def test_other_head_dims(build, head_dim: int) -> None:  # noqa: ANN001
    """Powers of two from 16 (each rotated half padded to a dot's depth of 16) to 256."""
    dtype, seq = torch.bfloat16, 17
    q, k, v = _qkv(1, 2, 1, seq, head_dim, dtype)
    tables = _rope_tables(1, seq, head_dim, dtype)
    out = _run(build(_spec(head_dim, dtype)), [q, k, v, *tables])
    _assert_matches(out, _eager(q, k, v, *tables, causal=True, scale=head_dim**-0.5))


def _random_tables(batch: int, seq: int, rotary: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """cos and sin [batch, seq, rotary] uniform in [-1, 1], every dim its own value: a kernel that
    read a dim's table entry for another dim, or rotated a pass-through dim, would show."""
    generator = torch.Generator().manual_seed(rotary)
    return [(torch.rand(batch, seq, rotary, generator=generator) * 2 - 1).to(dtype).to(DEVICE) for _ in range(2)]


ROPE_FORMS = [
    # (head_dim, rotary_dim, interleaved): the head dims of Phi-2 / StableLM-3B (80), Qwen-1.5B,
    # Gemma-2B-style 96, 112; partial rotary of Phi-2 (32 of 80), Pythia/StableLM-2 (16 of 64),
    # StableLM-3B (20 of 80: a rotary half of 10), GPT-NeoX-small (8 of 32); interleaved pairs of
    # GPT-J (64 of 256 is its size; 16 of 64 here), Ernie 4.5 (all 64), GLM (half of 128: 64).
    (80, None, False), (96, None, False), (112, None, False), (48, None, False),
    (80, 32, False), (64, 16, False), (80, 20, False), (32, 8, False),
    (64, None, True), (64, 16, True), (128, 64, True), (96, 48, True),
]


@pytest.mark.parametrize(("head_dim", "rotary_dim", "interleaved"), ROPE_FORMS,
                         ids=[f"d{d}-r{r or d}" + ("-pairs" if i else "") for d, r, i in ROPE_FORMS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_any_head_dim_partial_rotary_and_interleaved_pairs(build, dtype: torch.dtype, head_dim: int,  # noqa: ANN001
                                                           rotary_dim: int | None, interleaved: bool) -> None:
    """Head dims that are not powers of two (padded pieces, masked), a rotary dim below the head
    dim (the rest passed through), interleaved pairs; GQA 4:2, causal, 17 queries (a partial
    block), random tables per batch row."""
    q, k, v = _qkv(2, 4, 2, 17, head_dim, dtype)
    cos, sin = _random_tables(2, 17, rotary_dim or head_dim, dtype)
    out = _run(build(_spec(head_dim, dtype, rotary_dim=rotary_dim, interleaved=interleaved)), [q, k, v, cos, sin])
    _assert_matches(out, _eager(q, k, v, cos, sin, causal=True, scale=head_dim**-0.5, interleaved=interleaved))


@pytest.mark.parametrize(("head_dim", "rotary_dim", "interleaved", "window", "softcap"),
                         [(96, None, False, None, None), (80, 32, True, None, None), (80, 32, True, 6, 2.0)])
def test_matches_the_ops_reference(build, head_dim: int, rotary_dim: int | None, interleaved: bool,  # noqa: ANN001
                                   window: int | None, softcap: float | None) -> None:
    """The kernel computes what `ad.rope_attention` means (its torch reference op), in bf16 with
    GQA, at a head dim that is not a power of two, partial rotary in pairs, and with Gemma2's
    sliding window and soft cap on top of partial rotary in pairs (a cap of 2 bends most scores,
    see test_soft_cap_matches_eager_gemma2); eager attention on the window's mask agrees."""
    dtype, seq = torch.bfloat16, 17
    q, k, v = _qkv(2, 4, 2, seq, head_dim, dtype)
    cos, sin = _random_tables(1, seq, rotary_dim or head_dim, dtype)
    spec = _spec(head_dim, dtype, rotary_dim=rotary_dim, interleaved=interleaved, window=window, softcap=softcap)
    out = _run(build(spec), [q, k, v, cos, sin])
    expected = torch_ops.rope_attention(q, k, v, cos, sin, None, head_dim**-0.5, is_causal=True, window=window,
                                        softcap=softcap, interleaved=interleaved)
    _assert_matches(out, expected.contiguous())
    eager = _eager(q, k, v, cos, sin, mask=_sliding_window(seq, window or seq), scale=head_dim**-0.5,
                   softcap=softcap, interleaved=interleaved)
    _assert_matches(out, eager.contiguous())


@pytest.mark.parametrize("head_dim", [80, 96])
def test_odd_head_dims_with_a_mask_and_without_rope(build, head_dim: int) -> None:  # noqa: ANN001
    """Head dims 80 and 96 without RoPE (the head split in two padded halves) and with a random
    mask (the padded lanes of V and the output stay out of every row)."""
    dtype, seq = torch.bfloat16, 40
    q, k, v = _qkv(2, 4, 2, seq, head_dim, dtype)
    mask = _random_mask((2, 1, seq, seq))
    out = _run(build(_spec(head_dim, dtype, rope=False, has_mask=True, causal=False)), [q, k, v, mask])
    _assert_matches(out, _eager(q, k, v, mask=mask, scale=head_dim**-0.5))


def test_empty_sequence(build) -> None:  # noqa: ANN001
    q, k, v = _qkv(2, 4, 2, 0, 64, torch.bfloat16)
    cos, sin = _rope_tables(1, 0, 64, torch.bfloat16)
    assert _run(build(_spec(64, torch.bfloat16)), [q, k, v, cos, sin]).shape == (2, 4, 0, 64)


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(("fields", "message"), [
    ({"head_dim": 512}, "head_dim 512 .* needs tiles 512 wide, over the 256"),
    ({"head_dim": 256, "rotary_dim": 34}, r"head_dim 256 \(rotary_dim 34\) needs tiles 512 wide"),
    ({"head_dim": 0}, "head_dim 0 must be positive"),
    ({"rotary_dim": 15}, "rotary_dim 15 must be even"),
    ({"rotary_dim": 66}, "rotary_dim 66 must be even and in 2..head_dim 64"),
    ({"rope": False, "interleaved": True}, "interleaved pairs need RoPE"),
    ({"dtype": torch.float64}, "dtype torch.float64 is not one of"),
    ({"cos_dtype": None}, "rope=True needs cos_dtype"),
    ({"scale": float("nan")}, "softmax scale nan is not finite"),
    ({"window": 0}, "window 0 needs causal=True and must be positive"),
    ({"window": 4, "causal": False}, "window 4 needs causal=True"),
    ({"softcap": 0.0}, "softcap 0.0 is not a positive number"),
    ({"rope": False, "cos_dtype": None, "qk_norm": QkNorm(1e-6)}, "qk_norm needs rope=True"),
])
def test_spec_rejects_what_the_kernel_cannot_do(fields: dict, message: str) -> None:
    args = {"head_dim": 64, "dtype": torch.bfloat16, "rope": True, "has_mask": False, "causal": True,
            "scale": 0.125, "cos_dtype": torch.bfloat16} | fields
    with pytest.raises(ValueError, match=message):
        AttentionSpec(**args)


def test_launch_rejects_heads_that_do_not_group(build) -> None:  # noqa: ANN001
    q, k, v = _heads(1, 5, 3, 64, torch.float32), *_qkv(1, 2, 2, 5, 64, torch.float32)[1:]
    with pytest.raises(ValueError, match=r"q heads must be a multiple of the kv heads"):
        _run(build(_spec(64, torch.float32, rope=False)), [q, k, v])


# ------------------------------------------------------------------ launch and PTX


def _meta_inputs(spec: AttentionSpec, seq: int = 1024, batch: int = 2, heads: int = 32,
                 kv_heads: int = 8) -> list[torch.Tensor]:
    """A Llama-8B-like prefill on meta tensors (strides as HF's, a [1, 1, S, S] mask)."""
    def heads_of(h: int) -> torch.Tensor:
        proj = torch.empty(batch, seq, h * spec.head_dim, dtype=spec.dtype, device="meta")
        return proj.view(batch, seq, h, spec.head_dim).transpose(1, 2)

    tensors = [heads_of(heads), heads_of(kv_heads), heads_of(kv_heads)]
    if spec.rope:
        tensors += [torch.empty(1, seq, spec.rotary, dtype=spec.cos_dtype, device="meta")] * 2
    if spec.qk_norm:
        weight_dtype = torch.float32 if spec.qk_norm.weight_in_fp32 else spec.dtype
        tensors += [torch.empty(spec.head_dim, dtype=weight_dtype, device="meta")] * 2
    if spec.has_mask:
        tensors.append(torch.empty(1, 1, seq, seq, dtype=torch.bool, device="meta"))
    return tensors


def test_blocks_shrink_for_short_sequences() -> None:
    long = attention_blocks(128, torch.bfloat16, 4096)
    assert (long.block_m, long.block_n, long.num_warps) == (128, 32, 8)
    short = attention_blocks(128, torch.bfloat16, 5)
    assert (short.block_m, short.block_n, short.num_warps) == (16, 32, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_head_width_gets_tiles_and_options_triton_accepts(dtype: torch.dtype) -> None:
    """The interpreter ignores warps and stages, so only this sees a bad table entry on the CPU:
    at every head width, length and QK-norm, the tiles are ones tl.dot takes (powers of two, at
    least 16) and the options pass Triton's own sm_90 checks (num_warps a power of two)."""
    backend = make_backend(TARGET)
    for width in (16, 32, 64, 128, 256):
        for seq_len in (1, 5, 100, 4096):
            for qk_norm in (False, True):
                blocks = attention_blocks(width, dtype, seq_len, qk_norm)
                tiles = (blocks.block_m, blocks.block_n)
                assert all(t >= 16 and t & (t - 1) == 0 for t in tiles), (width, seq_len, blocks)
                backend.parse_options({"num_warps": blocks.num_warps, "num_stages": blocks.num_stages})


def test_launch_on_meta_tensors_is_specialized_as_triton_does(build) -> None:  # noqa: ANN001
    """One launch, grid (B * Hq, query blocks), and the types, constexprs and divisibility marks
    Triton's own binder gives the same arguments (unit strides become constexprs)."""
    spec = _spec(128, torch.bfloat16, has_mask=True, causal=True)
    module, tensors = build(spec), _meta_inputs(spec)
    launch = record_launch(module, module.kernel_name, tensors, [])
    blocks = attention_blocks(128, torch.bfloat16, 1024)
    assert launch.grid == (2 * 32, 1024 // blocks.block_m)
    ours = specialize_module(module, module.kernel_name, tensors)
    assert ours.constexprs["q_sd"] == 1 and ours.constexprs["BLOCK_N"] == blocks.block_n
    assert ours.options == {"num_warps": blocks.num_warps, "num_stages": blocks.num_stages, "enable_fp_fusion": True}

    backend = make_backend(TARGET)
    fn = JITFunction(getattr(module, module.kernel_name).fn)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    _, signature, constexprs, attrs = fn._pack_args(backend, dict(launch.kwargs), bound, specialization, options)
    assert ours.signature == signature
    assert ours.constexprs == {fn.arg_names[i]: v for (i,), v in constexprs.items()}
    assert set(ours.divisible) == {fn.arg_names[i] for (i,), a in attrs.items() if a}


def _compile(specs: list[Specialization], modules: list[ModuleType]) -> list[PtxReport]:
    """Under the interpreter, Triton's reductions were built as interpreter functions: compile
    in a child process that imports triton without it."""
    if triton.knobs.runtime.interpret:
        return _compile_in_child(specs)
    return [compile_specialization(s, getattr(m, s.name)) for s, m in zip(specs, modules, strict=True)]


def _assert_no_spills(build: Callable[[AttentionSpec], ModuleType], specs: list[AttentionSpec]) -> None:
    """Each spec's kernel, specialized for a 1024-token prefill with 32 q / 8 kv heads, compiles
    for sm_90 without a spill, within an H100's shared memory, with the blocks of its table."""
    modules = [build(s) for s in specs]
    reports = _compile([specialize_module(m, m.kernel_name, _meta_inputs(s)) for s, m in zip(specs, modules, strict=True)],
                       modules)
    for spec, report in zip(specs, reports, strict=True):
        blocks = attention_blocks(spec.pieces.width, spec.dtype, 1024, spec.qk_norm is not None)
        usage = (f"head_dim {spec.head_dim} rotary {spec.rotary_dim} pairs={spec.interleaved} mask={spec.has_mask} "
                 f"causal={spec.causal} window={spec.window} softcap={spec.softcap} qk_norm={spec.qk_norm} "
                 f"cos {spec.cos_dtype}: {report.registers} registers, {report.spills} B spilled, "
                 f"{report.shared_memory} B shared")
        assert report.registers > 0 and report.spills == 0, usage
        assert report.shared_memory <= H100_SHARED_MEMORY, usage
        assert (report.block_r, report.block_c, report.num_warps) == (blocks.block_m, blocks.block_n,
                                                                     blocks.num_warps), usage


PTX_ROPE_FORMS = [
    # (head_dim, rotary_dim, interleaved) at real model sizes: Phi-2 / StableLM-3B (80, all or
    # 32 or 20 rotated), 96 and 112 heads, GLM-4 (half of 128, interleaved), Pythia (32 of 128:
    # its pass piece pads 96 to 128, the widest tiles), GPT-J (64 of 256, interleaved).
    (80, None, False), (80, 32, False), (80, 20, False), (96, None, False), (112, None, False),
    (128, 64, True), (128, 32, False), (256, 64, True),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_ptx_for_sm90_has_no_spills(build, dtype: torch.dtype) -> None:  # noqa: ANN001
    """RoPE + mask and RoPE + causal at head_dim 64 and 128 (and all three with fp32 tables, the
    most registers; a sliding window; a soft cap; Gemma2's head_dim 256 with both; QK-norm at
    Qwen3's and Gemma3's sizes, and with partial rotary pairs), and the head dims and rotary forms
    of PTX_ROPE_FORMS with a mask and causal."""
    _assert_no_spills(build, [
        _spec(head_dim, dtype, has_mask=has_mask, causal=not has_mask)
        for head_dim in (64, 128) for has_mask in (True, False)
    ] + [
        _spec(128, dtype, has_mask=True, causal=True, cos_dtype=torch.float32),
        _spec(128, dtype, window=4096),
        _spec(128, dtype, softcap=50.0),
        _spec(256, dtype, window=4096, softcap=50.0, cos_dtype=torch.float32),  # Gemma2's sizes
        _spec(128, dtype, qk_norm=QkNorm(1e-6)),  # Qwen3's
        _spec(256, dtype, window=4096, qk_norm=QkNorm(1e-6, 1.0, weight_in_fp32=True)),  # Gemma3's
        _spec(80, dtype, rotary_dim=32, interleaved=True, qk_norm=QkNorm(1e-6)),
    ] + [
        _spec(head_dim, dtype, has_mask=True, causal=True, rotary_dim=rotary, interleaved=interleaved)
        for head_dim, rotary, interleaved in PTX_ROPE_FORMS
    ])


def test_ptx_for_sm90_in_fp32_with_qk_norm_has_no_spills(build) -> None:  # noqa: ANN001
    """fp32 dots hold their operands in registers: QK-norm on top spilled at head_dim 256 before
    its tiles got twice the warps."""
    _assert_no_spills(build, [_spec(head_dim, torch.float32, qk_norm=QkNorm(1e-6)) for head_dim in (128, 256)])
