"""A decoder-only GPT-style transformer (Radford et al. 2018/2019) as a sequence of blocks.

Blocks: `Embed` (token + learned positional embedding), N `TransformerBlock`s (pre-LN:
x + attn(LN(x)), then x + MLP(LN(x)); causal multi-head self-attention, a 4x GELU MLP),
and `LMHead` (final LN, linear to the vocabulary, no weight tying so a pipeline can
put the head on another stage than the embedding). Every block takes and returns one
tensor: token ids (B, T) in, activations (B, T, dim) between blocks, logits (B, T, V)
out, so a pipeline can cut between any two blocks. Weights start as GPT-2's:
normal(0, 0.02), residual projections scaled by 1/sqrt(2N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812


@dataclass(frozen=True)
class GPTSize:
    """Width, depth and heads of a named size."""

    dim: int
    layers: int
    heads: int


SIZES = {
    "gpt-tiny": GPTSize(dim=64, layers=2, heads=4),
    "gpt-mini": GPTSize(dim=128, layers=4, heads=4),
    "gpt-small": GPTSize(dim=256, layers=6, heads=8),
}


class Embed(nn.Module):
    """Token ids (B, T) -> token plus positional embeddings (B, T, dim)."""

    def __init__(self, vocab: int, seq_len: int, dim: int, dropout: float) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(seq_len, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.tokens(ids) + self.positions(pos))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float,
                     heads: int, part: slice = slice(None)) -> torch.Tensor:
    """Causal attention of (B, h, T, d) queries, keys and values: `F.scaled_dot_product_
    attention` without dropout; with it (`dropout` > 0), the probabilities' mask is drawn
    for all `heads` heads (B, heads, T, T) from the default generator, as `nn.Dropout`
    draws, and heads `part` of it used (the q/k/v heads). A tensor-parallel rank holding
    some of the heads so draws what one process would for them: the same masks, not a
    rank's own stream correlated with the others' (tensor_parallel/attention.py)."""
    if not dropout:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    b, _, t, d = q.shape
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    keep = torch.empty(b, heads, t, t, dtype=q.dtype, device=q.device).bernoulli_(1 - dropout)
    return (probs * keep[:, part].div_(1 - dropout)) @ v


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees positions <= t."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(d, dim=2))
        y = causal_attention(q, k, v, self.dropout if self.training else 0.0, self.heads)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    """Pre-LN block: x + attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(dropout))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))


class LMHead(nn.Sequential):
    """Final layer norm and the projection to vocabulary logits (B, T, V)."""

    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__(nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False))


def gpt(size: GPTSize, vocab: int, seq_len: int, dropout: float = 0.0) -> nn.Sequential:
    """Embedding, `size.layers` transformer blocks and the head, each one block."""
    if size.dim % size.heads:
        raise ValueError(f"dim {size.dim} is not divisible by {size.heads} heads")
    blocks: list[nn.Module] = [Embed(vocab, seq_len, size.dim, dropout)]
    blocks += [TransformerBlock(size.dim, size.heads, dropout) for _ in range(size.layers)]
    blocks.append(LMHead(size.dim, vocab))
    model = nn.Sequential(*blocks)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            std = 0.02 / math.sqrt(2 * size.layers) if name.endswith("proj.weight") or \
                name.endswith("mlp.2.weight") else 0.02
            nn.init.normal_(p, 0.0, std)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
    return model


def tp_plan(model: nn.Module) -> dict[str, str]:
    """Megatron-LM's split of every transformer block: attention by heads, the MLP's first
    linear by columns and its second by rows (one all-reduce each way per sub-layer); the
    embedding, the norms and the head stay whole."""
    plan: dict[str, str] = {}
    for i, block in enumerate(model.children()):
        if isinstance(block, TransformerBlock):
            plan.update({f"{i}.attn": "heads", f"{i}.mlp.0": "colwise", f"{i}.mlp.2": "rowwise"})
    return plan


def sequence_plan(model: nn.Module) -> dict[str, str]:
    """`tp_plan` with sequence parallelism (Korthikanti et al. 2022): the embedding's output
    split along the sequence, every layer norm, dropout and residual add on this rank's
    positions, each split layer gathering them (`_seq` styles), and the head's linear
    taking every position again."""
    plan: dict[str, str] = {}
    for i, block in enumerate(model.children()):
        if isinstance(block, Embed):
            plan[f"{i}"] = "split_seq"
        elif isinstance(block, TransformerBlock):
            plan.update({f"{i}.ln1": "norm_seq", f"{i}.attn": "heads_seq",
                         f"{i}.drop": "dropout_seq", f"{i}.ln2": "norm_seq",
                         f"{i}.mlp.0": "colwise_seq", f"{i}.mlp.2": "rowwise_seq",
                         f"{i}.mlp.3": "dropout_seq"})
        elif isinstance(block, LMHead):
            plan.update({f"{i}.0": "norm_seq", f"{i}.1": "gather_seq"})
    return plan
