"""The VoxCPM AudioVAE (V1 for ``voxcpm``, V2 for ``voxcpm2``) and its exact, batchable streaming decoder.

The VAE is a DAC-style stack of causal convolutions, Snake activations and causal transposed
convolutions. Module attribute names equal the keys of the published ``audiovae.pth``
``state_dict`` once weight norm is folded (see ``fold_weight_norm``), so checkpoints load with
``strict=True``. V1 and V2 share every building block; they differ in two parametrised places, which
``AudioVAEVariant`` (computed by ``ModelConfig.vae_variant``) states:

* the encoder's strided convolutions: V1 left-pads an odd stride ``s`` by ``s + 1``, V2 by ``s``;
* V2's decoder applies a per-channel affine sample-rate conditioning before every decoder block.

Because every decoder layer is causal, decoding a latent sequence chunk by chunk while carrying each
layer's last input frames gives exactly the samples of one decode of the whole sequence.
``StreamingVAEDecoder`` does that for many streams at once with preallocated, batch-first state.
The VAE runs in float32 unless cast (``AudioVAE.to(torch.bfloat16)``, the CUDA option; see docs/performance.md for the
measured error against float32): inputs and stream state take the VAE's dtype, audio comes out float32.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxwire.kernels import ops
from voxwire.model_config import AudioVAEConfig, AudioVAEVariant

logger = logging.getLogger(__name__)

# Stream state of a decode: one buffer per context-carrying layer, indexed by the layer's state_slot.
# ``None`` means a whole-sequence decode that starts from silence.
StreamBuffers = list[Tensor] | None
# A transform of a layer's input (V2's sample-rate conditioning of a decoder block).
LayerInput = Callable[[Tensor], Tensor]

_RESIDUAL_DILATIONS = (1, 3, 9)
_SUPPORTED_COND_TYPES = ("scale_bias", "scale_bias_init")


class _CausalContext:
    """Mixin for a layer that needs ``context`` past input frames in front of each input.

    A whole-sequence call pads with zeros (the reference's causal padding); a streaming call takes
    the frames from its slot of the stream state and stores the newest ``context`` frames back, in
    place, so that the next chunk continues seamlessly.
    """

    context: int
    state_slot: int = -1
    in_channels: int  # the convolution's (the class this one is mixed into)

    def _with_past(self, x: Tensor, states: StreamBuffers, snake_alpha: Tensor | None = None) -> Tensor:
        """x: (B, C, L) -> (B, C, context + L); with ``snake_alpha``, the Snake that precedes this layer is
        applied to x on the way (a streaming call then writes the activation once, into the extended input)."""
        if states is None or self.context == 0:
            if snake_alpha is not None:
                x = ops.snake(x, snake_alpha)
            return x if self.context == 0 else F.pad(x, (self.context, 0))
        past = states[self.state_slot]
        extended = torch.cat([past, x], dim=-1) if snake_alpha is None else ops.snake_with_past(x, snake_alpha, past)
        past.copy_(extended[..., extended.shape[-1] - self.context :])
        return extended

    def _add_with_past(
        self, x: Tensor, residual: Tensor, states: StreamBuffers, snake_alpha: Tensor
    ) -> tuple[Tensor, Tensor]:
        """-> (``_with_past(residual + x, states, snake_alpha)``, residual + x), the add and the Snake in one
        pass when streaming."""
        if states is None or self.context == 0:
            hidden = residual + x
            return self._with_past(hidden, states, snake_alpha), hidden
        past = states[self.state_slot]
        extended, hidden = ops.snake_with_past(x, snake_alpha, past, residual)
        past.copy_(extended[..., extended.shape[-1] - self.context :])
        return extended, hidden


class Snake1d(nn.Module):
    """Snake activation ``x + sin²(αx) / (α + 1e-9)`` with one learned α per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor, states: StreamBuffers = None) -> Tensor:
        """x: (B, C, L) -> (B, C, L); ``states`` is unused (pointwise in time)."""
        return ops.snake(x, self.alpha)


class CausalConv1d(_CausalContext, nn.Conv1d):
    """Conv1d that only looks back: ``left_pad`` past samples, no right padding."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        left_pad: int,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, dilation=dilation, groups=groups)
        self.context = left_pad

    def forward(self, x: Tensor, states: StreamBuffers = None, snake_alpha: Tensor | None = None) -> Tensor:
        """x: (B, C_in, L) -> (B, C_out, (L + left_pad - dilation·(k-1) - 1) // stride + 1); ``snake_alpha``:
        see ``_with_past``."""
        return super().forward(self._with_past(x, states, snake_alpha))

    def forward_added(
        self, x: Tensor, residual: Tensor, states: StreamBuffers, snake_alpha: Tensor
    ) -> tuple[Tensor, Tensor]:
        """-> (this conv on snake(residual + x), residual + x): see ``_add_with_past``."""
        extended, hidden = self._add_with_past(x, residual, states, snake_alpha)
        return super().forward(extended), hidden


class CausalConvTranspose1d(_CausalContext, nn.ConvTranspose1d):
    """Upsampling by ``stride`` with kernel ``2·stride``, cropped so output sample t sees inputs ≤ t // stride.

    The reference runs the transposed conv without padding and drops the last ``stride`` samples.
    Output block m (``stride`` samples) is ``W[:, :, :s]ᵀ x[m] + W[:, :, s:]ᵀ x[m-1]``: it depends on
    two input frames only, so one past frame is the whole context. Computing it as one matmul over
    (frame, previous frame) pairs gives the same samples several times faster than PyTorch's CPU
    transposed convolution at these shapes, and the same kernel serves whole and streaming decodes.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__(in_channels, out_channels, 2 * stride, stride=stride)
        self.context = (self.kernel_size[0] - 1) // stride
        # (2·C_in, C_out·stride): both taps of each output block stacked. Derived from ``weight``, so it is
        # not saved, and it is rebuilt whenever a state dict is loaded.
        self.register_buffer("packed_weight", self._pack(), persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.repack())

    def _pack(self) -> Tensor:
        stride = self.stride[0]
        taps = torch.cat([self.weight.detach()[:, :, :stride], self.weight.detach()[:, :, stride:]])
        return taps.reshape(2 * self.in_channels, -1)

    def repack(self) -> None:
        """Refresh ``packed_weight`` after ``weight`` changed other than through ``load_state_dict``."""
        with torch.no_grad():
            self.packed_weight = self._pack()

    packed_weight: Tensor
    bias: Tensor  # always built with one

    # The stream state takes the place of ConvTranspose1d's output_size (the output is always L·stride).
    def forward(  # type: ignore[override]  # stream state in place of output_size
        self, x: Tensor, states: StreamBuffers = None, snake_alpha: Tensor | None = None
    ) -> Tensor:
        """x: (B, C_in, L) -> (B, C_out, L·stride); ``snake_alpha``: see ``_with_past``."""
        batch, _, length = x.shape
        frames = self._with_past(x, states, snake_alpha).transpose(1, 2)  # (B, 1 + L, C_in), a view
        # The pairs are written frame-major (the cat's one copy transposes), so all B·L of them are the rows of one
        # GEMM. From a transposed view matmul would instead run a batched GEMM with the weight broadcast to
        # every batch element (stride 0), reading the whole weight once per element for only L rows each.
        pairs = torch.cat([frames[:, 1:], frames[:, :-1]], dim=2).view(batch * length, 2 * self.in_channels)
        blocks = (pairs @ self.packed_weight).view(batch, length, self.out_channels, self.stride[0])
        return ops.conv_transpose_out(blocks, self.bias)


def _run(
    layers: Sequence[nn.Module] | nn.Sequential,
    x: Tensor,
    states: StreamBuffers,
    conditions: Sequence[LayerInput | None] = (),
) -> Tensor:
    """Apply layers in order, threading the stream state through each; ``conditions[i]``, where given,
    transforms layer i's input. Two fusions save writing a tensor and reading it back: a Snake followed by
    a layer that prepends past frames is applied by that layer (``_CausalContext._with_past``), and a
    residual unit followed by another leaves its add to the next one's first Snake."""
    snake_alpha: Tensor | None = None
    pending: Tensor | None = None
    for index, layer in enumerate(layers):
        condition = conditions[index] if index < len(conditions) else None
        if condition is not None:
            x = condition(x)
        following = layers[index + 1] if index + 1 < len(layers) else None
        fusable = index + 1 >= len(conditions) or conditions[index + 1] is None
        if isinstance(layer, CausalResidualUnit):
            x, branch = layer.forward_pending(x, pending, states)
            pending = branch if isinstance(following, CausalResidualUnit) and fusable else None
            if pending is None:
                x = x + branch
        elif isinstance(layer, Snake1d) and isinstance(following, _CausalContext) and fusable:
            snake_alpha = layer.alpha
        elif snake_alpha is not None:
            x, snake_alpha = layer(x, states, snake_alpha=snake_alpha), None
        else:
            x = layer(x, states)
    return x


class CausalResidualUnit(nn.Module):
    """``x + [Snake, causal k7 conv (dilated), Snake, k1 conv](x)``."""

    def __init__(self, dim: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim),
            CausalConv1d(dim, dim, 7, left_pad=6 * dilation, dilation=dilation, groups=groups),
            Snake1d(dim),
            CausalConv1d(dim, dim, 1, left_pad=0),
        )

    def forward(self, x: Tensor, states: StreamBuffers = None) -> Tensor:
        """x: (B, C, L) -> (B, C, L)."""
        x, branch = self.forward_pending(x, None, states)
        return x + branch

    def forward_pending(self, x: Tensor, pending: Tensor | None, states: StreamBuffers) -> tuple[Tensor, Tensor]:
        """(x, pending) -> (x + pending, this unit's branch on it), the branch not yet added. ``pending`` is the
        previous unit's branch: the residual stream is carried as in the LMs, so that each add runs in the
        kernel that applies the next unit's first Snake (the same additions, so the same values)."""
        first, second, *rest = self.block
        snake, conv = cast(Snake1d, first), cast(CausalConv1d, second)
        if pending is None:
            hidden = conv(x, states, snake_alpha=snake.alpha)
        else:
            hidden, x = conv.forward_added(pending, x, states, snake.alpha)
        return x, _run(rest, hidden, states)


def _residual_units(dim: int, depthwise: bool) -> list[nn.Module]:
    return [CausalResidualUnit(dim, dilation, dim if depthwise else 1) for dilation in _RESIDUAL_DILATIONS]


class CausalEncoderBlock(nn.Module):
    """Three residual units at C channels, Snake, then a strided conv C -> 2C that downsamples by ``stride``."""

    def __init__(self, in_dim: int, stride: int, depthwise: bool, pad_by_stride: bool) -> None:
        super().__init__()
        # V1 pads by 2·ceil(s/2), one sample more than V2 for odd strides; both give L/s frames.
        left_pad = stride if pad_by_stride else 2 * math.ceil(stride / 2)
        self.block = nn.Sequential(
            *_residual_units(in_dim, depthwise),
            Snake1d(in_dim),
            CausalConv1d(in_dim, 2 * in_dim, 2 * stride, left_pad=left_pad, stride=stride),
        )

    def forward(self, x: Tensor, states: StreamBuffers = None) -> Tensor:
        """x: (B, C, L) -> (B, 2C, L / stride)."""
        return _run(self.block, x, states)


class CausalEncoder(nn.Module):
    """Waveform -> latent mean ``mu``; ``fc_logvar`` is kept only because checkpoints carry it."""

    def __init__(self, config: AudioVAEConfig, variant: AudioVAEVariant) -> None:
        super().__init__()
        dim = config.encoder_dim
        layers: list[nn.Module] = [CausalConv1d(1, dim, 7, left_pad=6)]
        for stride in config.encoder_rates:
            layers.append(CausalEncoderBlock(dim, stride, config.depthwise, variant.encoder_pads_by_stride))
            dim *= 2
        self.block = nn.Sequential(*layers)
        self.fc_mu = CausalConv1d(dim, config.latent_dim, 3, left_pad=2)
        self.fc_logvar = CausalConv1d(dim, config.latent_dim, 3, left_pad=2)

    def forward(self, audio: Tensor) -> Tensor:
        """audio: (B, 1, N), N a multiple of the hop -> mu: (B, latent_dim, N / hop)."""
        return self.fc_mu(_run(self.block, audio, None))


class CausalDecoderBlock(nn.Module):
    """Snake, transposed conv C -> C/2 upsampling by ``stride``, three residual units at C/2."""

    def __init__(self, in_dim: int, out_dim: int, stride: int, depthwise: bool) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(in_dim),
            CausalConvTranspose1d(in_dim, out_dim, stride),
            *_residual_units(out_dim, depthwise),
        )

    def forward(self, x: Tensor, states: StreamBuffers = None) -> Tensor:
        """x: (B, C, L) -> (B, C/2, L·stride)."""
        return _run(self.block, x, states)


class SampleRateCondition(nn.Module):
    """V2's per-channel affine ``x·scale[bucket] + bias[bucket]`` selected by the output sample rate's bucket."""

    def __init__(self, channels: int, buckets: int) -> None:
        super().__init__()
        self.scale_embed = nn.Embedding(buckets, channels)
        self.bias_embed = nn.Embedding(buckets, channels)

    def forward(self, x: Tensor, bucket: Tensor) -> Tensor:
        """x: (B, C, L), bucket: (1,) int64 -> (B, C, L)."""
        return x * self.scale_embed(bucket).unsqueeze(-1) + self.bias_embed(bucket).unsqueeze(-1)


class CausalDecoder(nn.Module):
    """Latents -> waveform in [-1, 1]; with ``sr_bin_boundaries`` (V2) every block's input is conditioned.

    Every layer that needs past input frames gets a ``state_slot`` at construction;
    ``stream_state_shapes[slot]`` is that layer's (channels, frames) of stream state.
    """

    sr_bin_boundaries: Tensor  # a buffer, with sample-rate conditioning

    def __init__(self, config: AudioVAEConfig, conditioned: bool) -> None:
        super().__init__()
        latent, channels = config.latent_dim, config.decoder_dim
        if config.depthwise:
            layers: list[nn.Module] = [
                CausalConv1d(latent, latent, 7, left_pad=6, groups=latent),
                CausalConv1d(latent, channels, 1, left_pad=0),
            ]
        else:
            layers = [CausalConv1d(latent, channels, 7, left_pad=6)]
        block_inputs: dict[int, int] = {}  # index in self.model -> input channels of that decoder block
        for stride in config.decoder_rates:
            block_inputs[len(layers)] = channels
            layers.append(CausalDecoderBlock(channels, channels // 2, stride, config.depthwise))
            channels //= 2
        layers += [Snake1d(channels), CausalConv1d(channels, 1, 7, left_pad=6)]
        self.model = nn.Sequential(*layers)
        self.output_sample_rate = config.output_sample_rate
        self.sr_cond_model: nn.ModuleList | None = None
        if conditioned:
            boundaries = config.sr_bin_boundaries or ()
            self.register_buffer("sr_bin_boundaries", torch.tensor(boundaries, dtype=torch.int32))
            # Indexed like self.model (None elsewhere) so that checkpoint keys line up with the blocks; torch
            # holds None in a ModuleList, though its types say modules only.
            conditions = [
                SampleRateCondition(block_inputs[index], len(boundaries) + 1) if index in block_inputs else None
                for index in range(len(layers))
            ]
            self.sr_cond_model = nn.ModuleList(conditions)  # type: ignore[arg-type]  # None among the modules
        self.stream_state_shapes = _assign_state_slots(self.model)

    def _sample_rate_bucket(self) -> Tensor:
        # torch.bucketize(rate, boundaries) (right=False) counts the boundaries strictly below the
        # rate; counting on the device avoids materialising the rate as a tensor on every call.
        return (self.sr_bin_boundaries < self.output_sample_rate).sum().view(1)

    def forward(self, latents: Tensor, states: StreamBuffers = None) -> Tensor:
        """latents: (B, latent_dim, T) -> audio: (B, 1, T·decoder_hop); ``states`` streams (see ``_CausalContext``)."""
        if self.sr_cond_model is None:
            return torch.tanh(_run(self.model, latents, states))
        bucket = self._sample_rate_bucket()
        conditions = [None if cond is None else partial(cond, bucket=bucket) for cond in self.sr_cond_model]
        return torch.tanh(_run(self.model, latents, states, conditions))


def _assign_state_slots(model: nn.Module) -> list[tuple[int, int]]:
    """Number the context-carrying layers of ``model``; return each slot's (channels, frames)."""
    shapes: list[tuple[int, int]] = []
    for module in model.modules():
        if isinstance(module, _CausalContext) and module.context > 0:
            module.state_slot = len(shapes)
            shapes.append((module.in_channels, module.context))
    return shapes


class AudioVAE(nn.Module):
    """The VoxCPM AudioVAE: ``encode`` waveform -> latents, ``decode`` latents -> waveform (whole sequences)."""

    def __init__(self, config: AudioVAEConfig, variant: AudioVAEVariant) -> None:
        super().__init__()
        _check_supported(config, variant)
        self.encoder = CausalEncoder(config, variant)
        self.decoder = CausalDecoder(config, variant.sample_rate_conditioning)
        self.sample_rate = config.sample_rate
        self.output_sample_rate = config.output_sample_rate
        self.encoder_hop = config.encoder_hop
        self.decoder_hop = config.decoder_hop
        self.latent_dim = config.latent_dim

    def encode(self, audio: Tensor) -> Tensor:
        """audio: (B, N) at ``sample_rate`` -> latents: (B, latent_dim, ceil(N / encoder_hop)).

        The waveform is right-padded with zeros to a whole number of hops, as the reference does.
        """
        if audio.ndim != 2:
            raise ValueError(f"encode expects audio of shape (B, N), got {tuple(audio.shape)}")
        pad = -audio.shape[-1] % self.encoder_hop
        audio = F.pad(audio.to(self.dtype), (0, pad))
        return self.encoder(audio.unsqueeze(1))

    def decode(self, latents: Tensor) -> Tensor:
        """latents: (B, latent_dim, T) -> audio: (B, T·decoder_hop) at ``output_sample_rate``, in [-1, 1]."""
        return self.decoder(latents.to(self.dtype)).squeeze(1).float()

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the VAE computes in (its weights')."""
        return self._first_weight.dtype

    @property
    def device(self) -> torch.device:
        """The device the VAE's weights are on."""
        return self._first_weight.device

    @property
    def _first_weight(self) -> Tensor:
        return cast(CausalConv1d, self.decoder.model[0]).weight


def _check_supported(config: AudioVAEConfig, variant: AudioVAEVariant) -> None:
    """Reject configurations no published checkpoint uses rather than silently computing something else."""
    if config.use_noise_block:
        raise ValueError("audio_vae_config.use_noise_block=true (random noise in the decoder) is not supported")
    if variant.sample_rate_conditioning:
        if config.sr_bin_boundaries is None:
            raise ValueError("sample-rate conditioning needs audio_vae_config.sr_bin_boundaries")
        if config.cond_type not in _SUPPORTED_COND_TYPES:
            raise ValueError(
                f"audio_vae_config.cond_type={config.cond_type!r} is not supported; "
                f"expected one of {_SUPPORTED_COND_TYPES}"
            )
        if config.cond_out_layer:
            raise ValueError("audio_vae_config.cond_out_layer=true is not supported")


# ---------------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------------


class VAEStreamState:
    """Decoder state of a pool of streams: one row per stream, every buffer (rows, channels, frames), in the
    VAE's dtype.

    Every update is in place, so views (``rows``) and CUDA graphs that captured the buffers stay valid.
    """

    def __init__(self, buffers: list[Tensor]) -> None:
        self.buffers = buffers

    @property
    def batch_size(self) -> int:
        return self.buffers[0].shape[0]

    @property
    def nbytes_per_stream(self) -> int:
        """Bytes of state one stream occupies."""
        return sum(math.prod(b.shape[1:]) * b.element_size() for b in self.buffers)

    def rows(self, n: int) -> VAEStreamState:
        """A view of the first ``n`` rows; decoding with it updates the pool."""
        return VAEStreamState([b[:n] for b in self.buffers])

    def reset_rows(self, rows: Tensor) -> None:
        """Zero the given rows (int64 indices, shape (R,)): a new stream starts from silence."""
        for buffer in self.buffers:
            buffer.index_fill_(0, rows, 0.0)

    def write_rows(self, rows: Tensor, source: VAEStreamState) -> None:
        """Set the given rows (int64 indices, shape (R,)) to the R streams of ``source``, in order."""
        for buffer, values in zip(self.buffers, source.buffers, strict=True):
            buffer.index_copy_(0, rows, values)

    def move_rows(self, src: Tensor, dst: Tensor) -> None:
        """Copy rows ``src`` to rows ``dst`` (int64 indices, shape (R,) each); the sources are read first."""
        for buffer in self.buffers:
            buffer.index_copy_(0, dst, buffer.index_select(0, src))


class StreamingVAEDecoder:
    """Decodes latent chunks of many streams at once, exactly as one whole-sequence ``AudioVAE.decode``.

    Each call runs the decoder on just the new frames, with every causal layer's past taken from and
    written back to ``VAEStreamState``: no host synchronisation, no state allocation, static shapes
    for a given (B, F).
    """

    def __init__(self, vae: AudioVAE) -> None:
        self.vae = vae

    def new_state(self, batch_size: int) -> VAEStreamState:
        """Zero state for ``batch_size`` streams on the VAE's device."""
        device = self.vae.device
        return VAEStreamState(
            [
                torch.zeros(batch_size, channels, frames, device=device, dtype=self.vae.dtype)
                for channels, frames in self.vae.decoder.stream_state_shapes
            ]
        )

    @torch.no_grad()
    def warm(self, context: Tensor, lm_dtype: torch.dtype, state: VAEStreamState) -> None:
        """Run fresh states over prompts' context patches and discard their audio: ``context`` is (B, C, P, D),
        the last C patches of each of the B streams of ``state`` (or one stream's (C, P, D)).

        The reference decodes these patches in front of the generated ones and cuts their samples; a
        causal decoder gives the same audio by starting from their state instead. The patches are
        rounded to ``lm_dtype`` first, as the reference's LM input is.
        """
        if context.numel():
            latents = context.to(self.vae.device).to(lm_dtype).float()
            self.decode(latents.reshape(state.batch_size, -1, context.size(-1)).transpose(1, 2), state)

    @torch.no_grad()
    def decode(self, latents: Tensor, state: VAEStreamState) -> Tensor:
        """latents: (B, latent_dim, F), F >= 1 -> the F·decoder_hop new samples per stream: (B, F·decoder_hop)."""
        if latents.shape[0] != state.batch_size:
            raise ValueError(f"latents have {latents.shape[0]} rows but the state has {state.batch_size}")
        return self.vae.decoder(latents.to(self.vae.dtype), state.buffers).squeeze(1).float()


# ---------------------------------------------------------------------------------------------------
# Precision
# ---------------------------------------------------------------------------------------------------

# The half precision the VAE runs in on CUDA when it passes ``choose_vae_dtype``'s check: float16 moves the
# same bytes as bfloat16 (half of float32's, which makes the VAE about a third of a 768-row step) with three
# more mantissa bits: 43.6 dB signal-to-error against float32 on the VoxCPM2-shape VAE where bfloat16 gets
# 25.7 dB (scripts/vae_bf16_error.py). Its risk is range (65504), which the check catches.
HALF_VAE_DTYPE = torch.float16
# The least signal-to-error ratio (dB) against float32 the half-precision VAE must reach on the check's
# decode to be chosen: about 1.8 % RMS error, under float16's measured 43.6 dB and far above bfloat16's.
MIN_HALF_VAE_SNR_DB = 35.0
CHECK_DECODE_ROWS = 64
"""Streams the check decode runs at once: a serving batch (steps of 64-768 rows run other cuBLAS and cuDNN kernels
than one stream does, and the half-precision choice is for those), the smallest of the sizes it stands for."""


@dataclass(frozen=True)
class DecodeError:
    """A streaming decode in some dtype against the same decode in float32."""

    samples: int
    signal_rms: float
    max_abs_error: float
    rms_error: float
    snr_db: float  # -inf when the half decode is not finite


def streamed_audio(vae: AudioVAE, latents: Tensor, patch_size: int) -> Tensor:
    """latents (B, D, T) decoded ``patch_size`` frames at a time, as the engine streams -> (B, T·hop) float32."""
    decoder = StreamingVAEDecoder(vae)
    state = decoder.new_state(latents.size(0))
    return torch.cat([decoder.decode(chunk, state) for chunk in latents.split(patch_size, dim=-1)], dim=-1)


@contextmanager
def exact_float32() -> Iterator[None]:
    """Within the block, float32 CUDA matmuls and cuDNN convolutions run in float32, not TF32 (cuDNN allows TF32 by
    default); the caller's ``allow_tf32`` flags are restored after."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32 = cudnn.allow_tf32 = False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


@torch.no_grad()
def decode_error(vae: AudioVAE, dtype: torch.dtype, latents: Tensor, patch_size: int) -> DecodeError:
    """The streaming decode of ``latents`` (B, D, T) with a ``dtype`` copy of ``vae`` (float32) against
    ``vae`` itself, in exact float32 (no TF32: the reference's own error would count against the copy)."""
    with exact_float32():
        exact = streamed_audio(vae, latents, patch_size)
    approx = streamed_audio(copy.deepcopy(vae).to(dtype), latents, patch_size)
    error = approx - exact
    finite = bool(torch.isfinite(approx).all())
    signal, noise = exact.pow(2).mean().item(), error.pow(2).mean().item()
    snr = 10 * math.log10(signal / max(noise, 1e-30)) if finite else -math.inf
    return DecodeError(exact.numel(), math.sqrt(signal), error.abs().max().item(), math.sqrt(noise), snr)


def choose_vae_dtype(vae: AudioVAE, patch_size: int, device: torch.device) -> torch.dtype:
    """The dtype the (float32) VAE should run in on ``device`` when none was asked for: float32 off CUDA, as
    the reference (the CPU gains nothing from half precision); on CUDA, what ``half_precision_check`` of
    this checkpoint's VAE allows (``dtype_after_check``)."""
    if device.type != "cuda":
        return torch.float32
    return dtype_after_check(half_precision_check(vae, patch_size))


def half_precision_check(vae: AudioVAE, patch_size: int, patches: int = 3) -> DecodeError:
    """``HALF_VAE_DTYPE`` against float32 on the VAE's device: N(0, 1) latents of ``CHECK_DECODE_ROWS`` streams,
    ``patches`` patches each, streamed as the engine streams them."""
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(CHECK_DECODE_ROWS, vae.latent_dim, patches * patch_size, generator=generator)
    return decode_error(vae, HALF_VAE_DTYPE, latents.to(vae.device), patch_size)


def dtype_after_check(measured: DecodeError) -> torch.dtype:
    """``HALF_VAE_DTYPE`` when the check decode reached ``MIN_HALF_VAE_SNR_DB`` (finite), else float32 with a
    warning; logged either way."""
    if measured.snr_db >= MIN_HALF_VAE_SNR_DB:
        logger.info(
            "AudioVAE in %s: %.1f dB signal-to-error against float32 (max sample error %.1e) on a check decode",
            HALF_VAE_DTYPE,
            measured.snr_db,
            measured.max_abs_error,
        )
        return HALF_VAE_DTYPE
    logger.warning(
        "AudioVAE in float32: in %s this checkpoint's check decode is %.1f dB from float32 (< %.0f dB, or not finite)",
        HALF_VAE_DTYPE,
        measured.snr_db,
        MIN_HALF_VAE_SNR_DB,
    )
    return torch.float32


# ---------------------------------------------------------------------------------------------------
# Checkpoint layout
# ---------------------------------------------------------------------------------------------------


def _norm_except_dim0(v: Tensor) -> Tensor:
    """v: (D0, ...) -> (D0, 1, ..., 1): the L2 norm of each slice along dim 0 (legacy weight_norm, dim=0)."""
    return torch.linalg.vector_norm(v, dim=tuple(range(1, v.ndim)), keepdim=True)


def fold_weight_norm(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Published layout -> ours: each ``X.weight_g`` + ``X.weight_v`` pair becomes ``X.weight = g·v/‖v‖``.

    The norm runs over all dims but 0, also for transposed convs (whose dim 0 is in_channels), as
    the legacy ``torch.nn.utils.weight_norm`` did. Other keys pass through unchanged.
    """
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        if key.endswith(".weight_v"):
            if key[: -len("_v")] + "_g" not in state_dict:
                raise ValueError(f"{key} has no matching weight_g")
            continue
        if not key.endswith(".weight_g"):
            out[key] = value
            continue
        base = key[: -len(".weight_g")]
        v = state_dict.get(base + ".weight_v")
        if v is None:
            raise ValueError(f"{key} has no matching weight_v")
        if base + ".weight" in state_dict:
            raise ValueError(f"{base} has both a plain weight and weight_g/weight_v")
        # torch._weight_norm is the kernel the legacy weight_norm hook ran at every forward, so the folded
        # weight is bit-identical to the one the reference computes on the same device.
        out[base + ".weight"] = torch._weight_norm(v.to(torch.float32), value.to(torch.float32), 0).to(v.dtype)
    return out


def to_published_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Ours -> published layout: every 3-D ``X.weight`` (the convolutions) becomes ``X.weight_g`` + ``X.weight_v``.

    ``v`` is the weight itself and ``g`` its norm over all dims but 0, so ``fold_weight_norm``
    gives the weight back. Embedding weights (2-D), Snake alphas, biases and buffers pass through.
    """
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        if key.endswith(".weight") and value.ndim == 3:
            out[key + "_g"] = _norm_except_dim0(value)
            out[key + "_v"] = value
        else:
            out[key] = value
    return out


def random_published_state_dict(config: AudioVAEConfig, variant: AudioVAEVariant, seed: int) -> dict[str, Tensor]:
    """Deterministic random VAE weights in the published (weight_g/weight_v) layout, fp32.

    Scales are chosen so that signals neither vanish nor blow up through the stack and the decoder's
    tanh output is neither saturated nor near zero; Snake alphas, weight norms and the V2 per-bucket
    affines all vary per channel so that tests exercise them. Every value is bfloat16-representable
    so fixtures can store it losslessly in half the bytes.
    """
    with torch.device("meta"):
        shapes = AudioVAE(config, variant)
    gains = {
        id(unit.block[3]): _RESIDUAL_BRANCH_GAIN for unit in shapes.modules() if isinstance(unit, CausalResidualUnit)
    }
    gains[id(shapes.decoder.model[-1])] = _OUTPUT_GAIN
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, Tensor] = {}
    for name, module in shapes.named_modules():
        for key, value in _random_parameters(module, gains.get(id(module)), generator).items():
            out[f"{name}.{key}"] = value.to(torch.bfloat16).to(torch.float32)
    if shapes.decoder.sr_cond_model is not None:
        out["decoder.sr_bin_boundaries"] = torch.tensor(config.sr_bin_boundaries, dtype=torch.int32)
    return out


# Row norms of the last conv of each residual branch and of the output conv: they keep the residual
# sum from growing ~2x per unit and put the pre-tanh output at a moderate level.
_RESIDUAL_BRANCH_GAIN = 0.3
_OUTPUT_GAIN = 0.05


def _random_parameters(module: nn.Module, gain: float | None, generator: torch.Generator) -> dict[str, Tensor]:
    """Random values for ``module``'s own parameters in the published layout; ``gain`` overrides the row norm."""

    def uniform(shape: tuple[int, ...], low: float, high: float) -> Tensor:
        return low + (high - low) * torch.rand(shape, generator=generator)

    if isinstance(module, Snake1d):
        return {"alpha": uniform(tuple(module.alpha.shape), 0.5, 1.5)}
    if isinstance(module, SampleRateCondition):
        shape = tuple(module.scale_embed.weight.shape)
        return {
            "scale_embed.weight": 1.0 + 0.2 * torch.randn(shape, generator=generator),
            "bias_embed.weight": 0.1 * torch.randn(shape, generator=generator),
        }
    if isinstance(module, (CausalConv1d, CausalConvTranspose1d)):
        shape = tuple(module.weight.shape)
        row_norm = _variance_preserving_row_norm(module) if gain is None else gain
        return {
            "bias": 0.05 * torch.randn(module.out_channels, generator=generator),
            "weight_g": row_norm * uniform((shape[0], 1, 1), 0.75, 1.25),
            # An arbitrary overall scale for v: only its direction may matter.
            "weight_v": uniform((1,), 0.5, 2.0) * torch.randn(shape, generator=generator),
        }
    return {}


def _variance_preserving_row_norm(conv: CausalConv1d | CausalConvTranspose1d) -> float:
    """Norm of a weight row (a slice along dim 0) that keeps unit-variance inputs at unit variance."""
    if isinstance(conv, CausalConvTranspose1d):
        # Rows are per input channel, of length C_out·2s; each output sample sums 2·C_in terms.
        return math.sqrt(conv.stride[0] * conv.out_channels / conv.in_channels)
    return 1.0
