"""The engine over a real (tiny) model: what a listener would notice. A session's audio does not depend on who
else is in the batch, equals the reference's audio for its seed, and aborts or failures free everything."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import voxwire
from voxwire.engine import Engine, EngineConfig, FinishReason, Request, RunnerOptions, SynthesisParams
from voxwire.engine.kv_pool import bytes_per_position
from voxwire.engine.outputs import PrefillItem, StepPlan
from voxwire.engine.runner import ModelRunner
from voxwire.errors import InvalidInputError
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tts import VoxCPM
from voxwire.voice_clip import VoiceClip

from .helpers import audio, crowd, request, run, voice

FIXTURES = Path(__file__).parents[1] / "fixtures" / "reference" / "model"


def make_engine(
    tts: VoxCPM, slots: int = 8, *, batch_invariant: bool = False, **config: int
) -> tuple[Engine, ModelRunner]:
    runner = ModelRunner(tts, RunnerOptions(num_slots=slots, max_length=256, batch_invariant=batch_invariant))
    return Engine(runner, EngineConfig(max_running=slots, **config)), runner


def test_a_session_sounds_the_same_alone_and_among_seven_others(tts: VoxCPM) -> None:
    target = request("target", "The same words, whoever else is speaking.", seed=42, max_len=14)
    alone = run(make_engine(tts)[0], {0: [target]})["target"]
    others = [
        request(f"o{i}", text, seed=100 + i, cfg_value=cfg, inference_timesteps=steps, max_len=length)
        for i, (text, cfg, steps, length) in enumerate(
            [
                ("Short.", 1.0, 10, 6),
                ("A much longer sentence with many words in it.", 3.0, 4, 20),
                ("中文句子，测试一下。", 2.5, 7, 12),
                ("Numbers: 3.14 and 42!", 1.5, 10, 9),
                ("Another voice.", 2.0, 12, 16),
                ("Mixed 语言 text.", 0.5, 2, 8),
                ("Last one here.", 2.2, 10, 11),
            ]
        )
    ]
    # Others arrive before, with and after the target, so it runs beside sessions at every stage.
    arrivals = {0: others[:3], 2: [target, others[3]], 3: others[4:6], 6: others[6:]}
    crowded = run(make_engine(tts)[0], arrivals)
    assert [o.finish_reason for o in crowded["target"]][-1] == alone[-1].finish_reason
    assert len(crowded["target"]) == len(alone)
    np.testing.assert_allclose(audio(crowded["target"]), audio(alone), atol=1e-4, rtol=0)
    assert all(outs[-1].finished for outs in crowded.values())


@pytest.mark.slow
@pytest.mark.isa
def test_batch_invariant_sessions_sound_bit_for_bit_as_alone(tts: VoxCPM) -> None:
    """Issue 9: with batch-invariant numerics, 24 sessions arriving over several steps (prefills sharing a step,
    rows of different lengths, guidance and timestep counts, voices) each produce exactly the audio they
    produce alone. The default numerics only promise the 1e-4 bound, which an FSQ boundary can break."""
    sessions = crowd(tts, 24)
    alone = {}
    for req in sessions:
        engine = make_engine(tts, slots=24, batch_invariant=True)[0]
        alone[req.request_id] = audio(run(engine, {0: [req]})[req.request_id])
    arrivals = {0: sessions[:10], 1: sessions[10:16], 3: sessions[16:20], 5: sessions[20:]}
    together = run(make_engine(tts, slots=24, batch_invariant=True)[0], arrivals)
    for req in sessions:
        assert np.array_equal(audio(together[req.request_id]), alone[req.request_id]), req.request_id


@pytest.mark.isa
@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "batch-invariant"])
def test_engine_reproduces_the_reference_generate(tts: VoxCPM, tmp_path: Path, batch_invariant: bool) -> None:
    """Sessions through the batching engine, side by side, each equal the reference's generate() output (with
    batch-invariant numerics too: they change roundings only)."""
    meta = json.loads((FIXTURES / "voxcpm2" / "meta.json").read_text(encoding="utf-8"))
    expected = load_file(str(FIXTURES / "voxcpm2" / "fixture.safetensors"))
    model = voxwire.load_model(make_tiny_checkpoint(tmp_path / "v2", "voxcpm2"), device="cpu")
    folder = FIXTURES / "voxcpm2"
    requests = []
    for case in meta["generate"]:
        prompt = case["prompt"]
        voice = None
        if prompt:
            voice = model.make_prompt(
                VoiceClip(
                    text=prompt.get("prompt_text"),
                    audio=folder / prompt["prompt_wav_path"] if "prompt_wav_path" in prompt else None,
                    reference_audio=folder / prompt["reference_wav_path"] if "reference_wav_path" in prompt else None,
                )
            )
        params = SynthesisParams(seed=case["seed"], max_len=meta["max_len"])
        requests.append(Request(case["key"], case["text"], params=params, prompt=voice))
    runner = ModelRunner(model, RunnerOptions(num_slots=len(requests), batch_invariant=batch_invariant))
    engine = Engine(runner, EngineConfig(max_running=len(requests)))
    outputs = run(engine, {0: requests})
    for case in meta["generate"]:
        reference = expected[f"generate.{case['key']}"].numpy()
        ours = audio(outputs[case["key"]])
        assert ours.shape == reference.shape, case["key"]
        assert float(np.abs(ours - reference).max()) <= 1e-4, case["key"]


def test_abort_mid_stream_frees_the_slot_and_silences_the_session(tts: VoxCPM) -> None:
    engine, runner = make_engine(tts, slots=2)
    engine.add(request("a", "This one will be cut off in the middle.", seed=1, min_len=50, max_len=60))
    engine.add(request("b", "This one keeps going.", seed=2, min_len=8, max_len=10))
    for _ in range(3):
        engine.step()
    assert engine.abort("a")
    assert engine.num_free_slots == 1
    seen = [out for _ in range(20) for out in engine.step()]
    assert [o.finish_reason for o in seen if o.request_id == "a"] == [FinishReason.ABORTED]
    assert all(o.audio.size == 0 for o in seen if o.request_id == "a")
    assert seen[-1].request_id == "b" and seen[-1].finished
    engine.step()  # delivers the last release to the runner
    assert not runner.requests and engine.num_free_slots == 2


def test_bad_requests_fail_alone(tts: VoxCPM) -> None:
    engine, runner = make_engine(tts, slots=3)
    long_text = "word " * 400  # more positions than the 256-position cache holds
    outputs = run(
        engine,
        {
            0: [
                request("ok", "Fine text.", seed=3, max_len=5),
                request("huge", long_text, seed=4),
                Request("bad-prompt", "Hello.", prompt="not a voice"),
            ]
        },
    )
    assert outputs["huge"][-1].finish_reason is FinishReason.ERROR and "positions" in outputs["huge"][-1].error
    assert outputs["bad-prompt"][-1].finish_reason is FinishReason.ERROR
    assert outputs["ok"][-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert not runner.requests


def test_a_request_is_laid_out_once_and_its_first_chunk_reports_its_prompt(
    tts: VoxCPM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: the runner lays a request out when the engine takes it (``prepare``) and its prefill reads that
    layout. A text in the default voice is tokenized once; one continuing a voice's transcript twice, as the
    reference does (the target alone for its length cap, the transcript and the target together for the prompt).
    The first chunk reports the prompt's positions (the SSE ``usage``), no later one does."""
    encoded: list[str] = []
    encode = tts.tokenizer.encode
    monkeypatch.setattr(tts.tokenizer, "encode", lambda text: encoded.append(text) or encode(text))
    spoken = voice(tts, seed=1)
    plain = request("plain", "Said once.", seed=1, max_len=4)
    voiced = Request("voiced", "Said twice.", params=SynthesisParams(seed=2, max_len=4), prompt=spoken)
    outputs = run(make_engine(tts, slots=2)[0], {0: [plain, voiced]})
    joined = "A transcript of the clip.Said twice."
    assert sorted(encoded) == sorted(["Said once.", "Said twice.", joined])
    assert spoken.audio_patches is not None and spoken.reference_patches is not None
    clips = spoken.audio_patches.shape[0] + spoken.reference_patches.shape[0] + 2
    expected = {"plain": len(encode("Said once.")) + 1, "voiced": len(encode(joined)) + 1 + clips}
    for rid, chunks in outputs.items():
        assert [chunk.prompt_positions for chunk in chunks] == [expected[rid]] + [None] * (len(chunks) - 1)


@pytest.mark.slow
def test_random_traffic_leaves_nothing_behind(tts: VoxCPM) -> None:
    """Randomly interleaved adds, aborts and natural finishes on the real runner: every request ends exactly
    once, and afterwards no per-request state, slot or queue entry is left."""
    engine, runner = make_engine(tts, slots=4, max_waiting=6)
    rng = random.Random(7)
    finals: dict[str, int] = {}
    live: list[str] = []
    for event in range(150):
        kind = rng.random()
        if kind < 0.45 and engine.num_waiting < 6:
            rid = f"r{event}"
            engine.add(
                request(
                    rid,
                    rng.choice(["Hi.", "Hello there, friend.", "一二三。"]),
                    seed=event,
                    max_len=rng.randint(3, 8),
                    inference_timesteps=rng.choice([2, 5, 10]),
                )
            )
            live.append(rid)
        elif kind < 0.6 and live:
            engine.abort(rng.choice(live))
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = finals.get(out.request_id, 0) + 1
                live.remove(out.request_id)
    while engine.has_work():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = finals.get(out.request_id, 0) + 1
    assert set(finals.values()) == {1}
    assert not runner.requests and engine.num_free_slots == 4 and engine.num_waiting == 0


def test_patches_continue_the_voice_in_the_next_utterance(tts: VoxCPM) -> None:
    engine, _ = make_engine(tts, slots=2)
    first = run(engine, {0: [request("one", "The first half of a long text.", seed=5, max_len=6)]})["one"]
    patches = torch.from_numpy(np.stack([o.patch for o in first]))
    assert patches.shape == (len(first), tts.config.patch_size, tts.config.feat_dim)
    voice = voxwire.prompt.VoicePrompt("The first half of a long text.", patches)
    second = Request("two", "And the second half.", params=SynthesisParams(seed=6, max_len=6), prompt=voice)
    through_engine = audio(run(engine, {0: [second]})["two"])
    direct = tts.generate("And the second half.", SynthesisParams(seed=6, max_len=6), prompt=voice)
    np.testing.assert_allclose(through_engine, direct, atol=1e-5, rtol=0)


def test_the_kv_pool_is_sized_by_memory_not_by_sessions_times_max_length(tts: VoxCPM) -> None:
    per_block = 16 * bytes_per_position(tts)
    runner = ModelRunner(
        tts, RunnerOptions(num_slots=64, max_length=512, kv_cache_bytes=10 * per_block + per_block // 2)
    )
    pool = runner.pool.base.tensor.nbytes + runner.pool.residual.tensor.nbytes + runner.pool.noise.nbytes
    assert pool == 10 * per_block and runner.num_kv_blocks == 10
    dense = 64 * 512 * bytes_per_position(tts)
    assert pool * 50 < dense
    with pytest.raises(ValueError, match="holds no session"):
        ModelRunner(tts, RunnerOptions(num_slots=2, kv_cache_bytes=per_block))


def test_more_timesteps_than_the_runner_holds_fail_that_request_alone(tts: VoxCPM) -> None:
    runner = ModelRunner(tts, RunnerOptions(num_slots=2, max_length=256, max_timesteps=8))
    outputs = run(
        Engine(runner, EngineConfig(max_running=2)),
        {
            0: [
                request("ok", "Fine.", seed=1, max_len=3, inference_timesteps=8),
                request("many", "Too many.", inference_timesteps=9),
            ]
        },
    )
    assert outputs["many"][-1].finish_reason is FinishReason.ERROR and "<= 8" in outputs["many"][-1].error
    assert outputs["ok"][-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


def test_a_request_longer_than_the_pool_is_refused_at_add(tts: VoxCPM) -> None:
    runner = ModelRunner(
        tts, RunnerOptions(num_slots=2, max_length=512, kv_cache_bytes=4 * 16 * bytes_per_position(tts))
    )
    engine = Engine(runner, EngineConfig(max_running=2))
    with pytest.raises(InvalidInputError, match="KV pool holds 48"):
        engine.add(request("long", "A sentence long enough to need more than the pool.", seed=1))


def test_admission_waits_for_blocks_and_every_session_sounds_as_alone(tts: VoxCPM) -> None:
    """A pool with room for one of these sessions at a time: the second waits for the first's blocks
    (no running stream ever lacks one), then both sound exactly as they do alone."""
    texts = {"a": "First in line.", "b": "Second, waiting for blocks."}
    requests = {rid: request(rid, text, seed=i, max_len=10) for i, (rid, text) in enumerate(texts.items())}
    alone = {rid: audio(run(make_engine(tts)[0], {0: [req]})[rid]) for rid, req in requests.items()}
    runner = ModelRunner(
        tts, RunnerOptions(num_slots=2, max_length=512, kv_cache_bytes=3 * 16 * bytes_per_position(tts))
    )
    engine = Engine(runner, EngineConfig(max_running=2))
    for req in requests.values():
        assert runner.prepare(req).kv_positions <= 32  # one session fits, two do not
        engine.add(req)
    [first] = engine.step()
    assert (engine.num_running, engine.num_waiting) == (1, 1)
    assert engine.kv_blocks_used == 2 and engine.kv_blocks_total == 2
    outputs = run(engine, {})
    outputs["a"].insert(0, first)
    for rid in requests:
        np.testing.assert_allclose(audio(outputs[rid]), alone[rid], atol=1e-4, rtol=0)
    assert engine.kv_blocks_used == 0


def test_decode_slots_may_be_any_subset_of_the_occupied_slots(tts: VoxCPM) -> None:
    """A scheduler may skip rows: decoding slots {2, 0} only, then all three, gives each session the audio
    of an every-step schedule (state is gathered by slot and scattered back)."""
    texts = ["One voice here.", "Another voice, a bit longer.", "Third."]
    reqs = [request(f"r{i}", text, seed=10 + i, min_len=6, max_len=6) for i, text in enumerate(texts)]
    every_step = run(make_engine(tts, slots=4)[0], {0: list(reqs)})
    runner = ModelRunner(tts, RunnerOptions(num_slots=4, max_length=256))
    blocks = iter(range(1, runner.num_kv_blocks))
    items = []
    for slot, req in enumerate(reqs):
        prepared = runner.prepare(req)
        need = -(-prepared.kv_positions // runner.block_size)
        items.append(PrefillItem(req.request_id, slot, req, prepared, tuple(next(blocks) for _ in range(need))))
    ids = tuple(r.request_id for r in reqs)
    got: dict[str, list[np.ndarray]] = {rid: [] for rid in ids}
    first = runner.execute(
        StepPlan(prefills=tuple(items), request_ids=ids, step_indices=(0, 0, 0), decode_slots=(0, 1, 2))
    )
    for rid, chunk in zip(ids, first.audio, strict=True):
        got[rid].append(chunk)
    subset = runner.execute(StepPlan(request_ids=("r2", "r0"), step_indices=(1, 1), decode_slots=(2, 0)))
    for rid, chunk in zip(("r2", "r0"), subset.audio, strict=True):
        got[rid].append(chunk)
    for _ in range(2):
        result = runner.execute(StepPlan(request_ids=ids, step_indices=(0, 0, 0), decode_slots=(0, 1, 2)))
        for rid, chunk in zip(ids, result.audio, strict=True):
            got[rid].append(chunk)
    for rid in ids:
        count = len(got[rid])
        np.testing.assert_allclose(np.concatenate(got[rid]), audio(every_step[rid][:count]), atol=1e-4, rtol=0)


def test_graphs_are_captured_up_front_and_replays_match_eager(tts: VoxCPM, emulated_graph_capture: None) -> None:
    """The CUDA-graph path (static index buffer, batch buckets with padding rows, timestep counts rounded up
    to a captured one) gives the eager step's audio, and nothing is captured while serving. Capture is
    emulated on CPU (``emulated_graph_capture``)."""
    arrivals = staggered_arrivals(tts)
    eager = run(make_engine(tts, slots=4)[0], arrivals)
    graph_runner = ModelRunner(tts, RunnerOptions(num_slots=4, max_length=256, cuda_graphs=True, max_timesteps=16))
    graph_runner.capture_graphs()
    captured = graph_runner.graph_captures
    assert captured == len(graph_runner.graphs.buckets) * 2  # timesteps 10 and 16 for buckets 1, 2, 4
    graphed = run(Engine(graph_runner, EngineConfig(max_running=4)), arrivals)
    assert graph_runner.graph_captures == captured
    for rid in arrivals_ids(arrivals):
        # Padding rows change the GEMM shapes, so fp32 rounding may differ: the batch-independence bound.
        np.testing.assert_allclose(audio(graphed[rid]), audio(eager[rid]), atol=1e-4, rtol=0)


def staggered_arrivals(tts: VoxCPM) -> dict[int, list[Request]]:
    return {
        0: [request("a", "First speaker here, talking for a while.", seed=1, min_len=12, max_len=14)],
        3: [request("b", "Second.", seed=2, inference_timesteps=4, max_len=9)],
        4: [request("c", "Third voice, 第三个。", seed=3, cfg_value=3.0, max_len=7)],
    }


@pytest.mark.slow
@pytest.mark.isa
def test_batch_invariant_graph_replays_equal_eager_bit_for_bit(tts: VoxCPM, emulated_graph_capture: None) -> None:
    """With batch-invariant numerics the CUDA-graph path's padding rows and rounded-up timestep counts change no
    bit of any session's audio (capture emulated on CPU)."""
    arrivals = staggered_arrivals(tts)
    eager = run(make_engine(tts, slots=4, batch_invariant=True)[0], arrivals)
    runner = ModelRunner(
        tts, RunnerOptions(num_slots=4, max_length=256, cuda_graphs=True, max_timesteps=16, batch_invariant=True)
    )
    runner.capture_graphs()
    graphed = run(Engine(runner, EngineConfig(max_running=4)), arrivals)
    for rid in arrivals_ids(arrivals):
        assert np.array_equal(audio(graphed[rid]), audio(eager[rid])), rid


def arrivals_ids(arrivals: dict[int, list[Request]]) -> list[str]:
    return [r.request_id for requests in arrivals.values() for r in requests]


def test_stale_non_finite_kv_never_reaches_the_next_occupant(tts: VoxCPM) -> None:
    """Issue 8, D1: whatever a slot's previous occupant left in the KV pool (here: NaN everywhere, as a
    poisoned voice leaves it), the next session in that slot sounds exactly as it does alone."""
    target = request("target", "Hello there.", seed=1, max_len=12)
    alone = audio(run(make_engine(tts)[0], {0: [target]})["target"])
    engine, runner = make_engine(tts)
    run(engine, {0: [request("before", "A longer sentence that fills more of the slot.", seed=9, max_len=20)]})
    for pool in (runner.pool.base.tensor, runner.pool.residual.tensor):
        pool.fill_(float("nan"))
    after = audio(run(engine, {0: [target]})["target"])
    assert np.isfinite(after).all()
    np.testing.assert_allclose(after, alone, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_rows_run_in_their_own_timestep_bucket(tts: VoxCPM, emulated_graph_capture: None) -> None:
    """Issue 21.4: one request asking for many timesteps does not make every row of the step run that many. Each
    timestep bucket's rows replay their own graph (a row with 4 runs the 4-step graph while another runs the
    16-step one), and every session still sounds as in the eager runner."""
    arrivals = staggered_arrivals(tts)  # "b" asks for 4 timesteps, the others for the default 10
    eager = run(make_engine(tts, slots=4)[0], arrivals)
    runner = ModelRunner(
        tts, RunnerOptions(num_slots=4, max_length=256, cuda_graphs=True, max_timesteps=16, graph_timesteps=(4, 10))
    )
    runner.capture_graphs()
    assert runner.graphs is not None
    replayed: list[tuple[int, int]] = []
    run_key = runner.graphs.run

    def recording(bucket: int, timesteps: int) -> torch.Tensor:
        replayed.append((bucket, timesteps))
        return run_key(bucket, timesteps)

    runner.graphs.run = recording  # type: ignore[method-assign]
    graphed = run(Engine(runner, EngineConfig(max_running=4)), arrivals)
    assert {timesteps for _, timesteps in replayed} == {4, 10}, "a row ran in another bucket than its own"
    assert (1, 4) in replayed  # "b" alone in its bucket while "a" and "c" run at 10
    for rid in arrivals_ids(arrivals):
        np.testing.assert_allclose(audio(graphed[rid]), audio(eager[rid]), atol=1e-4, rtol=0)


def test_eager_rows_of_different_buckets_sound_as_alone(tts: VoxCPM) -> None:
    """On CPU too, rows of different timestep buckets run as separate sub-steps, each as it would alone."""
    texts = {"few": ("Quick one.", 4), "many": ("A longer sentence with more steps.", 16)}
    reqs = [request(rid, text, seed=5, max_len=6, inference_timesteps=steps) for rid, (text, steps) in texts.items()]
    runner = ModelRunner(tts, RunnerOptions(num_slots=4, max_length=256, max_timesteps=16, graph_timesteps=(4,)))
    together = run(Engine(runner, EngineConfig(max_running=4)), {0: reqs})
    for req in reqs:
        alone = run(make_engine(tts, slots=4)[0], {0: [req]})
        np.testing.assert_allclose(audio(together[req.request_id]), audio(alone[req.request_id]), atol=1e-4, rtol=0)


def test_a_discarded_runner_is_freed_at_once_with_its_kv_pool(tts: VoxCPM, emulated_graph_capture: None) -> None:
    """Issue 21.10: the graphs no longer hold their runner, so dropping a runner frees it (and its KV pool) at
    once, not at the next cycle collection after the next runner sized its pool around it."""
    import gc
    import weakref

    runner = ModelRunner(tts, RunnerOptions(num_slots=2, max_length=64, cuda_graphs=True))
    runner.capture_graphs()
    pool, gone = weakref.ref(runner.pool.base.tensor), weakref.ref(runner)
    gc.disable()
    try:
        del runner
        assert gone() is None and pool() is None
    finally:
        gc.enable()


@pytest.mark.isa
def test_step_outputs_reuse_one_host_buffer_and_held_chunks_stay_intact(
    tts: VoxCPM, emulated_graph_capture: None
) -> None:
    """Issue 21.10: the buffer a step's outputs are read into is reused once its chunks are gone (not a fresh
    page-locked block per step), and never while a chunk of it is still held."""
    runner = ModelRunner(tts, RunnerOptions(num_slots=2, max_length=256, cuda_graphs=True))
    runner.capture_graphs()
    req = request("a", "Hold on to this one for a moment.", seed=3, min_len=8, max_len=8)
    prepared = runner.prepare(req)
    blocks = tuple(range(1, 1 + -(-prepared.kv_positions // runner.block_size)))
    admit = PrefillItem("a", 0, req, prepared, blocks)
    first = runner.execute(StepPlan(prefills=(admit,), request_ids=("a",), step_indices=(0,), decode_slots=(0,)))
    del first
    for step in range(1, 3):
        runner.execute(StepPlan(request_ids=("a",), step_indices=(step,), decode_slots=(0,)))
    assert runner._outputs.count == 1, "a new buffer was made although the last step's chunks were gone"
    held = runner.execute(StepPlan(request_ids=("a",), step_indices=(3,), decode_slots=(0,)))
    kept = held.audio[0].copy()
    runner.execute(StepPlan(request_ids=("a",), step_indices=(4,), decode_slots=(0,)))
    assert runner._outputs.count == 2
    assert np.array_equal(held.audio[0], kept), "a held chunk was overwritten by the next step"
