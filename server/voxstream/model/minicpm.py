"""MiniCPM4 transformer stack: the base LM, the residual LM, and the body of LocEnc and LocDiT.

Attribute names equal the checkpoint keys (``layers.{i}.self_attn.q_proj.weight``, ``norm.weight``,
``embed_tokens.weight``). Two entry points:

* ``forward`` runs a whole sequence (prefill, or a LocEnc/LocDiT call) and returns every layer's
  post-RoPE keys and values so the caller can fill a KV cache;
* ``forward_step`` runs one new token per batch row against a paged KV cache, at a per-row position.

Numerics follow the reference exactly (see the spec, section 11): RMSNorm in fp32 cast back before
the weight, RoPE applied in fp32 with tables stored in the module dtype, SDPA with GQA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from voxstream.config import MiniCPM4Config
from voxstream.model.kv_cache import PagedKV
from voxstream.model.paged_attention import decode_attention


class MiniCPMRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        variance = hidden.to(torch.float32).pow(2).mean(dim=-1, keepdim=True)
        # The product is fp32 (promotion) and is rounded to the activation dtype before the weight.
        return (hidden * torch.rsqrt(variance + self.eps)).to(hidden.dtype) * self.weight


class MiniCPMLongRoPE(nn.Module):
    """LongRoPE tables. ``cos_cached``/``sin_cached`` are non-persistent buffers, so casting the module to
    bf16 rounds them exactly as the reference's ``.to(bf16)`` does.

    Only ``num_positions`` rows are built (the reference builds ``max_position_embeddings`` rows); every
    row's value is independent of the table length, so a shorter table is exact and saves memory.
    """

    def __init__(self, config: MiniCPM4Config, num_positions: int) -> None:
        super().__init__()
        self.config = config
        self.num_positions = num_positions
        cos, sin = self._tables(None)
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)

    def _tables(self, device: torch.device | None) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 (num_positions, head_dim) cos and sin tables."""
        config, rope = self.config, self.config.rope_scaling
        dim = config.head_dim
        scale = config.max_position_embeddings / rope.original_max_position_embeddings
        scaling = math.sqrt(1 + math.log(scale) / math.log(rope.original_max_position_embeddings))
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim))
        use_long = config.max_position_embeddings > rope.original_max_position_embeddings
        factors = torch.tensor(rope.long_factor if use_long else rope.short_factor, dtype=torch.float32, device=device)
        positions = torch.arange(self.num_positions, dtype=torch.float32, device=device)
        freqs = torch.mul(torch.outer(positions, 1.0 / factors), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * scaling, emb.sin() * scaling

    def init_nonpersistent_buffers(self) -> None:
        """Recompute the tables in place (after ``to_empty``), rounded to the buffers' current dtype."""
        cos, sin = self._tables(self.cos_cached.device)
        self.cos_cached.copy_(cos)
        self.sin_cached.copy_(sin)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (...,) -> cos, sin (..., head_dim)."""
        return self.cos_cached[position_ids], self.sin_cached[position_ids]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, heads, T, hd) rotated in fp32 and returned in its own dtype; cos/sin broadcast to it."""
    x32 = x.to(torch.float32)
    return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)


RopeTables = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class DecodeKV:
    """What one layer's decode step needs of the cache: the pools, which layer, and each row's position."""

    cache: PagedKV
    layer: int
    positions: torch.Tensor  # (B,) long: where this step's token is written
    seq_lens: torch.Tensor  # (B,) int32: positions + 1, the live length attention reads


class MiniCPMAttention(nn.Module):
    def __init__(self, config: MiniCPM4Config) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)

    def _qkv(self, x: torch.Tensor, rope: RopeTables | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, H) -> q (B, nh, T, hd), k and v (B, nkv, T, hd), RoPE applied to q and k."""
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q.contiguous(), k.contiguous(), v.contiguous()

    def _out(self, attn: torch.Tensor) -> torch.Tensor:
        """attn (B, nh, T, hd) -> (B, T, H)."""
        batch, _, length, _ = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))

    def forward(
        self, x: torch.Tensor, rope: RopeTables | None, is_causal: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, H) -> output (B, T, H), keys and values (B, nkv, T, hd) for the cache."""
        q, k, v = self._qkv(x, rope)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
        return self._out(attn), k, v

    def forward_step(self, x: torch.Tensor, rope: RopeTables | None, step: DecodeKV) -> torch.Tensor:
        """x (B, H): one token per row, written into the paged cache at the step's positions -> output (B, H).

        Attention reads only each row's live positions (``paged_attention``)."""
        q, k, v = self._qkv(x.unsqueeze(1), rope)
        step.cache.write(step.layer, step.positions, k[:, :, 0], v[:, :, 0])
        pools = step.cache.layers[step.layer]
        attn = decode_attention(
            q[:, :, 0], pools.keys, pools.values, step.cache.block_tables, step.seq_lens, 1.0 / math.sqrt(self.head_dim)
        )
        return self.o_proj(attn.reshape(x.size(0), self.num_heads * self.head_dim))


class MiniCPMMLP(nn.Module):
    def __init__(self, config: MiniCPM4Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MiniCPMDecoderLayer(nn.Module):
    def __init__(self, config: MiniCPM4Config) -> None:
        super().__init__()
        self.self_attn = MiniCPMAttention(config)
        self.mlp = MiniCPMMLP(config)
        self.input_layernorm = MiniCPMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = MiniCPMRMSNorm(config.hidden_size, config.rms_norm_eps)
        # muP depth scaling; every released config has use_mup=false, so this is 1.0 in practice.
        self.residual_scale = config.scale_depth / math.sqrt(config.num_hidden_layers) if config.use_mup else 1.0

    def _residual(self, residual: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        return residual + branch * self.residual_scale if self.residual_scale != 1.0 else residual + branch

    def forward(
        self, x: torch.Tensor, rope: RopeTables | None, is_causal: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn, k, v = self.self_attn(self.input_layernorm(x), rope, is_causal)
        x = self._residual(x, attn)
        return self._residual(x, self.mlp(self.post_attention_layernorm(x))), k, v

    def forward_step(self, x: torch.Tensor, rope: RopeTables | None, step: DecodeKV) -> torch.Tensor:
        x = self._residual(x, self.self_attn.forward_step(self.input_layernorm(x), rope, step))
        return self._residual(x, self.mlp(self.post_attention_layernorm(x)))


class MiniCPMModel(nn.Module):
    """A MiniCPM4 stack with no LM head: embeddings in, final-normed hidden states out."""

    def __init__(self, config: MiniCPM4Config, rope_positions: int) -> None:
        """``rope_positions``: how many RoPE rows to build (the longest sequence this stack will see)."""
        super().__init__()
        self.config = config
        if config.vocab_size > 0:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MiniCPMDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = MiniCPMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope_emb = None if config.no_rope else MiniCPMLongRoPE(config, rope_positions)

    def forward(
        self, inputs_embeds: torch.Tensor, is_causal: bool
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """inputs_embeds (B, T, H) at positions 0..T-1 -> hidden (B, T, H) and per-layer (k, v) (B, nkv, T, hd)."""
        rope = None
        if self.rope_emb is not None:
            rope = self.rope_emb(torch.arange(inputs_embeds.size(1), device=inputs_embeds.device))
        hidden = inputs_embeds
        kvs = []
        for layer in self.layers:
            hidden, k, v = layer(hidden, rope, is_causal)
            kvs.append((k, v))
        return self.norm(hidden), kvs

    def forward_step(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, cache: PagedKV) -> torch.Tensor:
        """inputs_embeds (B, H), positions (B,) -> hidden (B, H); writes each layer's k/v at the positions."""
        rope = None
        if self.rope_emb is not None:
            cos, sin = self.rope_emb(positions)
            rope = (cos[:, None, None, :], sin[:, None, None, :])
        seq_lens = (positions + 1).to(torch.int32)
        hidden = inputs_embeds
        for index, layer in enumerate(self.layers):
            hidden = layer.forward_step(hidden, rope, DecodeKV(cache, index, positions, seq_lens))
        return self.norm(hidden)
