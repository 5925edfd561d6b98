"""Nano-vLLM-VoxCPM's HTTP API (its ``deployment/app``), so its clients work against ``voxwire serve`` unchanged.

=================================  ============================================================================
``POST /generate``                 ``target_text``; prompt by ``prompt_wav_base64`` + ``prompt_wav_format`` or
                                   ``prompt_latents_base64``, with ``prompt_text``; reference audio by
                                   ``ref_audio_wav_base64`` + ``ref_audio_wav_format`` or
                                   ``ref_audio_latents_base64``; ``lora_name``, ``max_generate_length`` (2000),
                                   ``temperature`` (1.0), ``cfg_value`` (1.5), ``seed``, ``response_format``
                                   (``mp3``, the default, or ``pcm``: s16le at the model's rate). Streams the
                                   audio with ``X-Audio-Sample-Rate``, ``X-Audio-Channels`` and
                                   ``X-Audio-Encoding`` (``mp3`` or ``s16le``).
``POST /encode_latents``           ``{wav_base64, wav_format}`` -> ``{prompt_latents_base64, feat_dim,
                                   latents_dtype, sample_rate, channels}`` (float32 bytes, rows of ``feat_dim``)
``GET /info``                      ``{model, lora, mp3}``
``GET /loras``, ``POST /loras``,   ``[{name}]``; ``{name, path}`` -> ``{name}``; ``{name}``
``DELETE /loras/{name}``
=================================  ============================================================================

Errors have that API's shape, ``{"detail": "..."}``, plus the ``request_id`` every error body carries: 400 for
invalid input (an unregistered ``lora_name`` included), 422 for a body that does not match the schema (``detail`` is
a list of ``{loc, msg, type}``), 503 while the server is not ready. Unknown fields are ignored, as its schemas do.
The work itself is voxwire's: the same engine, personas (``/loras`` is ``/v1/loras`` under another shape), voice
encoding and the mp3 encoder of ``/v1/audio/speech``. ``temperature`` scales the diffusion noise in Nano-vLLM;
voxwire's sampler has no such knob, so only 1.0 (the default) is accepted.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import hdrs, web

from voxwire.audio.clip import ClipTooLongError
from voxwire.audio.formats import AudioFormat, make_encoder
from voxwire.audio.mp3 import MP3_BITRATE
from voxwire.engine import Priority, SynthesisParams
from voxwire.errors import InvalidInputError
from voxwire.prompt import Patches, VoicePrompt
from voxwire.protocol.error_codes import ErrorCode
from voxwire.serving.edge.admission import require_accepting, require_admission
from voxwire.serving.edge.api_errors import ApiError, as_api_error
from voxwire.serving.edge.request_id import request_id
from voxwire.serving.http.body import read_json
from voxwire.serving.http.clips import encode_clip
from voxwire.serving.http.loras import persona_registry
from voxwire.serving.http.priority import request_priority
from voxwire.serving.http.request_models import ENCODE_LATENTS, GENERATE, NANO_LORA, Problem, RequestModel, Rule
from voxwire.serving.http.stream import stream_audio
from voxwire.serving.runtime.keys import CONFIG_KEY, METRICS_KEY, OWNER_KEY, SPEAKER_KEY, STATE_KEY, VOICES_KEY
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.persona_names import PersonaLoadError, UnknownPersonaError, client_owner, persona_targets
from voxwire.serving.speech.service import SpeechJob, UtteranceOptions

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_MP3_QUALITY = 2
"""What ``/info`` reports as the mp3 quality preset (LAME's scale; the encoder runs libmp3lame's default)."""


def add_nanovllm_routes(app: web.Application) -> None:
    app.router.add_post("/generate", _detail_errors(generate))
    app.router.add_post("/encode_latents", _detail_errors(encode_latents))
    app.router.add_get("/info", _detail_errors(info))
    app.router.add_get("/loras", _detail_errors(list_loras))
    app.router.add_post("/loras", _detail_errors(register_lora))
    app.router.add_delete("/loras/{name}", _detail_errors(unregister_lora))


def _detail_errors(handler: Handler) -> Handler:
    """Errors as FastAPI's ``{"detail": ...}`` (what that API's clients read), counted like the others."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except (UnknownPersonaError, PersonaLoadError) as exc:  # that API answers 400 for every LoRA refusal
            error = ApiError(ErrorCode(getattr(exc, "code", ErrorCode.UNKNOWN_PERSONA)), str(exc), status=400)
        except SchemaError as exc:
            request.app[METRICS_KEY].count_error("invalid_request")
            return web.json_response({"detail": exc.detail, "request_id": request_id(request)}, status=422)
        except Exception as exc:
            found = as_api_error(exc)
            if found is None or (request.writer is not None and request.writer.output_size > 0):
                raise  # a server bug (the error middleware logs it), or a stream already under way
            error = found
        request.app[METRICS_KEY].count_error(error.code.value)
        body = {"detail": error.message, "request_id": request_id(request)}
        return web.json_response(body, status=error.status, headers=error.headers)

    return wrapped


class SchemaError(Exception):
    """A body that does not match the schema: FastAPI's 422 ``detail`` list."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__(detail)
        self.detail = detail


_FASTAPI_TYPES = {
    Rule.NOT_OBJECT: "dict_type",
    Rule.MISSING: "missing",
    Rule.TYPE: "type",
    Rule.NOT_FINITE: "finite_number",
    Rule.MINIMUM: "greater_than_equal",
    Rule.CHOICE: "literal_error",
}
"""The rules its FastAPI schemas hold (422, with pydantic's error types); the others are that API's 400s."""


def _parse(body: object, model: RequestModel, config: ServerConfig) -> dict[str, Any]:
    """The model's fields of ``body`` (others ignored); a ``SchemaError`` listing every schema problem, else a
    400 for the first other one (a blank or overlong text)."""
    checked = model.check(body, config)
    schema = [problem for problem in checked.problems if problem.rule in _FASTAPI_TYPES]
    if schema:
        raise SchemaError([_detail(problem) for problem in schema])
    if checked.problems:
        raise _bad(checked.problems[0].message)
    return checked.values


def _detail(problem: Problem) -> dict[str, Any]:
    """One problem as a pydantic error: ``loc``, ``msg`` and ``type``."""
    if problem.rule is Rule.NOT_OBJECT:
        message = "Input should be a valid dictionary"
    elif problem.rule is Rule.MISSING:
        message = "Field required"
    elif problem.rule is Rule.MINIMUM:
        message = f"Input should be >= {problem.bound}"
    elif problem.rule is Rule.CHOICE:
        message = f"Input should be one of {problem.bound}"
    else:
        message = problem.message
    loc = ["body"] if problem.field is None else ["body", problem.field]
    return {"loc": loc, "msg": message, "type": _FASTAPI_TYPES[problem.rule]}


def _bad(message: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_REQUEST, message)


# ---- generate ----------------------------------------------------------------------------------


async def generate(request: web.Request) -> web.StreamResponse:
    app = request.app
    require_admission(app, connection=False)
    config, service = app[CONFIG_KEY], app[SPEAKER_KEY]
    body = await read_json(request, config.limits.body_timeout_s, _body_limit(config))
    fields = {**GENERATE.defaults(), **_parse(body, GENERATE, config)}  # its defaults differ from /v1/audio/speech's
    _check_prompt_fields(fields)
    if fields["temperature"] != 1.0:
        raise _bad("temperature other than 1.0 is not supported by this server's sampler")
    lora = fields.get("lora_name")
    if lora is not None and (service.personas is None or lora not in service.personas.names()):
        raise _bad(f"LoRA '{lora}' is not registered")
    text = fields["target_text"]
    try:
        params = SynthesisParams(
            cfg_value=float(fields["cfg_value"]), max_len=fields["max_generate_length"], seed=fields.get("seed")
        )
        config.engine.engine_config().limits.check(params)
    except ValueError as exc:
        raise _bad(str(exc)) from exc
    voice = await _voice(app, fields)
    pcm = fields["response_format"] == "pcm"
    rate = service.info.sample_rate
    encoder = make_encoder(AudioFormat.PCM_S16LE if pcm else AudioFormat.MP3, rate)
    headers = {
        hdrs.CONTENT_TYPE: f"audio/L16;rate={rate};channels=1" if pcm else "audio/mpeg",
        "X-Audio-Sample-Rate": str(rate),
        "X-Audio-Channels": "1",
        "X-Audio-Encoding": "s16le" if pcm else "mp3",
    }
    with app[STATE_KEY].utterance():  # a drain lets it finish, as it does a /v1/audio/speech request
        owner = client_owner(request.get(OWNER_KEY), request.protocol)
        priority = request_priority(request, None if "priority" not in fields else Priority(fields["priority"]))
        # No lead bound: the reader wants the audio as fast as it comes (engine.policy, rule 5).
        options = UtteranceOptions(lora, owner=owner, max_ahead_s=math.inf, priority=priority)
        job = SpeechJob(service.new_request_id("generate"), text, params, voice, options)
        outputs = service.speak(job)
        async with contextlib.aclosing(outputs):
            response, _ = await stream_audio(request, outputs, encoder, headers)
        await response.write_eof()
    return response


def _check_prompt_fields(fields: dict[str, Any]) -> None:
    """That API's rules: one prompt form (wav or latents, each with ``prompt_text``) or zero-shot, one reference
    form; their messages too."""
    has_wav = "prompt_wav_base64" in fields or "prompt_wav_format" in fields
    has_latents = "prompt_latents_base64" in fields
    has_ref_wav = "ref_audio_wav_base64" in fields or "ref_audio_wav_format" in fields
    if has_wav and has_latents:
        raise _bad("prompt_wav_* and prompt_latents_base64 are mutually exclusive")
    if has_ref_wav and "ref_audio_latents_base64" in fields:
        raise _bad("ref_audio_wav_* and ref_audio_latents_base64 are mutually exclusive")
    if has_ref_wav and not ("ref_audio_wav_base64" in fields and "ref_audio_wav_format" in fields):
        raise _bad("reference wav requires ref_audio_wav_base64 + ref_audio_wav_format")
    if has_wav and not ("prompt_wav_base64" in fields and "prompt_wav_format" in fields):
        raise _bad("wav prompt requires prompt_wav_base64 + prompt_wav_format")
    prompt_text = fields.get("prompt_text") or ""
    if (has_wav or has_latents) and not prompt_text:
        raise _bad(f"{'wav' if has_wav else 'latents'} prompt requires non-empty prompt_text")
    if not (has_wav or has_latents) and prompt_text:
        raise _bad("prompt_text is not allowed for zero-shot")


async def _voice(app: web.Application, fields: dict[str, Any]) -> VoicePrompt | None:
    """The request's voice: prompt and reference audio, each encoded here from a clip or given as latents."""
    prompt = await _patches(app, fields, "prompt")
    reference = await _patches(app, fields, "ref_audio")
    if prompt is None and reference is None:
        return None
    try:
        return VoicePrompt(fields.get("prompt_text", "") if prompt is not None else "", prompt, reference)
    except InvalidInputError as exc:
        raise _bad(str(exc)) from exc


async def _patches(app: web.Application, fields: dict[str, Any], prefix: str) -> Patches | None:
    latents = fields.get(f"{prefix}_latents_base64")
    if latents is not None:
        return _latent_patches(latents, f"{prefix}_latents_base64", app[VOICES_KEY].patch_shape, _max_patches(app))
    wav = fields.get(f"{prefix}_wav_base64")
    if wav is None:
        return None
    return await _encode(app, _b64(wav, f"{prefix}_wav_base64"), reference=prefix == "ref_audio")


def _max_patches(app: web.Application) -> int:
    """Patches of latents a prompt may hold: those of a clip of ``max_clip_seconds``, as an upload's."""
    info = app[SPEAKER_KEY].info
    return math.ceil(app[CONFIG_KEY].voices.max_clip_seconds * info.sample_rate / info.samples_per_patch)


def _b64(value: str, name: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _bad(f"Invalid base64 in {name}: {exc}") from exc


def _latent_patches(value: str, name: str, patch_shape: tuple[int, int], max_patches: int) -> Patches:
    """``/encode_latents``' float32 rows of ``feat_dim`` back into whole patches (N, P, D), at most
    ``max_patches`` of them: the length is checked on the base64 text, before anything is decoded."""
    patch, dim = patch_shape
    if len(value) > 4 * math.ceil(max_patches * patch * dim * 4 / 3):
        raise _bad(f"{name} holds more than {max_patches} patches, the latents of the longest clip allowed")
    data = _b64(value, name)
    if not data or len(data) % (4 * dim * patch):
        raise _bad(f"Invalid latent payload in {name}: expected float32 rows of {dim} in whole patches of {patch}")
    return np.frombuffer(data, dtype="<f4").reshape(-1, patch, dim).astype(np.float32)


async def _encode(app: web.Application, clip: bytes, *, reference: bool) -> Patches:
    """A clip (the bytes of an audio file, any format soundfile reads) as latent patches, encoded by the service
    (off the event loop) the way a prompt clip or, with ``reference``, a reference clip is (they are padded to
    whole patches on opposite sides)."""
    if reference and not app[SPEAKER_KEY].info.reference_cloning:
        raise _bad("Reference audio is not supported by the loaded model")
    try:
        # The transcript does not change the latents; the encoder needs one with prompt audio.
        voice = (await encode_clip(app, clip, None if reference else "-")).prompt
        patches = voice.reference_patches if reference else voice.audio_patches
    except ClipTooLongError as exc:
        raise _bad(str(exc)) from exc
    except InvalidInputError as exc:
        raise _bad(f"the audio is not usable: {exc}") from exc
    assert patches is not None
    return patches


# ---- latents, info, loras ----------------------------------------------------------------------


async def encode_latents(request: web.Request) -> web.Response:
    app = request.app
    require_accepting(app)  # encoding shares the model with the engine: not during warm-up or shutdown
    config = app[CONFIG_KEY]
    fields = _parse(await read_json(request, config.limits.body_timeout_s, _body_limit(config)), ENCODE_LATENTS, config)
    patches = await _encode(app, _b64(fields["wav_base64"], "wav_base64"), reference=False)
    data = patches.reshape(-1, patches.shape[-1]).astype("<f4").tobytes()
    return web.json_response(
        {
            "prompt_latents_base64": base64.b64encode(data).decode("ascii"),
            "feat_dim": int(patches.shape[-1]),
            "latents_dtype": "float32",
            "sample_rate": app[SPEAKER_KEY].info.sample_rate,
            "channels": 1,
        }
    )


def _body_limit(config: ServerConfig) -> int:
    """Room for two base64 clips (prompt and reference, each at most ``max_upload_bytes``) and the text."""
    return (
        2 * (4 * config.voices.max_upload_bytes // 3 + 4) + 4 * config.limits.max_text_chars_per_utterance + 64 * 1024
    )


async def info(request: web.Request) -> web.Response:
    app = request.app
    config, service = app[CONFIG_KEY], app[SPEAKER_KEY]
    registry = service.personas
    infos = await registry.infos() if registry is not None else []
    names = [info.name for info in infos]
    lora = {
        "enabled": registry is not None, "enable_lm": True, "enable_dit": True, "enable_proj": True,
        "max_loras": config.personas.max_personas, "max_lora_rank": config.personas.max_lora_rank,
        **(persona_targets(infos) if registry is not None else {}), "registered_names": names, "loaded": bool(names),
    }  # fmt: skip
    patch_size, feat_dim = app[VOICES_KEY].patch_shape
    model = {
        "sample_rate": service.info.sample_rate, "channels": 1, "feat_dim": feat_dim, "patch_size": patch_size,
        "model_path": service.info.name,
    }  # fmt: skip
    mp3 = {"bitrate_kbps": MP3_BITRATE // 1000, "quality": _MP3_QUALITY}
    return web.json_response({"model": model, "lora": lora, "mp3": mp3})


async def list_loras(request: web.Request) -> web.Response:
    personas = request.app[SPEAKER_KEY].personas
    return web.json_response([{"name": name} for name in (personas.names() if personas is not None else [])])


async def register_lora(request: web.Request) -> web.Response:
    app = request.app
    require_accepting(app)
    fields = _parse(await read_json(request, app[CONFIG_KEY].limits.body_timeout_s), NANO_LORA, app[CONFIG_KEY])
    added = await persona_registry(app).add(fields["name"], fields["path"], owner=request.get(OWNER_KEY))
    return web.json_response({"name": added.name})


async def unregister_lora(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    await persona_registry(request.app).remove(name, owner=request.get(OWNER_KEY))
    return web.json_response({"name": name})
