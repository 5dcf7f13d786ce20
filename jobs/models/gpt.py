"""GPT-2 style decoder (nanoGPT layout): one class for gpt_tiny and the whole GPT-2 family.

Layout: token embedding ``wte`` + learned position embedding ``wpe`` -> ``blocks`` (pre-LayerNorm,
causal self-attention with bias, GELU MLP 4x) -> final LayerNorm ``ln_f`` -> logits through the
transposed ``wte`` matrix (weight tying). With vocab 50257 and block size 1024 the parameter counts
are nanoGPT's: 124,439,808 (gpt2-small), 354,823,168 (medium), 774,030,080 (large),
1,557,611,200 (xl).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int  # longest sequence, in tokens; the size of the position table
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers, as GPT-2

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}.")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        q, k, v = self.c_attn(x).split(d_model, dim=2)
        # [B, T, C] -> [B, heads, T, head_dim], the layout scaled_dot_product_attention expects.
        q, k, v = (t.view(batch, seq_len, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(batch, seq_len, d_model)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One transformer layer; the unit of per-block FSDP wrapping and activation checkpointing."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only language model: int64 tokens [B, T] -> logits [B, T, vocab_size]."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        # No separate lm_head parameter: the output projection reads wte.weight directly. A second
        # module sharing the Parameter would be untied by Module.to_empty() after a meta-device
        # build, and FSDP would then shard two copies.

    # The model's own layers around its blocks, as methods the worker compiles on their own when the
    # blocks are compiled one by one (jobs/compiling.py: under FSDP, whose hooks sit between them).
    compile_regions = ("embed", "head")

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq_len = idx.shape[1]
        if seq_len > self.config.block_size:
            raise ValueError(f"sequence of {seq_len} tokens exceeds block_size={self.config.block_size}.")
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.ln_f(x), self.wte.weight)

    def custom_init(self) -> None:
        """nanoGPT/GPT-2 init, applied after every layer's own reset_parameters()."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer) so the residual stream's
        # variance does not grow with depth.
        # Blocks, or CheckpointWrappers that forward attributes to them (models.replace_units, before
        # init_weights): typed as Block, not checked with isinstance.
        for block in cast(Iterable[Block], self.blocks):
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def shard_units(self) -> list[nn.Module]:
        return list(self.blocks)

    def tp_plan(self) -> dict[str, str]:
        """The tensor-parallel plan of each block (Megatron's split, as torchtitan's llama3
        parallelize.py and transformers' ``base_model_tp_plan`` write it): the attention's input
        projection and the MLP's first layer split by output columns (each rank its heads, its
        hidden units), the projections back split by input rows (their outputs summed by one
        all-reduce per sublayer). ``c_attn`` stacks q, k and v: it splits per stacked chunk, so
        that each rank holds its heads of all three; attention then runs on ``n_head / tp`` heads.
        A declaration: tensor parallelism is not yet run (StrategySpec refuses strategy.tp > 1)."""
        return {"blocks.*.attn.c_attn": "colwise_stacked", "blocks.*.attn.c_proj": "rowwise",
                "blocks.*.mlp.c_fc": "colwise", "blocks.*.mlp.c_proj": "rowwise"}

    def train_flops_per_sample(self, seq_len: int, n_params: int) -> float:
        # PaLM appendix B / Chinchilla: 6 * N * T for the matmuls (forward 2 + backward 4 FLOPs per
        # parameter and token) plus 12 * n_layer * d_model * T^2 for attention scores and values
        # (causal masking not discounted). N excludes the position table (a lookup, no matmul) but
        # keeps wte, which is the output projection (nanoGPT's estimate_mfu convention).
        cfg = self.config
        n_matmul = n_params - self.wpe.weight.numel()
        return 6.0 * n_matmul * seq_len + 12.0 * cfg.n_layer * cfg.d_model * seq_len**2
