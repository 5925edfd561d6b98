"""``voxwire bench --http`` and mixed runs: the request body (``--priority``) and the HTTP exchange on a scripted
server, the body's audio meter on split chunks, and short runs against the real app over the simulated model
(``--model sim`` with its default flags, real-time pacing on): whole files, streams, a mixed level, and the command
line writing its table, JSON and progress, and failing loudly on refused requests and on a closed port.

No test asserts a speed: an idle sim server may pace a file to real time or run it flat out, and these pass either
way (short texts, levels of 1 to 2 s)."""

from __future__ import annotations

import asyncio
import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from voxwire.audio.formats import OPENAI_RESPONSE_FORMATS
from voxwire.client.bench.http_speech import Priority, post_speech, speech_body, speech_url
from voxwire.client.bench.measure import OPENAI_PCM_RATE, BodyMeter, RequestKind, UtteranceRecord
from voxwire.client.bench.plan import BenchPlan, run_plan
from voxwire.client.bench.runner import BenchConfig, LevelOutcome, LevelResult, level_outcome
from voxwire.client.errors import ServerError, ServerUnreachableError

from .helpers import free_port, voxwire

pytestmark = pytest.mark.asyncio

TEXTS = ("Yes, okay.", "Sure thing.", "One moment.")
"""About 0.7 s of the simulated model's speech each (15 characters a second)."""
PERCENTILES = ("p50", "p90", "p99")


def url(server) -> str:
    return str(server.make_url("/")).replace("http://", "ws://")


def config(server, **overrides: Any) -> BenchConfig:
    settings: dict[str, Any] = {"texts": TEXTS, "duration_s": 1.5, "progress": False}
    return BenchConfig(server=url(server), **{**settings, **overrides})


def ordered(summary: dict[str, Any], name: str) -> bool:
    values = [summary[name][percentile] for percentile in PERCENTILES]
    return None not in values and values == sorted(values)


# ---- what is sent, and how the answer is read -------------------------------------------------------------------


async def test_priority_is_sent_only_as_the_body_field_and_only_for_batch() -> None:
    default = speech_body("Hi.", RequestKind.HTTP_FILE, "pcm")
    assert default == {"model": "voxwire", "input": "Hi.", "response_format": "pcm"}  # realtime: nothing sent
    batch = speech_body("Hi.", RequestKind.HTTP_FILE, "pcm", priority=Priority.BATCH)
    assert batch == {**default, "priority": "batch"}
    stream = speech_body("Hi.", RequestKind.HTTP_STREAM, "wav", voice="v1", seed=3, persona="A")
    assert stream == {
        "model": "voxwire", "input": "Hi.", "response_format": "wav", "stream_format": "audio",
        "voice": "v1", "seed": 3, "persona": "A",
    }  # fmt: skip
    bench = BenchConfig(server="ws://h:1", texts=TEXTS, duration_s=1.0, personas=("A", "B"), priority=Priority.BATCH)
    assert bench.speech_body("Hi.", RequestKind.HTTP_FILE, user=1)["persona"] == "B"
    assert bench.speech_body("Hi.", RequestKind.HTTP_FILE)["priority"] == "batch"


async def test_the_speech_url_follows_the_server_address() -> None:
    assert speech_url("ws://127.0.0.1:8000") == "http://127.0.0.1:8000/v1/audio/speech"
    assert speech_url("127.0.0.1:8000") == "http://127.0.0.1:8000/v1/audio/speech"
    assert speech_url("wss://tts.example/voxwire/v1/tts/stream") == "https://tts.example/voxwire/v1/audio/speech"


async def test_the_meter_counts_split_samples_and_a_split_wav_header() -> None:
    assert OPENAI_RESPONSE_FORMATS["pcm"][1] == OPENAI_PCM_RATE  # the server's pcm rate
    pcm = BodyMeter("pcm")
    assert [pcm.feed(b"\0" * 3), pcm.feed(b"\0" * 1)] == [pytest.approx(1 / 24000), pytest.approx(1 / 24000)]
    header = struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 0xFFFFFFFF, b"WAVE", b"fmt ", 16, 1, 1, 48000, 96000, 2, 16,
                         b"data", 0xFFFFFFFF)  # fmt: skip
    wav = BodyMeter("wav")
    fed = [wav.feed(header[:10]), wav.feed(header[10:] + b"\0" * 960), wav.feed(b"\0" * 96000)]
    assert fed == [0.0, pytest.approx(0.01), pytest.approx(1.0)]  # the header's rate, not pcm's 24 kHz
    with pytest.raises(ValueError, match="not mono s16le"):
        BodyMeter("wav").feed(header.replace(b"WAVE", b"AVI "))


async def scripted_server(answer: bytes) -> tuple[asyncio.Server, list[bytes]]:
    """A server that reads one request (head and body) and answers ``answer``; the requests it read."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"Content-Length: (\d+)", head)[1])  # type: ignore[index]  # bench always sends it
        requests.append(head + await reader.readexactly(length))
        writer.write(answer)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), requests


async def test_a_batch_request_carries_the_field_and_no_priority_header() -> None:
    body = b"\0" * 4800
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:100], body[100:])
    ) + b"0\r\n\r\n"  # fmt: skip
    server, requests = await scripted_server(answer)
    port = server.sockets[0].getsockname()[1]
    async with server:
        speech = speech_body("Hi.", RequestKind.HTTP_FILE, "pcm", priority=Priority.BATCH)
        async with await post_speech(f"http://127.0.0.1:{port}/v1/audio/speech", speech, "key") as response:
            chunks = [chunk async for chunk in response.chunks()]
    assert chunks == [body[:100], body[100:]]  # each chunk as it was sent
    [request] = requests
    head, _, sent = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/audio/speech HTTP/1.1") and b"Authorization: Bearer key" in head
    assert b"priority" not in head.lower() and json.loads(sent)["priority"] == "batch"


async def test_a_cut_body_and_a_refusal_are_typed_errors() -> None:
    cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n"  # no last chunk: aborted
    error = json.dumps({"error": {"code": "text_too_long", "message": "too long"}}).encode()
    refused = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(error), error)
    for answer, code in ((cut, "connection_lost"), (refused, "text_too_long")):
        server, _ = await scripted_server(answer)
        port = server.sockets[0].getsockname()[1]
        async with server:
            with pytest.raises(ServerError) as caught:
                async with await post_speech(f"http://127.0.0.1:{port}/x", {}, None) as response:
                    [_ async for _ in response.chunks()]
        assert caught.value.code == code
    with pytest.raises(ServerUnreachableError):
        await post_speech(f"http://127.0.0.1:{free_port()}/x", {}, None)


async def test_a_mixed_level_fails_when_one_side_fails() -> None:
    live = [UtteranceRecord(4, 5, 0.0) for _ in range(100)]
    files = [UtteranceRecord(2, 5, 0.0, kind=RequestKind.HTTP_FILE, error="timeout") for _ in range(2)]
    mixed = LevelResult("closed", 4, records=live + files, files=2)
    assert level_outcome(mixed, 0.05) is LevelOutcome.FAILED  # 2 of 102 in all, but every file failed
    assert level_outcome(LevelResult("closed", 4, records=live + files), 0.05) is LevelOutcome.PASSED


# ---- against the real app over the simulated model ---------------------------------------------------------------


async def test_whole_files_report_throughput_per_level(serve, sim_app) -> None:
    server = await serve(app=sim_app())
    report = await run_plan(BenchPlan(config(server, kind=RequestKind.HTTP_FILE), concurrency=(1, 2)))
    assert report["stopped"] is None and report["settings"]["kind"] == "http_file"
    for level in report["levels"]:
        assert (level["kind"], level["failed"], level["outcome"], level["errors"]) == ("http_file", 0, "passed", {})
        assert level["completed"] == level["utterances"] >= level["concurrency"]
        assert level["requests_per_s"] > 0 and level["audio_per_wall_s"] > 0 and level["audio_s"] > 0
        assert ordered(level, "rtf_wall") and ordered(level, "ttfb_ms") and level["rtf"]["p50"] is not None
        assert level["peak_in_flight"] == level["concurrency"]
        assert 0 <= level["slower_than_realtime"] <= level["completed"]
        assert "underruns" not in level and "chunk_gap_ms" not in level  # a file is not played as it arrives
        for record in level["records"]:  # TTFB, the first chunk and the last byte come in that order
            assert 0 < record["connect_ms"] <= record["ttfb_ms"] <= record["ttfa_ms"] <= record["wall_s"] * 1000
    json.dumps(report)


async def test_streams_arrive_open_loop_and_are_played(serve, sim_app) -> None:
    server = await serve(app=sim_app())
    plan = BenchPlan(config(server, kind=RequestKind.HTTP_STREAM, response_format="wav"), rates=(4.0,))
    [level] = (await run_plan(plan))["levels"]
    assert (level["kind"], level["mode"], level["rate_per_s"], level["failed"]) == ("http_stream", "open", 4.0, 0)
    assert level["utterances"] >= 1 and level["audio_per_wall_s"] > 0 and ordered(level, "rtf_wall")
    assert level["underruns"]["total"] >= 0 and level["chunk_gap_ms"]["p50"] is not None  # played as it came
    # About 0.7 s each (15 characters a second, +-15 %, whole 160 ms chunks): the 48 kHz samples counted at the WAV
    # header's rate, not at pcm's 24 kHz (which would make them twice as long).
    assert all(0.3 < record["audio_s"] < 1.2 for record in level["records"])


async def test_a_mixed_level_reports_both_sides(serve, sim_app) -> None:
    server = await serve(app=sim_app())
    report = await run_plan(BenchPlan(config(server, files=2), concurrency=(2,), slo_p99_ttfa_ms=10_000))
    [level] = report["levels"]
    assert (level["kind"], level["concurrency"], level["file_concurrency"]) == ("mixed", 2, 2)
    live, files = level["live"], level["files"]
    assert (live["kind"], files["kind"]) == ("websocket", "http_file")
    assert level["utterances"] == live["utterances"] + files["utterances"] and level["failed"] == 0
    assert live["utterances"] >= 2 and files["utterances"] >= 2 and level["outcome"] == "passed"
    assert live["underruns"]["total"] >= 0 and live["chunk_gap_ms"]["p99"] is not None  # the live side
    assert files["requests_per_s"] > 0 and files["audio_per_wall_s"] > 0 and ordered(files, "rtf_wall")
    assert (live["peak_in_flight"], files["peak_in_flight"]) == (2, 2)
    assert {record["kind"] for record in files["records"]} == {"http_file"}
    assert "meets_slo" in level and "meets_slo" in live


async def test_the_command_line_writes_table_json_and_progress(serve, sim_app, tmp_path: Path) -> None:
    server = await serve(app=sim_app())
    report_path, plot_path, texts = tmp_path / "bench.json", tmp_path / "bench.png", tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS))
    result = await voxwire(
        "bench", "--server", url(server), "--http", "file", "--concurrency", "1", "--duration", "1",
        "--texts", str(texts), "--response-format", "wav", "--json", str(report_path), "--plot", str(plot_path),
        "--progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [level] = json.loads(report_path.read_text())["levels"]
    assert level["kind"] == "http_file" and level["completed"] > 0 and level["audio_per_wall_s"] > 0
    assert json.loads(report_path.read_text())["settings"]["response_format"] == "wav"
    row = next(line for line in result.stdout.decode().splitlines() if line.strip().startswith("c=1"))
    assert row.split()[1] == str(level["utterances"]) and "FAILED" not in row
    # stderr is not a terminal here: --progress prints whole lines, with the counts of files.
    assert re.search(r"^1 users: 1/1 s, \d+ files, 0 failed, 0 in flight$", result.stderr, re.M), result.stderr
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_refused_requests_fail_the_run_and_are_listed(serve, sim_app, tmp_path: Path) -> None:
    server = await serve(app=sim_app(max_text_chars_per_utterance=5))  # every text is too long
    report_path = tmp_path / "bench.json"
    result = await voxwire(
        "bench", "--server", url(server), "--files", "1", "--duration", "1", "--quiet", "--json", str(report_path),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "failed more than --max-failure-rate" in result.stderr
    [level] = json.loads(report_path.read_text())["levels"]
    assert level["outcome"] == "failed" and level["files"]["outcome"] == "failed"
    assert set(level["files"]["errors"]) == {"text_too_long"} and level["files"]["failed"] > 0
    stdout = result.stdout.decode()
    assert re.search(r"^failed at c=1\+1f: text_too_long \d+$", stdout, re.M), stdout
    assert [line.split()[-1] for line in stdout.splitlines() if line.strip().startswith("c=1+1f")][-1] == "FAILED"


async def test_a_closed_port_exits_unreachable() -> None:
    result = await voxwire("bench", "--server", f"ws://127.0.0.1:{free_port()}", "--http", "stream", "--quiet")
    assert result.returncode == ServerUnreachableError.exit_code and "cannot connect" in result.stderr


async def test_http_options_are_checked_before_the_run() -> None:
    closed = f"ws://127.0.0.1:{free_port()}"
    for args, message in (
        (("--priority", "batch"), "--priority is for HTTP requests"),
        (("--http", "file", "--words-per-second", "5"), "--words-per-second is for live WebSocket sessions"),
        (("--http", "file", "--find-max", "--slo-p99-ttfa-ms", "500"), "--find-max is for live WebSocket"),
    ):
        result = await voxwire("bench", "--server", closed, "--quiet", *args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
