"""MiniCPM4 transformer stack: the base LM, the residual LM, and the body of LocEnc and LocDiT.

Attribute names equal the checkpoint keys (``layers.{i}.self_attn.q_proj.weight``, ``norm.weight``,
``embed_tokens.weight``). Two entry points:

* ``forward`` runs a whole sequence (prefill, or a LocEnc/LocDiT call) and returns every layer's
  post-RoPE keys and values so the caller can fill a KV cache;
* ``forward_step`` runs one new token per batch row against a paged KV cache, at a per-row position.

Numerics follow the reference exactly (see the spec, section 11): RMSNorm in fp32 cast back before
the weight, RoPE applied in fp32 with tables stored in the module dtype, SDPA with GQA (on CUDA, LocEnc's
and LocDiT's short bidirectional sequences run ``kernels.small_attention``, the same numerics in one small tile).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from voxwire.kernels import batch_invariant, ops
from voxwire.kernels.reference import apply_rope
from voxwire.model.kv_cache import PagedKV
from voxwire.model.paged_attention import decode_attention
from voxwire.model_config import MiniCPM4Config


class MiniCPMRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalise ``hidden``; with ``residual``, normalise ``residual + hidden`` and return it too
        (one fused kernel on CUDA; see ``voxwire.kernels.reference.rms_norm`` for the exact math)."""
        return ops.rms_norm(hidden, self.weight, self.eps, residual)

    def quantized(
        self, hidden: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[ops.QuantizedRows, torch.Tensor]:
        """``forward``'s normed value quantized for an fp8 GEMM (one kernel on CUDA), and ``residual + hidden`` (or
        ``hidden``)."""
        return ops.rms_norm_fp8(hidden, self.weight, self.eps, residual)


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
        self.cos_cached: torch.Tensor
        self.sin_cached: torch.Tensor
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

    def prefix(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (length, head_dim) of positions 0..length-1: views of the precomputed tables, so a
        whole-sequence call (every LocEnc/LocDiT call) launches nothing to get them."""
        if length > self.num_positions:
            raise ValueError(f"{length} positions requested but the RoPE tables hold {self.num_positions}")
        return self.cos_cached[:length], self.sin_cached[:length]


RopeTables = tuple[torch.Tensor, torch.Tensor]


def linear_rows(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` for x (..., in) of any layout as one GEMM over all its rows -> (..., out).

    With a frozen weight (as the server holds the model) ``F.linear`` of a 3-D or 4-D input whose rows are not one
    stride apart (a slice of a sequence, a transposed patch) runs a batched GEMM against the weight expanded to every
    batch element: on CUDA the whole weight is read once per element. Such rows are copied into one matrix first and
    multiplied, then the bias added, as ``F.linear`` does when the weight needs a gradient (the reference's model);
    rows already one stride apart go to ``layer`` as they are (``F.linear`` folds them itself)."""
    leading = range(x.dim() - 2)
    if all(x.stride(i) == x.stride(i + 1) * x.size(i + 1) for i in leading):
        return layer(x)
    out = F.linear(x.reshape(-1, x.size(-1)), layer.weight)
    if layer.bias is not None:
        out = out + layer.bias
    return out.view(*x.shape[:-1], layer.out_features)


class _FusedLinear:
    """Bias-free ``nn.Linear`` layers that read the same input, run as one GEMM.

    ``fuse`` moves their weights into one ``(sum of outputs, input)`` tensor and makes each layer's
    weight a view of its rows: no second copy of the weights, ``load_state_dict`` (which copies in
    place) keeps the fused weight current, and parameter names and the state dict are unchanged.
    Calling returns ``None`` (the caller then runs the layers one by one) until ``fuse`` ran, or once a
    layer was replaced (wrapped for LoRA, say) or its weight no longer lives in the fused tensor. Moving or
    casting the owning module keeps the fusion: its ``_apply`` calls ``follow``, which fuses the converted
    weights again and so lets go of the old fused tensor (which would otherwise stay alive, stale).

    One layer alone is "fused" too (its weight moved into a tensor of its own), so that ``quantize_fp8`` can give it
    an fp8 copy that follows it the same way.
    """

    def __init__(self) -> None:
        self.weight: torch.Tensor | None = None
        self.layers: tuple[nn.Linear, ...] = ()
        self.addresses: tuple[int, ...] = ()
        # The fused weight in float8_e4m3fn (N, K) and its per-output-channel scale (1, N), once ``quantize_fp8``
        # ran: the GEMM then runs in fp8 (``ops.fp8_linear``), its input quantized per row.
        self.fp8: tuple[torch.Tensor, torch.Tensor] | None = None

    def fuse(self, *layers: nn.Linear) -> None:
        if any(layer.bias is not None for layer in layers):
            raise ValueError("only bias-free projections are fused")
        weight = torch.cat([layer.weight.detach() for layer in layers])
        start = 0
        for layer in layers:
            rows = layer.weight.size(0)
            layer.weight = nn.Parameter(weight[start : start + rows], requires_grad=layer.weight.requires_grad)
            start += rows
        self.weight, self.layers = weight, layers
        self.addresses = tuple(layer.weight.data_ptr() for layer in layers)
        if self.fp8 is not None:  # a new fused weight (``follow``): its fp8 copy is made again from it
            self.quantize_fp8()

    def quantize_fp8(self) -> None:
        """From now on the GEMM runs in fp8 against a copy of the fused weight quantized per output channel."""
        if self.weight is None:
            raise ValueError("quantize_fp8 needs the layers fused first")
        self.fp8 = ops.quantize_weight_fp8(self.weight)

    def follow(self, *layers: nn.Linear) -> None:
        """After the owner's ``_apply`` (``to``, ``cuda``, ``half``, ``to_empty``) converted each layer's weight
        on its own: fuse the new weights again, or, if a layer was replaced meanwhile, drop the fused tensor,
        whose values no layer uses any more."""
        if self.weight is None or self._current(layers):
            return  # unfused, or a conversion that changed nothing (``to`` of the same dtype and device)
        if all(mine is theirs for mine, theirs in zip(self.layers, layers, strict=True)):
            self.fuse(*self.layers)
        else:
            self.weight, self.layers, self.addresses, self.fp8 = None, (), (), None

    def _current(self, layers: tuple[nn.Linear, ...]) -> bool:
        """These are the fused layers and their weights still live in the fused tensor."""
        assert self.weight is not None
        if any(mine is not theirs for mine, theirs in zip(self.layers, layers, strict=True)):
            return False
        return all(
            layer.weight.data_ptr() == address
            and layer.weight.dtype == self.weight.dtype
            and layer.weight.device == self.weight.device
            for layer, address in zip(layers, self.addresses, strict=True)
        )

    def takes_fp8(self, *layers: nn.Linear) -> bool:
        """Whether the GEMM runs in fp8 now, so its input may come quantized (``ops.QuantizedRows``). Batch-invariant
        numerics tile ``F.linear`` (``kernels.batch_invariant``), not ``_scaled_mm``: the fused weight in its own
        dtype then, as without fp8."""
        return self.fp8 is not None and self._current(layers) and not batch_invariant.active()

    def __call__(self, x: torch.Tensor | ops.QuantizedRows, *layers: nn.Linear) -> torch.Tensor | None:
        if self.fp8 is not None and self.takes_fp8(*layers):
            return ops.fp8_linear(x, *self.fp8)
        if self.weight is None or not self._current(layers):
            return None
        assert isinstance(x, torch.Tensor), "a quantized input goes to an fp8 GEMM only (``takes_fp8``)"
        return F.linear(x, self.weight)


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
        self._fused = _FusedLinear()
        self._fused_out = _FusedLinear()

    def fuse_qkv(self) -> None:
        """Store q/k/v_proj's weights in one buffer so the three projections run as one GEMM (see
        ``_FusedLinear``); the parameters and the state dict keep their names and shapes."""
        self._fused.fuse(self.q_proj, self.k_proj, self.v_proj)

    def quantize_fp8(self) -> None:
        """q/k/v and o_proj as fp8 GEMMs (``_FusedLinear.quantize_fp8``); fuses q/k/v first if needed."""
        if self._fused.weight is None:
            self.fuse_qkv()
        self._fused.quantize_fp8()
        self._fused_out.fuse(self.o_proj)
        self._fused_out.quantize_fp8()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> MiniCPMAttention:
        super()._apply(fn, recurse)
        self._fused.follow(self.q_proj, self.k_proj, self.v_proj)
        self._fused_out.follow(self.o_proj)
        return self

    def takes_fp8(self) -> bool:
        """Whether q/k/v's GEMM runs in fp8 now: its input may then come quantized by the norm before it."""
        return self._fused.takes_fp8(self.q_proj, self.k_proj, self.v_proj)

    def _qkv(
        self, x: torch.Tensor | ops.QuantizedRows, rope: RopeTables | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, H), quantized if ``takes_fp8`` -> q (B, nh, T, hd), k and v (B, nkv, T, hd), RoPE applied to q
        and k."""
        batch, length, _ = x.shape
        fused = self._fused_qkv(x)
        if fused is not None:
            q_and_k, v = fused
            if rope is None:
                q, k = q_and_k.split([self.num_heads, self.num_kv_heads], 1)
            else:
                q, k = ops.rope_qk(q_and_k, *rope, self.num_heads)
            return q, k, v
        assert isinstance(x, torch.Tensor)
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q.contiguous(), k.contiguous(), v.contiguous()

    def _fused_qkv(self, x: torch.Tensor | ops.QuantizedRows) -> tuple[torch.Tensor, torch.Tensor] | None:
        """x (B, T, H) -> q and k before RoPE (B, nh + nkv, T, hd) and v (B, nkv, T, hd) from the one q/k/v GEMM, or
        None when the projections are not fused."""
        qkv = self._fused(x, self.q_proj, self.k_proj, self.v_proj)
        if qkv is None:
            return None
        # Views into the one GEMM's output: SDPA and the cache writes take strided tensors, and the values are
        # those of the separate projections (checked bit for bit on CPU).
        batch, length, _ = x.shape
        heads = qkv.view(batch, length, -1, self.head_dim).transpose(1, 2)
        q_and_k, v = heads.split([self.num_heads + self.num_kv_heads, self.num_kv_heads], 1)
        return q_and_k, v

    def _out(self, attn: torch.Tensor) -> torch.Tensor:
        """attn (B, nh, T, hd) -> (B, T, H)."""
        batch, _, length, _ = attn.shape
        rows = attn.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        out = self._fused_out(rows, self.o_proj)
        return self.o_proj(rows) if out is None else out

    def forward(
        self, x: torch.Tensor | ops.QuantizedRows, rope: RopeTables | None, is_causal: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, H), quantized if ``takes_fp8`` -> output (B, T, H), keys and values (B, nkv, T, hd) for the
        cache."""
        like = x.q if isinstance(x, ops.QuantizedRows) else x
        if (
            rope is not None
            and not is_causal
            and ops.fuses_rope_attention(like, self.num_heads, self.num_kv_heads, x.shape[1], self.head_dim)
        ):
            fused = self._fused_qkv(x)
            if fused is not None:  # RoPE inside the small-sequence kernel: q is rotated as it is loaded
                q_and_k, v = fused
                attn, k = ops.rope_attention(q_and_k, v, *rope, self.num_heads)
                return self._out(attn), k, v
        q, k, v = self._qkv(x, rope)
        attn = ops.attention(q, k, v, is_causal)
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
        self._fused = _FusedLinear()
        self._fused_down = _FusedLinear()

    def fuse_gate_up(self) -> None:
        """gate_proj and up_proj as one GEMM (see ``_FusedLinear``)."""
        self._fused.fuse(self.gate_proj, self.up_proj)

    def quantize_fp8(self) -> None:
        """gate/up and down_proj as fp8 GEMMs (``_FusedLinear.quantize_fp8``); fuses gate/up first if needed."""
        if self._fused.weight is None:
            self.fuse_gate_up()
        self._fused.quantize_fp8()
        self._fused_down.fuse(self.down_proj)
        self._fused_down.quantize_fp8()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> MiniCPMMLP:
        super()._apply(fn, recurse)
        self._fused.follow(self.gate_proj, self.up_proj)
        self._fused_down.follow(self.down_proj)
        return self

    def takes_fp8(self) -> bool:
        """Whether gate/up's GEMM runs in fp8 now: its input may then come quantized by the norm before it."""
        return self._fused.takes_fp8(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor | ops.QuantizedRows) -> torch.Tensor:
        """x (..., H), quantized if ``takes_fp8`` -> (..., H)."""
        gate_up = self._fused(x, self.gate_proj, self.up_proj)
        if gate_up is not None:
            gate, up = gate_up.chunk(2, dim=-1)
        else:
            assert isinstance(x, torch.Tensor)
            gate, up = self.gate_proj(x), self.up_proj(x)
        if self._fused_down.takes_fp8(self.down_proj):  # SiLU*mul writes the down projection's fp8 input
            down = self._fused_down(ops.silu_mul_fp8(gate, up), self.down_proj)
            assert down is not None
            return down
        activated = ops.silu_mul(gate, up)
        down = self._fused_down(activated, self.down_proj)
        return self.down_proj(activated) if down is None else down


class MiniCPMDecoderLayer(nn.Module):
    def __init__(self, config: MiniCPM4Config) -> None:
        super().__init__()
        self.self_attn = MiniCPMAttention(config)
        self.mlp = MiniCPMMLP(config)
        self.input_layernorm = MiniCPMRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = MiniCPMRMSNorm(config.hidden_size, config.rms_norm_eps)
        # muP depth scaling; every released config has use_mup=false, so this is 1.0 in practice.
        self.residual_scale = config.scale_depth / math.sqrt(config.num_hidden_layers) if config.use_mup else 1.0

    def _scaled(self, branch: torch.Tensor) -> torch.Tensor:
        return branch * self.residual_scale if self.residual_scale != 1.0 else branch

    # The residual stream is carried as (x, pending): ``pending`` is the previous layer's MLP branch, not yet
    # added, so each residual add runs fused with the norm that follows it (one kernel on CUDA). The sums
    # are the same additions in the same order as adding first, so every value is unchanged.

    def _input_norm(self, x: torch.Tensor, pending: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (input_layernorm(x + pending), x + pending); pending is None before the first layer."""
        if pending is None:
            return self.input_layernorm(x), x
        return self.input_layernorm(pending, residual=x)

    def _attention_then_mlp(self, x: torch.Tensor, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (x + attn, the MLP branch on it, pending)."""
        normed: torch.Tensor | ops.QuantizedRows
        if self.mlp.takes_fp8():  # the norm writes gate/up's fp8 input
            normed, x = self.post_attention_layernorm.quantized(self._scaled(attn), residual=x)
        else:
            normed, x = self.post_attention_layernorm(self._scaled(attn), residual=x)
        return x, self._scaled(self.mlp(normed))

    def forward(
        self, x: torch.Tensor, pending: torch.Tensor | None, rope: RopeTables | None, is_causal: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x, pending) -> (x, pending) after this layer, and its keys and values."""
        normed: torch.Tensor | ops.QuantizedRows
        if self.self_attn.takes_fp8():  # the norm writes q/k/v's fp8 input
            normed, x = (
                self.input_layernorm.quantized(x) if pending is None else self.input_layernorm.quantized(pending, x)
            )
        else:
            normed, x = self._input_norm(x, pending)
        attn, k, v = self.self_attn(normed, rope, is_causal)
        return *self._attention_then_mlp(x, attn), k, v

    def forward_step(
        self, x: torch.Tensor, pending: torch.Tensor | None, rope: RopeTables | None, step: DecodeKV
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, pending) of one token per row -> (x, pending) after this layer; writes the layer's k/v."""
        normed, x = self._input_norm(x, pending)
        return self._attention_then_mlp(x, self.self_attn.forward_step(normed, rope, step))


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

    def fuse_projections(self) -> None:
        """q/k/v and gate/up of every layer as one GEMM each; call once the weights are loaded."""
        for layer in self._decoder_layers():
            layer.self_attn.fuse_qkv()
            layer.mlp.fuse_gate_up()

    def quantize_fp8(self) -> None:
        """Every layer's four GEMMs (q/k/v, o_proj, gate/up, down_proj) in fp8 e4m3: weights per output channel,
        inputs per row (``ops.fp8_linear``); call once the weights are loaded and on their device."""
        for layer in self._decoder_layers():
            layer.self_attn.quantize_fp8()
            layer.mlp.quantize_fp8()

    @property
    def runs_fp8(self) -> bool:
        """Whether every layer's GEMMs hold an fp8 weight (``quantize_fp8``)."""
        return all(
            fused.fp8 is not None
            for layer in self._decoder_layers()
            for fused in (layer.self_attn._fused, layer.self_attn._fused_out, layer.mlp._fused, layer.mlp._fused_down)
        )

    def forward(
        self, inputs_embeds: torch.Tensor, is_causal: bool
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """inputs_embeds (B, T, H) at positions 0..T-1 -> hidden (B, T, H) and per-layer (k, v) (B, nkv, T, hd)."""
        rope = None if self.rope_emb is None else self.rope_emb.prefix(inputs_embeds.size(1))
        hidden, pending = inputs_embeds, None
        kvs = []
        for layer in self.layers:
            hidden, pending, k, v = layer(hidden, pending, rope, is_causal)
            kvs.append((k, v))
        return self._final_norm(hidden, pending), kvs

    def forward_step(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, cache: PagedKV) -> torch.Tensor:
        """inputs_embeds (B, H), positions (B,) -> hidden (B, H); writes each layer's k/v at the positions."""
        rope = None
        if self.rope_emb is not None:
            cos, sin = self.rope_emb(positions)
            rope = (cos[:, None, None, :], sin[:, None, None, :])
        seq_lens = (positions + 1).to(torch.int32)
        hidden, pending = inputs_embeds, None
        for index, layer in enumerate(self._decoder_layers()):
            hidden, pending = layer.forward_step(hidden, pending, rope, DecodeKV(cache, index, positions, seq_lens))
        return self._final_norm(hidden, pending)

    def _decoder_layers(self) -> Iterable[MiniCPMDecoderLayer]:
        return cast(Iterable[MiniCPMDecoderLayer], self.layers)  # a ModuleList is typed as holding any Module

    def _final_norm(self, hidden: torch.Tensor, pending: torch.Tensor | None) -> torch.Tensor:
        """The final norm of ``hidden + pending`` (the last layer's MLP branch, added here)."""
        return self.norm(hidden) if pending is None else self.norm(pending, residual=hidden)[0]
