"""What a user pointing ``load_model`` at a checkpoint sees: every published layout loads, every broken one
fails with one clear ``ModelLoadError`` naming the file, and nothing is returned half-loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import voxwire
from voxwire.errors import InvalidInputError, ModelLoadError
from voxwire.params import SynthesisParams
from voxwire.tiny.checkpoint import make_tiny_checkpoint


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "voxcpm2", "voxcpm2")


@pytest.fixture
def checkpoint(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "copy"))


def load_error(path: Path) -> str:
    with pytest.raises(ModelLoadError) as info:
        voxwire.load_model(path, device="cpu")
    return str(info.value)


def test_loads_and_speaks(checkpoint: Path) -> None:
    model = voxwire.load_model(checkpoint, device="cpu")
    audio = model.generate("Hello.", SynthesisParams(seed=0, max_len=6))
    assert audio.dtype == np.float32 and audio.size % model.samples_per_patch == 0 and audio.size > 0
    assert model.sample_rate == 48000 and model.dtype == torch.float32
    assert model.model.audio_vae.decoder.sr_bin_boundaries.dtype == torch.int32


def test_pytorch_model_bin_bare_and_wrapped_and_audiovae_safetensors(checkpoint: Path) -> None:
    weights = load_file(str(checkpoint / "model.safetensors"))
    (checkpoint / "model.safetensors").unlink()
    torch.save({"state_dict": weights}, checkpoint / "pytorch_model.bin")
    expected = voxwire.load_model(checkpoint, device="cpu").generate("Hi there.", SynthesisParams(seed=5, max_len=6))
    torch.save(weights, checkpoint / "pytorch_model.bin")
    vae = torch.load(checkpoint / "audiovae.pth", weights_only=True)["state_dict"]
    (checkpoint / "audiovae.pth").unlink()
    save_file(vae, str(checkpoint / "audiovae.safetensors"))
    audio = voxwire.load_model(checkpoint, device="cpu").generate("Hi there.", SynthesisParams(seed=5, max_len=6))
    np.testing.assert_array_equal(audio, expected)


def test_bf16_loads_transformer_in_bf16_and_vae_in_fp32(checkpoint: Path) -> None:
    model = voxwire.load_model(checkpoint, device="cpu", dtype="bfloat16")
    assert model.model.base_lm.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert model.model.base_lm.rope_emb.cos_cached.dtype == torch.bfloat16
    assert model.model.audio_vae.decoder.model[0].weight.dtype == torch.float32
    assert model.generate("Hi.", SynthesisParams(seed=1, max_len=5)).dtype == np.float32


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors", "audiovae.pth"])
def test_missing_file_is_named(checkpoint: Path, name: str) -> None:
    (checkpoint / name).unlink()
    message = load_error(checkpoint)
    assert "missing" in message or "cannot read" in message
    assert name.split(".")[0] in message


def test_truncated_safetensors(checkpoint: Path) -> None:
    path = checkpoint / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    message = load_error(checkpoint)
    assert "model.safetensors" in message and "truncated or corrupt" in message


def test_every_key_problem_in_one_error(checkpoint: Path) -> None:
    weights = load_file(str(checkpoint / "model.safetensors"))
    weights["stop_head.weight"] = torch.zeros(3, weights["stop_head.weight"].shape[1], dtype=torch.bfloat16)
    del weights["base_lm.norm.weight"]
    weights["base_lm.extra.weight"] = torch.zeros(2)
    save_file(weights, str(checkpoint / "model.safetensors"))
    message = load_error(checkpoint)
    assert "model.safetensors" in message
    assert "missing keys (1): base_lm.norm.weight" in message
    assert "unexpected keys (1): base_lm.extra.weight" in message
    assert "wrong shapes (1): stop_head.weight" in message


def test_vae_key_problems_name_the_vae_file(checkpoint: Path) -> None:
    state = torch.load(checkpoint / "audiovae.pth", weights_only=True)
    del state["state_dict"]["encoder.fc_mu.bias"]
    torch.save(state, checkpoint / "audiovae.pth")
    message = load_error(checkpoint)
    assert "audiovae.pth" in message and "encoder.fc_mu.bias" in message


def test_unknown_architecture_and_unknown_key(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "architecture": "voxcpm3"}))
    assert "unknown architecture 'voxcpm3'" in load_error(checkpoint)
    (checkpoint / "config.json").write_text(json.dumps({**config, "patch_sise": 4}))
    assert "patch_sise" in load_error(checkpoint)


def test_ignored_published_keys_are_accepted(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    config["device"] = "cuda"
    config["dit_config"]["mean_mode"] = False
    (checkpoint / "config.json").write_text(json.dumps(config))
    voxwire.load_model(checkpoint, device="cpu")


def test_not_a_folder(tmp_path: Path) -> None:
    assert "model folder not found" in load_error(tmp_path / "nothing-here")
    (tmp_path / "file.bin").write_bytes(b"x")
    assert "is a file" in load_error(tmp_path / "file.bin")


def test_empty_text_is_a_clear_error(pristine: Path) -> None:
    model = voxwire.load_model(pristine, device="cpu")
    for text in ("", "   \n ", None):
        with pytest.raises(InvalidInputError, match="non-empty"):
            model.generate(text, SynthesisParams(seed=0))  # type: ignore[arg-type]


def test_hugging_face_id_from_offline_cache(pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model id resolves through huggingface_hub's cache layout with HF_HUB_OFFLINE=1 (no network)."""
    cache = tmp_path / "hub"
    snapshot = cache / "models--openbmb--VoxCPM2" / "snapshots" / "0123456789abcdef"
    shutil.copytree(pristine, snapshot)
    (cache / "models--openbmb--VoxCPM2" / "refs").mkdir()
    (cache / "models--openbmb--VoxCPM2" / "refs" / "main").write_text("0123456789abcdef")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    model = voxwire.load_model("openbmb/VoxCPM2", device="cpu")
    assert model.sample_rate == 48000
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache"):
        voxwire.load_model("openbmb/VoxCPM1.5", device="cpu")
