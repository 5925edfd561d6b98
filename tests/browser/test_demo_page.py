"""The demo page in real headless Chromium against the real server: WebCodecs decodes, the worklet plays.

What the page reports is read from the library's live counters (``window.voxwireStats``):
packets decoded by WebCodecs ``AudioDecoder``, samples output by the ``AudioWorklet``, underruns of
its jitter buffer, and the time from the first text sent to the first sample played.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import soundfile

from voxwire.tts import VoxCPM

from .conftest import (
    DOCS_SCREENSHOT,
    KEY,
    OPUS_PACKET_SAMPLES,
    UPDATE_SCREENSHOT,
    WAIT_MS,
    DemoServer,
    open_demo,
    stats,
    with_page_digest,
)

pytestmark = pytest.mark.asyncio

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
RATE = 48_000
FADE_SAMPLES = 240  # the player's 5 ms fade-out on cancel
QUANTUM = 128  # an AudioWorklet renders in blocks of 128 samples

SENTENCE = "The quick brown fox jumps over the lazy dog, and then it takes a well deserved rest."
PARAGRAPH = " ".join(
    [
        "It was a bright cold day in April, and the clocks were striking thirteen.",
        "Winston Smith slipped quickly through the glass doors of Victory Mansions.",
        "The hallway smelt of boiled cabbage and old rag mats.",
        "At one end of it a coloured poster, too large for indoor display, had been tacked to the wall.",
        "It depicted simply an enormous face, more than a metre wide.",
        "It was the face of a man of about forty-five, with a heavy black moustache.",
    ]
)
TYPED = "Hello, Bravo charlie delta."

# A slow uplink: the page's `cancel` reaches the server 300 ms late, so frames of the cancelled
# utterance keep coming meanwhile and the client must drop them by their utterance number.
DELAY_CANCEL = """
const send = WebSocket.prototype.send;
WebSocket.prototype.send = function (data) {
    if (typeof data === 'string' && data.includes('"type":"cancel"')) setTimeout(() => send.call(this, data), 300);
    else send.call(this, data);
};
"""


@pytest.mark.slow
async def test_page_is_public_and_the_api_needs_the_key(demo_server: DemoServer) -> None:
    server = await demo_server(api_keys=(KEY,))
    public = [("/", 200, "text/html"), ("/client/client.js", 200, "javascript"), ("/client/demo.css", 200, "css")]
    hidden = [("/client/protocol.test.js", 404, None), ("/client/package.json", 404, None)]
    async with aiohttp.ClientSession() as http:
        for path, status, content_type in [*public, *hidden, ("/v1/voices", 401, None)]:
            async with http.get(server.make_url(path)) as response:
                assert response.status == status, path
                assert content_type is None or content_type in response.content_type, path
        async with http.get(server.make_url("/v1/voices"), headers={"Authorization": f"Bearer {KEY}"}) as response:
            assert response.status == 200


@pytest.mark.slow
@pytest.mark.alone  # real-time playback without an underrun
async def test_speaks_through_webcodecs_and_the_worklet(page: Any, demo_server: DemoServer) -> None:
    server = await demo_server(api_keys=(KEY,))
    await open_demo(page, server, lead_ms=500)  # a generous buffer: no underrun is acceptable
    await page.fill("#text", SENTENCE)
    await page.click("#play")

    # Mid-playback, the page shows the waveform and the numbers: that is the screenshot, which docs/clients.md shows
    # when this test runs with VOXWIRE_UPDATE_SCREENSHOT=1 (test_docs_screenshot.py tells when it is due).
    await page.wait_for_function(f"() => window.voxwireStats?.samplesPlayed > {RATE // 4}", timeout=WAIT_MS)
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = with_page_digest(await page.screenshot())
    (ARTIFACTS / "demo_page.png").write_bytes(screenshot)
    if os.environ.get(UPDATE_SCREENSHOT):
        DOCS_SCREENSHOT.write_bytes(screenshot)

    played_out = "s => s.utterancesDone >= 1 && s.bufferedSamples === 0 && s.samplesPlayed > 0"
    await page.wait_for_function(f"() => ({played_out})(window.voxwireStats)", timeout=WAIT_MS)
    result = await stats(page)
    ready = await page.evaluate("() => window.voxwireClient.settings")
    (ARTIFACTS / "demo_page_stats.json").write_text(json.dumps(result, indent=1))

    assert result["decoder"] == "webcodecs" and ready["format"] == "opus"
    assert result["packetsDecoded"] > 0
    # Every decoded sample but the Opus pre-skip went through the worklet: nothing lost, nothing doubled.
    assert result["samplesPlayed"] == result["packetsDecoded"] * OPUS_PACKET_SAMPLES - ready["pre_skip"]
    assert result["underruns"] == 0
    first = result["firstAudio"]
    assert first["utterance"] == 0
    assert 0 < first["receivedMs"] <= first["decodedMs"] <= first["latencyMs"] < 10_000
    assert (await page.text_content("#ttfa")) == f"{math.floor(first['latencyMs'] + 0.5)} ms"  # Math.round
    assert (await page.text_content("#underruns")) == "0"
    assert page.errors == []


@pytest.mark.slow
@pytest.mark.alone  # it times the silence after a click
async def test_cancel_silences_playback_at_once(page: Any, demo_server: DemoServer, slow_down) -> None:
    server = await demo_server()
    slow_down(server.app, 0.05)  # 0.16 s of audio a step: generation is still going when Stop is clicked
    await page.add_init_script(DELAY_CANCEL)
    await open_demo(page, server)
    ARTIFACTS.mkdir(exist_ok=True)
    await page.fill("#text", PARAGRAPH)
    await page.click("#play")
    await page.wait_for_function(f"() => window.voxwireStats.samplesPlayed > {RATE // 2}", timeout=WAIT_MS)
    assert (await stats(page))["playedAtCancel"] is None
    await page.click("#stop")
    await page.wait_for_function("() => window.voxwireStats.playedAtCancel !== null", timeout=WAIT_MS)
    await page.wait_for_timeout(1000)  # late frames of the cancelled utterance arrive and must stay silent
    result = await stats(page)
    (ARTIFACTS / "demo_cancel_stats.json").write_text(json.dumps(result, indent=1))
    assert result["samplesPlayed"] - result["playedAtCancel"] <= FADE_SAMPLES + QUANTUM
    assert result["bufferedSamples"] == 0
    assert result["framesDropped"] > 0  # late frames came, and none of them played
    dones = await page.evaluate("() => window.dones")
    assert [done["finish_reason"] for done in dones] == ["cancelled"]

    # Barge-in leaves the session usable: the next utterance plays.
    before = result["samplesPlayed"]
    await page.fill("#text", "And now for something completely different.")
    await page.click("#play")
    await page.wait_for_function(f"() => window.voxwireStats.samplesPlayed > {before + RATE // 4}", timeout=WAIT_MS)
    assert page.errors == []


@pytest.mark.slow
@pytest.mark.alone  # keys typed 15 ms apart
async def test_speak_as_i_type(page: Any, demo_server: DemoServer) -> None:
    server = await demo_server()
    await open_demo(page, server)
    await page.check("#live")
    # Sentences wait up to 2 s for their end: typing at 15 ms a key, each sentence is spoken whole.
    await page.fill("#delay", "2000")
    await page.dispatch_event("#delay", "change")
    await page.fill("#text", "")
    await page.type("#text", "Hello there. This sentence is typed word by word", delay=15)
    await page.press("#text", "Enter")  # ends the utterance: the last word is spoken too
    await page.wait_for_function("() => window.dones.length === 1", timeout=WAIT_MS)
    segments = await page.eval_on_selector_all("#segments li", "items => items.map(item => item.textContent)")
    assert segments == ["Hello there.", "This sentence is typed word by word"]
    dones = await page.evaluate("() => window.dones")
    assert dones[0]["finish_reason"] in ("stop", "length") and dones[0]["segments"] == 2
    await page.wait_for_function("() => window.voxwireStats.samplesPlayed > 0", timeout=WAIT_MS)
    assert page.errors == []


@pytest.mark.slow
async def test_typing_over_the_text_sends_every_character(page: Any, demo_server: DemoServer) -> None:
    """Keystrokes as a user makes them: select the example text, type over it, press Enter. The server must get
    the typed text whole: its first character replaced the selection and was once taken for already sent. It
    begins as the example text does ("Hello! This is voxwire"), so comparing old and new text alone is no fix."""
    server = await demo_server()
    sent: list[dict[str, Any]] = []
    page.on("websocket", lambda socket: socket.on("framesent", lambda payload: sent.append(json.loads(payload))))
    await open_demo(page, server)
    await page.check("#live")
    await page.click("#text")
    await page.keyboard.press("ControlOrMeta+A")
    await page.keyboard.type(TYPED)
    await page.keyboard.press("Enter")
    await page.wait_for_function("() => window.dones.length === 1", timeout=WAIT_MS)
    texts = [message["text"] for message in sent if message["type"] == "text"]
    assert "".join(texts) == TYPED
    assert [message["type"] for message in sent][-1] == "end"
    assert page.errors == []


@pytest.mark.slow
@pytest.mark.alone  # real-time playback without an underrun
async def test_pcm_where_webcodecs_is_missing(page: Any, demo_server: DemoServer) -> None:
    await page.add_init_script("delete window.AudioDecoder")  # a browser without WebCodecs
    server = await demo_server()
    await open_demo(page, server)
    await page.fill("#text", SENTENCE)
    await page.click("#play")
    played_out = "s => s.utterancesDone >= 1 && s.bufferedSamples === 0 && s.samplesPlayed > 0"
    await page.wait_for_function(f"() => ({played_out})(window.voxwireStats)", timeout=WAIT_MS)
    result = await stats(page)
    ready = await page.evaluate("() => window.voxwireClient.settings")
    dones = await page.evaluate("() => window.dones")
    assert ready["format"] == "pcm_f32le" and result["decoder"] == "pcm" and result["packetsDecoded"] == 0
    assert result["samplesPlayed"] == round(dones[0]["audio_s"] * ready["sample_rate"])
    assert result["underruns"] == 0 and result["firstAudio"]["latencyMs"] > 0
    assert page.errors == []


@pytest.mark.slow
async def test_upload_a_voice_and_speak_with_it(page: Any, demo_server: DemoServer, tmp_path: Path) -> None:
    server = await demo_server(api_keys=(KEY,))
    t = np.arange(16_000) / 16_000
    soundfile.write(tmp_path / "me.wav", (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32), 16_000)
    await open_demo(page, server)
    await page.set_input_files("#clip", tmp_path / "me.wav")
    await page.fill("#upload input[name=name]", "Me")
    await page.click("#upload button")
    saved = "() => document.querySelector('#upload-status').textContent.startsWith('saved')"
    await page.wait_for_function(saved, timeout=WAIT_MS)
    voice = await page.input_value("#voice")
    assert voice.startswith("voice_") and (await page.text_content("#voice option:checked")) == "Me (1.0 s)"

    await page.fill("#text", SENTENCE)
    await page.click("#play")
    await page.wait_for_function("() => window.dones.length === 1", timeout=WAIT_MS)
    assert (await page.evaluate("() => window.voxwireClient.settings.voice")) == voice
    assert (await page.evaluate("() => window.dones[0].finish_reason")) in ("stop", "length")
    assert page.errors == []


@pytest.mark.slow
async def test_the_page_lists_personas_and_speaks_with_one(
    page: Any, demo_server: DemoServer, persona_tts: VoxCPM
) -> None:
    lora = ROOT / "tests" / "fixtures" / "reference" / "lora" / "voxcpm2"
    bank = persona_tts.personas
    for name in list(bank.adapters) if bank is not None else []:  # left by an earlier persona test
        bank.remove(name)
    server = await demo_server(model=persona_tts, api_keys=(KEY,), loras=(("narrator", lora),), max_lora_rank=16)
    await open_demo(page, server)
    listed = "() => [...document.querySelectorAll('#persona option')].map((o) => o.textContent).join('|')"
    await page.wait_for_function(f"() => ({listed})() === 'none|narrator (rank 8)'", timeout=WAIT_MS)
    await page.select_option("#persona", "narrator")
    await page.dispatch_event("#persona", "change")
    await page.fill("#text", SENTENCE)
    await page.click("#play")
    await page.wait_for_function("() => window.dones.length === 1", timeout=WAIT_MS)
    assert (await page.evaluate("() => window.voxwireClient.settings.persona")) == "narrator"
    assert (await page.evaluate("() => window.dones[0].finish_reason")) in ("stop", "length")
    assert page.errors == []
