"""BERT encoder with its masked-language-model head: one class for bert-base and bert-tiny.

The parameter layout is Hugging Face's ``BertForMaskedLM``: embeddings (word, position,
token type, LayerNorm), post-LayerNorm encoder layers, no pooler, and the MLM head
``transform`` (dense + GELU + LayerNorm) followed by a decoder tied to the word embeddings with
its own bias. bert-base with vocab 30522 and 512 positions has 109,514,298 parameters, the count
of ``BertForMaskedLM`` for bert-base-uncased.

Logits come out for every position; the benchmark's synthetic targets are token ids, so no
masking is involved. There is no attention mask: synthetic batches have no padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class BertConfig:
    vocab_size: int
    max_positions: int = 512
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    d_ff: int = 0  # feed-forward width; 0 means 4 * d_model, as every published BERT size
    type_vocab_size: int = 2
    dropout: float = 0.0
    layer_norm_eps: float = 1e-12

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}.")
        if self.d_ff == 0:
            self.d_ff = 4 * self.d_model


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.query = nn.Linear(cfg.d_model, cfg.d_model)
        self.key = nn.Linear(cfg.d_model, cfg.d_model)
        self.value = nn.Linear(cfg.d_model, cfg.d_model)
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        q, k, v = (
            lin(x).view(batch, seq_len, self.n_head, -1).transpose(1, 2)
            for lin in (self.query, self.key, self.value)
        )
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.dense(y.transpose(1, 2).contiguous().view(batch, seq_len, d_model))


class BertLayer(nn.Module):
    """One post-LayerNorm encoder layer; the unit of per-block FSDP wrapping and checkpointing."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = BertSelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Linear(cfg.d_model, cfg.d_ff)
        self.output = nn.Linear(cfg.d_ff, cfg.d_model)
        self.output_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x)))
        return self.output_norm(x + self.dropout(self.output(F.gelu(self.intermediate(x)))))


class Bert(nn.Module):
    """Encoder + MLM head: int64 tokens [B, T] -> logits [B, T, vocab_size]."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.embeddings_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.n_layer))
        self.transform = nn.Linear(cfg.d_model, cfg.d_model)
        self.transform_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        # The decoder weight is word_embeddings.weight itself (one Parameter, so a meta-device
        # build followed by to_empty() cannot untie it); only its bias is separate.
        self.decoder_bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq_len = idx.shape[1]
        if seq_len > self.config.max_positions:
            raise ValueError(
                f"sequence of {seq_len} tokens exceeds max_positions={self.config.max_positions}."
            )
        pos = torch.arange(seq_len, device=idx.device)
        # Every token is segment 0, so the token-type lookup is row 0 broadcast over the batch.
        x = self.word_embeddings(idx) + self.position_embeddings(pos) + self.token_type_embeddings.weight[0]
        x = self.dropout(self.embeddings_norm(x))
        for block in self.blocks:
            x = block(x)
        x = self.transform_norm(F.gelu(self.transform(x)))
        # Bias added out of place rather than through F.linear: on 3-D input that returns a view,
        # which FSDP2 warns about at the root module's output.
        return F.linear(x, self.word_embeddings.weight) + self.decoder_bias

    def custom_init(self) -> None:
        """BERT's init (truncation aside): N(0, 0.02) weights, zero biases, unit LayerNorms."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
        nn.init.zeros_(self.decoder_bias)

    def shard_units(self) -> list[nn.Module]:
        return list(self.blocks)

    def tp_plan(self) -> dict[str, str]:
        """The tensor-parallel plan of each layer (Megatron's split; see GPT.tp_plan): query, key,
        value and the first feed-forward layer split by output columns, the attention's output and
        the second feed-forward layer by input rows. A declaration: not yet run."""
        return {"blocks.*.attention.query": "colwise", "blocks.*.attention.key": "colwise",
                "blocks.*.attention.value": "colwise", "blocks.*.attention.dense": "rowwise",
                "blocks.*.intermediate": "colwise", "blocks.*.output": "rowwise"}

    def train_flops_per_sample(self, seq_len: int, n_params: int) -> float:
        # Same formula as the decoder: 6 * N * T + 12 * n_layer * d_model * T^2, with N excluding
        # the position and token-type tables (lookups) and keeping the word embeddings, which are
        # the MLM decoder's matmul weight. Attention is bidirectional, so T^2 is exact here.
        cfg = self.config
        lookups = self.position_embeddings.weight.numel() + self.token_type_embeddings.weight.numel()
        return 6.0 * (n_params - lookups) * seq_len + 12.0 * cfg.n_layer * cfg.d_model * seq_len**2
