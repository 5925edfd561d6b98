"""Dataclasses that mirror a VoxCPM checkpoint's ``config.json``, section by section.

Field names and defaults are the reference implementation's (PyPI ``voxcpm`` 2.0.3, its pydantic
models ``VoxCPMConfig``, ``MiniCPM4Config``, ``AudioVAEConfig`` v1/v2). Unlike the reference, which
silently ignores every unknown key, parsing here is strict: a key the reference does not know is
rejected unless it is in the documented ignore list of its section (keys published configs carry but
no inference code reads, such as ``dit_config.mean_mode``). That turns a typo in a fine-tune's config
into a clear error instead of a silently different model.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Architecture = Literal["voxcpm", "voxcpm2"]
ARCHITECTURES: tuple[Architecture, ...] = ("voxcpm", "voxcpm2")

# Keys that appear in published or HF-exported configs but that no inference code reads.
_IGNORED_KEYS: dict[str, frozenset[str]] = {
    "": frozenset({"device", "torch_dtype", "transformers_version", "model_type", "architectures", "_name_or_path"}),
    "lm_config": frozenset({"model_type", "architectures", "torch_dtype", "transformers_version", "auto_map"}),
    "dit_config": frozenset({"mean_mode"}),
}


class ConfigError(ValueError):
    """A ``config.json`` that cannot describe a VoxCPM model; the message names the key and the fix."""


@dataclass(frozen=True)
class RopeScalingConfig:
    """LongRoPE settings (``lm_config.rope_scaling``); factor lists have head_dim/2 entries."""

    type: str
    long_factor: tuple[float, ...]
    short_factor: tuple[float, ...]
    original_max_position_embeddings: int


@dataclass(frozen=True)
class MiniCPM4Config:
    """One MiniCPM4 transformer stack (``lm_config``; also the template of every sub-transformer)."""

    bos_token_id: int
    eos_token_id: int
    hidden_size: int
    intermediate_size: int
    max_position_embeddings: int
    num_attention_heads: int
    num_hidden_layers: int
    num_key_value_heads: int
    rms_norm_eps: float
    rope_scaling: RopeScalingConfig
    vocab_size: int
    scale_emb: float
    dim_model_base: int
    scale_depth: float
    rope_theta: float
    use_mup: bool = True
    kv_channels: int | None = None
    no_rope: bool = False

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels else self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class EncoderConfig:
    """LocEnc size (``encoder_config``)."""

    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None


@dataclass(frozen=True)
class CfmConfig:
    """Training-time flow-matching settings (``dit_config.cfm_config``); none of them affects inference."""

    sigma_min: float = 1e-6
    solver: str = "euler"
    t_scheduler: str = "log-norm"
    training_cfg_rate: float = 0.1
    inference_cfg_rate: float = 1.0
    reg_loss_type: str = "l1"
    ratio_r_neq_t_range: tuple[float, float] = (0.25, 0.75)
    noise_cond_prob_range: tuple[float, float] = (0.0, 0.0)
    noise_cond_scale: float = 0.0


@dataclass(frozen=True)
class DitConfig:
    """LocDiT size (``dit_config``)."""

    cfm_config: CfmConfig
    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None
    dit_mean_mode: bool = False


@dataclass(frozen=True)
class AudioVAEConfig:
    """AudioVAE (``audio_vae_config``). V1 fields; the V2-only fields are ``None`` for ``voxcpm``."""

    encoder_dim: int = 128
    encoder_rates: tuple[int, ...] = (2, 5, 8, 8)
    latent_dim: int = 64
    decoder_dim: int = 1536
    decoder_rates: tuple[int, ...] = (8, 8, 5, 2)
    depthwise: bool = True
    sample_rate: int = 16000
    use_noise_block: bool = False
    # V2 only: the decoder's output rate and its sample-rate conditioning.
    out_sample_rate: int | None = None
    sr_bin_boundaries: tuple[int, ...] | None = None
    cond_type: str | None = None
    cond_dim: int | None = None
    cond_out_layer: bool | None = None

    @property
    def encoder_hop(self) -> int:
        """Input samples per latent frame."""
        return math.prod(self.encoder_rates)

    @property
    def decoder_hop(self) -> int:
        """Output samples per latent frame."""
        return math.prod(self.decoder_rates)

    @property
    def output_sample_rate(self) -> int:
        return self.out_sample_rate or self.sample_rate


@dataclass(frozen=True)
class AudioVAEVariant:
    """Where a checkpoint's AudioVAE departs from the voxcpm one (the reference's ``AudioVAE`` vs ``AudioVAEV2``).

    ``ModelConfig.vae_variant`` decides it once from the architecture, so the VAE never reads the architecture's
    name. The defaults are voxcpm's.
    """

    encoder_pads_by_stride: bool = False
    """Each strided encoder conv left-pads by its stride ``s`` (voxcpm2) instead of ``2·ceil(s/2)`` (voxcpm:
    one sample more for odd strides); both give L/s frames."""
    sample_rate_conditioning: bool = False
    """The decoder conditions every block's input on the output sample rate's bucket of ``sr_bin_boundaries``
    (voxcpm2 with boundaries)."""


_VAE_V1_KEYS = (
    "encoder_dim",
    "encoder_rates",
    "latent_dim",
    "decoder_dim",
    "decoder_rates",
    "depthwise",
    "sample_rate",
    "use_noise_block",
)
_VAE_V2_DEFAULTS: dict[str, Any] = {
    "decoder_dim": 2048,
    "decoder_rates": (8, 6, 5, 2, 2, 2),
    "out_sample_rate": 48000,
    "sr_bin_boundaries": (20000, 30000, 40000),
    "cond_type": "scale_bias",
    "cond_dim": 128,
    "cond_out_layer": False,
}


@dataclass(frozen=True)
class ModelConfig:
    """A whole checkpoint's ``config.json``.

    ``dtype`` is the checkpoint's training dtype as written in the file; the runtime dtype is chosen by
    the loader (bf16 on CUDA, fp32 on CPU unless asked otherwise).
    """

    architecture: Architecture
    lm_config: MiniCPM4Config
    encoder_config: EncoderConfig
    dit_config: DitConfig
    audio_vae_config: AudioVAEConfig
    patch_size: int
    feat_dim: int = 64
    residual_lm_num_layers: int = 6
    residual_lm_no_rope: bool = False
    scalar_quantization_latent_dim: int = 256
    scalar_quantization_scale: int = 9
    max_length: int = 4096
    dtype: str = "bfloat16"
    dit_mean_mode: bool = False
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ---- derived sub-transformer configs (the reference deep-copies lm_config and overrides) ----
    @property
    def residual_lm(self) -> MiniCPM4Config:
        return dataclasses.replace(
            self.lm_config,
            num_hidden_layers=self.residual_lm_num_layers,
            vocab_size=0,
            no_rope=self.residual_lm_no_rope,
        )

    def _local(self, section: EncoderConfig | DitConfig) -> MiniCPM4Config:
        return dataclasses.replace(
            self.lm_config,
            hidden_size=section.hidden_dim,
            intermediate_size=section.ffn_dim,
            num_attention_heads=section.num_heads,
            num_hidden_layers=section.num_layers,
            kv_channels=section.kv_channels,
            vocab_size=0,
        )

    @property
    def local_encoder(self) -> MiniCPM4Config:
        return self._local(self.encoder_config)

    @property
    def local_dit(self) -> MiniCPM4Config:
        return self._local(self.dit_config)

    @property
    def mean_mode(self) -> bool:
        return self.dit_config.dit_mean_mode if self.architecture == "voxcpm2" else self.dit_mean_mode

    @property
    def concat_fusion(self) -> bool:
        """Whether the residual LM's input and LocDiT's ``mu`` concatenate their two sources (projected back by
        ``fusion_concat_proj``; ``mu`` of two tokens) instead of summing them: voxcpm2."""
        return self.architecture == "voxcpm2"

    @property
    def reference_cloning(self) -> bool:
        """Whether the model clones a voice from a reference clip alone (no transcript): voxcpm2."""
        return self.architecture == "voxcpm2"

    @property
    def voice_design(self) -> bool:
        """Whether a ``(description)`` before the text designs the voice (the reference's convention): voxcpm2."""
        return self.architecture == "voxcpm2"

    @property
    def vae_variant(self) -> AudioVAEVariant:
        """How this checkpoint's AudioVAE differs from voxcpm's."""
        v2 = self.architecture == "voxcpm2"
        return AudioVAEVariant(
            encoder_pads_by_stride=v2,
            sample_rate_conditioning=v2 and self.audio_vae_config.sr_bin_boundaries is not None,
        )

    @property
    def decode_context_patches(self) -> int:
        """Trailing prompt patches that warm the VAE decoder before the first generated patch (the reference's
        ``streaming_prefix_len - 1``)."""
        return 3 if self.architecture == "voxcpm2" else 2

    @property
    def samples_per_patch(self) -> int:
        """Output audio samples per generated patch (one autoregressive step)."""
        return self.patch_size * self.audio_vae_config.decoder_hop

    @property
    def sample_rate(self) -> int:
        return self.audio_vae_config.output_sample_rate

    # ---- parsing ----
    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config.json") -> ModelConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object at the top level")
        architecture = data.get("architecture", "voxcpm")
        if architecture not in ARCHITECTURES:
            raise ConfigError(
                f"{source}: unknown architecture {architecture!r}; voxwire supports {', '.join(ARCHITECTURES)}"
            )
        top = _build(
            cls,
            data,
            "",
            source,
            exclude={"architecture", "raw", "lm_config", "encoder_config", "dit_config", "audio_vae_config"},
        )
        lm = _section(data, "lm_config", source, required=True)
        rope = _section(lm, "rope_scaling", source, required=True, path="lm_config.rope_scaling")
        rope_cfg = _build(RopeScalingConfig, rope, "lm_config.rope_scaling", source)
        lm_cfg = _build(MiniCPM4Config, lm, "lm_config", source, exclude={"rope_scaling"})
        dit = _section(data, "dit_config", source, required=True)
        cfm_cfg = _build(
            CfmConfig,
            _section(dit, "cfm_config", source, required=True, path="dit_config.cfm_config"),
            "dit_config.cfm_config",
            source,
        )
        vae_raw = _section(data, "audio_vae_config", source, required=False)
        vae_cfg = _vae_config(vae_raw, architecture, source)
        defaults = _V2_DEFAULTS if architecture == "voxcpm2" else {}
        config = cls(
            architecture=architecture,
            lm_config=MiniCPM4Config(rope_scaling=RopeScalingConfig(**rope_cfg), **lm_cfg),
            encoder_config=EncoderConfig(
                **_build(EncoderConfig, _section(data, "encoder_config", source, True), "encoder_config", source)
            ),
            dit_config=DitConfig(
                cfm_config=CfmConfig(**cfm_cfg),
                **_build(
                    DitConfig, dit, "dit_config", source, exclude={"cfm_config"}, allow_v2=architecture == "voxcpm2"
                ),
            ),
            audio_vae_config=vae_cfg,
            raw=data,
            **{**defaults, **top},
        )
        config.validate(source)
        return config

    def validate(self, source: str = "config.json") -> None:
        """Cross-field checks the reference leaves to a shape error deep inside a forward pass."""
        lm = self.lm_config
        for name, sub in (
            ("lm_config", lm),
            ("residual_lm", self.residual_lm),
            ("encoder_config", self.local_encoder),
            ("dit_config", self.local_dit),
        ):
            if sub.num_attention_heads % sub.num_key_value_heads:
                raise ConfigError(
                    f"{source}: {name} has {sub.num_attention_heads} attention heads, not a multiple "
                    f"of num_key_value_heads={sub.num_key_value_heads}"
                )
            if not sub.no_rope and len(lm.rope_scaling.short_factor) != sub.head_dim // 2:
                raise ConfigError(
                    f"{source}: lm_config.rope_scaling has {len(lm.rope_scaling.short_factor)} factors "
                    f"but {name} has head_dim {sub.head_dim}; they must be head_dim/2"
                )
        if self.architecture == "voxcpm" and self.residual_lm_no_rope:
            raise ConfigError(f"{source}: residual_lm_no_rope is a voxcpm2 key; the voxcpm architecture ignores it")
        if self.audio_vae_config.latent_dim != self.feat_dim:
            raise ConfigError(
                f"{source}: audio_vae_config.latent_dim={self.audio_vae_config.latent_dim} must equal "
                f"feat_dim={self.feat_dim}"
            )
        if self.patch_size < 1 or self.max_length < 2:
            raise ConfigError(f"{source}: patch_size and max_length must be positive")

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` content (what ``from_dict`` reads back)."""
        out = dataclasses.asdict(self)
        out.pop("raw")
        vae = out["audio_vae_config"]
        if self.architecture == "voxcpm":
            out.pop("residual_lm_no_rope")
            out["audio_vae_config"] = {k: vae[k] for k in _VAE_V1_KEYS}
            out["dit_config"].pop("dit_mean_mode")
        else:
            out.pop("dit_mean_mode")
        return {"architecture": out.pop("architecture"), **out}


_V2_DEFAULTS: dict[str, Any] = {
    "patch_size": 4,
    "residual_lm_num_layers": 8,
    "scalar_quantization_latent_dim": 512,
    "max_length": 8192,
}


def _section(data: dict[str, Any], key: str, source: str, required: bool, path: str | None = None) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{source}: missing required section {path or key!r}")
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {path or key!r} must be a JSON object, got {type(value).__name__}")
    return value


def _build(
    cls: type,
    data: dict[str, Any],
    section: str,
    source: str,
    exclude: frozenset[str] | set[str] = frozenset(),
    allow_v2: bool = True,
) -> dict[str, Any]:
    """Check ``data`` against ``cls``'s fields; return the kwargs for the fields it sets."""
    names = {f.name for f in dataclasses.fields(cls)} - set(exclude)
    if not allow_v2:
        names.discard("dit_mean_mode")
    ignored = _IGNORED_KEYS.get(section, frozenset())
    unknown = sorted(set(data) - names - set(exclude) - ignored)
    if unknown:
        where = f"section {section!r}" if section else "the top level"
        raise ConfigError(f"{source}: unknown key(s) {unknown} in {where}; known keys: {sorted(names)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in names and f.name in data:
            kwargs[f.name] = _coerce(data[f.name], f.name, section, source)
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name in names
        and f.name not in data
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if required:
        raise ConfigError(f"{source}: missing key(s) {required} in section {section or 'top level'!r}")
    return kwargs


def _coerce(value: Any, name: str, section: str, source: str) -> Any:
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        raise ConfigError(f"{source}: {section + '.' if section else ''}{name} must not be an object")
    return value


def _vae_config(raw: dict[str, Any], architecture: str, source: str) -> AudioVAEConfig:
    if architecture == "voxcpm":
        kwargs = _build(
            AudioVAEConfig,
            raw,
            "audio_vae_config",
            source,
            exclude={f.name for f in dataclasses.fields(AudioVAEConfig)} - set(_VAE_V1_KEYS),
        )
        return AudioVAEConfig(**kwargs)
    kwargs = _build(AudioVAEConfig, raw, "audio_vae_config", source)
    return AudioVAEConfig(**{**_VAE_V2_DEFAULTS, **kwargs})
