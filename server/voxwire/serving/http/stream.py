"""``stream_audio``: an utterance's encoded audio as a chunked HTTP body, shared by the OpenAI and Nano-vLLM APIs;
``whole_audio``: the same audio as one file, for a client that asks for it whole (``stream: false``).

The body streams as the audio is generated; an utterance that ends early (engine error or death, shutdown past
the drain timeout) cuts the chunked body short instead of ending it cleanly, so no client mistakes it for a
whole one: one INFO line, and the connection is aborted (``ResponseCut``). A whole file is only sent once the
utterance has finished, so one that ends early is answered with its error instead. HTTP streams rely on TCP
backpressure: a stalled reader stalls its handler (until the write deadline, ``connections``), and the engine's
per-request channel holds at most that utterance's audio.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

from aiohttp import web

from voxwire.audio.formats import StreamEncoder, whole_file
from voxwire.engine import Chunk, FinishReason
from voxwire.serving.edge.api_errors import ResponseCut
from voxwire.serving.http.trace_middleware import utterance_trace
from voxwire.serving.runtime.keys import (
    ENCODERS_KEY,
    METRICS_KEY,
    SPEAKER_KEY,
)
from voxwire.serving.runtime.tracing import UtteranceTrace
from voxwire.serving.speech.service import SpeechFailure

logger = logging.getLogger(__name__)


async def stream_audio(
    request: web.Request,
    outputs: AsyncGenerator[Chunk, None],
    encoder: StreamEncoder,
    headers: Mapping[str, str],
    frame: Callable[[bytes], bytes] = bytes,
) -> tuple[web.StreamResponse, int]:
    """Stream an utterance's encoded audio as a chunked body, each encoded block through ``frame``; the response
    (not ended yet: the caller may add a trailer, then ``write_eof``) and the patches generated."""
    response = web.StreamResponse(headers=headers)
    response.enable_chunked_encoding()

    async def start() -> None:
        await response.prepare(request)

    async def write(block: bytes) -> None:
        await response.write(frame(block))

    with utterance_trace(request) as trace:
        return response, await _speak(request, outputs, encoder, trace, start, write)


async def whole_audio(
    request: web.Request, outputs: AsyncGenerator[Chunk, None], encoder: StreamEncoder
) -> tuple[bytes, int]:
    """An utterance's encoded audio as one file with its real sizes (``formats.whole_file``), once it has finished,
    and the patches generated; an utterance that ends early raises its ``SpeechFailure`` (its error response)."""
    blocks: list[bytes] = []

    async def start() -> None:
        pass

    async def write(block: bytes) -> None:
        blocks.append(block)

    with utterance_trace(request) as trace:
        patches = await _speak(request, outputs, encoder, trace, start, write, streamed=False)
    return whole_file(encoder, b"".join(blocks)), patches


async def _speak(
    request: web.Request,
    outputs: AsyncGenerator[Chunk, None],
    encoder: StreamEncoder,
    trace: UtteranceTrace,
    start: Callable[[], Awaitable[None]],
    write: Callable[[bytes], Awaitable[None]],
    *,
    streamed: bool = True,
) -> int:
    """Encode the utterance's outputs and ``write`` each block, after ``start`` (once the first output came: a
    refusal before it is still an error response); the patches generated. A ``streamed`` body is cut short when
    the utterance ends early."""
    app = request.app
    metrics, encoders = app[METRICS_KEY], app[ENCODERS_KEY]
    rate = app[SPEAKER_KEY].info.sample_rate
    started = time.perf_counter()
    # Refusals (busy, a parameter over a limit, an unusable text) surface with the first output,
    # while a proper error status can still be sent.
    output = await anext(outputs)  # a SpeechFailure here becomes its error response
    trace.output(output)
    metrics.observe_first_audio(time.perf_counter() - started)
    await start()
    samples = patches = 0
    try:
        while True:
            samples += output.audio.size
            patches += int(output.audio.size > 0)
            for block in await encoders.encode(encoder, output.audio):
                await write(block)
            if output.finished:
                break
            output = await anext(outputs)
            trace.output(output)
    except (ConnectionResetError, asyncio.CancelledError):
        # aiohttp cancels the handler of a request whose client went away, or a write fails first.
        metrics.count_dropped("client_disconnected")
        raise
    except SpeechFailure as exc:
        # Cut the body short (no final chunk) so the client cannot mistake it for a whole utterance.
        if exc.finish is not None:
            metrics.count_utterance(exc.finish.value)
        metrics.count_dropped("shutdown" if exc.finish is FinishReason.ABORTED else exc.code.value)
        if not streamed:
            raise  # nothing sent yet: the client gets the error itself
        code = exc.code.value
        logger.info("%s %s: cut short, the utterance ended early: %s: %s", request.method, request.path, code, exc)
        if request.transport is not None:
            request.transport.abort()
        raise ResponseCut(f"utterance ended early: {code}: {exc}") from exc
    finally:
        metrics.add_audio(samples / rate)
    reason = output.finish_reason
    assert reason is not None, "the loop ends on the final output"
    metrics.count_utterance(reason.value)
    for block in await encoders.finish(encoder):
        await write(block)
    return patches
