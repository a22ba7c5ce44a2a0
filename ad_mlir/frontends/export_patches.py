"""HF's sequence-mixer functions that torch.export cannot trace with a dynamic sequence length
(their reference implementations loop in Python over chunks of the sequence, so the export fixes
the length: "Constraints violated (seq)"), routed through opaque `ad_mlir` ops with fake
implementations (`torch_ops.mamba2_chunk_scan`, `torch_ops.chunk_gated_delta_rule`,
`torch_ops.selective_scan`) while the project exports a model, and restored after.

transformers 5.x keeps these kernels as module-level functions of each modeling file
(`mamba2_chunk_scan` in Mamba2, Nemotron-H, Bamba, Zamba2, GraniteMoeHybrid...;
`torch_chunk_gated_delta_rule` in Qwen3-Next, Olmo-Hybrid...; Mamba1's `mamba_selective_scan` in
Mamba and Falcon-Mamba, a loop over time steps), called by their global name, so
each loaded modeling module that defines one gets it replaced; a transformers version without
them is left alone. Only the call the exported inference graph makes is routed: the whole
sequence from an empty state, no final state asked for (HF's own cache is off), no packed
sequences; any other call (an initial state, `return_final_states`, `cu_seqlens`) runs HF's
function as it is.

Some MoE blocks loop in Python over the experts that the routing hit (`nonzero()` of the expert
mask: a data-dependent count, which torch.export cannot trace: "Could not guard on data-dependent
expression"). `METHODS` replaces such a class's `forward`, while the project exports, with
one that runs every expert on every token and weights each by its routing weight (0 where the
routing did not pick it), adding the experts in HF's order: the sum HF computes, with exact zeros
added where it skips an expert. CPM-Ant's attention mask builds a tensor from a Python list
of the length's positions; it gets the same mask from `torch.arange`. Llama 4's MoE block reshapes
its experts' output in a way whose strides torch.export cannot simplify; it gets the same ops
without the round trip. ZAYA's CCA projection slices seq - 1 tokens, which torch.export cannot
tell from one; it gets the same values from a slice of seq tokens. MiniMax's lightning attention
loops over blocks of `min(block_size, seq)` tokens; it gets the same recurrence (a linear
attention with a decay per head) as a Mamba2 scan through `torch_ops.mamba2_chunk_scan`, whose
cached form generation uses. RecurrentGemma's RG-LRU loops over time steps in a method
(`RecurrentGemmaRglru._rnn_scan`); without a state it gets the same recurrence through
`torch_ops.rg_lru_scan`. RWKV's time mixing loops over time steps (`rwkv_linear_attention`);
`RwkvSelfAttention.forward` without a state gets the same recurrence through `torch_ops.wkv_scan`,
and it and `RwkvFeedForward.forward` shift their tokens by a concatenation (HF's `ZeroPad2d`
with a negative pad exports as a pad the cache pass cannot hold; the concatenation is a token
window). Three more fix the length only in the export for generation
(batch and length both dynamic, the length down to 1): Aria's MoE block views its flattened
input back for its shared experts (they get the input itself), Inkling2's dynamic short
convolution flips an unfolded view (it flips a contiguous copy), and DeepSeek-V4's CSA compressor
and indexer shift windows through a slice of windows - 1 (they shift by a concatenation). DeepSeek
sparse attention's indexer (DeepSeek-V3.2 and its copies) takes `topk(min(index_topk, keys))`,
whose check `min(index_topk, keys) <= keys` torch.export cannot prove for a length below
index_topk; it ranks the scores padded with that many -inf columns (`_PaddedTopk`). All are
`METHODS`. So are transformers' `FP8Linear` and the zoo's `Fp8BlockLinear` (fine-grained FP8
checkpoints, `zoo/quantized.py`): the first calls a Hub kernel that has no CPU form and no fake,
the second would export as the format's arithmetic in ATen ops, unfused; routed through `torch_ops.linear_fp8_block`, their fp8 weights and scales are graph
weights of one op; so is the zoo's `Nvfp4Linear` (ModelOpt NVFP4, `zoo/modelopt.py`) through
`torch_ops.linear_nvfp4`, and gpt-oss's MLP (`GptOssMLP`) when its experts are MXFP4
(`zoo.mxfp4`'s `Mxfp4Experts`) through `torch_ops.moe_mxfp4` from the router's logits, and
fine-grained FP8's MoE experts (transformers' `FP8Experts`, the zoo's `Fp8BlockExperts`) through
`torch_ops.moe_fp8_block` from the router's choices. One more is replaced
only in the export for generation (`GENERATION_METHODS`), whose
steps hold only real tokens: XLM's mask of the positions past its count of tokens that are not
its pad id, a sum over the tokens, as all ones (exact for sequences without the pad id).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ad_mlir.semantics import torch_ops

MODELING_MODULES = "transformers.models."
INTEGRATION_MODULES = ("transformers.integrations.finegrained_fp8", "ad_mlir.zoo.quantized", "ad_mlir.zoo.ct_fp8",
                       "ad_mlir.zoo.modelopt", "ad_mlir.zoo.gptq")
"""Modules outside `MODELING_MODULES` whose classes `METHODS` names (quantized layers: transformers'
and the zoo's subclass of it)."""


def _packed(kwargs: dict[str, Any]) -> bool:
    """A tensor among the extra arguments: packed-sequence offsets (`cu_seqlens`, `seq_idx`), which
    the routed op does not take. The model's flags forwarded along (`use_cache`, ...) change
    nothing in the scan."""
    return any(isinstance(v, torch.Tensor) for v in kwargs.values())


def _route_mamba2_chunk_scan(module: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def routed(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,  # noqa: N803
               C: torch.Tensor, chunk_size: int, D: torch.Tensor | None = None,  # noqa: N803
               dt_bias: torch.Tensor | None = None, initial_states: torch.Tensor | None = None,
               dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")),
               return_final_states: bool = False, **kwargs: Any) -> Any:
        if initial_states is not None or return_final_states or _packed(kwargs):
            return original(hidden_states, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, initial_states=initial_states,
                            dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=return_final_states,
                            **kwargs)
        return torch.ops.ad_mlir.mamba2_chunk_scan(module, hidden_states, dt, A, B, C, chunk_size, D, dt_bias,
                                                   dt_softplus, float(dt_limit[0]), float(dt_limit[1]))

    return routed


def _route_chunk_gated_delta_rule(module: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def routed(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               chunk_size: int = 64, initial_state: torch.Tensor | None = None, output_final_state: bool = False,
               use_qk_l2norm_in_kernel: bool = False, **kwargs: Any) -> Any:
        if initial_state is not None or output_final_state or _packed(kwargs):
            return original(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                            output_final_state=output_final_state,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
        out = torch.ops.ad_mlir.chunk_gated_delta_rule(module, query, key, value, g, beta, chunk_size,
                                                       use_qk_l2norm_in_kernel)
        return out, None

    return routed


def _route_mamba_selective_scan(module: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def routed(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,  # noqa: N803
               C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,  # noqa: N803
               delta_bias: torch.Tensor | None = None, delta_softplus: bool = False, return_last_state: bool = False,
               **kwargs: Any) -> Any:
        # use_mambapy / use_associative_scan choose how HF computes the same scan: not routed on
        if return_last_state or _packed(kwargs):
            return original(hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                            return_last_state=return_last_state, **kwargs)
        return torch.ops.ad_mlir.selective_scan(module, hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus)

    return routed


ROUTES: dict[str, Callable[[str, Callable[..., Any]], Callable[..., Any]]] = {
    "mamba2_chunk_scan": _route_mamba2_chunk_scan,
    "torch_chunk_gated_delta_rule": _route_chunk_gated_delta_rule,
    "mamba_selective_scan": _route_mamba_selective_scan,
}
"""HF function name -> (module name, HF's function) -> the function that routes it."""


def _routing_weight(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, expert: int) -> torch.Tensor:
    """[tokens, 1]: each token's routing weight of `expert` (its top-k picks distinct experts, so
    at most one term is not 0)."""
    return (top_k_weights * (top_k_index == expert)).sum(dim=-1, keepdim=True)


def _dbrx_experts_dense(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' `DbrxExperts.forward` (a loop over the experts hit, `index_add_` of each one's
    weighted output), every expert on every token."""
    batch_size = hidden_states.shape[0]
    hidden_states = hidden_states.reshape(-1, self.hidden_size)
    shape = (-1, self.ffn_hidden_size, self.hidden_size)
    w1, v1, w2 = (self.mlp.w1.view(shape), self.mlp.v1.view(shape), self.mlp.w2.view(shape))
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        states = self.mlp(hidden_states, w1[e], v1[e], w2[e]) * _routing_weight(top_k_index, top_k_weights, e)
        out = out + states.to(out.dtype)  # HF's index_add_ into its zeros_like(hidden_states)
    return out.view(batch_size, -1, self.hidden_size)


def _longcat_experts_dense(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' `LongcatFlashExperts.forward`: routed experts (gate/up, act, down) and
    zero-compute experts (identity, index >= the routed count), every one on every token."""
    out = torch.zeros_like(hidden_states)
    for e in range(self.total_experts):
        if e >= self.num_routed_experts or self.gate_up_proj is None:
            states = self.identity_expert(hidden_states)
        else:
            gate, up = torch.nn.functional.linear(hidden_states, self.gate_up_proj[e]).chunk(2, dim=-1)
            states = torch.nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e])
        out = out + (states * _routing_weight(top_k_index, top_k_weights, e)).to(hidden_states.dtype)
    return out


def _cpmant_attention_mask(self: Any, input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor,
                           length: torch.Tensor) -> torch.Tensor:
    """transformers' `CpmAntModel._prepare_attention_mask`, whose left-padding mask is a tensor of a
    Python list (`list(range(seqlen - prompt_length))[::-1]`, which fixes the length at export),
    with the same values from `torch.arange`."""
    batch, seqlen, device = input_ids.size(0), input_ids.size(1), input_ids.device
    directional_mask_2d = torch.arange(seqlen, device=device) <= torch.arange(seqlen, device=device).view(-1, 1)
    attention_mask = context[:, None, :] | (
        context[:, :, None].logical_not() & directional_mask_2d.view(1, seqlen, seqlen))
    attention_mask = attention_mask & (span[:, None, :] == span[:, :, None])
    reversed_positions = torch.arange(seqlen - self.prompt_length - 1, -1, -1, device=device)
    mask_1d = reversed_positions[None, :].repeat(batch, 1) < length[:, None]
    mask_1d = torch.cat((torch.ones(batch, self.prompt_length, device=device).bool(), mask_1d), dim=1)
    return mask_1d.view(batch, seqlen, 1) & mask_1d.view(batch, 1, seqlen) & attention_mask


def _llama4_text_moe(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' `Llama4TextMoe.forward` with its experts' two `bmm`s (`Llama4TextExperts.forward`)
    inline: HF's experts return [experts * tokens, hidden], which the block reshapes back to
    [experts, tokens, hidden], and torch.export cannot simplify the strides of that round trip
    (its guard `seq * min(128, 128 * seq) == 128 * seq` fixes the length); here the experts'
    output stays [experts, tokens, hidden]. The same ops on the same values."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_scores, router_logits = self.router(hidden_states)
    routed_in = hidden_states.repeat(router_scores.shape[1], 1)
    routed_in = routed_in * router_scores.transpose(0, 1).reshape(-1, 1)
    experts = self.experts
    routed_in = routed_in.view(experts.gate_up_proj.shape[0], -1, experts.hidden_size)
    gate, up = torch.bmm(routed_in, experts.gate_up_proj).chunk(2, dim=-1)
    routed_out = torch.bmm(up * experts.act_fn(gate), experts.down_proj)
    return self.shared_expert(hidden_states) + routed_out.sum(dim=0), router_logits


def _zaya_cca_projection(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `ZayaCCAProjection.forward` without a cache (with one, HF's), its delayed
    values shifted by one token as `cat([state, delayed])[:, :-1]` where HF writes `cat([state,
    delayed[:, :-1]])` (the same values): torch.export cannot tell whether HF's slice of seq - 1
    tokens has one, and its guard `seq - 1 != 1` fixes the length."""
    def forward(self: Any, hidden_states: torch.Tensor, cache: Any, conv_mask: torch.Tensor | None = None) -> Any:
        if cache is not None:
            return original(self, hidden_states, cache, conv_mask)
        if conv_mask is not None:
            hidden_states = hidden_states * conv_mask[:, :, None].to(hidden_states.dtype)
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        projected_queries, projected_keys = self.q_proj(hidden_states), self.k_proj(hidden_states)
        qk_states = torch.cat([projected_queries, projected_keys], dim=-1)
        query_residual = projected_queries.view(*hidden_shape)
        key_residual = projected_keys.view(*hidden_shape).transpose(1, 2)
        key_residual = sys.modules[type(self).__module__].repeat_kv(key_residual, self.num_key_value_groups)
        query_residual = (query_residual + key_residual.transpose(1, 2)) * 0.5
        key_residual = query_residual.view(*input_shape, -1, self.num_key_value_groups, self.head_dim).mean(dim=-2)
        qk_states = torch.nn.functional.pad(qk_states.transpose(1, 2), (self.conv_kernel_size, 0))
        qk_states = self.conv_qk_grouped(self.conv_qk_depthwise(qk_states)).transpose(1, 2)
        query_hidden_size = query_residual.shape[-2] * query_residual.shape[-1]
        query = qk_states[..., :query_hidden_size].view(*hidden_shape) + query_residual
        key = qk_states[..., query_hidden_size:].view(*hidden_shape) + key_residual
        value_current = self.v_proj_current(hidden_states)
        delayed_v_state = self.v_proj_delayed(hidden_states)
        recurrent_v_state = self.v_proj_delayed(hidden_states.new_zeros(input_shape[0], 1, self.hidden_size))
        value_delayed = torch.cat([recurrent_v_state, delayed_v_state], dim=1)[:, :-1]
        value = torch.cat([value_current, value_delayed], dim=-1).view(*hidden_shape)
        return query, key, value

    return forward


LIGHTNING_SCAN_MODULE = "transformers.models.mamba2.modeling_mamba2"
"""The modeling module whose `mamba2_chunk_scan` (HF's) computes MiniMax's lightning attention."""


def _minimax_lightning_attention(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `MiniMaxLightningAttention.forward` without a cache (with one, HF's), its
    attention core through `torch_ops.mamba2_chunk_scan` (HF's Mamba2 scan), whose cached form is
    `ad.cached_ssm_scan`. HF's no-cache form loops over blocks of `min(block_size, seq)` tokens
    (torch.export fixes the length on it: `min(256, seq) <= seq`) and computes, from a zero
    state, o_i = sum_{j <= i} exp(-slope_h (i - j)) (q_i . k_j) v_j; its decode (with a cache) is
    the recurrence S_t = exp(-slope_h) S_{t-1} + k_t^T v_t, o_t = q_t S_t. That is Mamba2's scan
    with time steps dt = 1 (no bias, no softplus, HF's default clamp to [0, inf)), A = -slope_h,
    x = v, B = k, C = q (a group per head, the state [head_dim, head_dim]) and no D. The scan
    returns fp32 (cast back to the values' dtype, HF's); it sums the decays as cumulative sums of
    A where HF multiplies powers of exp(-slope), so its values are HF's up to fp32 rounding, at
    any length (no block limit). The norm, gate and output projection are HF's."""
    def forward(self: Any, hidden_states: torch.Tensor, position_embeddings: Any, attention_mask: torch.Tensor | None,
                cache: Any = None, **kwargs: Any) -> Any:
        if cache is not None:
            return original(self, hidden_states, position_embeddings, attention_mask, cache, **kwargs)
        batch_size, seq_len, _ = hidden_states.shape
        heads, head_dim = self.num_attention_heads, self.head_dim
        qkv_states = self.act_fn(self.qkv_proj(hidden_states))
        qkv_states = sys.modules[type(self).__module__].apply_mask_to_padding_states(qkv_states, attention_mask)
        qkv_states = qkv_states.reshape(batch_size, seq_len, heads, 3 * head_dim)
        query, key, value = torch.split(qkv_states, head_dim, dim=3)
        dt = torch.ones_like(value[..., 0], dtype=torch.float32)
        decay = -self.slope_rate.view(heads)
        attn_output = torch.ops.ad_mlir.mamba2_chunk_scan(LIGHTNING_SCAN_MODULE, value, dt, decay, key, query,
                                                          self.block_size, None, None, False, 0.0, math.inf)
        attn_output = attn_output.to(value.dtype).reshape(batch_size, seq_len, heads * head_dim)
        attn_output = torch.sigmoid(self.output_gate(hidden_states)) * self.norm(attn_output)
        return self.out_proj(attn_output), None

    return forward


def _aria_text_moe(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """transformers' `AriaTextMoELayer.forward` with its shared experts on the block's input where
    HF gives them its flattened view reshaped back (`hidden_states.view(-1, hidden).view(shape)`,
    the same tensor): with batch and length both dynamic torch.export cannot simplify the strides
    of that round trip (its guard `seq * min(128, 128 * seq) == 128 * seq` fixes the length)."""
    flat = hidden_states.view(-1, hidden_states.size(-1))
    _, top_k_weights, top_k_index = self.router(flat)
    expert_output = self.experts(flat, top_k_index, top_k_weights).view(hidden_states.shape)
    return expert_output + self.shared_experts(hidden_states)


def _inkling2_dynamic_short_convolution(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `Inkling2DynamicShortConvolution.forward` (and Inkling2-Loop's copy) without a
    cache and packed sequences (with either, HF's), its windows flipped after a contiguous copy of
    HF's `unfold` where HF flips the unfolded view itself: the view's window and sequence strides
    are both 1, and the flip's output layout compares their sizes (its guard `seq < 4`, the kernel
    size, fixes the length). The same values, then HF's ops."""
    def forward(self: Any, hidden_states: torch.Tensor, dynamic_input: torch.Tensor, cache: Any = None,
                conv_mask: torch.Tensor | None = None, cache_offset: int = 0, **kwargs: Any) -> torch.Tensor:
        if cache is not None or kwargs.get("seq_idx") is not None:
            return original(self, hidden_states, dynamic_input, cache, conv_mask, cache_offset, **kwargs)
        input_dtype = hidden_states.dtype
        batch_size, seq_len, hidden_size = hidden_states.shape
        size = self.conv_kernel_size
        dynamic_weights = self.weight_proj(dynamic_input).float()
        dynamic_weights = dynamic_weights.view(batch_size, seq_len, self.num_heads, 1, size)
        weights = self.static_weight.float().T.view(self.num_heads, -1, size) + dynamic_weights
        hidden_states = hidden_states.float()
        residual = hidden_states
        module = sys.modules[type(self).__module__]
        context = module.apply_mask_to_padding_states(hidden_states, conv_mask).transpose(1, 2)
        context = torch.nn.functional.pad(context, (size - 1, 0))[..., -(seq_len + size - 1):]
        windows = context.unfold(-1, size, 1).contiguous().flip(-1).transpose(1, 2)
        windows = windows.reshape(batch_size, seq_len, self.num_heads, -1, size)
        hidden_states = (windows * weights).sum(-1).reshape(batch_size, seq_len, hidden_size)
        hidden_states = (hidden_states + residual) / math.sqrt(2 * size + 1)
        return hidden_states.to(input_dtype)

    return forward


def _deepseek_v4_compressed(module: Any, kv: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """[batch, windows, head_dim]: the compressed entries of DeepSeek-V4's CSA compressor or its
    indexer (`module`) without a cache, as HF computes them (windows from position 0), with the
    previous window's half of each window (Ca; window 0's zeros and -inf gates) shifted in by
    `cat([first, all])[:, :-1]` where HF writes `new_kv[:, 1:, :ratio] = chunk_kv[:, :-1]` under
    `if n_windows > 1`: the copy into that slice of windows - 1 guards on whether it is one window
    (`seq - 1 != 1`, then `seq >= 3`, which fix the length). The same values, then HF's ops."""
    ratio, head_dim = module.compress_rate, module.head_dim
    batch, usable = kv.shape[0], (kv.shape[1] // ratio) * ratio
    if usable == 0:
        return kv.new_zeros((batch, 0, head_dim))
    windows = usable // ratio
    chunk_kv = kv[:, :usable].view(batch, windows, ratio, -1)
    chunk_gate = gate[:, :usable].view(batch, windows, ratio, -1) + module.position_bias
    previous_kv = torch.cat([chunk_kv.new_zeros((batch, 1, ratio, head_dim)), chunk_kv[..., :head_dim]], dim=1)
    previous_gate = torch.cat([chunk_gate.new_full((batch, 1, ratio, head_dim), float("-inf")),
                               chunk_gate[..., :head_dim]], dim=1)
    new_kv = torch.cat([previous_kv[:, :-1], chunk_kv[..., head_dim:]], dim=2)
    new_gate = torch.cat([previous_gate[:, :-1], chunk_gate[..., head_dim:]], dim=2)
    compressed = module.kv_norm((new_kv * new_gate.softmax(dim=2, dtype=torch.float32).to(new_kv.dtype)).sum(dim=2))
    positions = (torch.arange(windows, device=compressed.device) * ratio).unsqueeze(0).expand(batch, -1)
    cos, sin = module.rotary_emb(compressed, position_ids=positions, layer_type=module.rope_layer_type)
    return sys.modules[type(module).__module__].apply_rotary_pos_emb(compressed.unsqueeze(1), cos, sin).squeeze(1)


def _deepseek_v4_indexer(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `DeepseekV4Indexer.forward` without a cache (with one, HF's), its compressed
    keys from `_deepseek_v4_compressed`."""
    def forward(self: Any, hidden_states: torch.Tensor, q_residual: torch.Tensor, position_ids: torch.Tensor,
                cache: Any, layer_idx: int) -> torch.Tensor:
        if cache is not None:
            return original(self, hidden_states, q_residual, position_ids, cache, layer_idx)
        batch, seq_len, _ = hidden_states.shape
        module = sys.modules[type(self).__module__]
        compressed_kv = _deepseek_v4_compressed(self, self.kv_proj(hidden_states), self.gate_proj(hidden_states))
        cos_q, sin_q = self.rotary_emb(hidden_states, position_ids=position_ids, layer_type=self.rope_layer_type)
        q = self.q_b_proj(q_residual).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        q = module.apply_rotary_pos_emb(q, cos_q, sin_q).transpose(1, 2)
        index_scores = self.scorer(q, compressed_kv, hidden_states)
        compressed_len = compressed_kv.shape[1]
        top_k = min(self.index_topk, compressed_len)
        if compressed_len == 0:
            return index_scores.topk(top_k, dim=-1).indices
        causal_threshold = (position_ids + 1) // self.compress_rate
        entry_indices = torch.arange(compressed_len, device=index_scores.device)
        future_mask = entry_indices.view(1, 1, -1) >= causal_threshold.unsqueeze(-1)
        top_k_indices = index_scores.masked_fill(future_mask, float("-inf")).topk(top_k, dim=-1).indices
        invalid = top_k_indices >= causal_threshold.unsqueeze(-1)
        return torch.where(invalid, torch.full_like(top_k_indices, -1), top_k_indices)

    return forward


def _deepseek_v4_csa_compressor(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `DeepseekV4CSACompressor.forward` without a cache (with one, HF's), its
    compressed entries from `_deepseek_v4_compressed`."""
    def forward(self: Any, hidden_states: torch.Tensor, q_residual: torch.Tensor, position_ids: torch.Tensor,
                cache: Any, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        if cache is not None:
            return original(self, hidden_states, q_residual, position_ids, cache, layer_idx)
        batch, seq_len, _ = hidden_states.shape
        compressed_kv = _deepseek_v4_compressed(self, self.kv_proj(hidden_states),
                                                self.gate_proj(hidden_states)).unsqueeze(1)
        top_k_indices = self.indexer(hidden_states, q_residual, position_ids, cache, layer_idx)
        compressed_len = compressed_kv.shape[2]
        safe_indices = torch.where(top_k_indices >= 0, top_k_indices, torch.full_like(top_k_indices, compressed_len))
        block_bias = compressed_kv.new_full((batch, 1, seq_len, compressed_len + 1), float("-inf"))
        block_bias.scatter_(-1, safe_indices.unsqueeze(1), 0.0)
        return compressed_kv, block_bias[..., :compressed_len]

    return forward


class _PaddedTopk(torch.overrides.TorchFunctionMode):
    """`scores.topk(k)` over the last dim with a symbolic `k` (HF's `min(index_topk, keys)`) as
    the top-k of the scores padded with k columns of -inf, the padding's indices clamped to the
    last key. torch.export cannot prove topk's own check `min(index_topk, keys) <= keys` (its
    guard fixes the length unless index_topk is at most the least length it traces, 2); over
    keys + k columns it holds. A padded column is picked only where fewer than k scores are
    finite, so every finite one is picked too: the last key is then either picked already or -inf,
    as the -inf columns HF picks there (which the attention's mask masks)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not torch.Tensor.topk or len(args) != 2 or not isinstance(args[1], torch.SymInt) or \
                kwargs not in ({"dim": -1}, {}) or args[0].dim() == 0:
            return func(*args, **kwargs)
        scores, k = args
        keys = scores.shape[-1]
        padded = torch.nn.functional.pad(scores, (0, k), value=float("-inf"))
        best = padded.topk(k, dim=-1)
        return torch.return_types.topk((best.values, best.indices.clamp(max=keys - 1)))


def _deepseek_v32_indexer(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `DeepseekV32Indexer.forward` and its copies, HF's own, its top-k through
    `_PaddedTopk`."""
    def forward(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        with _PaddedTopk():
            return original(self, *args, **kwargs)

    return forward


def _xlm_every_token_real(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `XLMModel.forward` with `attention_mask` all ones where it is given neither
    that nor `lengths` (with either, HF's as called). HF then counts each row's tokens that are not
    `pad_index` (`lengths`) and masks the hidden states of positions at or beyond that count
    (`get_masks`: `arange(seq) < lengths`, a reduction over the tokens that a decode step of one
    token cannot compute for the whole sequence). `LLM` pads no sequence, so in a sequence without
    the pad id the count is the sequence's length and HF's mask is all ones: what the given mask
    says, for each step alike. In a sequence that holds the pad id HF masks its last positions
    instead (it takes the id for right padding), which no cache reproduces: exact only for
    sequences without the pad id. For the export for generation only (`GENERATION_METHODS`)."""
    signature = inspect.signature(original)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = signature.bind(self, *args, **kwargs)
        named = given.arguments
        if named.get("input_ids") is not None and named.get("attention_mask") is None and named.get("lengths") is None:
            named["attention_mask"] = torch.ones_like(named["input_ids"])
        return original(*given.args, **given.kwargs)

    return forward


def _rg_lru_scan(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `RecurrentGemmaRglru._rnn_scan` without a state (with one, HF's): its gate
    zeroed where a sequence restarts (HF's `recurrent_gate * ~reset`, ordinary ops), then the
    recurrence through `torch_ops.rg_lru_scan`, no final state kept (HF's cache is off)."""
    def scan(self: Any, hidden_states: torch.Tensor, recurrent_gate: torch.Tensor, reset: torch.Tensor,
             recurrent_states: torch.Tensor | None, acc_dtype: torch.dtype = torch.float32) -> Any:
        if recurrent_states is not None or acc_dtype != torch.float32:
            return original(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype)
        return torch.ops.ad_mlir.rg_lru_scan(hidden_states, recurrent_gate * ~reset), None

    return scan


def _shifted_one_token(hidden: torch.Tensor) -> torch.Tensor:
    """RWKV's `time_shift` (`ZeroPad2d((0, 0, 1, -1))`: each token gets the previous one's row, the
    first a zero row) as a shift by a concatenation, `cat([zeros, hidden])[:, :-1]`: the same
    values, in the form the cache pass holds as a token window."""
    return torch.cat([hidden.new_zeros(hidden.shape[0], 1, hidden.shape[2]), hidden], dim=1)[:, :-1]


def _rwkv_time_mixing(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `RwkvSelfAttention.forward` without a state (with one, HF's): the token shift
    (`_shifted_one_token`) and the key, value and receptance projections as HF's
    `extract_key_value`, the decay `-exp(time_decay)` as ordinary ops, then the WKV recurrence
    through `torch_ops.wkv_scan` (HF's `rwkv_linear_attention` loops over time steps), no final
    state kept (HF's cache is off)."""
    def forward(self: Any, hidden: torch.Tensor, state: Any = None, use_cache: bool = False) -> Any:
        if state is not None or use_cache:
            return original(self, hidden, state, use_cache)
        shifted = _shifted_one_token(hidden)
        key = self.key(hidden * self.time_mix_key + shifted * (1 - self.time_mix_key))
        value = self.value(hidden * self.time_mix_value + shifted * (1 - self.time_mix_value))
        receptance = torch.sigmoid(self.receptance(hidden * self.time_mix_receptance
                                                   + shifted * (1 - self.time_mix_receptance)))
        rwkv = torch.ops.ad_mlir.wkv_scan(-torch.exp(self.time_decay), self.time_first, key, value)
        return self.output(receptance * rwkv), None

    return forward


def _rwkv_channel_mixing(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `RwkvFeedForward.forward` without a state (with one, HF's): HF's ops, its
    token shift as `_shifted_one_token`."""
    def forward(self: Any, hidden: torch.Tensor, state: Any = None) -> Any:
        if state is not None:
            return original(self, hidden, state)
        shifted = _shifted_one_token(hidden)
        key = hidden * self.time_mix_key + shifted * (1 - self.time_mix_key)
        receptance = hidden * self.time_mix_receptance + shifted * (1 - self.time_mix_receptance)
        value = self.value(torch.square(torch.relu(self.key(key))))
        return torch.sigmoid(self.receptance(receptance)) * value, None

    return forward


def _fp8_block_linear(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `FP8Linear.forward` (and `zoo.quantized.Fp8BlockLinear`'s) with block scales
    and dynamic activations, through `torch_ops.linear_fp8_block` (what its finegrained-fp8
    kernel computes): the fp8 weight and its scales stay graph weights. Per-tensor scales, static activations or a weight that is not
    fp8 (a dequantized model) take HF's forward."""
    def forward(self: Any, input: torch.Tensor) -> torch.Tensor:
        if self.block_size is None or self.activation_scheme != "dynamic" or \
                self.weight.dtype != torch.float8_e4m3fn or self.weight_scale_inv.dtype != torch.float32:
            return original(self, input)
        return torch.ops.ad_mlir.linear_fp8_block(input, self.weight, self.weight_scale_inv, self.bias,
                                                  list(self.block_size))

    return forward


def _fp8_channel_linear(original: Callable[..., Any]) -> Callable[..., Any]:
    """`zoo.ct_fp8.Fp8ChannelLinear.forward` (compressed-tensors FP8-dynamic) as
    `torch_ops.quantize_fp8_dynamic` per token, then `torch_ops.linear_fp8` with the per-channel
    (or per-tensor) weight scale: the references compute its forward exactly, and the fp8 weight
    and its scale stay graph weights."""
    def forward(self: Any, input: torch.Tensor) -> torch.Tensor:
        q, scale = torch.ops.ad_mlir.quantize_fp8_dynamic(input, True)
        return torch.ops.ad_mlir.linear_fp8(q, self.weight, scale, self.weight_scale, self.bias, input.dtype)

    return forward


def _nvfp4_linear(original: Callable[..., Any]) -> Callable[..., Any]:
    """`zoo.modelopt.Nvfp4Linear.forward` (ModelOpt NVFP4) as `torch_ops.linear_nvfp4`, which
    computes it exactly: the packed codes and their scales stay graph weights of one op."""
    def forward(self: Any, input: torch.Tensor) -> torch.Tensor:
        return torch.ops.ad_mlir.linear_nvfp4(input, self.weight, self.weight_scale, self.weight_scale_2, self.bias)

    return forward


def _gpt_oss_mxfp4_mlp(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `GptOssMLP.forward` with MXFP4 experts (`zoo.mxfp4.Mxfp4Experts`, a loaded
    gpt-oss checkpoint's) as the router's linear, then `torch_ops.moe_mxfp4` from its logits
    (gpt-oss's routing and experts): the experts' blocks and scales are graph weights of one op.
    It returns the router's logits beside the output, as transformers' MXFP4 MLP does (the
    decoder layer drops them). Experts that are not MXFP4 take HF's forward."""
    def forward(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # imported here, as torch_ops.moe_mxfp4 imports it: its loader brings triton in
        from ad_mlir.zoo.mxfp4 import Mxfp4Experts

        if not isinstance(self.experts, Mxfp4Experts):
            return original(self, hidden_states)
        flat = hidden_states.reshape(-1, self.router.hidden_dim)
        logits = torch.nn.functional.linear(flat, self.router.weight, self.router.bias)
        out = torch.ops.ad_mlir.moe_mxfp4(flat, logits, *self.experts.operands(), self.router.top_k,
                                          self.experts.alpha, self.experts.limit)
        return out.reshape(hidden_states.shape), logits

    return forward


def _fp8_block_experts(original: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' `FP8Experts.forward` (and `zoo.quantized.Fp8BlockExperts`') with block scales,
    dynamic activations and silu-gated experts, through `torch_ops.moe_fp8_block` from the
    router's choices (what its forward computes, expert by expert): the stacked fp8 experts and
    their scales stay graph weights of one op. Other experts (static activations, per-tensor
    scales, FP4 weights, a clamped or softcapped gate, a dequantized model) take HF's forward."""
    def forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        plain_gate = self.has_gate and self.swiglu_alpha is None and self.limit is None and self.gate_softcap is None
        if self.block_size is None or self.activation_scheme != "dynamic" or not plain_gate or \
                getattr(self.config, "hidden_act", None) != "silu" or self.gate_up_proj.dtype != torch.float8_e4m3fn \
                or self.gate_up_proj_scale_inv.dtype != torch.float32:
            return original(self, hidden_states, top_k_index, top_k_weights)
        return torch.ops.ad_mlir.moe_fp8_block(hidden_states, top_k_index, top_k_weights, self.gate_up_proj,
                                               self.gate_up_proj_scale_inv, self.down_proj, self.down_proj_scale_inv,
                                               list(self.block_size))

    return forward


def _int4_linear(original: Callable[..., Any]) -> Callable[..., Any]:
    """`zoo.gptq.Int4Linear.forward` (GPTQ and AWQ int4) through `torch_ops.linear_int4`, whose
    reference is its forward: the packed words, zero points, scales and g_idx stay graph weights."""
    def forward(self: Any, input: torch.Tensor) -> torch.Tensor:
        return torch.ops.ad_mlir.linear_int4(input, self.qweight, self.qzeros, self.scales, self.g_idx, self.bias,
                                             self.group_size, self.zero_offset)

    return forward


def _always(replacement: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda _: replacement


EXPERTS = ("self", "hidden_states", "top_k_index", "top_k_weights")
DEEPSEEK_V4_COMPRESSOR = ("self", "hidden_states", "q_residual", "position_ids", "cache", "layer_idx")
DSA_INDEXER = ("self", "hidden_states", "q_resid", "position_embeddings", "attention_mask", "position_ids", "cache")
DYNAMIC_CONVOLUTION = ("self", "hidden_states", "dynamic_input", "cache", "conv_mask", "cache_offset", "kwargs")
METHODS: dict[str, tuple[str, tuple[str, ...], Callable[[Callable[..., Any]], Callable[..., Any]]]] = {
    "DbrxExperts": ("forward", EXPERTS, _always(_dbrx_experts_dense)),
    "LongcatFlashExperts": ("forward", EXPERTS, _always(_longcat_experts_dense)),
    "Llama4TextMoe": ("forward", ("self", "hidden_states"), _always(_llama4_text_moe)),
    "CpmAntModel": ("_prepare_attention_mask", ("self", "input_ids", "span", "context", "length"),
                    _always(_cpmant_attention_mask)),
    "ZayaCCAProjection": ("forward", ("self", "hidden_states", "cache", "conv_mask"), _zaya_cca_projection),
    "MiniMaxLightningAttention": ("forward", ("self", "hidden_states", "position_embeddings", "attention_mask",
                                              "cache", "kwargs"), _minimax_lightning_attention),
    "AriaTextMoELayer": ("forward", ("self", "hidden_states"), _always(_aria_text_moe)),
    "RecurrentGemmaRglru": ("_rnn_scan", ("self", "hidden_states", "recurrent_gate", "reset", "recurrent_states",
                                          "acc_dtype"), _rg_lru_scan),
    "RwkvSelfAttention": ("forward", ("self", "hidden", "state", "use_cache"), _rwkv_time_mixing),
    "RwkvFeedForward": ("forward", ("self", "hidden", "state"), _rwkv_channel_mixing),
    **{name: ("forward", DYNAMIC_CONVOLUTION, _inkling2_dynamic_short_convolution)
       for name in ("Inkling2DynamicShortConvolution", "Inkling2LoopDynamicShortConvolution")},
    **{name: ("forward", ("self", "input"), _fp8_block_linear) for name in ("FP8Linear", "Fp8BlockLinear")},
    "Fp8ChannelLinear": ("forward", ("self", "input"), _fp8_channel_linear),
    "Nvfp4Linear": ("forward", ("self", "input"), _nvfp4_linear),
    "GptOssMLP": ("forward", ("self", "hidden_states"), _gpt_oss_mxfp4_mlp),
    **{name: ("forward", EXPERTS, _fp8_block_experts) for name in ("FP8Experts", "Fp8BlockExperts")},
    "Int4Linear": ("forward", ("self", "input"), _int4_linear),
    "DeepseekV4CSACompressor": ("forward", DEEPSEEK_V4_COMPRESSOR, _deepseek_v4_csa_compressor),
    "DeepseekV4Indexer": ("forward", DEEPSEEK_V4_COMPRESSOR, _deepseek_v4_indexer),
    **{name: ("forward", DSA_INDEXER, _deepseek_v32_indexer)
       for name in ("DeepseekV32Indexer", "GlmMoeDsaIndexer", "AXK2Indexer", "HYV4Indexer", "Dots3NoteTextIndexer")},
}
"""HF class name -> (method, its parameters, HF's method -> the method that replaces it while the
project exports): MoE blocks that run every expert on every token, Llama 4's MoE block with its
experts inline, CPM-Ant's attention mask, ZAYA's CCA projection and MiniMax's lightning attention
without a cache, Aria's MoE block, RecurrentGemma's RG-LRU scan and RWKV's time and channel mixing
without a state, Inkling2's dynamic
short convolution, DeepSeek-V4's CSA
compressor and indexer without a cache, DeepSeek sparse attention's indexers (HF's own, their
top-k padded), fine-grained FP8's `FP8Linear` and `Fp8BlockLinear` (in `INTEGRATION_MODULES`)
through the opaque `linear_fp8_block`, and compressed-tensors FP8's `Fp8ChannelLinear` through
`quantize_fp8_dynamic` and `linear_fp8`, ModelOpt NVFP4's `Nvfp4Linear` through `linear_nvfp4`,
gpt-oss's MLP on MXFP4 experts through `moe_mxfp4`, fine-grained FP8's `FP8Experts` and
`Fp8BlockExperts` through `moe_fp8_block`, and the int4 formats' `Int4Linear` through
`linear_int4`. A class whose method takes other parameters (another transformers version) is
left alone."""


XLM_FORWARD = ("self", "input_ids", "attention_mask", "langs", "token_type_ids", "position_ids", "lengths", "cache",
               "inputs_embeds", "output_attentions", "output_hidden_states", "return_dict", "kwargs")
GENERATION_METHODS: dict[str, tuple[str, tuple[str, ...], Callable[[Callable[..., Any]], Callable[..., Any]]]] = {
    "XLMModel": ("forward", XLM_FORWARD, _xlm_every_token_real),
}
"""`METHODS` replaced only in the export for generation (`routed_for_export(generation=True)`),
where every token of a step is a real one (`LLM` pads no sequence): XLM's padding mask, counted
from the tokens that are not its pad id, as all ones. The plain export keeps HF's mask."""


def _patched_methods(
        methods: dict[str, tuple[str, tuple[str, ...], Callable[[Callable[..., Any]], Callable[..., Any]]]],
) -> Iterator[tuple[type, str, Callable[..., Any]]]:
    """(class, method, its replacement) for each `methods` class of the loaded modeling modules."""
    seen: set[int] = set()
    for name, module in list(sys.modules.items()):
        if not (name.startswith(MODELING_MODULES) or name in INTEGRATION_MODULES) or module is None:
            continue
        for cls_name, (method, parameters, replacement) in methods.items():
            cls = module.__dict__.get(cls_name)
            if not isinstance(cls, type) or id(cls) in seen or method not in cls.__dict__:
                continue
            seen.add(id(cls))
            if tuple(inspect.signature(cls.__dict__[method]).parameters) == parameters:
                yield cls, method, replacement(cls.__dict__[method])


@contextlib.contextmanager
def routed_for_export(generation: bool = False) -> Iterator[list[str]]:
    """Within it, every loaded transformers modeling module's `ROUTES` functions are routed
    through the opaque ops and its `METHODS` classes' methods are replaced (with `generation`,
    those of `GENERATION_METHODS` too); yields the names of what it replaced."""
    patched: list[tuple[Any, str, Any]] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith(MODELING_MODULES) or module is None:
            continue
        for function, route in ROUTES.items():
            original = module.__dict__.get(function)
            if callable(original):
                torch_ops.SEQUENCE_MIXER_FUNCTIONS[name, function] = original
                setattr(module, function, route(name, original))
                patched.append((module, function, original))
    chosen = {**METHODS, **(GENERATION_METHODS if generation else {})}
    methods = [(cls, method, cls.__dict__[method], replacement)
               for cls, method, replacement in _patched_methods(chosen)]
    for cls, method, _, replacement in methods:
        setattr(cls, method, replacement)
    try:
        yield [f"{m.__name__}.{f}" for m, f, _ in patched] + [f"{c.__module__}.{c.__name__}.{m}"
                                                             for c, m, _, _ in methods]
    finally:
        for module, function, original in patched:
            setattr(module, function, original)
        for cls, method, original, _ in methods:
            setattr(cls, method, original)
