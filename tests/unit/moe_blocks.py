"""HF mixture-of-experts blocks built small, and the `ad.moe` operands that stand for them.

The operands are made here from the block's parameters with torch ops, independently of
`match-moe` (which builds the same stacking as IR): the router logits, the stacked experts,
and for Qwen2-MoE its shared expert cut in slices of the routed experts' intermediate size
(`shared_experts` virtual experts) with its sigmoid gate's logits."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AutoConfig

BLOCKS = {
    "mixtral": ("transformers.models.mixtral.modeling_mixtral", "MixtralSparseMoeBlock"),
    "qwen3_moe": ("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock"),
    "qwen2_moe": ("transformers.models.qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock"),
    "olmoe": ("transformers.models.olmoe.modeling_olmoe", "OlmoeSparseMoeBlock"),
}


def moe_config(family: str, hidden: int = 48, experts: int = 4, top_k: int = 2, inter: int = 32,
               **overrides: object) -> object:
    """A small config of `family` whose experts have intermediate size `inter` (Qwen2-MoE's
    shared expert 2 * inter: two virtual experts)."""
    sizes = {"hidden_size": hidden, "num_experts_per_tok": top_k, "intermediate_size": inter,
             "moe_intermediate_size": inter, "num_local_experts": experts, "num_experts": experts,
             "shared_expert_intermediate_size": 2 * inter}
    config = AutoConfig.for_model(family, **(sizes | overrides))
    config._experts_implementation = "grouped_mm"  # what torch.export of the block records
    return config


def hf_block(family: str, config: object, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """The family's sparse MoE block with random weights (std 0.2: router logits of a few units,
    so the top-k is clear of ties)."""
    import importlib

    module, name = BLOCKS[family]
    torch.manual_seed(seed)
    block = getattr(importlib.import_module(module), name)(config)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=0.2)
    return block.eval().to(dtype)


@dataclass
class MoeOperands:
    input: torch.Tensor
    router_logits: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    shared_gate: torch.Tensor | None
    properties: dict = field(default_factory=dict)

    def args(self) -> tuple:
        """The reference op's arguments."""
        p = self.properties
        return (self.input, self.router_logits, self.gate_up, self.down, self.shared_gate, p["top_k"],
                p.get("shared_experts", 0), p.get("normalize", False), p.get("round_weights", False))


def moe_operands(family: str, block: torch.nn.Module, x: torch.Tensor) -> MoeOperands:
    """`ad.moe`'s operands and properties for `block` on tokens `x` [tokens, hidden]."""
    config = block.experts.config
    logits = torch.nn.functional.linear(x, block.gate.weight)
    normalize = family == "mixtral" or config.norm_topk_prob  # Mixtral always renormalizes
    properties = {"top_k": config.num_experts_per_tok, "normalize": normalize}
    if family != "mixtral":
        properties["round_weights"] = True  # Qwen and OLMoE cast the weights to the logits' dtype
    gate_up, down, shared_gate = block.experts.gate_up_proj, block.experts.down_proj, None
    if hasattr(block, "shared_expert"):
        mlp, inter = block.shared_expert, down.shape[2]
        slices = mlp.gate_proj.weight.shape[0] // inter
        hidden = x.shape[1]
        shared_gate_up = torch.cat([mlp.gate_proj.weight.view(slices, inter, hidden),
                                    mlp.up_proj.weight.view(slices, inter, hidden)], dim=1)
        shared_down = mlp.down_proj.weight.view(hidden, slices, inter).permute(1, 0, 2)
        gate_up, down = torch.cat([gate_up, shared_gate_up]), torch.cat([down, shared_down])
        shared_gate = torch.nn.functional.linear(x, block.shared_expert_gate.weight)
        properties["shared_experts"] = slices
    return MoeOperands(x, logits, gate_up.detach(), down.detach(), shared_gate, properties)


class _Expert(torch.nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.w1 = torch.nn.Linear(hidden, inter, bias=False)
        self.w3 = torch.nn.Linear(hidden, inter, bias=False)
        self.w2 = torch.nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class LoopMoe(torch.nn.Module):
    """A hand-written MoE block in the shape of HF's Mixtral before transformers 5: a loop over
    the experts, each with linears of its own, `torch.where` of a one-hot mask and `index_add_`.
    With `topk_first`, the top-k of the logits is taken before the softmax."""

    def __init__(self, hidden: int = 48, inter: int = 32, experts: int = 4, top_k: int = 2,
                 topk_first: bool = False):
        super().__init__()
        self.top_k, self.topk_first, self.num_experts = top_k, topk_first, experts
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        self.experts = torch.nn.ModuleList(_Expert(hidden, inter) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        if self.topk_first:
            weights, chosen = torch.topk(logits, self.top_k, dim=-1)
            weights = torch.softmax(weights, dim=-1, dtype=torch.float)
        else:
            weights = torch.softmax(logits, dim=1, dtype=torch.float)
            weights, chosen = torch.topk(weights, self.top_k, dim=-1)
            weights /= weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(chosen, num_classes=self.num_experts).permute(2, 1, 0)
        for e, expert in enumerate(self.experts):
            slot, tokens = torch.where(mask[e])
            y = expert(x[tokens]) * weights[tokens, slot, None]
            out.index_add_(0, tokens, y.to(x.dtype))
        return out
