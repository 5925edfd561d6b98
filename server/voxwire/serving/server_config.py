"""``ServerConfig``: every setting and limit of ``voxwire serve``, in groups, validated on construction.

Each group is a frozen dataclass of settings, and each setting's docstring is its one description: the flag's
help and its row in docs/operations.md are made from it (``serving.settings``). The HTTP and WebSocket handlers
read their limits from here (through ``keys.CONFIG_KEY``); the engine's own knobs are derived by
``EngineSettings.engine_config``. Nothing else in the server has a magic number that an operator might want to
change.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import socket
from argparse import ArgumentTypeError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, get_type_hints

from voxwire.audio.opus import DEFAULT_BITRATE, DEFAULT_COMPLEXITY, OpusSettings
from voxwire.engine import EngineConfig, ParamLimits, RunnerOptions
from voxwire.engine.cost_model import StepCost
from voxwire.params import SynthesisParams
from voxwire.protocol.wire import MAX_PLAYBACK_LEAD_MS
from voxwire.serving.settings import flag
from voxwire.sim.runner import DEFAULT_SIM_COST

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


def device_list(text: str) -> tuple[str, ...]:
    """``--devices cuda:0, cuda:1`` -> ``("cuda:0", "cuda:1")`` (an empty item is left for validation to name)."""
    return tuple(device.strip() for device in text.split(","))


def alias_arg(text: str) -> tuple[str, str]:
    """``--voice-alias FOREIGN=OURS`` -> ``(foreign, ours)``."""
    foreign, sep, ours = text.partition("=")
    if not sep or not foreign.strip() or not ours.strip():
        raise ArgumentTypeError(f"expected FOREIGN=OURS, got {text!r}")
    return foreign.strip(), ours.strip()


def persona_arg(text: str) -> tuple[str, Path]:
    """``--lora NAME=DIR`` -> ``(name, Path(folder))``."""
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise ArgumentTypeError(f"expected NAME=DIR, got {text!r}")
    return name, Path(folder)


DIT_FP8_CHOICES = {"auto": None, "on": True, "off": False}
"""``--dit-fp8``'s values, and what each asks the loader (``load_model(dit_fp8=...)``; None: its default)."""
DEFAULT_MAX_AHEAD_LIMIT_MS = 30_000
"""``--max-ahead-limit-ms`` when not set (and ``--max-ahead-ms`` is below it)."""


@dataclass(frozen=True)
class EngineSettings:
    """The model, where and in what precision it runs, and how the engine schedules and sizes its work."""

    title: ClassVar[str] = "Model and engine"

    model: str = "demo"
    """A checkpoint folder, a Hugging Face id (``openbmb/VoxCPM2``, downloaded through ``huggingface_hub``, which
    honours its cache and ``HF_HUB_OFFLINE=1``), ``demo`` (tiny random weights built in: it speaks noise, no
    download) or ``sim`` (no weights: [the load-testing simulator](#load-testing-without-a-gpu---model-sim) paces
    its steps by ``--sim-cost`` and speaks a looped clip)."""
    sim_cost: str = DEFAULT_SIM_COST
    """With ``--model sim``: one engine step's duration, a sum of a fixed time, a time per decode row and a time
    per prefill position ([the simulator](#load-testing-without-a-gpu---model-sim))."""
    device: str | None = field(default=None, metadata=flag(shown_default="cuda when available"))
    """Torch device of the engine (``cuda``, ``cpu``, ...); excludes ``--devices``."""
    dtype: str | None = field(default=None, metadata=flag(shown_default="bfloat16 on CUDA, float32 on CPU"))
    """Dtype of the transformer parts: ``bfloat16`` or ``float32``."""
    vae_dtype: str | None = field(
        default=None, metadata=flag(shown_default="float16 on CUDA if its check decode passes, else float32")
    )
    """Dtype of the AudioVAE: ``float16`` halves its memory traffic on a GPU at the error stated in
    [performance](performance.md#half-precision-vae-error) (``bfloat16`` is accepted, with 8x the error)."""
    dit_fp8: str = "auto"
    """LocDiT's decoder GEMMs in float8 e4m3 (per-row and per-channel scales): ``auto`` on a GPU that has fp8 GEMMs
    (compute capability 8.9+, e.g. H100, H200) with a half-precision model, at the error stated in
    [performance](performance.md#fp8-dit-gemms-error-cpu-emulation); ``on``, ``off``."""
    max_sessions: int = 16
    """Engine slots: utterances synthesized at once (batch rows; each holds a KV cache)."""
    max_waiting: int = 64
    """Utterances waiting for a slot beyond the free ones (then ``busy``); a request is never refused while a slot
    is free."""
    max_prefill_tokens_per_step: int = 512
    """Prompt positions admitted per engine step, so that arrivals add bounded latency to running streams
    (``--no-realtime`` only: real-time admission is budgeted by the measured step time)."""
    realtime: bool = True
    """Schedule engine steps by playback deadline ([scheduling](#scheduling)): the step cost is measured at
    start-up and followed while serving, streams ahead of their listeners yield steps to those behind, admission
    is budgeted by step time.
    ``--no-realtime``: every stream decodes every step, FIFO admission by ``--max-prefill-tokens-per-step``."""
    playback_lead_ms: int = 300
    """Audio a listener buffers before playing, for clients that announce no ``playback_lead_ms`` (at most
    10000)."""
    max_ahead_ms: int = 1000
    """How far ahead of its listener a WebSocket stream may be generated, for clients that send no
    ``start.max_ahead_ms`` (real-time; [scheduling](#scheduling)). HTTP responses have no such bound: their audio
    comes as fast as the engine makes it, and what a slow reader has not read waits in the server (at most the
    request's length)."""
    max_ahead_limit_ms: int | None = field(default=None, metadata=flag(shown_default="30000, at least --max-ahead-ms"))
    """The most a WebSocket client may ask for as ``start.max_ahead_ms`` (``out_of_range`` above)."""
    max_batch_sessions: int | None = field(default=None, metadata=flag(shown_default="a quarter of --max-sessions"))
    """Engine slots ``batch`` requests (the ``priority`` field or the ``Voxwire-Priority`` header) may hold at once,
    so that real-time requests always find the rest ([scheduling](#scheduling)); at least 1."""
    max_batch_gap_ms: int = 1000
    """The ``batch`` guarantee: a batch request decodes at least once this often, and one that has waited this long
    for a slot queues as a real-time request would."""
    max_step_load: float = 0.9
    """Real-time: a new stream is refused ``busy`` (HTTP 503 with ``Retry-After``) while one engine step of the
    streams the engine runs and the new one, at the step time measured over its last steps, would take more than
    this share of a chunk's duration, so that the live streams never underrun ([scheduling](#scheduling))."""
    max_length: int | None = field(default=None, metadata=flag(shown_default="model's"))
    """LM positions per slot (prompt + generated patches)."""
    max_inference_timesteps: int = 50
    """Largest ``inference_timesteps`` a client may ask for (each one is a diffusion pass per patch); at least
    the default a request gets without asking, 10."""
    kv_cache_gb: float | None = field(default=None, metadata=flag(shown_default="by memory"))
    """Device memory of the KV block pool, in GiB: sessions share it by the positions they reach, and a request
    waits for its blocks. By default, on CUDA, what is free after the weights and activations, times
    ``--gpu-memory-utilization``; on other devices, room for ``--max-sessions`` sessions at ``--max-length``."""
    gpu_memory_utilization: float = 0.9
    """Fraction of the GPU's memory the server may use in all (it sizes the default KV pool)."""
    voice_cache_mb: int = 256
    """Device memory, in MiB, for the encoded patches of recently used voices, so that sessions with the same
    voice skip re-encoding it; the least recently used are dropped first (0: none; see
    [architecture](architecture.md#prefill-and-the-voice-cache))."""
    batch_invariant: bool = False
    """Every session's audio bit for bit what it is alone, whatever else the batch holds (GEMMs over fixed row
    tiles, attention in fixed chunks, one prefill at a time); slower: see
    [correctness](correctness.md#batch-invariance) and [its cost](performance.md#batch-invariant-numerics)."""

    def __post_init__(self) -> None:
        _check(self, "dit_fp8", self.dit_fp8, self.dit_fp8 in DIT_FP8_CHOICES, f"one of {', '.join(DIT_FP8_CHOICES)}")
        _positive_ints(self, "max_sessions", "max_waiting", "max_prefill_tokens_per_step", "max_inference_timesteps")
        # Below the default, every request that names no timesteps (and the warm-up) would be refused.
        default_steps = SynthesisParams().inference_timesteps
        ok = self.max_inference_timesteps >= default_steps
        _check(self, "max_inference_timesteps", self.max_inference_timesteps, ok, f">= {default_steps}, the default")
        length = self.max_length
        _check(self, "max_length", length, length is None or (_is_int(length) and length > 0), "None or an int > 0")
        gb = self.kv_cache_gb
        _check(self, "kv_cache_gb", gb, gb is None or (_is_finite(gb) and gb > 0), "None or a number > 0")
        share = self.gpu_memory_utilization
        _check(self, "gpu_memory_utilization", share, _is_finite(share) and 0 < share <= 1, "a number in (0, 1]")
        _at_least_zero(self, "voice_cache_mb")
        lead = self.playback_lead_ms
        ok = _is_int(lead) and 0 <= lead <= MAX_PLAYBACK_LEAD_MS
        _check(self, "playback_lead_ms", lead, ok, f"an int in [0, {MAX_PLAYBACK_LEAD_MS}]")
        _positive_ints(self, "max_ahead_ms", "max_batch_gap_ms")
        limit = self.max_ahead_limit_ms
        ok = limit is None or (_is_int(limit) and limit >= self.max_ahead_ms)
        _check(self, "max_ahead_limit_ms", limit, ok, f"None or an int >= --max-ahead-ms ({self.max_ahead_ms})")
        batch = self.max_batch_sessions
        ok = batch is None or (_is_int(batch) and 1 <= batch <= self.max_sessions)
        _check(self, "max_batch_sessions", batch, ok, f"None or an int in [1, --max-sessions ({self.max_sessions})]")
        _positive_numbers(self, "max_step_load")
        for name in ("realtime", "batch_invariant"):
            _check(self, name, getattr(self, name), isinstance(getattr(self, name), bool), "a bool")
        try:
            StepCost.parse(self.sim_cost)
        except ValueError as exc:
            raise ValueError(f"EngineSettings.sim_cost={self.sim_cost!r} is invalid: {exc}") from None

    @property
    def kv_cache_bytes(self) -> int | None:
        return None if self.kv_cache_gb is None else int(self.kv_cache_gb * 2**30)

    @property
    def ahead_limit_ms(self) -> int:
        """``--max-ahead-limit-ms``, or its default: 30000, at least ``--max-ahead-ms``."""
        default = max(DEFAULT_MAX_AHEAD_LIMIT_MS, self.max_ahead_ms)
        return default if self.max_ahead_limit_ms is None else self.max_ahead_limit_ms

    @property
    def batch_sessions(self) -> int:
        """``--max-batch-sessions``, or its default: a quarter of ``--max-sessions``, at least 1."""
        return max(1, self.max_sessions // 4) if self.max_batch_sessions is None else self.max_batch_sessions

    @property
    def voice_cache_bytes(self) -> int:
        return self.voice_cache_mb * 2**20

    def engine_config(self) -> EngineConfig:
        """The engine's knobs, derived from these settings."""
        return EngineConfig(
            max_running=self.max_sessions,
            max_waiting=self.max_waiting,
            max_prefill_tokens_per_step=self.max_prefill_tokens_per_step,
            realtime=self.realtime,
            playback_lead_s=self.playback_lead_ms / 1000,
            max_ahead_s=self.max_ahead_ms / 1000,
            max_batch_running=self.batch_sessions,
            max_batch_gap_s=self.max_batch_gap_ms / 1000,
            max_step_load=self.max_step_load,
            limits=ParamLimits(max_inference_timesteps=self.max_inference_timesteps),
        )

    def runner_options(self) -> RunnerOptions:
        """How the model's runner is sized, derived from these settings."""
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


@dataclass(frozen=True)
class Topology:
    """The processes that serve: frontends sharing the port, and the engine processes that own the model."""

    title: ClassVar[str] = "Processes"

    workers: int = field(default_factory=spare_cores, metadata=flag(shown_default="one per spare core"))
    """Frontend processes sharing the port, each with its own event loop, sockets and encoders, and one engine
    process that owns the model: by default the usable cores less one, at least 1 (0: this one
    process serves everything; [architecture](architecture.md#topologies))."""
    devices: tuple[str, ...] = field(default=(), metadata=flag(parse=device_list, shown_default="none"))
    """Comma-separated devices, one engine process each (``cuda:0,cuda:1``; ``cpu,cpu`` in tests), each with its
    own KV pool and graphs; new utterances go to the engine with the most free capacity. Implies ``--workers 1``
    at least, since the engines run in processes of their own ([deploy](deploy.md#several-gpus-in-one-machine))."""
    liveness_timeout_s: float = 5.0
    """On by default, as in every topology but ``--workers 0``: an engine or frontend process whose heart thread
    (a beat every quarter second, whatever its loop is doing) has been silent this long is not running (stopped,
    frozen), and the supervisor ends it and starts another ([liveness](#liveness-and-replacement)). A busy or
    CPU-starved process still beats."""
    stall_timeout_s: float = 60.0
    """The least time an engine step, or one turn of a frontend's event loop, may take before the loop counts as
    stuck (a deadlock, a step that never returns) and its process is ended and replaced; with ``--workers 0`` a
    stuck engine thread ends the server (exit 1). The bound of an engine step is the larger of this and
    ``--stall-factor`` times its worst modelled step ([liveness](#liveness-and-replacement))."""
    stall_factor: float = 20.0
    """How many times its worst modelled step (the start-up step-cost fit at ``--max-sessions`` rows and
    ``--max-prefill-tokens-per-step`` positions) an engine step may take before it counts as stuck, when that
    is longer than ``--stall-timeout-s``."""
    crash_loop_deaths: int = 5
    """Engine deaths (crashed, killed, or ended as hung) within ``--crash-loop-window-s`` after which the server
    stops replacing engines and exits 1 naming the cause, so that its orchestrator sees a crash loop (an engine
    that never served exits 1 at once: a bad checkpoint or ``--lora``)."""
    crash_loop_window_s: float = 600.0
    """The window, in seconds, over which ``--crash-loop-deaths`` are counted."""

    def __post_init__(self) -> None:
        _at_least_zero(self, "workers")
        _positive_numbers(self, "liveness_timeout_s", "stall_timeout_s", "stall_factor", "crash_loop_window_s")
        _positive_ints(self, "crash_loop_deaths")
        devices = self.devices
        ok = isinstance(devices, tuple) and all(isinstance(d, str) and d.strip() == d and d for d in devices)
        _check(self, "devices", devices, ok, "a tuple of device names such as 'cuda:0'")

    @property
    def frontends(self) -> int:
        """Frontend processes to run: ``workers``, at least 1 with ``devices`` (0: this process serves alone)."""
        return max(self.workers, 1) if self.devices else self.workers


@dataclass(frozen=True)
class Transport:
    """Where the server listens, how it names itself, and who may use it."""

    title: ClassVar[str] = "Network and access"

    host: str = "127.0.0.1"
    """Interface to listen on (``0.0.0.0``: every interface)."""
    port: int = 8000
    """TCP port (0 picks a free one)."""
    replica_id: str = field(default_factory=socket.gethostname, metadata=flag(shown_default="the hostname"))
    """The name in every response's ``X-Voxwire-Replica`` header (which replica a balancer chose)."""
    api_keys: tuple[str, ...] = field(default=(), metadata=flag(repeatable=True, shown_default="none"))
    """An accepted API key (repeatable; none: authentication is off, which needs ``--no-auth`` unless ``--host`` is
    loopback); ``/health`` and ``/ready`` stay open ([authentication](#authentication-and-origins))."""
    no_auth: bool = False
    """Serve without API keys on an address other than loopback: anyone who reaches it may use the whole API,
    voice uploads and deletes included (logged as a warning at start). Without it such a server refuses to start,
    so that a key list lost on the way (an unset variable, a missing Secret) cannot open it silently."""
    allowed_origins: tuple[str, ...] = field(default=(), metadata=flag(repeatable=True, shown_default="any"))
    """A browser ``Origin`` allowed to use the API, WebSocket and HTTP alike, with CORS answers (repeatable; none:
    every origin, without CORS headers)."""
    ping_interval_s: float = 20.0
    """WebSocket ping period (keeps proxies from dropping quiet connections, detects dead peers)."""
    tls_cert: Path | None = field(default=None, metadata=flag(shown_default="none: plain HTTP"))
    """PEM certificate chain to serve HTTPS and WSS with, on the same port (with ``--tls-key``); reloaded on SIGHUP
    and when the file changes ([TLS](deploy.md#tls)). A load balancer that terminates TLS is still the recommended
    setup."""
    tls_key: Path | None = field(default=None, metadata=flag(shown_default="none: plain HTTP"))
    """PEM private key of ``--tls-cert`` (both or neither)."""
    tls_poll_s: float = 5.0
    """How often the server looks at the TLS files' modification times, to load a renewed pair without a restart
    (a bad new pair is logged and the old one kept)."""
    wyoming_port: int | None = field(default=None, metadata=flag(shown_default="none: no Wyoming listener"))
    """Also serve Home Assistant's [Wyoming protocol](clients.md#home-assistant-wyoming) on this TCP port of
    ``--host`` (0 picks a free one). Wyoming has no authentication: anyone who reaches the port may speak, so it is
    for a trusted network; with API keys on a host other than loopback it needs ``--wyoming-without-auth``."""
    wyoming_without_auth: bool = False
    """Serve ``--wyoming-port`` on a host other than loopback although API keys protect the HTTP API: the Wyoming
    port stays open to anyone who reaches it. Without it such a server refuses to start."""

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("Transport.tls_cert and tls_key go together: give --tls-cert and --tls-key, or neither")
        _positive_numbers(self, "tls_poll_s")
        _check(self, "port", self.port, _is_int(self.port) and 0 <= self.port <= 65535, "an int in [0, 65535]")
        _check(self, "replica_id", self.replica_id, _is_token(self.replica_id), "1-253 letters, digits or ._:-")
        for name in ("api_keys", "allowed_origins"):
            values = getattr(self, name)
            ok = isinstance(values, tuple) and all(isinstance(v, str) and v for v in values)
            _check(self, name, values, ok, "a tuple of non-empty strings")
        _positive_numbers(self, "ping_interval_s")
        _check(self, "no_auth", self.no_auth, isinstance(self.no_auth, bool), "a bool")
        wyoming = self.wyoming_port
        ok = wyoming is None or (_is_int(wyoming) and 0 <= wyoming <= 65535)
        _check(self, "wyoming_port", wyoming, ok, "None or an int in [0, 65535]")
        _check(
            self,
            "wyoming_without_auth",
            self.wyoming_without_auth,
            isinstance(self.wyoming_without_auth, bool),
            "a bool",
        )
        if wyoming is not None and self.api_keys and not self.wyoming_without_auth and not is_loopback(self.host):
            raise ValueError(
                f"Transport.wyoming_port: the Wyoming protocol has no authentication, so --wyoming-port on --host "
                f"{self.host} would open the API keys' server to anyone on the network; serve it on a loopback host, "
                "or add --wyoming-without-auth (VOXWIRE_WYOMING_WITHOUT_AUTH=true) to serve it on a trusted network"
            )
        if self.no_auth and self.api_keys:
            raise ValueError("Transport.no_auth contradicts api_keys: give API keys (--api-key) or --no-auth, not both")
        if not (self.api_keys or self.no_auth or is_loopback(self.host)):
            raise ValueError(
                f"Transport.host={self.host!r} is not loopback, so serving it needs an API key (--api-key, "
                "VOXWIRE_API_KEYS), or --no-auth (VOXWIRE_NO_AUTH=true) to serve it without authentication"
            )

    @property
    def open_to_network(self) -> bool:
        """Whether clients of other machines may use the API without a key (``--no-auth`` on a non-loopback host)."""
        return not self.api_keys and not is_loopback(self.host)


@dataclass(frozen=True)
class Limits:
    """What one connection or request may ask and how long it may take: one client reaching a limit gets a typed
    error and affects no other session. The engine's capacity and the bounds of voices and personas are with their
    [flags](#flags)."""

    title: ClassVar[str] = "Limits"

    max_connections: int = 256
    """WebSockets open at once on the server, all frontends together (then 503 ``busy`` before the upgrade; under
    ``--workers`` the frontends check and take a place under one lock, so a burst spread over them cannot pass
    it). A socket still waiting for its API key is not counted here but in ``--max-keyless-connections``."""
    max_keyless_connections: int = 64
    """WebSockets upgraded without an API key, whose key may come in their first message (the ElevenLabs endpoints,
    as ElevenLabs allows), open at once in one server process (each frontend under ``--workers``; then 503 ``busy``
    before the upgrade). They count here until their key is accepted, then against ``--max-connections`` (a key
    that finds it full: closed with 1013 ``busy``)."""
    key_timeout_s: float = 10.0
    """A WebSocket upgraded without an API key must send it in its first message this soon, else it is closed (1008
    ``unauthorized``)."""
    max_message_bytes: int = 64 * 1024
    """Largest WebSocket message a client may send (``message_too_large``; over 4x: closed unread, 1009)."""
    max_messages_per_s: float = 1000.0
    """Client messages per second per WebSocket, with a one-second burst; a flood is closed with 4003
    ``rate_limited`` so that one connection cannot starve the other sessions of the event loop."""
    max_queued_utterances: int = 8
    """Utterances of one WebSocket not done yet, speaking or waiting their turn (``too_many_utterances``)."""
    max_contexts: int = 16
    """Named contexts one WebSocket holds at once, besides its default one (``too_many_contexts``; a
    ``close_context`` frees one)."""
    max_text_chars_per_message: int = 4096
    """Largest ``text`` of one WebSocket message, and largest ``instructions`` (a WebSocket ``start``'s and
    ``/v1/audio/speech``'s: the description is spoken in front of every sentence) (``text_too_long``)."""
    max_text_chars_per_utterance: int = 20_000
    """Largest text of one utterance, and ``input`` of ``/v1/audio/speech`` (``utterance_too_long``,
    ``text_too_long``); it also sizes the speech body limit (4 bytes a character + 64 KiB, and on ``/v1/audio/speech``
room for a ``ref_audio`` clip of ``--max-upload-bytes``)."""
    header_timeout_s: float = 15.0
    """An HTTP request's headers must be complete this soon after the connection opens or its previous response
    (idle keep-alive connections close after it too)."""
    body_timeout_s: float = 60.0
    """An HTTP request body (speech JSON, voice upload) must arrive whole within this (``body_timeout``, 408)."""
    strict_fields: bool = False
    """Refuse a ``/v1/audio/speech`` body field the server does not know (400 ``unknown_field``, as OpenAI's API
    does) instead of ignoring it: by default it is ignored, named in the response's ``X-Voxwire-Ignored-Fields``
    and counted in ``voxwire_ignored_fields_total``, so clients of other OpenAI-compatible servers work unchanged."""
    write_timeout_s: float = 30.0
    """A connection (HTTP or WebSocket) whose client leaves the server's data unsent this long (its socket full: it
    stopped reading) is aborted, its socket freed, whatever was being sent."""
    max_wyoming_connections: int = 16
    """[Wyoming](clients.md#home-assistant-wyoming) connections one server process (each frontend under
    ``--workers``) holds at once; one more gets an ``error`` ``busy`` and is closed."""
    max_http_connections: int = 512
    """HTTP connections one server process (each frontend under ``--workers``) holds at once, WebSockets aside
    (``--max-connections``); one more is answered 503 ``busy`` and closed before its request is read."""
    idle_timeout_s: float = 300.0
    """A WebSocket with no client message and nothing being spoken for this long is closed (4002
    ``idle_timeout``)."""
    max_unsent_audio_s: float = 5.0
    """Audio produced but not yet taken by a WebSocket; a slower reader is closed (4001 ``slow_consumer``), never
    buffered without bound."""
    max_buffer_delay_ms: int = 500
    """Default wait for more text before an incomplete sentence is spoken (a client may set its own)."""
    drain_timeout_s: float = 30.0
    """On shutdown, how long live utterances may keep speaking before their sockets are closed."""
    trace_flush_timeout_s: float = 3.0
    """On shutdown, with [traces](#request-ids-and-traces) on, how long the span exporters may take to send the
    spans left; then the server stops without them (an unresponsive collector delays its exit by this much at most,
    after the drain)."""

    def __post_init__(self) -> None:
        _positive_ints(
            self, "max_connections", "max_keyless_connections", "max_message_bytes", "max_queued_utterances",
            "max_contexts", "max_text_chars_per_message", "max_text_chars_per_utterance",
        )  # fmt: skip
        _positive_numbers(
            self, "max_messages_per_s", "header_timeout_s", "body_timeout_s", "idle_timeout_s", "key_timeout_s",
            "max_unsent_audio_s", "drain_timeout_s", "trace_flush_timeout_s",
        )  # fmt: skip
        _at_least_zero(self, "max_buffer_delay_ms")
        _positive_numbers(self, "write_timeout_s")
        _positive_ints(self, "max_http_connections", "max_wyoming_connections")


@dataclass(frozen=True)
class VoiceSettings:
    """The voice store: where uploaded voices persist, how many it keeps, and the bounds of an upload."""

    title: ClassVar[str] = "Voice store"

    voices_dir: Path | None = field(default=None, metadata=flag(shown_default="memory only"))
    """Folder where uploaded voices persist across restarts."""
    max_voices: int = 1000
    """Voices in the store; uploads beyond it are refused until one is deleted (``voice_limit``, 409)."""
    max_upload_bytes: int = 10 * 1024 * 1024
    """A voice upload's whole multipart body, and a speech request's ``ref_audio`` clip (``upload_too_large``,
    413)."""
    max_clip_seconds: float = 30.0
    """A voice clip's duration, read from the file's header before decoding; decoding stops at the limit whatever
    the header says (``clip_too_long``). Longer prompts slow every utterance that uses the voice."""
    max_transcript_chars: int = 2000
    """A voice upload's ``transcript``, part of every prompt that uses the voice (``text_too_long``, refused while
    the body is read)."""
    max_voice_name_chars: int = 200
    """A voice upload's ``name`` (``text_too_long``; control and format characters: ``invalid_name``)."""
    max_voice_jobs: int = 2
    """Voice clips (uploads, speech requests' ``ref_audio``, and the wav prompts of ``/encode_latents`` and
    ``/generate``) decoded and encoded at once by one server process (each frontend under ``--workers``), and clips
    encoded or waiting at once on each engine process from every frontend together; more get 503 ``busy`` with
    ``Retry-After`` (a frontend's, before the clip is decoded), so that clips cannot crowd out the streams' CPU."""
    inline_voices: int = 64
    """Voices made from clips sent with a speech request (``ref_audio``) kept encoded, by the clip's content and
    transcript, least recently used dropped first: the same clip again is not decoded or encoded again (0: every
    request's clip is)."""
    voice_aliases: tuple[tuple[str, str], ...] = field(
        default=(), metadata=flag(repeatable=True, parse=alias_arg, metavar="FOREIGN=OURS", shown_default="none")
    )
    """Another API's voice id or name that names one of ours wherever a request names a voice (HTTP, our WebSocket,
    ElevenLabs' routes and sockets), so an agent's configuration works unchanged: ``--voice-alias
    21m00Tcm4TlvDq8ikWAM=voice_0123456789abcdef`` (repeatable; matched ignoring case). Ours is a built-in voice
    (``default``, an OpenAI name) or a saved voice's id; an alias to a voice the server does not have stops it at
    start."""

    def __post_init__(self) -> None:
        _positive_ints(
            self, "max_voices", "max_upload_bytes", "max_transcript_chars", "max_voice_name_chars", "max_voice_jobs"
        )
        _positive_numbers(self, "max_clip_seconds")
        foreign = [name.casefold() for name, _ in self.voice_aliases]
        _check(self, "voice_aliases", self.voice_aliases, len(set(foreign)) == len(foreign), "one voice per name")
        _at_least_zero(self, "inline_voices")


@dataclass(frozen=True)
class PersonaSettings:
    """LoRA personas: those loaded at start, where more may be loaded from, and how many fit."""

    title: ClassVar[str] = "Personas"

    loras: tuple[tuple[str, Path], ...] = field(
        default=(), metadata=flag(repeatable=True, parse=persona_arg, metavar="NAME=DIR", shown_default="none")
    )
    """A LoRA persona loaded before ``/ready``: a name and a checkpoint folder in the reference's fine-tuning
    format (repeatable; [personas](#personas-lora-adapters))."""
    lora_root: Path | None = field(default=None, metadata=flag(shown_default="none: ``POST /v1/loras`` refused"))
    """``POST /v1/loras`` loads only folders inside it (no symbolic link out of it)."""
    max_personas: int = 4
    """LoRA personas resident on the device at once (more are swapped in, least recently used first, never one in
    use)."""
    max_lora_rank: int = 64
    """Largest LoRA rank accepted (``lora_too_large``); resident adapters are padded to it (memory and compute
    per step)."""
    max_loras: int = 64
    """Personas registered at once, ``--lora`` and ``POST /v1/loras`` (``persona_limit``, 409)."""
    persona_slots_per_client: int | None = field(default=None, metadata=flag(shown_default="half of --max-personas"))
    """Resident persona slots one client (an API key; without authentication, a connection) holds at once with its
    running requests, so that no client takes them all; its request for one more persona waits (default: half of
    ``--max-personas``, at least 1; [personas](#personas-lora-adapters))."""
    max_persona_wait_s: float = 20.0
    """How long a request may wait in the engine's queue for a persona slot (all held by other personas' running
    requests, or its client at ``--persona-slots-per-client``) before it is refused 503 ``busy`` with
    ``Retry-After`` (the WebSocket: an ``error`` ``busy``)."""

    def __post_init__(self) -> None:
        _positive_ints(self, "max_personas", "max_lora_rank", "max_loras")
        cap = self.persona_slots_per_client
        _check(self, "persona_slots_per_client", cap, cap is None or (_is_int(cap) and cap > 0), "None or an int > 0")
        _positive_numbers(self, "max_persona_wait_s")
        names = [name for name, _ in self.loras]
        ok = all(isinstance(name, str) and is_persona_name(name) for name in names) and len(set(names)) == len(names)
        _check(self, "loras", self.loras, ok, "distinct names of 1-64 letters, digits or ._-")
        _check(self, "loras", self.loras, len(names) <= self.max_loras, f"at most max_loras={self.max_loras} personas")

    @property
    def slots_per_client(self) -> int:
        """``persona_slots_per_client``, or its default: half of ``max_personas``, at least 1."""
        cap = self.persona_slots_per_client
        return max(1, self.max_personas // 2) if cap is None else cap


@dataclass(frozen=True)
class AudioSettings:
    """How the audio streams are encoded."""

    title: ClassVar[str] = "Audio"

    opus_bitrate: int = DEFAULT_BITRATE
    """Opus bits per second, for every Opus and Ogg Opus stream."""
    opus_complexity: int = DEFAULT_COMPLEXITY
    """Opus encoder complexity, 0-10 (7 and up cost ~5x the CPU of 6 on speech:
    [performance](performance.md#opus-on-speech-complexity-and-bitrate))."""
    encoder_threads: int = 2
    """Threads that run the audio encoders off the event loop (libopus releases the GIL; 0: on the loop)."""

    def __post_init__(self) -> None:
        _positive_ints(self, "opus_bitrate")
        _at_least_zero(self, "encoder_threads")
        try:
            self.opus_settings()
        except ValueError as exc:
            raise ValueError(f"AudioSettings.opus_bitrate/opus_complexity are invalid: {exc}") from None

    def opus_settings(self) -> OpusSettings:
        """How every Opus stream is coded."""
        return OpusSettings(self.opus_bitrate, self.opus_complexity)


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one server process, in groups; defaults suit a single GPU and a trusted local network.

    ``ServerConfig.of(max_sessions=2, port=0)`` makes one from settings named flat, as their flags are.
    """

    engine: EngineSettings = field(default_factory=EngineSettings)
    topology: Topology = field(default_factory=Topology)
    transport: Transport = field(default_factory=Transport)
    limits: Limits = field(default_factory=Limits)
    voices: VoiceSettings = field(default_factory=VoiceSettings)
    personas: PersonaSettings = field(default_factory=PersonaSettings)
    audio: AudioSettings = field(default_factory=AudioSettings)

    def __post_init__(self) -> None:
        devices = self.topology.devices
        _check(self, "devices", devices, not (devices and self.engine.device), "empty when device is given (--device)")

    @classmethod
    def of(cls, **settings: Any) -> ServerConfig:
        """The config with these settings, named flat (``max_sessions=2``), each in its group; the others default."""
        return cls().with_settings(**settings)

    def with_settings(self, **settings: Any) -> ServerConfig:
        """This config with these settings, named flat (``port=0``), replaced in their groups."""
        changes: dict[str, dict[str, Any]] = {}
        for name, value in settings.items():
            if name not in _GROUP_OF:
                raise TypeError(f"ServerConfig has no setting {name!r}")
            changes.setdefault(_GROUP_OF[name], {})[name] = value
        groups = {group: dataclasses.replace(getattr(self, group), **values) for group, values in changes.items()}
        return dataclasses.replace(self, **groups)

    def engine_config(self) -> EngineConfig:
        """The engine's knobs: the engine settings', with the persona admission's (``personas``)."""
        personas = self.personas
        return dataclasses.replace(
            self.engine.engine_config(),
            persona_slots_per_owner=personas.slots_per_client,
            max_persona_wait_s=personas.max_persona_wait_s,
        )

    def engine_devices(self) -> tuple[str | None, ...]:
        """The device of each engine process: ``devices``, or the one ``device``."""
        return self.topology.devices or (self.engine.device,)


_GROUP_OF = {
    setting.name: group
    for group, group_class in get_type_hints(ServerConfig).items()
    for setting in dataclasses.fields(group_class)
}
"""Each setting's group: ``{"max_connections": "limits", ...}``."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (``--host``) is a loopback address, reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: it may name any interface
        return False


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_persona_name(value: str) -> bool:
    return _NAME.fullmatch(value) is not None


def _is_token(value: object) -> bool:
    """Safe as an HTTP header value and in logs: no spaces or control characters."""
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9._:-]{1,253}", value) is not None


def _positive_ints(group: object, *names: str) -> None:
    for name in names:
        value = getattr(group, name)
        _check(group, name, value, _is_int(value) and value > 0, "an int > 0")


def _positive_numbers(group: object, *names: str) -> None:
    for name in names:
        value = getattr(group, name)
        _check(group, name, value, _is_finite(value) and value > 0, "a finite number > 0")


def _at_least_zero(group: object, name: str) -> None:
    value = getattr(group, name)
    _check(group, name, value, _is_int(value) and value >= 0, "an int >= 0")


def _check(group: object, name: str, value: object, ok: bool, rule: str) -> None:
    if not ok:
        raise ValueError(f"{type(group).__name__}.{name}={value!r} is invalid: must be {rule}")
