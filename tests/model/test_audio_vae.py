"""AudioVAE: parity with the reference on golden fixtures, checkpoint layout, and exact streaming decode."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.bounds import assert_within, weight_norm_fold_bound

from voxwire.model.audio_vae import (
    AudioVAE,
    StreamingVAEDecoder,
    VAEStreamState,
    fold_weight_norm,
    random_published_state_dict,
    to_published_state_dict,
)
from voxwire.model_config import AudioVAEConfig, AudioVAEVariant, ModelConfig
from voxwire.tiny.configs import TINY_CONFIGS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "vae"
FIXTURE_NAMES = ("voxcpm-16k", "voxcpm-44k", "voxcpm2")
TOLERANCE = 1e-5  # max |ours - expected| relative to max |expected|, fp32

V1 = AudioVAEVariant()
V2 = AudioVAEVariant(encoder_pads_by_stride=True, sample_rate_conditioning=True)
REAL_CONFIGS = {
    "VoxCPM-0.5B": (AudioVAEConfig(), V1),
    "VoxCPM1.5": (
        AudioVAEConfig(
            encoder_dim=64,
            encoder_rates=(2, 3, 6, 7, 7),
            decoder_dim=2048,
            decoder_rates=(7, 7, 6, 3, 2),
            sample_rate=44100,
        ),
        V1,
    ),
    "VoxCPM2": (
        AudioVAEConfig(
            decoder_dim=2048,
            decoder_rates=(8, 6, 5, 2, 2, 2),
            out_sample_rate=48000,
            sr_bin_boundaries=(20000, 30000, 40000),
            cond_type="scale_bias",
            cond_dim=128,
            cond_out_layer=False,
        ),
        V2,
    ),
}


def tiny(name: str) -> tuple[AudioVAEConfig, AudioVAEVariant]:
    config = ModelConfig.from_dict(TINY_CONFIGS[name])
    return config.audio_vae_config, config.vae_variant


def random_vae(name: str, seed: int = 5) -> AudioVAE:
    config, variant = tiny(name)
    vae = AudioVAE(config, variant)
    vae.load_state_dict(fold_weight_norm(random_published_state_dict(config, variant, seed)), strict=True)
    return vae.eval()


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert actual.shape == expected.shape
    return ((actual - expected).abs().max() / expected.abs().max()).item()


# ---- parity with the reference ------------------------------------------------------------------


def load_fixture(name: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(inputs and reference outputs, published-layout weights in fp32)."""
    tensors = load_file(str(FIXTURES / f"{name}.safetensors"))
    prefix = "weights."
    weights = {
        key[len(prefix) :]: value.to(torch.float32) if value.is_floating_point() else value
        for key, value in tensors.items()
        if key.startswith(prefix)
    }
    return tensors, weights


@pytest.mark.isa
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_encode_and_decode_match_the_reference(name: str) -> None:
    fixture, weights = load_fixture(name)
    config, architecture = tiny(name)
    vae = AudioVAE(config, architecture)
    vae.load_state_dict(fold_weight_norm(weights), strict=True)
    with torch.no_grad():
        encoded = vae.encode(fixture["audio"])
        decoded = vae.decode(fixture["latents"])
    assert fixture["audio"].shape[-1] % config.encoder_hop != 0  # the clip exercises the right padding
    assert relative_error(encoded, fixture["encoded"]) < TOLERANCE
    assert relative_error(decoded, fixture["decoded"]) < TOLERANCE
    assert 0.02 < fixture["decoded"].std().item() < 0.6  # the comparison is on a real signal


@pytest.mark.isa
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_published_layout_is_the_one_the_reference_loaded(name: str) -> None:
    _, weights = load_fixture(name)
    ours = to_published_state_dict(AudioVAE(*tiny(name)).state_dict())
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in weights.items()}


@cache
def shape_only_vae(name: str) -> AudioVAE:
    """A tiny or released VAE on the meta device: shapes without weights."""
    with torch.device("meta"):
        return AudioVAE(*(REAL_CONFIGS[name] if name in REAL_CONFIGS else tiny(name)))


@pytest.mark.slow
def test_published_layout_has_the_real_checkpoints_entry_counts() -> None:
    # Counts of audiovae.pth state entries (model spec 2.4): 0.5B 243, 1.5 299, V2 312.
    counts = {name: len(to_published_state_dict(shape_only_vae(name).state_dict())) for name in REAL_CONFIGS}
    assert counts == {"VoxCPM-0.5B": 243, "VoxCPM1.5": 299, "VoxCPM2": 312}


# ---- weight norm folding ------------------------------------------------------------------------


def test_fold_normalises_over_all_dims_but_0_also_for_transposed_convs() -> None:
    g = torch.tensor([0.5, 2.0, 3.0]).view(3, 1, 1)
    v = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(0))
    key = "decoder.model.2.block.1"  # a ConvTranspose1d: dim 0 is in_channels
    folded = fold_weight_norm({f"{key}.weight_g": g, f"{key}.weight_v": v, f"{key}.bias": torch.ones(2)})
    assert set(folded) == {f"{key}.weight", f"{key}.bias"}
    weight = folded[f"{key}.weight"]
    torch.testing.assert_close(weight.flatten(1).norm(dim=1), g.flatten())
    torch.testing.assert_close(weight / g, v / v.flatten(1).norm(dim=1).view(3, 1, 1))


@pytest.mark.isa
def test_fold_inverts_to_published() -> None:
    ours = random_vae("voxcpm2").state_dict()
    published = to_published_state_dict(ours)
    assert "decoder.model.2.block.1.weight_g" in published and "decoder.model.2.block.1.weight" not in published
    assert published["decoder.model.2.block.1.weight_g"].shape == (64, 1, 1)  # in_channels of the transposed conv
    assert "decoder.sr_cond_model.2.scale_embed.weight" in published  # embeddings are not weight-normed
    folded = fold_weight_norm(published)
    assert list(folded) == list(ours)
    for key, value in ours.items():
        if key + "_g" not in published:
            assert torch.equal(folded[key], value), key  # passed through
            continue
        # g and ||v|| are the same norm from two kernels (summation orders): equal to rounding error, per row.
        bound = weight_norm_fold_bound(value[0].numel()) * value.double().abs()
        assert_within(folded[key], value.double(), bound)
    assert folded["decoder.sr_bin_boundaries"].dtype == torch.int32


@pytest.mark.parametrize("suffix", ["weight_g", "weight_v"])
def test_fold_rejects_half_a_pair(suffix: str) -> None:
    key = f"encoder.fc_mu.{suffix}"
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        fold_weight_norm({key: torch.ones(4, 1, 1), "encoder.fc_mu.bias": torch.zeros(4)})


# ---- random weights -----------------------------------------------------------------------------


@pytest.mark.isa
@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_random_weights_are_deterministic_non_trivial_and_audible(name: str) -> None:
    config, variant = tiny(name)
    first = random_published_state_dict(config, variant, 3)
    assert all(
        torch.equal(value, second)
        for value, second in zip(first.values(), random_published_state_dict(config, variant, 3).values(), strict=True)
    )
    assert not torch.equal(
        first["encoder.fc_mu.weight_v"], random_published_state_dict(config, variant, 4)["encoder.fc_mu.weight_v"]
    )
    alphas = torch.cat([v.flatten() for k, v in first.items() if k.endswith(".alpha")])
    assert alphas.min() > 0.4 and alphas.max() < 1.6 and alphas.std() > 0.2
    norms = torch.cat([v.flatten() for k, v in first.items() if k.endswith(".weight_g")])
    assert norms.std() > 0.1
    latents = torch.randn(2, config.latent_dim, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        audio = random_vae(name, seed=3).decode(latents)
    assert 0.03 < audio.std().item() < 0.5
    assert (audio.abs() > 0.99).float().mean().item() < 1e-3


def test_unsupported_configurations_are_rejected() -> None:
    config, _ = tiny("voxcpm2")
    with pytest.raises(ValueError, match="use_noise_block"):
        AudioVAE(AudioVAEConfig(use_noise_block=True), V1)
    with pytest.raises(ValueError, match="cond_type"):
        AudioVAE(AudioVAEConfig(**{**config.__dict__, "cond_type": "concat"}), V2)
    with pytest.raises(ValueError, match="sr_bin_boundaries"):
        AudioVAE(AudioVAEConfig(), V2)


@pytest.mark.parametrize(
    ("name", "variant"), [("voxcpm-16k", V1), ("voxcpm-44k", V1), ("voxcpm2", V2), ("voxcpm2-b", V2)]
)
def test_each_architecture_gets_its_vae_variant(name: str, variant: AudioVAEVariant) -> None:
    assert ModelConfig.from_dict(TINY_CONFIGS[name]).vae_variant == variant


def test_encode_rejects_a_channel_axis() -> None:
    with pytest.raises(ValueError, match=r"\(B, N\)"):
        random_vae("voxcpm-16k").encode(torch.zeros(1, 1, 640))


# ---- streaming ----------------------------------------------------------------------------------

STREAM_NAMES = ("voxcpm-16k", "voxcpm-44k", "voxcpm2")


def run_schedule(
    streamer: StreamingVAEDecoder,
    state: VAEStreamState,
    chunk_sizes: list[int],
    streams: list[tuple[int, int, int]],
    seed: int,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Decode ``len(chunk_sizes)`` steps on the whole pool; stream (row, first step, end step) owns its row then.

    Rows without a stream get random latents too, so any leak between rows would show. Returns each
    stream's (latents (latent_dim, T), streamed audio (T·hop,)).
    """
    generator = torch.Generator().manual_seed(seed)
    latent_dim = streamer.vae.latent_dim
    latents_of: list[list[torch.Tensor]] = [[] for _ in streams]
    audio_of: list[list[torch.Tensor]] = [[] for _ in streams]
    for step, frames in enumerate(chunk_sizes):
        starting = [row for row, first, _ in streams if first == step]
        if starting:
            state.reset_rows(torch.tensor(starting))
        latents = torch.randn(state.batch_size, latent_dim, frames, generator=generator)
        audio = streamer.decode(latents, state)
        assert audio.shape == (state.batch_size, frames * streamer.vae.decoder_hop)
        for index, (row, first, end) in enumerate(streams):
            if first <= step < end:
                latents_of[index].append(latents[row])
                audio_of[index].append(audio[row])
    return [(torch.cat(z, dim=-1), torch.cat(a)) for z, a in zip(latents_of, audio_of, strict=True)]


def assert_streams_match_full_decode(vae: AudioVAE, results: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for latents, streamed in results:
        with torch.no_grad():
            full = vae.decode(latents.unsqueeze(0))[0]
        assert relative_error(streamed, full) < TOLERANCE


@pytest.mark.parametrize("name", STREAM_NAMES)
def test_streaming_equals_full_decode_for_staggered_streams_and_uneven_chunks(name: str) -> None:
    vae = random_vae(name)
    streamer = StreamingVAEDecoder(vae)
    state = streamer.new_state(3)
    pointers = [b.data_ptr() for b in state.buffers]
    # Chunks shorter and longer than the first conv's 6-frame context; row 1 hosts two streams; row 2's
    # stream starts on a row that decoded junk before; stream lengths 14, 6, 11 and 4 frames.
    chunk_sizes = [2, 1, 3, 1, 8, 2, 1]
    streams = [(0, 0, 7), (1, 1, 4), (2, 4, 7), (1, 5, 7)]
    assert_streams_match_full_decode(vae, run_schedule(streamer, state, chunk_sizes, streams, seed=11))
    assert [b.data_ptr() for b in state.buffers] == pointers  # updated in place, never reallocated


@pytest.mark.slow
@pytest.mark.isa
def test_streaming_decode_traces_as_one_graph_without_host_syncs() -> None:
    # fullgraph=True fails on any graph break: a .item(), a branch on a tensor value, a data-dependent
    # shape. One graph with in-place state updates is what CUDA-graph capture needs.
    streamer = StreamingVAEDecoder(random_vae("voxcpm2"))
    compiled_state, eager_state = streamer.new_state(2), streamer.new_state(2)
    compiled = torch.compile(streamer.decode, fullgraph=True, backend="eager")
    for step in range(2):
        latents = torch.randn(2, streamer.vae.latent_dim, 4, generator=torch.Generator().manual_seed(step))
        assert torch.equal(compiled(latents, compiled_state), streamer.decode(latents, eager_state))
    assert all(torch.equal(a, b) for a, b in zip(compiled_state.buffers, eager_state.buffers, strict=True))


def test_rows_view_and_compaction_keep_streams_exact() -> None:
    vae = random_vae("voxcpm2")
    streamer = StreamingVAEDecoder(vae)
    pool = streamer.new_state(4)
    generator = torch.Generator().manual_seed(2)
    chunks = [torch.randn(4, vae.latent_dim, 4, generator=generator) for _ in range(4)]
    # Steps 0-1: the stream lives in row 3 of the full pool. Then the engine compacts rows 2,3 -> 0,1
    # and runs a 2-row batch on the view, then the full pool again.
    streamed = [streamer.decode(chunks[0], pool)[3], streamer.decode(chunks[1], pool)[3]]
    pool.move_rows(torch.tensor([2, 3]), torch.tensor([0, 1]))
    streamed.append(streamer.decode(chunks[2][:2], pool.rows(2))[1])
    streamed.append(streamer.decode(chunks[3], pool)[1])
    latents = torch.cat([chunks[0][3], chunks[1][3], chunks[2][1], chunks[3][1]], dim=-1)
    assert_streams_match_full_decode(vae, [(latents, torch.cat(streamed))])


@pytest.mark.isa
def test_reset_and_move_touch_only_the_given_rows() -> None:
    vae = random_vae("voxcpm-16k")
    streamer = StreamingVAEDecoder(vae)
    state = streamer.new_state(4)
    streamer.decode(torch.randn(4, vae.latent_dim, 3, generator=torch.Generator().manual_seed(0)), state)
    before = [b.clone() for b in state.buffers]
    assert all(b.flatten(1).abs().sum(dim=1).min() > 0 for b in before)  # every row holds some state
    state.reset_rows(torch.tensor([1, 3]))
    for old, new in zip(before, state.buffers, strict=True):
        assert torch.equal(new[[0, 2]], old[[0, 2]]) and not new[[1, 3]].any()
    state.move_rows(torch.tensor([0, 2]), torch.tensor([2, 3]))  # overlapping: row 2 is read before it is written
    for old, new in zip(before, state.buffers, strict=True):
        assert torch.equal(new[2], old[0]) and torch.equal(new[3], old[2]) and torch.equal(new[0], old[0])


def test_state_view_shares_storage_with_the_pool() -> None:
    state = StreamingVAEDecoder(random_vae("voxcpm-16k")).new_state(3)
    view = state.rows(2)
    assert view.batch_size == 2
    view.buffers[0].fill_(1.0)
    assert state.buffers[0][:2].eq(1).all() and not state.buffers[0][2].any()


def test_decode_rejects_a_batch_that_does_not_fit_the_state() -> None:
    streamer = StreamingVAEDecoder(random_vae("voxcpm-16k"))
    with pytest.raises(ValueError, match="rows"):
        streamer.decode(torch.zeros(2, 64, 1), streamer.new_state(3))


def expected_state_floats(config: AudioVAEConfig) -> int:
    """Floats of decoder context per stream, counted from the architecture (model spec 3.7)."""
    channels = config.decoder_dim
    floats = 6 * config.latent_dim  # first k7 conv on the latents
    for _ in config.decoder_rates:
        floats += channels  # the transposed conv keeps one past frame of its input
        channels //= 2
        floats += (6 + 18 + 54) * channels  # the k7 convs of three residual units, dilations 1, 3, 9
    return floats + 6 * channels  # output conv


@pytest.mark.parametrize("name", [*TINY_CONFIGS, *REAL_CONFIGS])
def test_state_bytes_per_stream(name: str) -> None:
    state = StreamingVAEDecoder(shape_only_vae(name)).new_state(2)
    config = REAL_CONFIGS[name][0] if name in REAL_CONFIGS else tiny(name)[0]
    assert state.nbytes_per_stream == 4 * expected_state_floats(config)
    assert all(b.dtype == torch.float32 and b.shape[0] == 2 for b in state.buffers)


def test_state_bytes_of_the_released_vaes() -> None:
    measured = {name: StreamingVAEDecoder(shape_only_vae(name)).new_state(1).nbytes_per_stream for name in REAL_CONFIGS}
    assert measured == {"VoxCPM-0.5B": 464_640, "VoxCPM1.5": 637_952, "VoxCPM2": 647_424}
