"""A sentence is laid out once, by the engine (issue 30): whatever the topology, the text of a WebSocket sentence or
of ``POST /v1/audio/speech`` goes through the model's tokenizer exactly once, in the process that runs the engine,
and the SSE ``usage`` counts the positions the engine laid out (not a second estimate made by the frontend).

One tokenization is what a sentence in the model's default voice needs: its target text alone (the layout reuses
those ids for the prompt; ``sequence.lay_out``). A sentence continuing a voice's transcript needs two, as the
reference's layout does (the target alone for the length cap, the transcript and the target together for the
prompt); ``tests/engine/test_model_runner.py`` counts that case.

How the server's processes are asked: as in ``test_frontend_imports``, a ``sitecustomize`` module on the server's
``PYTHONPATH`` runs in every Python process at start-up, spawned children included; here it wraps
``TextTokenizer.encode`` to append each text it is given to ``<folder>/<pid>.jsonl``. Nothing is added to the
server itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from tests.server_process import ServerProcess

from voxwire.client.connection import Connection
from voxwire.protocol.wire import Done
from voxwire.tts import VoxCPM

from .helpers import utterance

pytestmark = pytest.mark.slow  # two servers (one with an engine process), ~45 s on two cores

WS_SENTENCE = "The zebra finch sings to the morning."
HTTP_SENTENCE = "A wombat answers over plain HTTP."

ENCODES_HOOK = textwrap.dedent(
    """
    import json, os
    from voxwire.text import tokenizer

    _encode = tokenizer.TextTokenizer.encode

    def _counted_encode(self, text):
        path = os.path.join(os.environ["VOXWIRE_TEST_ENCODES_DIR"], f"{os.getpid()}.jsonl")
        with open(path, "a") as file:
            file.write(json.dumps(text) + "\\n")
        return _encode(self, text)

    tokenizer.TextTokenizer.encode = _counted_encode
    """
)
"""``sitecustomize.py`` for the server's processes: every ``TextTokenizer.encode`` call is logged with its text."""


@pytest.fixture(params=["0", "1"], ids=["in-process", "workers-1"], scope="module")
def server(
    request: pytest.FixtureRequest, tiny_tts: VoxCPM, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Path]]:
    """A server on the tiny model (``--workers 0``: engine and handlers in one process; ``--workers 1``: the engine
    in a child process), and the folder its processes log their tokenizations to."""
    hook, encodes = tmp_path_factory.mktemp("hook"), tmp_path_factory.mktemp("encodes")
    (hook / "sitecustomize.py").write_text(ENCODES_HOOK)
    python_path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": python_path, "VOXWIRE_TEST_ENCODES_DIR": str(encodes)}
    args = ("--model", tiny_tts.name, "--workers", request.param, "--encoder-threads", "1")
    with ServerProcess(*args, env=env) as process:
        process.wait_ready()
        yield process, encodes


def encoded(folder: Path, word: str) -> list[str]:
    """Every text any of the server's processes tokenized that contains ``word``."""
    texts = [json.loads(line) for log in folder.glob("*.jsonl") for line in log.read_text().splitlines()]
    return [text for text in texts if word in text]


def test_a_websocket_sentence_is_tokenized_once(server: tuple[ServerProcess, Path]) -> None:
    process, encodes = server
    _, done = asyncio.run(speak(process.ws_url, WS_SENTENCE))
    assert done.finish_reason in ("stop", "length")
    assert encoded(encodes, "zebra") == [WS_SENTENCE]


def test_an_http_sentence_is_tokenized_once_and_its_usage_counts_the_engine_s_layout(
    server: tuple[ServerProcess, Path], tiny_tts: VoxCPM
) -> None:
    process, encodes = server
    usage = asyncio.run(sse_usage(process.url, HTTP_SENTENCE))
    assert encoded(encodes, "wombat") == [HTTP_SENTENCE]
    # The model's default voice: the sentence's tokens, then the audio-start position.
    assert usage["input_tokens"] == len(tiny_tts.tokenizer.encode(HTTP_SENTENCE)) + 1
    assert usage["output_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def speak(url: str, text: str) -> tuple[bytes, Done]:
    async with await Connection.open(url, None) as connection:
        return await utterance(connection, text, seed=4)


async def sse_usage(url: str, text: str) -> dict[str, int]:
    """The ``usage`` of the closing event of an SSE speech request."""
    body = {"model": "tts-1", "input": text, "response_format": "pcm", "stream_format": "sse", "seed": 2}
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/audio/speech", json=body) as response:
        assert response.status == 200, await response.text()
        events = (await response.read()).decode().split("\n\n")[:-1]
    done = json.loads(events[-1].removeprefix("data: "))
    assert done["type"] == "speech.audio.done"
    return {key: int(value) for key, value in done["usage"].items()}
