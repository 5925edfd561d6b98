"""``voxwire say`` end to end against the real app in process (tiny model on CPU): the audio on stdout is
the engine's for the seed (bit-exact in float), WAV and Ogg Opus files decode, stdin lines are spoken as
they arrive, failures exit with their typed codes, speakers get float PCM, and no torch is imported."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile

from voxwire.audio.pcm import to_s16le
from voxwire.client.connection import endpoint_url
from voxwire.client.errors import OutputUnavailableError
from voxwire.client.output import SpeakerSink, choose_sink
from voxwire.client.say import one_text, say
from voxwire.errors import InvalidInputError
from voxwire.params import SynthesisParams
from voxwire.tts import VoxCPM

from .helpers import TIMEOUT_S, launch, voxwire

pytestmark = pytest.mark.asyncio

TEXT = "Hello there."
SEED = 11


def url(server) -> str:
    return str(server.make_url("/")).replace("http://", "ws://")


@pytest.mark.isa
@pytest.mark.parametrize("fmt", ["pcm_f32le", "pcm_s16le"])
async def test_stdout_pcm_is_the_engines_audio_for_the_seed(serve, tiny_tts: VoxCPM, fmt: str) -> None:
    server = await serve()
    result = await voxwire("say", "--server", url(server), "--seed", str(SEED), "--format", fmt, "--out", "-", TEXT)
    assert result.returncode == 0, result.stderr
    expected = tiny_tts.generate(TEXT, SynthesisParams(seed=SEED))
    if fmt == "pcm_f32le":
        np.testing.assert_array_equal(np.frombuffer(result.stdout, dtype="<f4"), expected)
    else:
        assert result.stdout == to_s16le(expected)


async def test_quiet_says_nothing_on_success(serve, tmp_path: Path) -> None:
    server = await serve()
    result = await voxwire("say", "--server", url(server), "--quiet", "--out", str(tmp_path / "a.wav"), TEXT)
    assert result.returncode == 0 and result.stderr == ""


@pytest.mark.isa
async def test_wav_to_stdout_and_to_a_file_read_back_with_soundfile(serve, tiny_tts: VoxCPM, tmp_path: Path) -> None:
    server = await serve()
    path = tmp_path / "hello.wav"
    piped = await voxwire("say", "--server", url(server), "--seed", str(SEED), "--out", "-", TEXT)
    saved = await voxwire("say", "--server", url(server), "--seed", str(SEED), "--out", str(path), TEXT)
    assert piped.returncode == saved.returncode == 0, piped.stderr + saved.stderr
    # Each ends with one summary line on stderr: what it wrote, where, how soon the audio came.
    assert (
        "voxwire say: spoke " in piped.stderr and " s of audio to standard output, first audio after " in piped.stderr
    )
    assert f" s of audio to {path}, first audio after " in saved.stderr

    expected = np.frombuffer(to_s16le(tiny_tts.generate(TEXT, SynthesisParams(seed=SEED))), dtype="<i2")
    streamed, rate = soundfile.read(io.BytesIO(piped.stdout), dtype="int16")  # streaming header: sizes unknown
    np.testing.assert_array_equal(streamed, expected)
    assert rate == 48000 and piped.stdout[4:8] == b"\xff\xff\xff\xff"
    info = soundfile.info(path)  # a file gets its real sizes patched in at the end
    assert (info.frames, info.samplerate, info.subtype) == (expected.size, 48000, "PCM_16")
    np.testing.assert_array_equal(soundfile.read(path, dtype="int16")[0], expected)


async def test_ogg_opus_file_decodes_to_the_utterance_length(serve, tiny_tts: VoxCPM, tmp_path: Path) -> None:
    server = await serve()
    path = tmp_path / "hello.ogg"  # the extension picks Ogg Opus
    result = await voxwire("say", "--server", url(server), "--seed", str(SEED), "--out", str(path), TEXT)
    assert result.returncode == 0, result.stderr
    decoded, rate = soundfile.read(path, dtype="float32")
    assert path.read_bytes()[:4] == b"OggS" and rate == 48000
    assert decoded.size == tiny_tts.generate(TEXT, SynthesisParams(seed=SEED)).size


async def test_format_opus_writes_ogg_opus_to_stdout(serve, tiny_tts: VoxCPM) -> None:
    server = await serve()
    result = await voxwire("say", "--server", url(server), "--seed", str(SEED), "--format", "opus", "--out", "-", TEXT)
    assert result.returncode == 0, result.stderr
    decoded, rate = soundfile.read(io.BytesIO(result.stdout), dtype="float32")
    assert result.stdout[:4] == b"OggS" and rate == 48000
    assert decoded.size == tiny_tts.generate(TEXT, SynthesisParams(seed=SEED)).size


async def test_stdin_lines_are_spoken_as_they_arrive(serve) -> None:
    server = await serve()
    process = await launch("say", "-v", "--server", url(server), "--format", "pcm_s16le", "--out", "-", "-")
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    process.stdin.write(b"The first line is here.\n")
    await process.stdin.drain()
    # Audio of line 1 arrives while line 2 has not been written yet.
    first_audio = await asyncio.wait_for(process.stdout.read(4096), TIMEOUT_S)
    assert first_audio
    process.stdin.write(b"And then a second one.\n")
    process.stdin.close()
    rest, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    log = stderr.decode()
    assert process.returncode == 0, log
    assert "segment 0: 'The first line is here.'" in log and "segment 1: 'And then a second one.'" in log
    assert log.index("time to first audio") < log.index("segment 1")
    assert len(first_audio + rest) % 2 == 0 and len(rest) > 0


@pytest.mark.slow
async def test_failures_exit_with_typed_codes(serve) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    unreachable = await voxwire("say", "--server", dead, "--out", "-", TEXT)
    assert unreachable.returncode == 3 and "cannot connect" in unreachable.stderr

    server = await serve(api_keys=("sesame",))
    refused = await voxwire("say", "--server", url(server), "--out", "-", TEXT)
    assert refused.returncode == 4 and "HTTP 401" in refused.stderr and "--token" in refused.stderr
    env = {**os.environ, "VOXWIRE_TOKEN": "sesame"}
    allowed = await voxwire("say", "--server", url(server), "--voice", "nobody", "--out", "-", TEXT, env=env)
    assert allowed.returncode == 5 and "unknown_voice" in allowed.stderr
    spoken = await voxwire("say", "--server", url(server) + "v1/tts/stream", "--token", "sesame", "--out", "-", TEXT)
    assert spoken.returncode == 0 and spoken.stdout[:4] == b"RIFF"


@pytest.mark.slow
@pytest.mark.isa
async def test_a_persona_speaks_its_own_audio(serve, persona_app, persona_tts: VoxCPM) -> None:
    server = await serve(app=persona_app())
    command = ("say", "--server", url(server), "--seed", str(SEED), "--format", "pcm_f32le", "--out", "-")
    result = await voxwire(*command, "--persona", "A", TEXT)
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(
        np.frombuffer(result.stdout, dtype="<f4"), persona_tts.generate(TEXT, SynthesisParams(seed=SEED), lora="A")
    )
    unknown = await voxwire(*command, "--persona", "nobody", TEXT)
    assert unknown.returncode == 5 and "unknown_persona" in unknown.stderr


class FakeOutputStream:
    """Stands in for ``sounddevice.RawOutputStream``: records what would have been played."""

    def __init__(self, *, samplerate: int, channels: int, dtype: str) -> None:
        self.settings = (samplerate, channels, dtype)
        self.state = "new"
        self.played: list[bytes] = []

    def start(self) -> None:
        self.state = "started"

    def write(self, data: bytes) -> None:
        assert self.state == "started"
        self.played.append(data)

    def stop(self) -> None:
        self.state = "stopped"

    def close(self) -> None:
        assert self.state == "stopped", "close only after stop (which waits for the audio to play out)"


@pytest.mark.isa
async def test_speakers_play_the_engines_float_audio(serve, tiny_tts: VoxCPM) -> None:
    server = await serve()
    fake = types.SimpleNamespace(RawOutputStream=FakeOutputStream)
    sink = SpeakerSink(fake)  # type: ignore[arg-type]
    result = await say(url(server), one_text(TEXT), sink, seed=SEED)
    assert sink.stream.settings == (48000, 1, "float32") and sink.stream.state == "stopped"
    played = np.frombuffer(b"".join(sink.stream.played), dtype="<f4")
    np.testing.assert_array_equal(played, tiny_tts.generate(TEXT, SynthesisParams(seed=SEED)))
    assert result.ttfa_s is not None and result.done.finish_reason in ("stop", "length")


async def test_without_speakers_a_terminal_gets_an_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # import fails as if not installed
    terminal = types.SimpleNamespace(isatty=lambda: True)
    with pytest.raises(OutputUnavailableError, match=r"voxwire\[speakers\].*--out"):
        choose_sink(None, "wav", stdout=terminal)  # type: ignore[arg-type]
    piped = io.BytesIO()
    assert choose_sink(None, "wav", stdout=piped).stream is piped  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", ["say", "bench"])
async def test_the_clients_import_no_torch(serve, tmp_path: Path, command: str) -> None:
    server = await serve()
    args = {
        "say": ["say", "--server", url(server), "--out", str(tmp_path / "a.wav"), TEXT],
        "bench": ["bench", "--server", url(server), "--duration", "1", "--quiet", "--json", str(tmp_path / "b.json")],
    }[command]
    script = (
        "import sys\nfrom voxwire.cli.main import main\n"
        f"code = main({args!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    assert process.returncode == 0, stderr.decode()


async def test_server_addresses_resolve_to_the_stream_endpoint() -> None:
    from voxwire.serving.ws.handler import STREAM_PATH

    assert endpoint_url("127.0.0.1:8000") == f"ws://127.0.0.1:8000{STREAM_PATH}"
    assert endpoint_url("https://tts.example.com/") == f"wss://tts.example.com{STREAM_PATH}"
    assert endpoint_url("ws://h:1/custom/path?x=1") == "ws://h:1/custom/path?x=1"
    with pytest.raises(InvalidInputError, match="--server"):
        endpoint_url("ftp://h")
