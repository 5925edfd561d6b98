"""Two contexts of one connection in real headless Chromium: the library's `context(id)` prepares a second turn
while the first is spoken, both are decoded by WebCodecs, and they play one after the other through the one
worklet, every decoded sample once (what the live counters, ``window.voxwireStats``, report)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import OPUS_PACKET_SAMPLES, WAIT_MS, DemoServer, open_demo, stats

pytestmark = pytest.mark.asyncio

TWO_TURNS = """async () => {
    const tts = window.voxwireClient;
    window.firsts = [];
    tts.addEventListener('firstAudio', (event) => window.firsts.push(event.detail.utterance));
    const next = tts.context('turn-2');
    const ready = await next.configure({ seed: 5 });
    tts.text('This is the first turn, spoken right now. ');
    tts.end();
    next.text('The second turn was prepared meanwhile. ');
    next.end();
    return ready.context_id;
}"""


@pytest.mark.slow
async def test_a_prepared_context_plays_after_the_current_turn(page: Any, demo_server: DemoServer) -> None:
    server = await demo_server()
    await open_demo(page, server, lead_ms=300)
    await page.fill("#text", "Hello.")
    await page.click("#play")  # the page makes its client and speaks once
    played_out = "n => s => s.utterancesDone >= n && s.bufferedSamples === 0 && s.samplesPlayed > 0"
    await page.wait_for_function(f"() => ({played_out})(1)(window.voxwireStats)", timeout=WAIT_MS)
    before = await stats(page)

    assert await page.evaluate(TWO_TURNS) == "turn-2"
    await page.wait_for_function(f"() => ({played_out})(3)(window.voxwireStats)", timeout=WAIT_MS)
    after = await stats(page)
    dones = await page.evaluate("() => window.dones")
    pre_skip = await page.evaluate("() => window.voxwireClient.settings.pre_skip")

    turns = {done.get("context_id"): done for done in dones[1:]}
    assert set(turns) == {None, "turn-2"} and all(d["finish_reason"] in ("stop", "length") for d in turns.values())
    assert turns[None]["utterance"] == 1 and turns["turn-2"]["utterance"] == 2
    assert await page.evaluate("() => window.firsts") == [1, 2], "the prepared turn plays after the current one"
    decoded = after["packetsDecoded"] - before["packetsDecoded"]
    # Each turn is its own Opus stream: every decoded sample but each one's pre-skip played, none twice.
    assert after["samplesPlayed"] - before["samplesPlayed"] == decoded * OPUS_PACKET_SAMPLES - 2 * pre_skip
    assert page.errors == []
