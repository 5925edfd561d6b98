"""``ServerConfig``: every setting and limit of ``voxwire serve``, validated on construction.

The HTTP and WebSocket handlers read their limits from here (through ``keys.CONFIG_KEY``); the
engine's own knobs are derived by ``engine_config``. Nothing else in the server has a magic number
that an operator might want to change.
"""

from __future__ import annotations

import math
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from voxwire.audio.opus import DEFAULT_BITRATE, DEFAULT_COMPLEXITY, OpusSettings
from voxwire.engine import EngineConfig, ParamLimits, RunnerOptions
from voxwire.engine.cost_model import StepCost
from voxwire.protocol.wire import MAX_PLAYBACK_LEAD_MS
from voxwire.sim.runner import DEFAULT_SIM_COST

# Fields that must be > 0; the others are checked by name in __post_init__.
_POSITIVE_INTS = (
    "max_sessions", "max_waiting", "max_prefill_tokens_per_step", "max_inference_timesteps", "max_connections",
    "max_message_bytes", "max_text_chars_per_message", "max_text_chars_per_utterance", "max_upload_bytes",
    "max_voices", "opus_bitrate", "max_transcript_chars", "max_voice_name_chars", "max_queued_utterances",
    "max_personas", "max_lora_rank", "max_loras", "max_voice_jobs",
)  # fmt: skip
_POSITIVE_FLOATS = (
    "max_clip_seconds", "idle_timeout_s", "ping_interval_s", "max_unsent_audio_s", "drain_timeout_s",
    "max_messages_per_s", "header_timeout_s", "body_timeout_s", "liveness_timeout_s",
)  # fmt: skip
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""A persona's name: safe in URLs (``DELETE /v1/loras/{name}``), logs and headers."""


CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
"""cgroup v2 CPU quota ("<quota> <period>" or "max <period>"): a container's CPU limit, which affinity ignores."""


def usable_cores() -> int:
    """CPU cores this process may use: its CPU affinity, capped by a container's CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()
        return max(1, min(cores, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):  # no cgroup v2 file, or "max": no quota
        return cores


def spare_cores() -> int:
    """The default ``--workers``: the usable cores less the one the engine process keeps busy; at least 1."""
    return max(1, usable_cores() - 1)


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one server process; defaults suit a single GPU and a trusted local network."""

    # ---- network and model ----
    host: str = "127.0.0.1"
    """Interface to listen on (``0.0.0.0`` for every interface)."""
    port: int = 8000
    """TCP port; 0 picks a free one (tests)."""
    model: str = "demo"
    """Checkpoint folder, Hugging Face id, ``demo`` (tiny random weights: the audio is noise), or ``sim``
    (no weights: a load-testing simulator that paces steps by ``sim_cost`` and speaks a looped clip)."""
    sim_cost: str = DEFAULT_SIM_COST
    """``--model sim`` only: duration of one engine step, e.g. ``4ms+0.17ms/row+9.2us/token``."""
    device: str | None = None
    """Torch device; None picks CUDA when available, else CPU."""
    dtype: str | None = None
    """Dtype of the transformer parts; None picks bfloat16 on CUDA, float32 elsewhere."""
    replica_id: str = field(default_factory=socket.gethostname)
    """Names this server in every response's ``X-Voxwire-Replica`` header (which replica a balancer chose)."""
    vae_dtype: str | None = None
    """Dtype of the AudioVAE; None is float32 (float16 halves its memory traffic; errors: docs/performance.md)."""

    # ---- access ----
    api_keys: tuple[str, ...] = ()
    """Accepted API keys; empty disables authentication. ``/health`` and ``/ready`` stay open."""
    allowed_origins: tuple[str, ...] = ()
    """``Origin`` values (browser pages) allowed to use the API, WebSocket and HTTP alike, with CORS answers for
    them; empty allows every origin (and sends no CORS headers)."""
    voices_dir: Path | None = None
    """Folder where uploaded voices persist across restarts; None keeps them in memory only."""

    # ---- personas (LoRA adapters) ----
    loras: tuple[tuple[str, Path], ...] = ()
    """Personas loaded before the server reports ready: (name, checkpoint folder in the reference's format)."""
    max_personas: int = 4
    """LoRA personas resident on the device at once (more may be registered; they are swapped in, least
    recently used first, never one in use)."""
    max_lora_rank: int = 64
    """Largest LoRA rank accepted; every resident adapter is padded to it (memory and compute per step)."""
    max_loras: int = 64
    """Personas registered at once (host memory); ``POST /v1/loras`` beyond it is refused."""
    lora_root: Path | None = None
    """``POST /v1/loras`` loads only folders inside it (no symbolic link out of it); None refuses the request."""

    # ---- engine capacity ----
    max_sessions: int = 16
    """Engine slots: utterances synthesized at once (batch rows; each holds a KV cache)."""
    max_waiting: int = 64
    """Utterances queued for a free slot; beyond it requests are refused with ``queue_full``."""
    max_prefill_tokens_per_step: int = 512
    """Prompt positions admitted per engine step, so arrivals add bounded latency to running streams
    (FIFO policy only: the real-time policy budgets admissions by the measured step time)."""
    realtime: bool = True
    """Schedule by playback deadline (``engine.policy``): the runner measures its step cost at start-up,
    streams ahead of their listeners yield steps to those behind, admission is budgeted by step time.
    Off: every running stream decodes every step (FIFO admission by ``max_prefill_tokens_per_step``)."""
    playback_lead_ms: int = 300
    """Audio a listener buffers before playing, for clients that announce no ``playback_lead_ms``."""
    max_ahead_ms: int = 1000
    """A stream with this much audio ready ahead of its listener skips steps (real-time policy)."""
    max_length: int | None = None
    """LM positions per slot (prompt + generated patches); None uses the model's ``max_length``."""
    max_inference_timesteps: int = 50
    """Largest ``inference_timesteps`` a client may ask for (each one is a diffusion pass per patch)."""
    kv_cache_gb: float | None = None
    """Device memory of the KV block pool, in GiB (sessions share it by the positions they reach). None:
    on CUDA, what is free after the weights and activations, times ``gpu_memory_utilization``; on other
    devices, room for ``max_sessions`` sessions at ``max_length``."""
    gpu_memory_utilization: float = 0.9
    """Fraction of the GPU's memory the server may use in all (for the default ``kv_cache_gb``)."""
    voice_cache_mb: int = 256
    """Device memory, in MiB, for the encoded patches of recently used voices, so sessions with the same
    voice skip re-encoding it (least recently used voices are dropped first; 0 keeps none)."""
    batch_invariant: bool = False
    """Compute every session's rows independently of the rest of the batch, so that its audio is bit for bit what
    it is alone (``ModelRunner(batch_invariant=True)``); slower (docs/performance.md)."""

    # ---- per-connection and per-request limits ----
    max_connections: int = 256
    """WebSocket connections open at once; the next one is refused as ``busy`` (HTTP 503)."""
    max_message_bytes: int = 64 * 1024
    """Largest WebSocket message a client may send."""
    max_text_chars_per_message: int = 4096
    """Largest ``text`` of one WebSocket ``text`` message."""
    max_text_chars_per_utterance: int = 20_000
    """Largest text of one utterance (WebSocket, buffered) or one ``/v1/audio/speech`` ``input``."""
    max_upload_bytes: int = 10 * 1024 * 1024
    """Largest voice-clip upload (the whole multipart body of ``POST /v1/voices``)."""
    max_clip_seconds: float = 30.0
    """Longest voice clip accepted; longer prompts slow every utterance that uses the voice."""
    max_voices: int = 1000
    """Voices kept in the store; uploads beyond it are refused until one is deleted."""
    max_voice_jobs: int = 2
    """Voice uploads decoded and encoded at once by one server process (each frontend under ``--workers``), and
    clips encoded or waiting at once on each engine process from every frontend together; more are refused with
    503 ``busy`` and ``Retry-After``, so uploads cannot crowd out the streams' CPU."""
    max_transcript_chars: int = 2000
    """Largest ``transcript`` of a voice upload (it is part of every prompt that uses the voice)."""
    max_voice_name_chars: int = 200
    """Largest ``name`` of a voice upload."""
    max_queued_utterances: int = 8
    """Utterances of one WebSocket not done yet (speaking or waiting their turn); more are refused."""
    max_messages_per_s: float = 1000.0
    """Client messages a WebSocket may send per second, with a burst of one second's worth; a flood beyond it is
    closed (``rate_limited``, 4003) so that one connection cannot monopolise the server's event loop."""

    # ---- timing and flow control ----
    idle_timeout_s: float = 300.0
    """A WebSocket with no client message and nothing being spoken for this long is closed."""
    ping_interval_s: float = 20.0
    """WebSocket ping period (keeps proxies from dropping quiet connections, detects dead peers)."""
    max_unsent_audio_s: float = 5.0
    """Audio a session may have produced but not yet sent; a slower reader is disconnected."""
    max_buffer_delay_ms: int = 500
    """Default wait for more text before speaking an incomplete sentence (a client may override it)."""
    header_timeout_s: float = 15.0
    """An HTTP connection must send a request's complete headers this soon after it opens or after its previous
    response; idle keep-alive connections are closed after it too."""
    body_timeout_s: float = 60.0
    """An HTTP request body (speech JSON, voice upload) must arrive whole within this long."""
    drain_timeout_s: float = 30.0
    """On shutdown, how long live utterances may keep speaking before their sockets are closed."""

    # ---- audio ----
    opus_bitrate: int = DEFAULT_BITRATE
    """Opus bitrate in bits per second, for every Opus and Ogg Opus stream."""
    opus_complexity: int = DEFAULT_COMPLEXITY
    """Opus encoder complexity, 0-10: 7 and up cost ~5x the CPU of 6 on speech (docs/performance.md)."""
    encoder_threads: int = 2
    """Threads that run audio encoders off the event loop (libopus releases the GIL); 0 encodes on the loop."""

    # ---- processes ----
    workers: int = field(default_factory=spare_cores)
    """Frontend processes (``--workers N``): each runs its own event loop, sockets and encoders on the shared
    port, and one engine process owns the model; 0 serves everything from this one process. Default: one per
    core the engine process does not need (``spare_cores``)."""
    liveness_timeout_s: float = 5.0
    """``--workers``/``--devices``: an engine or frontend process that has not shown life (its loop stamps a
    heartbeat several times a second) for this long is hung, not busy: the supervisor ends it, so the exit path
    of a dead engine (or the restart of a dead frontend) runs instead of connections waiting on a stopped process.
    """
    devices: tuple[str, ...] = ()
    """``--devices cuda:0,cuda:1``: one engine process per device (each its own KV pool and graphs), new
    utterances to the one with the most free capacity; empty: one engine on ``device``. Implies at least one
    frontend process (``frontends``), since the engines run in processes of their own."""

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            _check(name, value, _is_int(value) and value > 0, "an int > 0")
        for name in _POSITIVE_FLOATS:
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            _check(name, value, number and math.isfinite(value) and value > 0, "a finite number > 0")
        _check("port", self.port, _is_int(self.port) and 0 <= self.port <= 65535, "an int in [0, 65535]")
        length = self.max_length
        _check("max_length", length, length is None or (_is_int(length) and length > 0), "None or an int > 0")
        gb = self.kv_cache_gb
        number = isinstance(gb, (int, float)) and not isinstance(gb, bool)
        _check("kv_cache_gb", gb, gb is None or (number and math.isfinite(gb) and gb > 0), "None or a number > 0")
        share = self.gpu_memory_utilization
        number = isinstance(share, (int, float)) and not isinstance(share, bool)
        _check("gpu_memory_utilization", share, number and 0 < share <= 1, "a number in (0, 1]")
        cache = self.voice_cache_mb
        _check("voice_cache_mb", cache, _is_int(cache) and cache >= 0, "an int >= 0")
        delay = self.max_buffer_delay_ms
        _check("max_buffer_delay_ms", delay, _is_int(delay) and delay >= 0, "an int >= 0")
        lead = self.playback_lead_ms
        _check("playback_lead_ms", lead, _is_int(lead) and 0 <= lead <= MAX_PLAYBACK_LEAD_MS, "an int in [0, 10000]")
        ahead = self.max_ahead_ms
        _check("max_ahead_ms", ahead, _is_int(ahead) and ahead > 0, "an int > 0")
        for name in ("realtime", "batch_invariant"):
            _check(name, getattr(self, name), isinstance(getattr(self, name), bool), "a bool")
        _check("replica_id", self.replica_id, _is_token(self.replica_id), "1-253 letters, digits or ._:-")
        for name in ("encoder_threads", "workers"):
            value = getattr(self, name)
            _check(name, value, _is_int(value) and value >= 0, "an int >= 0")
        devices = self.devices
        ok = isinstance(devices, tuple) and all(isinstance(d, str) and d.strip() == d and d for d in devices)
        _check("devices", devices, ok, "a tuple of device names such as 'cuda:0'")
        _check("devices", devices, not (devices and self.device), "empty when device is given (--device)")
        try:
            self.opus_settings()
        except ValueError as exc:
            raise ValueError(f"ServerConfig.opus_bitrate/opus_complexity are invalid: {exc}") from None
        try:
            StepCost.parse(self.sim_cost)
        except ValueError as exc:
            raise ValueError(f"ServerConfig.sim_cost={self.sim_cost!r} is invalid: {exc}") from None
        names = [name for name, _ in self.loras]
        ok = all(isinstance(name, str) and is_persona_name(name) for name in names) and len(set(names)) == len(names)
        _check("loras", self.loras, ok, "distinct names of 1-64 letters, digits or ._-")
        _check("loras", self.loras, len(names) <= self.max_loras, f"at most max_loras={self.max_loras} personas")
        for name in ("api_keys", "allowed_origins"):
            values = getattr(self, name)
            ok = isinstance(values, tuple) and all(isinstance(v, str) and v for v in values)
            _check(name, values, ok, "a tuple of non-empty strings")

    @property
    def frontends(self) -> int:
        """Frontend processes to run: ``workers``, at least 1 with ``devices`` (0: this process serves alone)."""
        return max(self.workers, 1) if self.devices else self.workers

    def engine_devices(self) -> tuple[str | None, ...]:
        """The device of each engine process: ``devices``, or the one ``device``."""
        return self.devices or (self.device,)

    @property
    def kv_cache_bytes(self) -> int | None:
        return None if self.kv_cache_gb is None else int(self.kv_cache_gb * 2**30)

    @property
    def voice_cache_bytes(self) -> int:
        return self.voice_cache_mb * 2**20

    def engine_config(self) -> EngineConfig:
        """The engine's knobs, derived from this configuration."""
        return EngineConfig(
            max_running=self.max_sessions,
            max_waiting=self.max_waiting,
            max_prefill_tokens_per_step=self.max_prefill_tokens_per_step,
            realtime=self.realtime,
            playback_lead_s=self.playback_lead_ms / 1000,
            max_ahead_s=self.max_ahead_ms / 1000,
            limits=ParamLimits(max_inference_timesteps=self.max_inference_timesteps),
        )

    def runner_options(self) -> RunnerOptions:
        """How the model's runner is sized, derived from this configuration."""
        return RunnerOptions(
            num_slots=self.max_sessions,
            max_length=self.max_length,
            kv_cache_bytes=self.kv_cache_bytes,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_timesteps=self.max_inference_timesteps,
            voice_cache_bytes=self.voice_cache_bytes,
            measure_cost=self.realtime,  # the real-time policy budgets steps by it
            batch_invariant=self.batch_invariant,
        )

    def opus_settings(self) -> OpusSettings:
        """How every Opus stream is coded."""
        return OpusSettings(self.opus_bitrate, self.opus_complexity)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_persona_name(value: str) -> bool:
    return _NAME.fullmatch(value) is not None


def _is_token(value: object) -> bool:
    """Safe as an HTTP header value and in logs: no spaces or control characters."""
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9._:-]{1,253}", value) is not None


def _check(name: str, value: object, ok: bool, rule: str) -> None:
    if not ok:
        raise ValueError(f"ServerConfig.{name}={value!r} is invalid: must be {rule}")
