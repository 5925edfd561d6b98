"""LoRA personas in the engine: rows with different personas share steps, and each session hears exactly what it
would hear alone; personas can be added, swapped out and removed under load without leaking into anyone's audio."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import voxwire
from voxwire.engine import Engine, EngineConfig, FinishReason, Request, RunnerOptions
from voxwire.engine.runner import ModelRunner
from voxwire.model.lora import LoRAAdapter, LoRAConfig, load_lora
from voxwire.model.personas import UnreservedLayersError
from voxwire.params import SynthesisParams
from voxwire.prompt import VoicePrompt
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tts import VoxCPM

from .helpers import audio, crowd, request, run

LORA = Path(__file__).parents[1] / "fixtures" / "reference" / "lora" / "voxcpm2"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A: the reference-made adapter; B: the same layers with other weights."""
    other = tmp_path_factory.mktemp("persona") / "b"
    shutil.copytree(LORA, other)
    state = load_file(str(other / "lora_weights.safetensors"))
    save_file({k: (-0.7 * v).contiguous() for k, v in state.items()}, str(other / "lora_weights.safetensors"))
    return {"A": LORA, "B": other}


def persona_model(tmp_path_factory: pytest.TempPathFactory, adapters: dict[str, Path], max_personas: int) -> VoxCPM:
    """A fresh model (adapting wraps its layers) with personas A and B registered."""
    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "v2", "voxcpm2", seed=0)
    tts = voxwire.load_model(folder, device="cpu", dtype=torch.float32)
    tts.enable_personas(max_personas=max_personas, max_rank=16)
    for name, directory in adapters.items():
        tts.load_persona(name, directory)
    return tts


@pytest.fixture(scope="module")
def tts(tmp_path_factory: pytest.TempPathFactory, adapters: dict[str, Path]) -> VoxCPM:
    return persona_model(tmp_path_factory, adapters, max_personas=4)


def engine(tts: VoxCPM, slots: int = 4, batch_invariant: bool = False) -> tuple[Engine, ModelRunner]:
    runner = ModelRunner(tts, RunnerOptions(num_slots=slots, max_length=256, batch_invariant=batch_invariant))
    return Engine(runner, EngineConfig(max_running=slots)), runner


def with_persona(req: Request, persona: str | None) -> Request:
    return Request(req.request_id, req.text, req.params, persona=persona)


def speakers(tts: VoxCPM) -> list[Request]:
    texts = ["Hello world, this is a test.", "A second voice says this.", "第三个人说话。", "And one more."]
    personas = [None, "A", "B", "A"]
    return [
        with_persona(request(f"r{i}", text, seed=11 + i, max_len=10 + i), persona)
        for i, (text, persona) in enumerate(zip(texts, personas, strict=True))
    ]


def solo(tts: VoxCPM, req: Request, batch_invariant: bool = False) -> np.ndarray:
    return audio(run(engine(tts, batch_invariant=batch_invariant)[0], {0: [req]})[req.request_id])


@pytest.mark.isa
@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "batch-invariant"])
def test_engine_persona_equals_the_reference_with_its_adapter(tts: VoxCPM, batch_invariant: bool) -> None:
    meta = json.loads((LORA / "meta.json").read_text(encoding="utf-8"))
    case = next(c for c in meta["generate"] if c["key"] == "en")
    req = with_persona(request("ref", case["text"], seed=case["seed"], max_len=meta["max_len"]), "A")
    expected = load_file(str(LORA / "fixture.safetensors"))["generate.en"].numpy()
    np.testing.assert_allclose(solo(tts, req, batch_invariant), expected, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_a_batch_mixing_personas_gives_each_row_its_solo_audio(tts: VoxCPM) -> None:
    reqs = speakers(tts)
    alone = {req.request_id: solo(tts, req) for req in reqs}
    mixed = run(engine(tts)[0], {0: reqs[:2], 1: reqs[2:]})
    for req in reqs:
        np.testing.assert_allclose(audio(mixed[req.request_id]), alone[req.request_id], atol=1e-4, rtol=0)
    # The personas are audible: A, B and no persona give three different voices for the same request.
    base = speakers(tts)[1]
    voices = [solo(tts, with_persona(base, p)) for p in (None, "A", "B")]
    for i in range(3):
        for j in range(i):
            n = min(voices[i].size, voices[j].size)
            assert float(np.abs(voices[i][:n] - voices[j][:n]).max()) > 0.05
    assert tts.personas is not None and all(tts.personas.users(name) == 0 for name in ("A", "B"))


@pytest.mark.slow
@pytest.mark.isa
def test_batch_invariant_rows_with_personas_sound_bit_for_bit_as_alone(tts: VoxCPM) -> None:
    """With batch-invariant numerics a batch mixing persona A, persona B and none gives each of 6 sessions exactly
    its solo audio (the adapters' per-row matmuls included): each persona twice, arriving over three steps, with a
    voice, Chinese text, other timestep counts and lengths among them (``crowd``)."""
    reqs = [
        with_persona(req, persona) for req, persona in zip(crowd(tts, 6), [None, "A", "B", "A", None, "B"], strict=True)
    ]
    alone = {req.request_id: solo(tts, req, batch_invariant=True) for req in reqs}
    together = run(engine(tts, slots=6, batch_invariant=True)[0], {0: reqs[:3], 1: reqs[3:5], 2: reqs[5:]})
    for req in reqs:
        assert np.array_equal(audio(together[req.request_id]), alone[req.request_id]), req.request_id


def test_graph_bookkeeping_covers_persona_rows(tts: VoxCPM, emulated_graph_capture: None) -> None:
    reqs = speakers(tts)
    arrivals = {0: reqs[:1], 1: reqs[1:3], 3: reqs[3:]}
    eager = run(engine(tts)[0], arrivals)
    runner = ModelRunner(tts, RunnerOptions(num_slots=4, max_length=256, cuda_graphs=True, max_timesteps=16))
    runner.capture_graphs()
    captured = runner.graph_captures
    graphed = run(Engine(runner, EngineConfig(max_running=4)), arrivals)
    assert captured and runner.graph_captures == captured, "steps must replay graphs captured up front"
    for req in reqs:
        np.testing.assert_allclose(audio(graphed[req.request_id]), audio(eager[req.request_id]), atol=1e-4, rtol=0)


def test_swapping_through_one_device_slot_leaks_nothing(
    tts: VoxCPM, tmp_path_factory: pytest.TempPathFactory, adapters: dict[str, Path]
) -> None:
    """One resident persona at a time: B evicts A once A's request is done. A request for B while A's holds the
    only slot waits in the queue for it (issue 20.6: it used to fail at once) and then speaks as it does alone."""
    one_slot = persona_model(tmp_path_factory, adapters, max_personas=1)
    reqs = speakers(tts)
    a, b = reqs[1], reqs[2]
    eng, _ = engine(one_slot)
    outputs = run(eng, {0: [a], 1: [b]})
    np.testing.assert_allclose(audio(outputs[a.request_id]), solo(tts, a), atol=1e-4, rtol=0)
    np.testing.assert_allclose(audio(outputs[b.request_id]), solo(tts, b), atol=1e-4, rtol=0)
    assert outputs[b.request_id][-1].finish_reason is not FinishReason.ERROR
    for req in (b, a, b):  # swap B in, A back, B again: each equals the many-slot model's audio
        np.testing.assert_allclose(solo(one_slot, req), solo(tts, req), atol=1e-4, rtol=0)


def test_removing_a_persona_lets_its_requests_finish_and_refuses_new_ones(
    tmp_path_factory: pytest.TempPathFactory, adapters: dict[str, Path]
) -> None:
    model = persona_model(tmp_path_factory, adapters, max_personas=2)
    bank = model.personas
    assert bank is not None
    first = with_persona(request("first", "Speaking while removed.", seed=5, max_len=9), "B")
    expected = solo(model, first)
    eng, _ = engine(model)
    eng.add(first)
    outputs = [o for _ in range(3) for o in eng.step()]
    bank.remove("B")
    later = with_persona(request("later", "Too late.", seed=6, max_len=5), "B")
    eng.add(later)
    while eng.has_work():
        outputs += eng.step()
    heard = np.concatenate([o.audio for o in outputs if o.request_id == "first"])
    np.testing.assert_allclose(heard, expected, atol=1e-4, rtol=0)
    last = [o for o in outputs if o.request_id == "later"][-1]
    assert last.finish_reason == FinishReason.ERROR and "unknown persona 'B'" in (last.error or "")
    assert "B" not in bank.resident  # its slot was freed when its last request ended
    # Registered again, it is the same voice.
    bank.register("B", load_lora(adapters["B"], model.model))
    np.testing.assert_allclose(solo(model, first), expected, atol=1e-4, rtol=0)


def slot_buffers(model: VoxCPM) -> dict[str, int]:
    """The address of every adapter slot buffer: what a captured CUDA graph reads."""
    bank = model.personas
    assert bank is not None
    return {
        f"{path}.{name}": getattr(layer, name).data_ptr()
        for path, layer in bank.layers.items()
        for name in ("lora_A", "lora_B", "scaling")
    }


@pytest.mark.slow
def test_a_persona_added_after_graph_capture_needs_no_capture_and_sounds_as_if_loaded_before(
    tts: VoxCPM,
    tmp_path_factory: pytest.TempPathFactory,
    emulated_graph_capture: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Adapters are graph inputs: layers are reserved before capture, and loading (or removing) a persona afterwards
    only writes its weights into the reserved slot buffers in place, so no graph is captured again and the
    persona speaks exactly as on a model that had it before the engine started (``tts``)."""
    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("late") / "v2", "voxcpm2", seed=0)
    late = voxwire.load_model(folder, device="cpu", dtype=torch.float32)
    bank = late.enable_personas(max_personas=4, max_rank=16)
    bank.reserve(load_lora(LORA, late.model).config)  # what the server reserves at start-up
    addresses = slot_buffers(late)
    runner = ModelRunner(late, RunnerOptions(num_slots=4, max_length=256, cuda_graphs=True, max_timesteps=16))
    with caplog.at_level(logging.INFO, logger="voxwire.engine.runner"):
        runner.capture_graphs()
    captured = runner.graph_captures
    assert captured == len(runner.graphs.buckets) * len(runner.graphs.timestep_counts)  # type: ignore[union-attr]
    assert runner.graph_capture_seconds > 0
    assert f"captured {captured} CUDA graphs" in caplog.text
    late.load_persona("A", LORA)
    reqs = speakers(tts)[:2]  # no persona, and persona A
    heard = run(Engine(runner, EngineConfig(max_running=4)), {0: reqs})
    assert runner.graph_captures == captured and slot_buffers(late) == addresses
    for req in reqs:
        np.testing.assert_allclose(audio(heard[req.request_id]), solo(tts, req), atol=1e-4, rtol=0)
    bank.remove("A")
    late.load_persona("B", LORA)  # another name, the same adapter: the same voice again
    again = with_persona(reqs[1], "B")
    heard_again = audio(run(Engine(runner, EngineConfig(max_running=4)), {0: [again]})[again.request_id])
    assert runner.graph_captures == captured and slot_buffers(late) == addresses
    np.testing.assert_allclose(heard_again, solo(tts, reqs[1]), atol=1e-4, rtol=0)


def test_after_capture_an_adapter_of_unreserved_layers_is_refused_not_captured(
    tmp_path_factory: pytest.TempPathFactory, emulated_graph_capture: None
) -> None:
    """Capturing seals the adapted layers: a persona needing others is refused at load (typed), and personas
    enabled only after capture are refused per request, instead of replaying graphs without their layers."""
    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("sealed") / "v2", "voxcpm2", seed=0)
    sealed = voxwire.load_model(folder, device="cpu", dtype=torch.float32)
    sealed.enable_personas(max_personas=2, max_rank=16).reserve(LoRAConfig(enable_lm=True))  # q/k/v/o only
    runner = ModelRunner(sealed, RunnerOptions(num_slots=2, max_length=256, cuda_graphs=True, max_timesteps=16))
    runner.capture_graphs()
    with pytest.raises(UnreservedLayersError, match="did not reserve"):
        sealed.load_persona("A", LORA)  # it adapts the MLPs, the DiT and the projections too
    assert sealed.personas is not None and not sealed.personas.adapters

    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("never") / "v2", "voxcpm2", seed=0)
    plain = voxwire.load_model(folder, device="cpu", dtype=torch.float32)
    runner = ModelRunner(plain, RunnerOptions(num_slots=2, max_length=256, cuda_graphs=True, max_timesteps=16))
    runner.capture_graphs()
    plain.enable_personas(max_personas=2, max_rank=16)
    plain.load_persona("A", LORA)
    req = with_persona(request("late", "Too late for the graphs.", seed=3, max_len=4), "A")
    last = run(Engine(runner, EngineConfig(max_running=2)), {0: [req]})[req.request_id][-1]
    assert last.finish_reason is FinishReason.ERROR and "after this engine captured" in (last.error or "")


def poisoned(model: VoxCPM, name: str, value: float) -> None:
    """Register an adapter of persona A's layers whose weights are all ``value`` (load_lora refuses such files:
    this is a bad slot reaching the bank anyway)."""
    good = load_lora(LORA, model.model)
    weights = {path: (torch.full_like(a, value), torch.full_like(b, value)) for path, (a, b) in good.weights.items()}
    assert model.personas is not None
    model.personas.register(name, LoRAAdapter("poison", good.config, weights))


@pytest.mark.slow
@pytest.mark.isa
@pytest.mark.parametrize(
    ("batch_invariant", "value"),
    [(False, float("nan")), (True, float("nan")), (True, float("inf"))],
    ids=["default-nan", "batch-invariant-nan", "batch-invariant-inf"],
)
def test_a_nan_persona_fails_its_own_request_at_once_and_touches_no_other_row(
    tmp_path_factory: pytest.TempPathFactory, adapters: dict[str, Path], batch_invariant: bool, value: float
) -> None:
    """Issue 20.1: a resident NaN (or infinite) adapter used to turn every row's adapter update into NaN with
    batch-invariant numerics (each row's update multiplied the other slots' by zero), silencing everyone, and its
    own request spoke silence up to its length cap. Now that request ends with an error at its first step, and
    bystanders (no persona, a healthy one), alongside it and after it, hear what they hear without it: bit for bit
    what a healthy request of one step beside them gives, and with batch-invariant numerics their solo audio."""
    model = persona_model(tmp_path_factory, adapters, max_personas=4)
    poisoned(model, "poison", value)
    bystanders = [with_persona(req, persona) for req, persona in zip(speakers(model)[:2], (None, "A"), strict=True)]
    bad = with_persona(request("bad", "A poisoned voice.", seed=9, max_len=40), "poison")
    healthy = with_persona(request("bad", "A poisoned voice.", seed=9, max_len=1, min_len=0), "A")

    beside_healthy = run(engine(model, batch_invariant=batch_invariant)[0], {0: [healthy, *bystanders]})
    eng, _ = engine(model, batch_invariant=batch_invariant)
    outputs = run(eng, {0: [bad, *bystanders]})
    assert len(outputs["bad"]) == 1, "the first non-finite step ends the request"
    assert outputs["bad"][-1].finish_reason is FinishReason.ERROR
    assert "NaN or infinite" in (outputs["bad"][-1].error or "")
    for req in bystanders:
        heard = audio(outputs[req.request_id])
        assert np.array_equal(heard, audio(beside_healthy[req.request_id])), req.request_id
        if batch_invariant:
            assert np.array_equal(heard, solo(model, req, batch_invariant=True)), req.request_id
    # After it ended, its adapter still resident and its row and blocks reused: the same audio as on a fresh engine.
    assert model.personas is not None and "poison" in model.personas.resident
    later = run(eng, {0: bystanders})
    fresh = run(engine(model, batch_invariant=batch_invariant)[0], {0: bystanders})
    for req in bystanders:
        assert np.array_equal(audio(later[req.request_id]), audio(fresh[req.request_id])), req.request_id


def test_adding_personas_while_sessions_speak_leaves_them_unchanged(
    tts: VoxCPM, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A model serving without personas gets its first ones mid-stream (its layers are adapted then): the
    running session sounds as it would alone, and a session that then asks for the new persona gets it."""
    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("add") / "v2", "voxcpm2", seed=0)
    fresh = voxwire.load_model(folder, device="cpu", dtype=torch.float32)
    plain, voiced = speakers(tts)[0], speakers(tts)[1]
    expected_plain = solo(fresh, plain)
    eng, _ = engine(fresh)
    eng.add(plain)
    outputs = [o for _ in range(3) for o in eng.step()]
    fresh.enable_personas(max_personas=2, max_rank=8)
    fresh.load_persona("A", LORA)
    eng.add(voiced)
    while eng.has_work():
        outputs += eng.step()
    heard = {rid: np.concatenate([o.audio for o in outputs if o.request_id == rid]) for rid in ("r0", "r1")}
    np.testing.assert_allclose(heard["r0"], expected_plain, atol=1e-4, rtol=0)
    np.testing.assert_allclose(heard["r1"], solo(tts, voiced), atol=1e-4, rtol=0)


def test_voiced_rows_with_different_personas_share_a_prefill(tts: VoxCPM) -> None:
    """A voice's patches are encoded once (and cached) without any persona; each row's persona still adapts the
    projection of those encodings into the LM, even when voiced rows of several personas are prefilled together."""
    patches = 0.5 * torch.randn(
        8, tts.config.patch_size, tts.config.feat_dim, generator=torch.Generator().manual_seed(3)
    )
    voice = VoicePrompt("A short clip.", patches)
    reqs = [
        Request(
            f"v{i}",
            text,
            params=SynthesisParams(seed=5 + i, max_len=6),
            prompt=voice,
            persona=persona,
        )
        for i, (text, persona) in enumerate([("One voice.", "A"), ("Two voices.", "B"), ("Three.", None)])
    ]
    alone = {req.request_id: solo(tts, req) for req in reqs}
    together = run(engine(tts)[0], {0: reqs})
    for req in reqs:
        assert together[req.request_id][-1].finish_reason is not FinishReason.ERROR
        np.testing.assert_allclose(audio(together[req.request_id]), alone[req.request_id], atol=1e-4, rtol=0)
    # The persona reaches the voiced prompt: the same request with A and without a persona differ.
    plain = solo(tts, Request("p", "One voice.", params=SynthesisParams(seed=5, max_len=6), prompt=voice))
    n = min(plain.size, alone["v0"].size)
    assert float(np.abs(plain[:n] - alone["v0"][:n]).max()) > 0.05
