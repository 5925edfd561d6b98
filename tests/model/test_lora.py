"""LoRA personas in the reference's format: parity with the reference's own LoRA inference, and strict loading.

The adapters and expected audio under ``tests/fixtures/reference/lora/`` were made by
``scripts/reference/lora_fixtures.py`` with the reference's ``LoRAConfig``/``LoRALinear`` and its inference
path; nothing here derives them from voxwire.
"""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import voxwire
from voxwire.errors import ModelLoadError
from voxwire.kernels.batch_invariant import batch_invariant as invariant_numerics
from voxwire.model import lora as lora_module
from voxwire.model.lora import MAX_LORA_ALPHA, MAX_LORA_WEIGHT, LoRALoadError, LoRATooLargeError, load_lora
from voxwire.model.personas import PersonaLinear, PersonaRows
from voxwire.params import SynthesisParams
from voxwire.tiny.checkpoint import make_tiny_checkpoint, weights_digest
from voxwire.tts import VoxCPM
from voxwire.voice_clip import VoiceClip

LORA = Path(__file__).parents[1] / "fixtures" / "reference" / "lora"
PROMPTS = Path(__file__).parents[1] / "fixtures" / "reference" / "model"
NAMES = ["voxcpm-16k", "voxcpm2"]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("lora"))


@cache
def fp32_model(name: str, tmp_root: str) -> VoxCPM:
    directory = make_tiny_checkpoint(Path(tmp_root) / name, name, seed=0)
    meta = json.loads((LORA / name / "meta.json").read_text(encoding="utf-8"))
    assert weights_digest(directory) == meta["weights_digest"], "rerun scripts/reference/lora_fixtures.py"
    return voxwire.load_model(directory, device="cpu", dtype=torch.float32)


def cases() -> list:
    params = []
    for name in NAMES:
        meta = json.loads((LORA / name / "meta.json").read_text(encoding="utf-8"))
        params += [pytest.param(name, case, id=f"{name}-{case['key']}") for case in meta["generate"]]
    return params


@pytest.mark.slow
@pytest.mark.isa
@pytest.mark.parametrize(("name", "case"), cases())
def test_persona_matches_the_reference_with_its_adapter_loaded(name: str, case: dict, tmp_root: str) -> None:
    tts = fp32_model(name, tmp_root)
    meta = json.loads((LORA / name / "meta.json").read_text(encoding="utf-8"))
    expected = load_file(str(LORA / name / "fixture.safetensors"))[f"generate.{case['key']}"].numpy()
    prompt = case["prompt"]
    voice = None
    if prompt:
        voice = tts.make_prompt(VoiceClip(text=prompt["prompt_text"], audio=PROMPTS / name / prompt["prompt_wav_path"]))
    params = SynthesisParams(seed=case["seed"], max_len=meta["max_len"])
    plain = tts.generate(case["text"], params, prompt=voice)
    persona = tts.generate(case["text"], params, prompt=voice, lora=LORA / name)
    assert persona.shape == expected.shape
    assert float(np.abs(persona - expected).max()) <= 1e-4
    # The adapter matters (the comparison could not pass without it), and leaves no trace after its request.
    assert plain.shape != expected.shape or float(np.abs(plain - expected).max()) > 0.1
    np.testing.assert_array_equal(tts.generate(case["text"], params, prompt=voice), plain)


# ---- strict loading ----


def adapter_copy(tmp_path: Path, name: str = "voxcpm2") -> tuple[Path, dict[str, torch.Tensor]]:
    folder = tmp_path / "adapter"
    shutil.copytree(LORA / name, folder)
    return folder, load_file(str(folder / "lora_weights.safetensors"))


def write_state(folder: Path, state: dict[str, torch.Tensor]) -> None:
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "lora_weights.safetensors"))


def load_error(folder: Path, tmp_root: str) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load_lora(folder, fp32_model("voxcpm2", tmp_root).model)
    return str(caught.value)


Q0 = "base_lm.layers.0.self_attn.q_proj"
DIT_V1 = "feat_decoder.estimator.decoder.layers.1.self_attn.v_proj"


def test_every_offending_key_is_named_in_one_error(tmp_path: Path, tmp_root: str) -> None:
    folder, state = adapter_copy(tmp_path)
    del state[f"{Q0}.lora_B"]  # missing partner
    state[f"{DIT_V1}.lora_A"] = torch.zeros(8, 3)  # wrong shape
    state["stop_proj.lora_A"] = torch.zeros(8, 32)  # not targeted by the config
    write_state(folder, state)
    message = load_error(folder, tmp_root)
    assert f"{Q0}.lora_B: missing" in message
    assert f"{DIT_V1}.lora_A: shape (8, 3)" in message
    assert "stop_proj.lora_A: unknown key" in message


def test_a_rank_that_differs_from_the_config_is_refused(tmp_path: Path, tmp_root: str) -> None:
    folder, _ = adapter_copy(tmp_path)
    document = json.loads((folder / "lora_config.json").read_text())
    document["lora_config"]["r"] = 4
    (folder / "lora_config.json").write_text(json.dumps(document))
    assert "config says r=4" in load_error(folder, tmp_root)


def test_missing_config_or_weights_are_named(tmp_path: Path, tmp_root: str) -> None:
    folder, _ = adapter_copy(tmp_path)
    (folder / "lora_weights.safetensors").unlink()
    assert "neither lora_weights.safetensors nor lora_weights.ckpt" in load_error(folder, tmp_root)
    (folder / "lora_config.json").unlink()
    assert "lora_config.json is missing" in load_error(folder, tmp_root)


@pytest.mark.isa
@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "state_dict"])
def test_ckpt_variant_and_compiled_key_names_load_the_same_weights(
    tmp_path: Path, tmp_root: str, wrapped: bool
) -> None:
    model = fp32_model("voxcpm2", tmp_root).model
    expected = load_lora(LORA / "voxcpm2", model).weights
    folder, state = adapter_copy(tmp_path)
    (folder / "lora_weights.safetensors").unlink()
    # torch.compile's wrapper puts "._orig_mod." into the names the trainer saves.
    compiled = {k.replace("feat_decoder.estimator.", "feat_decoder._orig_mod.estimator."): v for k, v in state.items()}
    torch.save({"state_dict": compiled} if wrapped else compiled, folder / "lora_weights.ckpt")
    loaded = load_lora(folder, model).weights
    assert loaded.keys() == expected.keys()
    for path, (a, b) in expected.items():
        assert torch.equal(loaded[path][0], a) and torch.equal(loaded[path][1], b)


@pytest.mark.isa
def test_synth_cli_speaks_with_a_lora_folder(tmp_path: Path, tmp_root: str, capsys: pytest.CaptureFixture) -> None:
    import soundfile

    from voxwire.cli.main import main

    meta = json.loads((LORA / "voxcpm2" / "meta.json").read_text(encoding="utf-8"))
    case = next(c for c in meta["generate"] if c["key"] == "en")
    fp32_model("voxcpm2", tmp_root)  # checks the checkpoint digest
    common = ["synth", "--model", str(Path(tmp_root) / "voxcpm2"), "--device", "cpu", "--dtype", "float32"]
    common += ["--text", case["text"], "--seed", str(case["seed"]), "--max-len", str(meta["max_len"]), "--quiet"]
    assert main([*common, "--lora", str(LORA / "voxcpm2"), "--out", str(tmp_path / "persona.wav")]) == 0
    heard, _ = soundfile.read(str(tmp_path / "persona.wav"), dtype="float32")
    expected = load_file(str(LORA / "voxcpm2" / "fixture.safetensors"))["generate.en"].numpy()
    assert heard.shape == expected.shape
    assert float(np.abs(heard - expected).max()) <= 2**-14  # 16-bit WAV
    assert main([*common, "--lora", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.wav")]) == 2
    assert "not a LoRA checkpoint directory" in capsys.readouterr().err


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 3e38, -2e3])
def test_non_finite_or_absurd_weights_are_refused(tmp_path: Path, tmp_root: str, value: float) -> None:
    """Issue 20.1: a diverged training run writes NaN adapters; they loaded, and silenced every user's audio."""
    folder, state = adapter_copy(tmp_path)
    state[f"{Q0}.lora_B"][3, 1] = value
    write_state(folder, state)
    message = load_error(folder, tmp_root)
    expected = "NaN or infinite" if not np.isfinite(value) else f"above the bound {MAX_LORA_WEIGHT:g}"
    assert f"{Q0}.lora_B: " in message and expected in message


@pytest.mark.parametrize(
    ("text", "field"),
    [("NaN", "alpha=nan"), ("Infinity", "alpha=inf"), ("-1e5", "alpha=-100000.0"), ("1" + "0" * 400, "alpha=1000")],
)
def test_non_finite_or_absurd_alpha_is_refused(tmp_path: Path, tmp_root: str, text: str, field: str) -> None:
    """``"alpha": NaN`` loaded and was then listed as a bare NaN, which is no JSON."""
    folder, _ = adapter_copy(tmp_path)
    config = (folder / "lora_config.json").read_text()
    (folder / "lora_config.json").write_text(config.replace('"alpha": 16', f'"alpha": {text}'))
    message = load_error(folder, tmp_root)
    assert field in message and f"|alpha| <= {MAX_LORA_ALPHA:g}" in message


@pytest.mark.isa
@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "batch-invariant"])
def test_a_poisoned_slot_never_reaches_another_row(batch_invariant: bool) -> None:
    """Each row's adapter is selected by its slot, never computed for every slot and masked (0 x NaN = NaN): rows
    of slot 0 (no persona) and of a healthy slot give bit for bit what they give with the bad slot empty."""
    generator = torch.Generator().manual_seed(0)
    rows = PersonaRows()
    layer = PersonaLinear(torch.nn.Linear(6, 5), slots=3, max_rank=4, rows=rows)
    layer.set_slot(1, torch.randn(2, 6, generator=generator), torch.randn(5, 2, generator=generator), 2.0)
    x = torch.randn(4, 3, 6, generator=generator)  # (rows, tokens, in)
    rows.index = torch.tensor([0, 1, 2, 1])
    with invariant_numerics(batch_invariant):
        clean = layer(x)
        for value in (float("nan"), float("inf")):
            layer.set_slot(2, torch.full((4, 6), value), torch.full((5, 4), value), 1.0)
            poisoned = layer(x)
            healthy = [0, 1, 3]
            assert torch.equal(poisoned[healthy], clean[healthy])
            assert not bool(torch.isfinite(poisoned[2]).all())


@pytest.mark.parametrize("where", ["config", "header"])
def test_a_rank_above_max_rank_is_refused_before_the_weights_are_read(
    tmp_path: Path, tmp_root: str, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Issue 20.9: the rank comes from ``lora_config.json`` and then the safetensors header (a config may
    understate it), before any weight is in memory: the weight loader is never called."""
    folder, _ = adapter_copy(tmp_path)
    if where == "header":
        config = (folder / "lora_config.json").read_text()
        (folder / "lora_config.json").write_text(config.replace('"r": 8', '"r": 2'))
    model = fp32_model("voxcpm2", tmp_root).model

    def no_weights(*args: object, **kwargs: object) -> object:
        raise AssertionError("the weights were read")

    monkeypatch.setattr(lora_module, "load_file", no_weights)
    with pytest.raises(LoRATooLargeError) as caught:
        load_lora(folder, model, max_rank=4)
    said = {"config": "rank 8 (r=8 in lora_config.json)", "header": "rank 8 (base_lm.layers.0.mlp.down_proj.lora_A (8,"}
    assert said[where] in caught.value.public and "max_rank=4" in caught.value.public
    assert str(folder) not in caught.value.public and str(folder) in str(caught.value)


def test_the_public_message_has_no_path_and_no_config_contents(tmp_path: Path, tmp_root: str) -> None:
    """Issue 20.5: a server shows clients ``public``; ``str`` keeps every detail for the files' owner."""
    folder, _ = adapter_copy(tmp_path)
    document = json.loads((folder / "lora_config.json").read_text())
    document["lora_config"].update({"SECRET_FIELD": 1, "alpha": "SECRET_VALUE"})
    (folder / "lora_config.json").write_text(json.dumps(document))
    with pytest.raises(LoRALoadError) as caught:
        load_lora(folder, fp32_model("voxcpm2", tmp_root).model)
    public = caught.value.public
    assert "lora_config.json" in public and "alpha must be" in public and "1 unknown field" in public
    assert "SECRET" not in public and str(tmp_path) not in public
    detail = str(caught.value)
    assert "SECRET_FIELD" in detail and "SECRET_VALUE" in detail and str(folder) in detail
