"""EAGLE-3 draft heads (Li et al., 2025) in the checkpoint layout vLLM loads
(`LlamaForCausalLMEagle3`): their module in plain torch, a loader and a writer of random ones.

A head reads the target's hidden states after three of its layers, concatenated [tokens, 3 *
target hidden] (`eagle_aux_hidden_state_layer_ids` in its config; without it vLLM's default: 2,
half the layers, 3 before the last), and drafts with one decoder layer:

- `fc` [H, 3 * target hidden] projects the three states to the head's width;
- the layer's attention reads the token's embedding after `input_layernorm` beside the hidden
  state after `hidden_norm`, concatenated: `q_proj`, `k_proj` and `v_proj` take 2H; the
  residual is the un-normed hidden state; then `post_attention_layernorm`, the MLP, the residual;
- `norm`, then `lm_head` over a draft vocabulary (`draft_vocab_size` rows, the target's most
  frequent tokens): draft id i is target id `i + d2t[i]`;
- the embedding is the target's (a checkpoint may carry its own `embed_tokens.weight`).

The input at position p is (the target's hidden state at p, the token at p + 1): it predicts the
token at p + 2. A later drafted position takes the head's own output before `norm` as its hidden
state, in place of `fc`'s.

Weight names are the EAGLE-3 release's: `fc.weight`, `midlayer.<...>` (vLLM also reads
`layers.0.<...>`), `norm.weight`, `lm_head.weight`, `d2t` (int64 [draft vocab]) and `t2d`
(bool [target vocab], which tokens the draft vocabulary holds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS = "model.safetensors"


def default_layers(target_layers: int) -> tuple[int, ...]:
    """vLLM's choice of the three hidden states when the config names none (as HF's
    `output_hidden_states` numbers them: i is the stream after i layers)."""
    return (2, target_layers // 2, target_layers - 3)


class Eagle3Layer(torch.nn.Module):
    """The head's decoder layer (module docstring): attention over 2H inputs, then the MLP."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // heads
        self.heads, self.kv_heads = heads, kv_heads
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.self_attn = torch.nn.Module()
        self.self_attn.q_proj = torch.nn.Linear(2 * h, heads * self.head_dim, bias=False)
        self.self_attn.k_proj = torch.nn.Linear(2 * h, kv_heads * self.head_dim, bias=False)
        self.self_attn.v_proj = torch.nn.Linear(2 * h, kv_heads * self.head_dim, bias=False)
        self.self_attn.o_proj = torch.nn.Linear(heads * self.head_dim, h, bias=False)
        self.mlp = LlamaMLP(config)


class Eagle3Head(torch.nn.Module):
    """An EAGLE-3 head (module docstring). `forward` runs new positions of one sequence after the
    K/V of its earlier positions (`cache`)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        target_hidden = getattr(config, "target_hidden_size", None) or h
        self.fc = torch.nn.Linear(3 * target_hidden, h, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = torch.nn.Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config)
        self.embed_tokens: torch.nn.Embedding | None = None
        """The token embedding: the target's (`share_embedding`) or the checkpoint's own."""

    @property
    def layers(self) -> tuple[int, ...] | None:
        """The target's hidden states it reads (None: the config names none)."""
        ids = getattr(self.config, "eagle_aux_hidden_state_layer_ids", None)
        return tuple(ids) if ids else None

    def share_embedding(self, embedding: torch.nn.Embedding) -> None:
        if self.embed_tokens is None:
            self.embed_tokens = embedding

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft vocabulary ids as the target's."""
        return draft_ids + self.d2t[draft_ids]

    def forward(self, hidden: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """New positions `positions` [n] (after the cache's, in order) with `hidden` [n, H] (the
        target's through `fc`, or the head's own) and the next tokens `token_ids` [n]: the draft
        logits [n, draft vocab], the outputs before `norm` [n, H] and the K/V cache
        [kv_heads, cached + n, head_dim] each."""
        layer = self.midlayer
        attn = layer.self_attn
        assert self.embed_tokens is not None, "share the target's embedding first"
        x = torch.cat([layer.input_layernorm(self.embed_tokens(token_ids)), layer.hidden_norm(hidden)], dim=-1)
        n, d = len(positions), layer.head_dim
        q = attn.q_proj(x).view(n, layer.heads, d).transpose(0, 1)
        k = attn.k_proj(x).view(n, layer.kv_heads, d).transpose(0, 1)
        v = attn.v_proj(x).view(n, layer.kv_heads, d).transpose(0, 1)
        cos, sin = self.rotary(x, positions[None])
        q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
        q, k = q[0], k[0]
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=1), torch.cat([cache[1], v], dim=1)
        before = k.shape[1] - n
        mask = torch.ones(n, k.shape[1], dtype=torch.bool).tril(before)
        groups = layer.heads // layer.kv_heads
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0),
                                             attn_mask=mask)
        residual = attn.o_proj(out.transpose(0, 1).reshape(n, -1)) + hidden
        prenorm = layer.mlp(layer.post_attention_layernorm(residual)) + residual
        return self.lm_head(self.norm(prenorm)), prenorm, (k, v)


def load_eagle3(directory: str | Path) -> Eagle3Head:
    """The head saved in `directory` (config.json and model.safetensors, module docstring)."""
    directory = Path(directory)
    fields = json.loads((directory / "config.json").read_text())
    if ARCHITECTURE not in fields.get("architectures", [ARCHITECTURE]):
        raise ValueError(f"{directory}: config.json architectures = {fields['architectures']}: an EAGLE-3 head is "
                         f"{ARCHITECTURE}")
    config = _config(fields)
    head = Eagle3Head(config)
    weights = {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: v
               for k, v in load_file(str(directory / WEIGHTS)).items()}
    own = weights.pop("embed_tokens.weight", None)
    if own is not None:
        head.embed_tokens = torch.nn.Embedding.from_pretrained(own, freeze=True)
    weights.setdefault("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
    weights.setdefault("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
    missing, unexpected = head.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not m.startswith("rotary.")]
    if missing or unexpected:
        raise ValueError(f"{directory}: EAGLE-3 weights missing {missing}, unexpected {unexpected}")
    return head.eval()


def write_eagle3(directory: str | Path, target: torch.nn.Module, draft_tokens: list[int] | None = None,
                 layers: tuple[int, ...] | None = None, std: float = 0.5, seed: int = 0, **fields: Any) -> Path:
    """A random EAGLE-3 head for `target` (an HF causal LM) saved in `directory`: the target's
    width, heads and RoPE, one layer, weights of std `std`, the draft vocabulary `draft_tokens`
    (target ids in increasing order; default all), reading the hidden states `layers` (default:
    none named, vLLM's choice). `fields` override the config's."""
    t = target.config
    draft_tokens = sorted(draft_tokens if draft_tokens is not None else range(t.vocab_size))
    config = {"architectures": [ARCHITECTURE], "model_type": "llama", "hidden_size": t.hidden_size,
              "num_attention_heads": t.num_attention_heads, "num_key_value_heads": t.num_key_value_heads,
              "head_dim": getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
              "intermediate_size": t.intermediate_size, "rms_norm_eps": t.rms_norm_eps, "hidden_act": "silu",
              "num_hidden_layers": 1, "vocab_size": t.vocab_size, "draft_vocab_size": len(draft_tokens),
              "target_hidden_size": t.hidden_size, "max_position_embeddings": t.max_position_embeddings,
              "rope_theta": _rope_theta(t), "tie_word_embeddings": False, **fields}
    if layers is not None:
        config["eagle_aux_hidden_state_layer_ids"] = list(layers)
    head = Eagle3Head(_config(config))
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, p in head.state_dict().items():
        if name.startswith("rotary.") or name in ("d2t", "t2d"):
            continue
        if name.endswith("norm.weight"):
            weights[name] = 1 + 0.1 * torch.randn(p.shape, generator=generator)
        else:
            weights[name] = std * torch.randn(p.shape, generator=generator)
    ids = torch.tensor(draft_tokens, dtype=torch.int64)
    weights["d2t"] = ids - torch.arange(len(ids))
    weights["t2d"] = torch.zeros(t.vocab_size, dtype=torch.bool).index_fill(0, ids, True)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(directory / WEIGHTS))
    return directory


def _config(fields: dict[str, Any]) -> LlamaConfig:
    fields = {k: v for k, v in fields.items() if k not in ("architectures", "model_type")}
    if "draft_vocab_size" not in fields:
        fields["draft_vocab_size"] = fields["vocab_size"]
    return LlamaConfig(**fields)


def _rope_theta(config: Any) -> float:
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
