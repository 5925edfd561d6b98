"""``voxwire serve``: command line → ``ServerConfig`` → the aiohttp app on uvloop, with graceful SIGTERM.

On SIGTERM or SIGINT the server keeps listening while it drains (``/ready`` answers 503, new work is
refused, live utterances finish up to ``--drain-timeout-s``), then closes WebSockets with 1001, stops
the engine and exits 0. The app itself is built by ``voxwire.serving.app.make_app``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from voxwire.cli import environment

if TYPE_CHECKING:
    from voxwire.serving.config import ServerConfig

# Limits exposed as --kebab-case flags of the field's type; the help says what each bounds.
_LIMITS: dict[str, str] = {
    "max_sessions": "engine slots: utterances synthesized at once",
    "max_waiting": "utterances queued for a free slot before requests are refused as busy",
    "max_prefill_tokens_per_step": "prompt positions admitted per engine step",
    "max_length": "LM positions per slot (default: the model's)",
    "max_inference_timesteps": "largest inference_timesteps a client may request",
    "max_connections": "WebSocket connections open at once",
    "max_message_bytes": "largest WebSocket message from a client",
    "max_text_chars_per_message": "largest text of one WebSocket text message",
    "max_text_chars_per_utterance": "largest text of one utterance or speech request",
    "max_upload_bytes": "largest voice-clip upload",
    "max_clip_seconds": "longest voice clip",
    "max_voices": "voices kept in the store",
    "max_voice_jobs": "voice uploads decoded and encoded at once per server process (then 503 busy)",
    "voice_cache_mb": "device memory for encoded voices, MiB, least recently used dropped first (0: none)",
    "max_transcript_chars": "largest transcript of a voice upload",
    "max_voice_name_chars": "largest name of a voice upload",
    "max_queued_utterances": "utterances of one WebSocket not done yet",
    "max_messages_per_s": "client messages per second per WebSocket (burst: one second's worth)",
    "header_timeout_s": "HTTP request headers must arrive within this (also the keep-alive idle time)",
    "body_timeout_s": "an HTTP request body must arrive whole within this",
    "idle_timeout_s": "close a WebSocket idle this long",
    "ping_interval_s": "WebSocket ping period",
    "max_unsent_audio_s": "audio a session may have unsent before it is cut off as too slow",
    "max_buffer_delay_ms": "default wait for more text before speaking an incomplete sentence",
    "playback_lead_ms": "audio a listener buffers before playing, for clients that announce none (real-time)",
    "max_ahead_ms": "a stream this far ahead of its listener skips engine steps (real-time)",
    "drain_timeout_s": "on shutdown, how long live utterances may keep speaking",
    "opus_bitrate": "Opus bitrate, bits per second",
    "opus_complexity": "Opus encoder complexity, 0-10 (7 and up cost ~5x the CPU of 6 on speech)",
    "encoder_threads": "threads running audio encoders off the event loop (0: on the loop)",
    "workers": "frontend processes sharing the port, with one engine process owning the model (default: one per spare "
    "core, at least 1; 0: one process)",
    "liveness_timeout_s": "--workers: a process silent this long is hung; the supervisor ends it (engine: the service "
    "stops; frontend: it is restarted)",
    "max_personas": "LoRA personas resident on the device at once (more are swapped in, least recently used first)",
    "max_lora_rank": "largest LoRA rank accepted (resident adapters are padded to it)",
    "max_loras": "LoRA personas registered at once (--lora and POST /v1/loras)",
}


def register(parser: argparse.ArgumentParser) -> None:
    from voxwire.serving.config import ServerConfig

    defaults = ServerConfig()
    parser.description = (
        "Serve a VoxCPM model: WebSocket /v1/tts/stream, POST /v1/audio/speech, voices, "
        "/v1/loras, /health, /ready, /metrics. Every option may also come from the environment variable shown "
        "with it (the command line wins): switches read true/false, 1/0 or yes/no, repeatable options a "
        "comma-separated list, added to the command line's (VOXWIRE_API_KEYS keeps keys out of ps output)."
    )
    parser.formatter_class = environment.HelpFormatter
    parser.add_argument(
        "--model",
        default=defaults.model,
        help="checkpoint folder, Hugging Face id (e.g. openbmb/VoxCPM2), 'demo' (tiny random model: noise), "
        "or 'sim' (load-testing simulator: no weights, steps paced by --sim-cost, a looped speech clip)",
    )
    parser.add_argument(
        "--sim-cost",
        default=defaults.sim_cost,
        help="with --model sim: one engine step's duration, a sum of a fixed time, a time per decode row "
        "and a time per prefill position",
    )
    parser.add_argument("--host", default=defaults.host, help="interface to listen on (0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=defaults.port, help="TCP port")
    parser.add_argument("--device", help="cuda, cpu, ... (default: cuda when available)")
    parser.add_argument(
        "--devices",
        help="comma-separated devices, one engine process each, e.g. cuda:0,cuda:1 (cpu,cpu for tests); "
        "new utterances go to the engine with the most free capacity; implies --workers 1 at least",
    )
    parser.add_argument("--dtype", help="bfloat16 or float32 (default: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument(
        "--vae-dtype",
        help="dtype of the AudioVAE: float32, float16 or bfloat16 (default: float16 on CUDA if its check decode "
        "passes, else float32; see docs/performance.md)",
    )
    parser.add_argument("--api-key", action="append", default=[], help="accepted API key (repeatable)")
    parser.add_argument(
        "--allowed-origin", action="append", default=[], help="browser Origin allowed to use the API (default: any)"
    )
    parser.add_argument(
        "--lora",
        action="append",
        default=[],
        type=_persona_arg,
        metavar="NAME=DIR",
        help="load a LoRA persona (a checkpoint folder in the reference's fine-tuning format) before serving; "
        "repeatable",
    )
    parser.add_argument("--lora-root", type=Path, help="POST /v1/loras loads only folders inside it (default: refused)")
    parser.add_argument("--voices-dir", type=Path, help="folder where voices persist (default: memory only)")
    parser.add_argument(
        "--replica-id", help="name sent in every response's X-Voxwire-Replica header (default: the hostname)"
    )
    for name, help_text in _LIMITS.items():
        default = getattr(defaults, name)
        kind = float if isinstance(default, float) else int
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default, help=help_text)
    parser.add_argument(
        "--kv-cache-gb",
        type=float,
        help="device memory of the KV block pool, GiB (default: on CUDA what is free after weights and "
        "activations times --gpu-memory-utilization; elsewhere room for --max-sessions at --max-length)",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=defaults.gpu_memory_utilization,
        help="fraction of the GPU's memory the server may use (sizes the default KV cache)",
    )
    parser.add_argument(
        "--realtime",
        action=argparse.BooleanOptionalAction,
        default=defaults.realtime,
        help="schedule engine steps by playback deadline: the step cost is measured at start-up, streams "
        "ahead of their listeners yield to those behind, admission is budgeted by step time "
        "(--no-realtime: every stream decodes every step, FIFO admission by --max-prefill-tokens-per-step)",
    )
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="every session's audio bit for bit what it is alone, whatever else the batch holds (GEMMs over fixed "
        "row tiles, attention in fixed chunks, one prefill at a time; slower)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="least severe log shown"
    )
    parser.set_defaults(func=run)
    environment.read_from_environment(parser)


def _persona_arg(value: str) -> tuple[str, Path]:
    name, sep, folder = value.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {value!r}")
    return name, Path(folder)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServerConfig:
    """The ``ServerConfig`` the arguments describe, each option missing from them read from its ``VOXWIRE_``
    variable in ``environ`` (default: this process's environment), else its default (``cli.environment``)."""
    return _config(environment.with_environment(args, os.environ if environ is None else environ))


def _config(args: argparse.Namespace) -> ServerConfig:
    """The ``ServerConfig`` of arguments that ``with_environment`` has completed."""
    from voxwire.serving.config import ServerConfig

    return ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        sim_cost=args.sim_cost,
        device=args.device,
        devices=tuple(d.strip() for d in args.devices.split(",")) if args.devices else (),
        dtype=args.dtype,
        vae_dtype=args.vae_dtype,
        api_keys=tuple(dict.fromkeys(args.api_key)),
        allowed_origins=tuple(args.allowed_origin),
        voices_dir=args.voices_dir,
        loras=tuple(args.lora),
        lora_root=args.lora_root,
        kv_cache_gb=args.kv_cache_gb,
        gpu_memory_utilization=args.gpu_memory_utilization,
        realtime=args.realtime,
        batch_invariant=args.batch_invariant,
        **({"replica_id": args.replica_id} if args.replica_id else {}),
        **{name: getattr(args, name) for name in _LIMITS},
    )


def run(args: argparse.Namespace) -> int:
    from voxwire.errors import InvalidInputError
    from voxwire.serving.launch import serve

    settings = environment.with_environment(args, os.environ)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = _config(settings)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from exc
    return serve(config)
