"""Tiny model configurations in the published ``config.json`` format, for tests, demos and benchmarks.

Each one keeps every structural feature of the release it imitates (patch size, VAE rates and sample
rates, GQA with two KV heads, LongRoPE, v2's q-dim != hidden-dim local transformers and RoPE-free
residual LM) and shrinks only the widths and depths, so a whole model runs in milliseconds on a CPU.
"""

from __future__ import annotations

from typing import Any

# The tiny tokenizer (voxwire.tiny.tokenizer_files) has this many entries; ids 101-104 are specials.
TINY_VOCAB_SIZE = 566


def _rope(head_dim: int, max_positions: int) -> dict[str, Any]:
    # Distinct, growing factors so LongRoPE's per-frequency scaling is really exercised.
    factors = [round(1.0 + 0.37 * j + 0.01 * j * j, 6) for j in range(head_dim // 2)]
    return {
        "type": "longrope",
        "long_factor": factors,
        "short_factor": factors,
        "original_max_position_embeddings": max_positions,
    }


def _lm(hidden: int, ffn: int, heads: int, layers: int, kv_channels: int | None, max_positions: int = 4096) -> dict:
    head_dim = kv_channels or hidden // heads
    config = {
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "max_position_embeddings": max_positions,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000,
        "rope_scaling": _rope(head_dim, max_positions),
        "vocab_size": TINY_VOCAB_SIZE,
        "use_mup": False,
        "scale_emb": 12,
        "dim_model_base": 256,
        "scale_depth": 1.4,
    }
    if kv_channels is not None:
        config["kv_channels"] = kv_channels
    return config


def _local(hidden: int, ffn: int, heads: int, layers: int, kv_channels: int | None) -> dict[str, Any]:
    section: dict[str, Any] = {"hidden_dim": hidden, "ffn_dim": ffn, "num_heads": heads, "num_layers": layers}
    if kv_channels is not None:
        section["kv_channels"] = kv_channels
    return section


_CFM = {"sigma_min": 1e-06, "solver": "euler", "t_scheduler": "log-norm", "inference_cfg_rate": 2.0}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    # Like VoxCPM-0.5B: patch 2, 16 kHz V1 VAE with the release's rates, weights in pytorch_model.bin.
    "voxcpm-16k": {
        "architecture": "voxcpm",
        "lm_config": _lm(64, 128, 4, 2, None),
        "patch_size": 2,
        "feat_dim": 64,
        "residual_lm_num_layers": 1,
        "scalar_quantization_latent_dim": 16,
        "scalar_quantization_scale": 9,
        "encoder_config": _local(32, 64, 2, 1, None),
        "dit_config": {**_local(32, 64, 2, 2, None), "cfm_config": dict(_CFM, inference_cfg_rate=1.0)},
        "audio_vae_config": {
            "encoder_dim": 4,
            "encoder_rates": [2, 5, 8, 8],
            "latent_dim": 64,
            "decoder_dim": 32,
            "decoder_rates": [8, 8, 5, 2],
            "depthwise": True,
            "sample_rate": 16000,
        },
        "max_length": 512,
        "dtype": "bfloat16",
    },
    # Like VoxCPM1.5: patch 4, 44.1 kHz V1 VAE with rates [2,3,6,7,7] / [7,7,6,3,2].
    "voxcpm-44k": {
        "architecture": "voxcpm",
        "lm_config": _lm(64, 96, 4, 2, None),
        "patch_size": 4,
        "feat_dim": 64,
        "residual_lm_num_layers": 2,
        "scalar_quantization_latent_dim": 12,
        "scalar_quantization_scale": 9,
        "encoder_config": _local(32, 48, 2, 2, None),
        "dit_config": {**_local(32, 48, 2, 1, None), "cfm_config": dict(_CFM, inference_cfg_rate=1.0)},
        "audio_vae_config": {
            "encoder_dim": 4,
            "encoder_rates": [2, 3, 6, 7, 7],
            "latent_dim": 64,
            "decoder_dim": 64,
            "decoder_rates": [7, 7, 6, 3, 2],
            "sample_rate": 44100,
        },
        "max_length": 512,
        "dtype": "bfloat16",
    },
    # Like VoxCPM2: patch 4, kv_channels wider than hidden/heads in the local transformers, RoPE-free
    # residual LM, 16 kHz in / 48 kHz out V2 VAE with sample-rate conditioning.
    "voxcpm2": {
        "architecture": "voxcpm2",
        "lm_config": _lm(64, 96, 4, 2, 16),
        "patch_size": 4,
        "feat_dim": 64,
        "scalar_quantization_latent_dim": 24,
        "scalar_quantization_scale": 9,
        "residual_lm_num_layers": 2,
        "residual_lm_no_rope": True,
        "encoder_config": _local(32, 64, 4, 1, 16),
        "dit_config": {**_local(32, 64, 4, 2, 16), "mean_mode": False, "cfm_config": _CFM},
        "audio_vae_config": {
            "encoder_dim": 4,
            "encoder_rates": [2, 5, 8, 8],
            "latent_dim": 64,
            "decoder_dim": 64,
            "decoder_rates": [8, 6, 5, 2, 2, 2],
            "sr_bin_boundaries": [20000, 30000, 40000],
            "sample_rate": 16000,
            "out_sample_rate": 48000,
        },
        "max_length": 512,
        "device": "cuda",
        "dtype": "bfloat16",
    },
    # A second V2 shape: more heads, a deeper base LM, patch 2, wider VAE.
    "voxcpm2-b": {
        "architecture": "voxcpm2",
        "lm_config": _lm(96, 128, 6, 3, 16),
        "patch_size": 2,
        "feat_dim": 64,
        "scalar_quantization_latent_dim": 20,
        "scalar_quantization_scale": 9,
        "residual_lm_num_layers": 1,
        "residual_lm_no_rope": True,
        "encoder_config": _local(48, 64, 2, 2, 16),
        "dit_config": {**_local(48, 64, 6, 1, 16), "mean_mode": False, "cfm_config": _CFM},
        "audio_vae_config": {
            "encoder_dim": 8,
            "encoder_rates": [2, 5, 8, 8],
            "latent_dim": 64,
            "decoder_dim": 128,
            "decoder_rates": [8, 6, 5, 2, 2, 2],
            "sr_bin_boundaries": [20000, 30000, 40000],
            "sample_rate": 16000,
            "out_sample_rate": 48000,
        },
        "max_length": 512,
        "dtype": "bfloat16",
    },
}


def _release_lm(hidden: int, ffn: int, layers: int, kv_channels: int | None) -> dict[str, Any]:
    config = _lm(hidden, ffn, 16, layers, kv_channels, max_positions=32768)
    return {**config, "vocab_size": 73448}


# Full-size shapes of the three releases (random weights: for benchmarks and GPU checks, where values
# do not change the cost). Shapes from the published config.json files (spec, section 2.2).
RELEASE_SHAPES: dict[str, dict[str, Any]] = {
    "voxcpm-0.5b-shape": {
        "architecture": "voxcpm",
        "lm_config": _release_lm(1024, 4096, 24, None),
        "patch_size": 2,
        "feat_dim": 64,
        "residual_lm_num_layers": 6,
        "scalar_quantization_latent_dim": 256,
        "scalar_quantization_scale": 9,
        "encoder_config": _local(1024, 4096, 16, 4, None),
        "dit_config": {**_local(1024, 4096, 16, 4, None), "cfm_config": dict(_CFM, inference_cfg_rate=1.0)},
        "max_length": 4096,
        "dtype": "bfloat16",
    },
    "voxcpm-1.5-shape": {
        "architecture": "voxcpm",
        "lm_config": _release_lm(1024, 4096, 24, None),
        "patch_size": 4,
        "feat_dim": 64,
        "residual_lm_num_layers": 8,
        "scalar_quantization_latent_dim": 256,
        "scalar_quantization_scale": 9,
        "encoder_config": _local(1024, 4096, 16, 8, None),
        "dit_config": {**_local(1024, 4096, 16, 8, None), "cfm_config": dict(_CFM, inference_cfg_rate=1.0)},
        "audio_vae_config": {
            "encoder_dim": 64,
            "encoder_rates": [2, 3, 6, 7, 7],
            "latent_dim": 64,
            "decoder_dim": 2048,
            "decoder_rates": [7, 7, 6, 3, 2],
            "sample_rate": 44100,
        },
        "max_length": 4096,
        "dtype": "bfloat16",
    },
    "voxcpm2-shape": {
        "architecture": "voxcpm2",
        "lm_config": _release_lm(2048, 6144, 28, 128),
        "patch_size": 4,
        "feat_dim": 64,
        "scalar_quantization_latent_dim": 512,
        "scalar_quantization_scale": 9,
        "residual_lm_num_layers": 8,
        "residual_lm_no_rope": True,
        "encoder_config": _local(1024, 4096, 16, 12, 128),
        "dit_config": {**_local(1024, 4096, 16, 12, 128), "mean_mode": False, "cfm_config": _CFM},
        "audio_vae_config": {
            "encoder_dim": 128,
            "encoder_rates": [2, 5, 8, 8],
            "latent_dim": 64,
            "decoder_dim": 2048,
            "decoder_rates": [8, 6, 5, 2, 2, 2],
            "sr_bin_boundaries": [20000, 30000, 40000],
            "sample_rate": 16000,
            "out_sample_rate": 48000,
        },
        "max_length": 8192,
        "dtype": "bfloat16",
    },
}

ALL_CONFIGS: dict[str, dict[str, Any]] = {**TINY_CONFIGS, **RELEASE_SHAPES}
