"""Sessions that share a saved voice: the second one does not run LocEnc over the voice's patches again,
sounds exactly as it would without the cache, and the cache stays within its byte budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voxwire.engine import Chunk, Engine, EngineConfig, Request, RunnerOptions, SynthesisParams
from voxwire.engine.runner import ModelRunner
from voxwire.engine.voice_cache import VoiceCache
from voxwire.prompt import VoicePrompt
from voxwire.tts import VoxCPM

from .helpers import voice


def speak(runner: ModelRunner, *requests: Request) -> dict[str, np.ndarray]:
    """Run the requests together until they finish; each one's audio."""
    engine = Engine(runner, EngineConfig(max_running=runner.num_slots))
    for request in requests:
        engine.add(request)
    outputs: dict[str, list[Chunk]] = {}
    while engine.has_work():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return {rid: np.concatenate([o.audio for o in outs]) for rid, outs in outputs.items()}


def say(rid: str, text: str, prompt: VoicePrompt | None, seed: int) -> Request:
    return Request(rid, text, params=SynthesisParams(seed=seed, max_len=6), prompt=prompt)


class LocEncCalls:
    """The number of patches of each LocEnc call (decode steps encode one patch per row)."""

    def __init__(self, tts: VoxCPM) -> None:
        self.sizes: list[int] = []
        self._handle = tts.model.feat_encoder.register_forward_hook(self._record)

    def _record(self, module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        self.sizes.append(args[0].shape[0] * args[0].shape[1])

    def __enter__(self) -> LocEncCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()


@pytest.mark.isa
def test_a_second_session_with_the_same_voice_skips_locenc_and_sounds_the_same(tts: VoxCPM) -> None:
    saved = voice(tts, seed=1)  # 3 reference + 5 prompt patches: one LocEnc call of 8 when encoded
    cached, uncached = (
        ModelRunner(tts, RunnerOptions(num_slots=2)),
        ModelRunner(tts, RunnerOptions(num_slots=2, voice_cache_bytes=0)),
    )
    for runner in (cached, uncached):
        speak(runner, say("first", "The first session.", saved, seed=3))
    with LocEncCalls(tts) as calls:
        second = speak(cached, say("second", "Another session, same voice.", saved, seed=4))["second"]
    assert 8 not in calls.sizes and set(calls.sizes) == {1}, calls.sizes
    with LocEncCalls(tts) as calls:
        without = speak(uncached, say("second", "Another session, same voice.", saved, seed=4))["second"]
    assert 8 in calls.sizes
    np.testing.assert_array_equal(second, without)
    # The same voice loaded again (a new object with equal patches) shares the entry.
    reloaded = VoicePrompt(saved.text, saved.audio_patches.copy(), saved.reference_patches.copy())
    with LocEncCalls(tts) as calls:
        speak(cached, say("third", "Reloaded.", reloaded, seed=5))
    assert set(calls.sizes) == {1} and len(cached.voice_cache) == 1


def test_cached_voices_keep_batch_independence(tts: VoxCPM) -> None:
    saved, other = voice(tts, seed=1), voice(tts, seed=2, audio=4, reference=2)
    alone = speak(
        ModelRunner(tts, RunnerOptions(num_slots=4, voice_cache_bytes=0)), say("target", "Same words.", saved, seed=9)
    )
    runner = ModelRunner(tts, RunnerOptions(num_slots=4))
    speak(runner, say("warm", "Puts the voice in the cache.", saved, seed=1))
    crowded = speak(
        runner,
        say("a", "A zero-shot neighbour.", None, seed=2),
        say("target", "Same words.", saved, seed=9),
        say("b", "A neighbour with a voice of its own.", other, seed=3),
        say("c", "And one sharing the target's voice.", saved, seed=4),
    )
    np.testing.assert_allclose(crowded["target"], alone["target"], atol=1e-4, rtol=0)
    assert len(runner.voice_cache) == 2


def test_new_voices_admitted_together_are_encoded_in_one_locenc_call(tts: VoxCPM) -> None:
    """A step's new voices share one LocEnc launch set (issue 34): 8 + 6 patches in one call, a voice used twice
    encoded once; with batch-invariant numerics each voice alone, as its prefill is."""
    first, second = voice(tts, seed=1), voice(tts, seed=2, audio=4, reference=2)
    requests = (say("a", "One.", first, seed=1), say("b", "Two.", second, seed=2), say("c", "Three.", first, seed=3))
    with LocEncCalls(tts) as calls:
        speak(ModelRunner(tts, RunnerOptions(num_slots=3)), *requests)
    assert [size for size in calls.sizes if size > 3] == [14], calls.sizes
    with LocEncCalls(tts) as calls:
        speak(ModelRunner(tts, RunnerOptions(num_slots=3, batch_invariant=True)), *requests)
    assert [size for size in calls.sizes if size > 3] == [8, 6], calls.sizes


def test_the_cache_evicts_least_recently_used_voices_within_its_budget() -> None:
    entry = torch.zeros(4, 8)  # 128 bytes
    cache = VoiceCache(capacity_bytes=2 * entry.nbytes)
    cache.put("a", entry)
    cache.put("b", entry.clone())
    assert cache.get("a") is entry  # "a" is now the most recently used
    cache.put("c", entry.clone())
    assert cache.get("b") is None and cache.get("a") is entry and cache.get("c") is not None
    assert cache.nbytes == 2 * entry.nbytes and len(cache) == 2
    cache.put("huge", torch.zeros(100, 8))  # larger than the whole budget: not kept, nothing evicted
    assert cache.get("huge") is None and len(cache) == 2
    disabled = VoiceCache(capacity_bytes=0)
    disabled.put("a", entry)
    assert disabled.get("a") is None
    with pytest.raises(ValueError, match="capacity_bytes"):
        VoiceCache(capacity_bytes=-1)


def test_a_voice_digest_depends_on_its_patches_only(tts: VoxCPM) -> None:
    saved = voice(tts, seed=1)
    assert saved.digest == VoicePrompt("Other words.", saved.audio_patches.copy(), saved.reference_patches).digest
    assert saved.digest != voice(tts, seed=2).digest
    # The same patches as prompt audio or as a reference clip are different voices.
    assert (
        VoicePrompt(audio_patches=saved.audio_patches).digest
        != VoicePrompt(reference_patches=saved.audio_patches).digest
    )
