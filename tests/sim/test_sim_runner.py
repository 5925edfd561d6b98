"""The simulated runner: steps last what the cost model says; utterances are the clip, sized by their text."""

from __future__ import annotations

import numpy as np
import pytest

from voxwire.engine import Engine, EngineConfig, Request, SynthesisParams
from voxwire.engine.cost_model import StepCost
from voxwire.sim.model import SPEECH_CLIP, SimSpeech, speech_clip
from voxwire.sim.runner import SimConfig, SimRunner
from voxwire.voice_clip import VoiceClip

COST = "10ms+1ms/row+0.5ms/token"


class FakeTime:
    """A clock that only sleeping advances, and a log of the sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def engine_over(runner: SimRunner, max_running: int = 8) -> Engine:
    return Engine(runner, EngineConfig(max_running=max_running, max_prefill_tokens_per_step=10_000))


def run_to_end(engine: Engine) -> dict[str, list[np.ndarray]]:
    audio: dict[str, list[np.ndarray]] = {}
    while engine.has_unfinished():
        for output in engine.step():
            audio.setdefault(output.request_id, []).append(output.audio)
    return audio


def test_each_step_sleeps_for_the_cost_of_its_rows_and_prefill_tokens() -> None:
    fake = FakeTime()
    config = SimConfig(cost=StepCost.parse(COST))
    engine = engine_over(SimRunner(speech_clip(48000), 8, config, sleep=fake.sleep, clock=fake.clock))
    engine.add(Request("a", "Hello there, how are you?", SynthesisParams(seed=1)))  # 25 bytes: 9 simulated tokens
    engine.add(Request("b", "Fine.", SynthesisParams(seed=2)))  # 2 tokens
    engine.step()  # both prefilled and decoded: 10 ms + 2 rows + 11 tokens
    engine.step()  # both decode
    assert fake.sleeps == pytest.approx([0.010 + 0.002 + 0.0055, 0.010 + 0.002])


def test_the_runners_own_time_counts_against_the_step() -> None:
    fake = FakeTime()

    def slow_clock() -> float:
        fake.now += 0.004  # every look at the clock finds 4 ms gone: the step's bookkeeping
        return fake.now

    runner = SimRunner(
        speech_clip(48000), 1, SimConfig(cost=StepCost.parse("20ms")), sleep=fake.sleep, clock=slow_clock
    )
    engine = engine_over(runner, 1)
    engine.add(Request("a", "Hello.", SynthesisParams(seed=1)))
    engine.step()
    assert fake.sleeps == pytest.approx([0.016])


def test_utterances_are_the_looped_clip_in_chunks_and_their_length_follows_the_text() -> None:
    fake = FakeTime()
    config = SimConfig()
    clip = speech_clip(config.sample_rate)
    runner = SimRunner(clip, 4, config, sleep=fake.sleep, clock=fake.clock)
    engine = engine_over(runner, 4)
    short, long = "Yes, I think so.", "This sentence is a good deal longer than the other one, so it lasts longer."
    engine.add(Request("short", short, SynthesisParams(seed=3)))
    engine.add(Request("long", long, SynthesisParams(seed=3)))
    audio = run_to_end(engine)
    assert {chunk.size for chunks in audio.values() for chunk in chunks} == {config.samples_per_patch}
    seconds = {rid: sum(c.size for c in chunks) / config.sample_rate for rid, chunks in audio.items()}
    for rid, text in (("short", short), ("long", long)):
        expected = len(text) / config.chars_per_second
        assert expected * 0.85 - config.chunk_seconds <= seconds[rid] <= expected * 1.15 + config.chunk_seconds
    # The same seed starts both at the same place in the clip, and the audio is the clip, looped.
    joined = np.concatenate(audio["long"])
    windows = np.lib.stride_tricks.sliding_window_view(clip, 64)
    start = int(np.flatnonzero(np.all(windows == joined[:64], axis=1))[0])
    looped = np.concatenate([clip, clip])
    assert np.array_equal(joined, looped[start : start + joined.size])
    assert np.array_equal(np.concatenate(audio["short"]), joined[: sum(c.size for c in audio["short"])])


def test_the_same_seed_gives_the_same_utterance_and_another_seed_another() -> None:
    def speak(seed: int) -> np.ndarray:
        fake = FakeTime()
        engine = engine_over(SimRunner(speech_clip(48000), 1, sleep=fake.sleep, clock=fake.clock), 1)
        engine.add(Request("a", "A sentence of medium length, spoken once.", SynthesisParams(seed=seed)))
        return np.concatenate(run_to_end(engine)["a"])

    assert np.array_equal(speak(5), speak(5))
    assert not np.array_equal(speak(5), speak(6))


def test_the_packaged_clip_is_speech_and_small() -> None:
    assert SPEECH_CLIP.stat().st_size < 200_000
    clip = speech_clip(48000)
    assert clip.size / 48000 > 5
    frames = clip[: clip.size // 960 * 960].reshape(-1, 960)
    rms = np.sqrt((frames**2).mean(axis=1))
    # Speech has pauses and syllables: loud and quiet 20 ms frames, unlike a tone or noise.
    assert np.percentile(rms, 90) > 10 * max(np.percentile(rms, 10), 1e-5)


def test_sim_voices_are_latents_shaped_like_voxcpm2s_and_cost_prefill() -> None:
    model = SimSpeech()
    clip = speech_clip(48000)[: 48000 * 2]
    voice = model.make_prompt(VoiceClip(reference_audio=clip, reference_sample_rate=48000))
    assert voice.reference_patches is not None and tuple(voice.reference_patches.shape[1:]) == model.patch_shape
    runner = SimRunner(clip, 1)
    voiced = runner.prepare(Request("v", "Hello.", prompt=voice))
    plain = runner.prepare(Request("p", "Hello."))
    assert voiced.prompt_positions == plain.prompt_positions + voice.reference_patches.shape[0] + 2
    assert voiced.kv_positions - voiced.prompt_positions == plain.kv_positions - plain.prompt_positions
