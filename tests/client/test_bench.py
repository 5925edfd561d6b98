"""``voxwire bench``: the player simulation and audio meter on known input, the SLO search on a scripted
server, and runs against the real app in process: every report field per level, open loop with text
streamed word by word, a server-side delay before the first chunk showing up in the measured TTFA, and
the command line writing its table, JSON and PNG."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from voxwire.audio.formats import make_encoder
from voxwire.client.bench.measure import AudioMeter, UtteranceRecord, simulate_player
from voxwire.client.bench.plan import BenchPlan, run_plan
from voxwire.client.bench.runner import BenchConfig, LevelResult, find_max
from voxwire.client.bench.texts import BUILTIN_TEXTS, words
from voxwire.client.errors import ServerError
from voxwire.protocol.wire import AudioFrame
from voxwire.serving.runtime.keys import SPEAKER_KEY

from ..serving.conftest import LORA
from .helpers import voxwire

pytestmark = pytest.mark.asyncio

SHORT_TEXTS = ("Sure, I can help with that.", "The meeting moved to three thirty.", "你好，很高兴认识你。")
DELAY_S = 0.4
PERCENTILES = {"p50", "p90", "p99", "mean", "max"}
LEVEL_FIELDS = {
    "mode", "concurrency", "rate_per_s", "utterances", "failed", "failure_rate", "outcome", "errors",
    "peak_in_flight", "wall_s", "audio_s",
    "audio_per_wall_s", "ttfa_ms", "ttfd_ms", "server_ttfa_ms", "engine_ttfc_ms", "connect_ms", "rtf", "rtf_wall",
    "stall_ms", "chunk_gap_ms", "max_chunk_gap_ms", "underruns", "records",
}  # fmt: skip


def url(server) -> str:
    return str(server.make_url("/")).replace("http://", "ws://")


def config(server, **overrides: Any) -> BenchConfig:
    settings: dict[str, Any] = {"texts": SHORT_TEXTS, "duration_s": 2.0, "progress": False}
    return BenchConfig(server=url(server), **{**settings, **overrides})


# ---- measurement on known input ----------------------------------------------------------------------------------


async def test_player_underruns_only_when_the_buffer_runs_dry() -> None:
    steady = [(0.1 * n, 0.16) for n in range(10)]  # 160 ms of audio every 100 ms: always ahead
    assert simulate_player(steady, 0.2).underruns == 0
    # Starts at 0.1 s (0.32 s buffered), dry at 0.42 s, back to the 0.2 s lead at 1.05 s.
    late = [(0.0, 0.16), (0.1, 0.16), (1.0, 0.16), (1.05, 0.16)]
    result = simulate_player(late, 0.2)
    assert result.underruns == 1 and result.stall_s == pytest.approx(1.05 - 0.42)
    assert simulate_player(late, 2.0).underruns == 0  # never starts before the end: nothing to run dry
    assert simulate_player([(0.0, 0.1), (0.5, 0.1)], 0.05).underruns == 1


async def test_meter_counts_seconds_and_the_first_decodable_frame() -> None:
    audio = np.sin(np.arange(48000, dtype=np.float32) / 10) * 0.5
    for fmt in ("opus", "ogg_opus", "pcm_s16le", "pcm_f32le"):
        encoder, meter = make_encoder(fmt, 48000), AudioMeter(fmt, 48000)
        blocks = [encoder.encode(audio[start : start + 7680]) for start in range(0, audio.size, 7680)]
        blocks.append(encoder.finish())
        fed = [meter.feed(AudioFrame(fmt, 0, n, tuple(block))) for n, block in enumerate(blocks) if block]
        total = sum(seconds for seconds, _ in fed)
        assert fed[0][1], fmt  # the first frame already carries audio a decoder can play
        assert total == pytest.approx(1.0, abs=0.03), fmt  # Opus: whole 20 ms packets plus the pre-skip


async def test_record_derives_rtf_and_gaps() -> None:
    record = UtteranceRecord(level=1, text_chars=10, started_s=0.0, wall_s=1.1)
    record.complete([(0.1, 0.5), (0.3, 0.5), (0.6, 1.0)], decodable_at=0.1, lead_s=0.2)
    assert (record.ttfa_ms, record.ttfd_ms, record.audio_s) == pytest.approx((100, 100, 2.0))
    assert (record.rtf, record.rtf_wall) == pytest.approx((0.5, 0.55))
    assert record.chunk_gaps_ms == pytest.approx([200, 300]) and record.underruns == 0


async def test_words_keep_the_text_and_split_chinese_per_character() -> None:
    assert words("Hello there,  world.") == ["Hello", " there,", "  world."]
    assert words("你好，世界") == ["你", "好", "，", "世", "界"]
    assert all("".join(words(text)) == text for text in BUILTIN_TEXTS)
    assert any(not text.isascii() for text in BUILTIN_TEXTS) and max(map(len, BUILTIN_TEXTS)) > 200


async def test_find_max_doubles_then_bisects() -> None:
    tried: list[int] = []

    async def level(concurrency: int) -> LevelResult:
        tried.append(concurrency)
        ttfa = 100.0 if concurrency <= 5 else 900.0
        record = UtteranceRecord(concurrency, 5, 0.0, ttfa_ms=ttfa)
        return LevelResult("closed", concurrency, records=[record])

    found, results = await find_max(level, slo_p99_ttfa_ms=500, max_concurrency=64)
    assert found == 5 and tried == [1, 2, 4, 8, 6, 5]
    assert [result.level for result in results] == [1, 2, 4, 5, 6, 8]
    tried.clear()
    assert (await find_max(level, slo_p99_ttfa_ms=500, max_concurrency=3))[0] == 3 and tried == [1, 2, 3]


# ---- against the real app --------------------------------------------------------------------------------------


async def test_report_has_every_field_per_level(serve) -> None:
    server = await serve()
    report = await run_plan(BenchPlan(config(server), concurrency=(1, 2), slo_p99_ttfa_ms=10_000))
    assert [level["concurrency"] for level in report["levels"]] == [1, 2] and report["stopped"] is None
    for level in report["levels"]:
        assert level.keys() >= LEVEL_FIELDS and level["failed"] == 0 and level["utterances"] >= level["concurrency"]
        assert (level["failure_rate"], level["outcome"]) == (0.0, "passed")
        for name in ("ttfa_ms", "ttfd_ms", "rtf", "rtf_wall", "chunk_gap_ms", "max_chunk_gap_ms", "stall_ms"):
            assert level[name].keys() >= PERCENTILES and level[name]["p50"] is not None, name
        assert {"total", "utterances_with_underruns"} <= level["underruns"].keys()
        assert level["ttfa_ms"]["p50"] <= level["ttfa_ms"]["p90"] <= level["ttfa_ms"]["p99"]
        assert level["rtf"]["p50"] < level["rtf_wall"]["p50"]  # the second also counts the wait for first audio
        assert level["audio_s"] > 0 and level["peak_in_flight"] == level["concurrency"]
        assert level["meets_slo"] is (level["underruns"]["total"] == 0)
        # The server's share of each TTFA (from its done) lies within what the client measured.
        assert all(0 < r["engine_ttfc_ms"] <= r["server_ttfa_ms"] <= r["ttfa_ms"] for r in level["records"])
    json.dumps(report)  # the report is plain JSON


async def test_open_loop_with_text_streamed_word_by_word(serve) -> None:
    server = await serve()
    plan = BenchPlan(config(server, words_per_second=20.0, format="ogg_opus"), rates=(3.0,))
    [level] = (await run_plan(plan))["levels"]
    assert (level["mode"], level["rate_per_s"], level["failed"]) == ("open", 3.0, 0)
    assert level["utterances"] >= 1 and level["connect_ms"]["p50"] is not None
    # Ogg: decodable once the first audio page is in, never before the first byte.
    assert all(r["ttfd_ms"] >= r["ttfa_ms"] for r in level["records"])


def delay_first_chunk(app: Any, delay: dict[str, float]) -> None:
    """Hold every engine request's first chunk for ``delay["s"]`` seconds (a test-only stand-in for a slow server)."""
    service = app[SPEAKER_KEY]
    speak = service.speak

    def delayed(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async def stream() -> AsyncIterator[Any]:
            async with contextlib.aclosing(speak(*args, **kwargs)) as outputs:
                first = True
                async for output in outputs:
                    if first and delay["s"]:
                        await asyncio.sleep(delay["s"])
                    first = False
                    yield output

        return stream()

    service.speak = delayed


@pytest.mark.slow
async def test_a_server_side_delay_shows_in_the_printed_ttfa(serve, app_factory, tmp_path: Path) -> None:
    delay = {"s": 0.0}
    app = app_factory()
    server = await serve(app=app)
    delay_first_chunk(app, delay)
    [baseline] = (await run_plan(BenchPlan(config(server, duration_s=3.0))))["levels"]

    delay["s"] = DELAY_S
    report_path, plot_path = tmp_path / "bench.json", tmp_path / "bench.png"
    result = await voxwire(
        "bench", "--server", url(server), "--concurrency", "1", "--duration", "3", "--quiet",
        "--json", str(report_path), "--plot", str(plot_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [delayed] = json.loads(report_path.read_text())["levels"]
    base, slow = baseline["ttfa_ms"], delayed["ttfa_ms"]
    print(f"baseline TTFA p50 {base['p50']:.0f} ms, with {DELAY_S * 1000:.0f} ms injected {slow['p50']:.0f} ms")
    assert delayed["failed"] == 0 and min(r["ttfa_ms"] for r in delayed["records"]) >= DELAY_S * 1000
    assert DELAY_S * 1000 + 0.5 * base["p50"] <= slow["p50"] <= DELAY_S * 1000 + base["p99"] + 150
    assert delayed["ttfd_ms"]["p50"] >= DELAY_S * 1000
    # The printed table carries the same numbers.
    row = next(line for line in result.stdout.decode().splitlines() if line.strip().startswith("c=1"))
    assert f"{slow['p50']:.0f}" in row.split()
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_users_take_the_personas_in_turn(serve, persona_app) -> None:
    app = persona_app(lora_root=LORA.parent)
    server = await serve(app=app)
    service = app[SPEAKER_KEY]
    await service.personas.add("B", str(LORA), owner=None)
    used: list[str | None] = []
    speak = service.speak

    def spy(*args: Any, **kwargs: Any) -> Any:
        used.append(args[0].options.persona)  # the persona each engine request is made with (its SpeechJob)
        return speak(*args, **kwargs)

    service.speak = spy  # type: ignore[method-assign]
    report = await run_plan(BenchPlan(config(server, personas=("A", "B"), duration_s=1.0), concurrency=(2,)))
    [level] = report["levels"]
    assert level["failed"] == 0 and set(used) == {"A", "B"} and report["settings"]["personas"] == ("A", "B")
    with pytest.raises(ServerError) as caught:  # checked before the run
        await run_plan(BenchPlan(config(server, personas=("A", "nobody"))))
    assert caught.value.code == "unknown_persona"


async def test_users_ramp_up_evenly_and_each_utterance_names_its_user(serve) -> None:
    server = await serve()
    ramp = BenchPlan(config(server, duration_s=2.5, ramp_up_s=1.5), concurrency=(3,))
    [level] = (await run_plan(ramp))["levels"]
    first_start = {}
    for record in sorted(level["records"], key=lambda record: record["started_s"]):
        first_start.setdefault(record["user"], record["started_s"])
    assert sorted(first_start) == [0, 1, 2]
    for user, started in first_start.items():  # user k of 3 starts 0.5 k s into the level
        assert 0.5 * user <= started < 0.5 * user + 0.4, first_start
    cold = BenchPlan(config(server, duration_s=1.0, ramp_up_s=0.0), concurrency=(3,))
    [together] = (await run_plan(cold))["levels"]
    assert min(record["started_s"] for record in together["records"] if record["user"] == 2) < 0.1  # no ramp


async def test_users_ramp_up_over_the_first_second_by_default(serve) -> None:
    server = await serve()
    report = await run_plan(BenchPlan(config(server, duration_s=2.0), concurrency=(4,)))
    [level] = report["levels"]
    assert report["settings"]["ramp_up_s"] == 1.0
    last = min(record["started_s"] for record in level["records"] if record["user"] == 3)
    assert 0.75 <= last < 0.75 + 0.4
    short = BenchConfig(server="ws://localhost:1", texts=SHORT_TEXTS, duration_s=1.0)
    assert short.effective_ramp_up_s == 0.5  # at most half of a short level


async def test_a_ramp_must_fit_in_the_level() -> None:
    with pytest.raises(ValueError, match=r"ramp_up_s=3\.0 is invalid"):
        BenchConfig(server="ws://localhost:1", texts=SHORT_TEXTS, duration_s=2.0, ramp_up_s=3.0)
    with pytest.raises(ValueError, match=r"ramp_up_s=-1\.0 is invalid"):
        BenchConfig(server="ws://localhost:1", texts=SHORT_TEXTS, duration_s=2.0, ramp_up_s=-1.0)
