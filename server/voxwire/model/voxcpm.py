"""The VoxCPM network: every sub-module under its checkpoint name, and the two batched functions the
one-utterance API and the batching engine both call.

* ``prefill`` consumes a right-padded batch of whole input sequences, writes their keys and values
  straight into their KV blocks and returns each row's decode state;
* ``decode_step`` makes one latent patch per row (the CFM sampler conditioned on both LMs), reports
  each row's stop logits, and advances both LMs by the new patch, all in place on static buffers.

Both take per-row positions and parameters and never read a tensor back to the host, so a runner can
capture ``decode_step`` in a CUDA graph. What the step means follows the reference loop exactly: the
stop logits of step i come from the base-LM state that conditioned patch i, and patch i is always
produced (the caller decides to stop after it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from voxwire.model.audio_vae import AudioVAE
from voxwire.model.cfm import CfmSchedule, UnifiedCFM
from voxwire.model.fsq import ScalarQuantizationLayer
from voxwire.model.kv_cache import PagedKV
from voxwire.model.local_dit import VoxCPMLocDiT
from voxwire.model.local_encoder import VoxCPMLocEnc
from voxwire.model.minicpm import MiniCPMModel
from voxwire.model_config import ModelConfig
from voxwire.sequence import InputSequence


@dataclass(frozen=True)
class PrefillBatch:
    """Right-padded input sequences (see the spec, section 4.3, for the layouts)."""

    text_tokens: torch.Tensor  # (B, T) long; 0 at audio and padding positions
    feats: torch.Tensor  # (B, T, P, D) model dtype; zero patches at text and padding positions
    text_mask: torch.Tensor  # (B, T) model dtype, 1 at text-token positions
    audio_mask: torch.Tensor  # (B, T) model dtype, 1 at audio-patch positions
    lengths: torch.Tensor  # (B,) long, real length of each row (>= 1)
    # Flat index (row * T + position) of every audio position, row by row.
    audio_positions: torch.Tensor  # (N,) long
    # LocEnc's outputs (N, encoder hidden) for those positions, in that order, when the caller has them (a
    # runner's voice cache); None: ``prefill`` encodes them. Encoder space, not LM space: the projection into
    # the LM runs per row in the batch, where a row's LoRA persona applies.
    audio_encodings: torch.Tensor | None = None

    @classmethod
    def from_sequences(
        cls,
        sequences: list[InputSequence],
        device: torch.device,
        dtype: torch.dtype,
        audio_encodings: torch.Tensor | None = None,
    ) -> PrefillBatch:
        """Right-pad sequences into one batch on ``device`` (feats and masks in ``dtype``); ``audio_encodings``
        (N, encoder hidden), if given, are LocEnc's outputs for the sequences' audio positions, row by row."""
        width = max(sequence.length for sequence in sequences)
        # Found on the host, from the unpadded masks, so the prefill never waits for the device to find them.
        audio_positions = torch.cat(
            [row * width + sequence.audio_mask.nonzero().squeeze(1) for row, sequence in enumerate(sequences)]
        )

        def stack(field: str, field_dtype: torch.dtype) -> torch.Tensor:
            rows = [getattr(sequence, field) for sequence in sequences]
            padded = [F.pad(r, (0, 0) * (r.dim() - 1) + (0, width - r.size(0))) for r in rows]
            return torch.stack(padded).to(device=device, dtype=field_dtype)

        return cls(
            text_tokens=stack("tokens", torch.long),
            feats=stack("feats", dtype),
            text_mask=stack("text_mask", dtype),
            audio_mask=stack("audio_mask", dtype),
            lengths=torch.tensor([sequence.length for sequence in sequences], device=device),
            audio_positions=audio_positions.to(device),
            audio_encodings=audio_encodings,
        )


@dataclass(frozen=True)
class DecodeState:
    """Per-row state between steps. Batch-first buffers, updated in place by ``decode_step``."""

    lm_hidden: torch.Tensor  # (B, H) base-LM state that conditions the next patch
    residual_hidden: torch.Tensor  # (B, H) residual-LM state
    cond: torch.Tensor  # (B, P, D) previous patch (the last prefill patch at step 0)
    positions: torch.Tensor  # (B,) long, KV position the next step writes

    def rows(self, start: int, count: int) -> DecodeState:
        """A view of rows ``start .. start+count-1`` (in-place updates reach this state)."""
        return DecodeState(*(t[start : start + count] for t in self.as_tuple()))

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        return (self.lm_hidden, self.residual_hidden, self.cond, self.positions)

    def copy_(self, other: DecodeState) -> None:
        for mine, theirs in zip(self.as_tuple(), other.as_tuple(), strict=True):
            mine.copy_(theirs)


class VoxCPMModel(nn.Module):
    """Both architectures: ``voxcpm`` fuses the residual-LM input by addition, ``voxcpm2`` concatenates and
    projects (``fusion_concat_proj``), gives LocDiT two ``mu`` tokens, and runs its residual LM without RoPE."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.concat_fusion = config.concat_fusion
        lm, hidden = config.lm_config, config.lm_config.hidden_size
        self.base_lm = MiniCPMModel(lm, rope_positions=config.max_length)
        self.residual_lm = MiniCPMModel(config.residual_lm, rope_positions=config.max_length)
        self.feat_encoder = VoxCPMLocEnc(config.local_encoder, config.feat_dim, config.patch_size)
        estimator = VoxCPMLocDiT(
            config.local_dit, config.feat_dim, config.patch_size, mu_tokens=2 if self.concat_fusion else 1
        )
        self.feat_decoder = UnifiedCFM(estimator, mean_mode=config.mean_mode)
        self.fsq_layer = ScalarQuantizationLayer(
            hidden, config.scalar_quantization_latent_dim, config.scalar_quantization_scale
        )
        self.enc_to_lm_proj = nn.Linear(config.encoder_config.hidden_dim, hidden)
        self.lm_to_dit_proj = nn.Linear(hidden, config.dit_config.hidden_dim)
        self.res_to_dit_proj = nn.Linear(hidden, config.dit_config.hidden_dim)
        if self.concat_fusion:
            self.fusion_concat_proj = nn.Linear(2 * hidden, hidden)
        self.stop_proj = nn.Linear(hidden, hidden)
        self.stop_head = nn.Linear(hidden, 2, bias=False)
        self.audio_vae = AudioVAE(config.audio_vae_config, config.vae_variant)
        self.embed_scale = lm.scale_emb if lm.use_mup else 1.0

    def cast_transformers(self, dtype: torch.dtype) -> None:
        """Cast everything but the AudioVAE (which always runs in float32), as the reference does."""
        for name, child in self.named_children():
            if name != "audio_vae":
                child.to(dtype)

    def fuse_projections(self) -> None:
        """Every transformer's q/k/v and gate/up as one GEMM each (checkpoint keys unchanged); call after
        the weights are loaded and the model is on its device in its dtype."""
        for stack in (self.base_lm, self.residual_lm, self.feat_encoder.encoder, self.feat_decoder.estimator.decoder):
            stack.fuse_projections()

    def quantize_dit_fp8(self) -> None:
        """LocDiT's decoder GEMMs (q/k/v, o_proj, gate/up, down_proj of every layer: 99 % of the DiT's FLOPs) in fp8
        e4m3, weights scaled per output channel and inputs per row (``MiniCPMModel.quantize_fp8``); call after
        ``fuse_projections``, on the model's device."""
        self.feat_decoder.estimator.decoder.quantize_fp8()

    @property
    def dit_runs_fp8(self) -> bool:
        """Whether ``quantize_dit_fp8`` ran (and the GEMMs still run in fp8: a layer wrapped since runs its own)."""
        return self.feat_decoder.estimator.decoder.runs_fp8

    def embed_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """patches (B, T, P, D) -> LM-space audio embeddings (B, T, H)."""
        return self.enc_to_lm_proj(self.feat_encoder(patches))

    def encode_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """patches (N, P, D) -> LocEnc outputs (N, encoder hidden), before the projection into the LM."""
        return self.feat_encoder(patches.unsqueeze(0))[0]

    def embed_audio_positions(self, batch: PrefillBatch) -> torch.Tensor:
        """LM-space audio embeddings (B, T, H) of a prefill batch, zero wherever ``audio_mask`` is 0.

        A batch without audio never reaches LocEnc. With ``batch.audio_encodings`` (a runner's voices, each
        encoded once over its own patches and cached) LocEnc does not run here at all. Without them it runs
        as the reference runs it, over every position of the batch: gathering the audio positions would
        change the GEMMs' shapes and the projection's input layout, and in bf16 on CPU the rounding with them,
        a few ulps off the reference. The projection into the LM runs on the batch's (B, T) layout, so each
        row's LoRA persona, selected per row, applies."""
        rows, length = batch.feats.shape[:2]
        if batch.audio_positions.numel() == 0:  # zero-shot rows only
            return batch.feats.new_zeros(rows, length, self.config.lm_config.hidden_size)
        if batch.audio_encodings is None:
            encoded = self.feat_encoder(batch.feats)
        else:
            scattered = batch.audio_encodings.new_zeros(rows * length, batch.audio_encodings.size(-1))
            scattered.index_copy_(0, batch.audio_positions, batch.audio_encodings)
            encoded = scattered.view(rows, length, -1)
        return self.enc_to_lm_proj(encoded) * batch.audio_mask.unsqueeze(-1)

    def _residual_input(self, lm_hidden: torch.Tensor, audio_embeds: torch.Tensor) -> torch.Tensor:
        if self.concat_fusion:
            return self.fusion_concat_proj(torch.cat((lm_hidden, audio_embeds), dim=-1))
        return lm_hidden + audio_embeds

    def prefill(self, batch: PrefillBatch, base_cache: PagedKV, residual_cache: PagedKV) -> DecodeState:
        """Run both LMs over whole sequences, fill the cache rows, return the state for step 0."""
        audio_mask, text_mask = batch.audio_mask.unsqueeze(-1), batch.text_mask.unsqueeze(-1)
        audio_embeds = self.embed_audio_positions(batch)  # zero wherever audio_mask is 0
        text_embeds = self.base_lm.embed_tokens(batch.text_tokens)
        if self.embed_scale != 1.0:
            text_embeds = text_embeds * self.embed_scale
        hidden, kvs = self.base_lm(text_mask * text_embeds + audio_embeds, is_causal=True)
        base_cache.fill(kvs)
        # FSQ applies at audio positions only: the last position is token 101 (unquantised) in zero-shot and
        # reference modes, a prompt patch (quantised) in continuation mode.
        hidden = self.fsq_layer(hidden) * audio_mask + hidden * text_mask
        residual, kvs = self.residual_lm(self._residual_input(hidden, audio_embeds), is_causal=True)
        residual_cache.fill(kvs)
        rows = torch.arange(hidden.size(0), device=hidden.device)
        last = batch.lengths - 1
        return DecodeState(
            lm_hidden=hidden[rows, last],
            residual_hidden=residual[rows, last],
            cond=batch.feats[rows, last],
            positions=batch.lengths.clone(),
        )

    def stop_logits(self, lm_hidden: torch.Tensor) -> torch.Tensor:
        """lm_hidden (B, H) -> (B, 2); argmax 1 means the utterance may end after this step's patch."""
        return self.stop_head(F.silu(self.stop_proj(lm_hidden)))

    def dit_condition(self, state: DecodeState) -> torch.Tensor:
        """mu for LocDiT: (B, Hd) summed in v1, (B, 2*Hd) concatenated in v2."""
        from_lm, from_residual = self.lm_to_dit_proj(state.lm_hidden), self.res_to_dit_proj(state.residual_hidden)
        return torch.cat((from_lm, from_residual), dim=-1) if self.concat_fusion else from_lm + from_residual

    def decode_step(
        self,
        state: DecodeState,
        base_cache: PagedKV,
        residual_cache: PagedKV,
        noise: torch.Tensor,
        cfg_value: torch.Tensor,
        schedule: CfmSchedule,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One autoregressive step for every row: ``sample_patch``, ``stop_logits``, then ``advance``.

        Args:
            state: rows' decode state, advanced in place.
            base_cache, residual_cache: the paged caches with the same rows' block tables.
            noise: (B, D, P) model dtype, this step's CFM starting noise per row.
            cfg_value: (B,) float32 guidance strength per row.
            schedule: per-row CFM time grids.

        Returns:
            patch (B, P, D) in the model dtype, and stop logits (B, 2).
        """
        patch = self.sample_patch(state, noise, cfg_value, schedule)
        stop = self.stop_logits(state.lm_hidden)
        self.advance(state, patch, base_cache, residual_cache)
        return patch, stop

    def sample_patch(
        self, state: DecodeState, noise: torch.Tensor, cfg_value: torch.Tensor, schedule: CfmSchedule
    ) -> torch.Tensor:
        """The next patch (B, P, D) of every row, from its LM states and previous patch."""
        patch = self.feat_decoder(noise, self.dit_condition(state), state.cond.transpose(1, 2), cfg_value, schedule)
        return patch.transpose(1, 2)

    def advance(self, state: DecodeState, patch: torch.Tensor, base_cache: PagedKV, residual_cache: PagedKV) -> None:
        """Feed each row's patch (B, P, D) to both LMs at the row's position and move the state on, in place."""
        audio_embed = self.embed_patches(patch.unsqueeze(1))[:, 0]
        lm_hidden = self.fsq_layer(self.base_lm.forward_step(audio_embed, state.positions, base_cache))
        residual_input = self._residual_input(lm_hidden, audio_embed)
        residual = self.residual_lm.forward_step(residual_input, state.positions, residual_cache)
        state.copy_(DecodeState(lm_hidden, residual, patch, state.positions + 1))
