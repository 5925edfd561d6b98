"""Golden LoRA fixtures, made and run by the reference implementation (PyPI voxcpm 2.0.3).

Runs in the reference environment (``bash scripts/reference/setup_env.sh``), never in voxwire's:

    .venv-reference/bin/python scripts/reference/lora_fixtures.py

For a v1 (``voxcpm-16k``) and a v2 (``voxcpm2``) tiny checkpoint it:

* builds the reference model in training mode with its own ``LoRAConfig`` (r=8, alpha=16; the LM's
  attention and MLP, the LocDiT's attention and every projection targeted), so its own ``LoRALinear``
  layers are created, and fills their ``lora_A``/``lora_B`` with seeded random values (the reference
  initialises ``lora_B`` to zero, which would make the adapter a no-op);
* saves them the way the reference's fine-tuning script saves an adapter: the ``lora_`` entries of the
  model's state dict in ``lora_weights.safetensors``, and ``lora_config.json``
  (``{"base_model": ..., "lora_config": ...}``);
* loads that directory through the reference's own inference path (``VoxCPM(..., lora_config=...,
  lora_weights_path=...)``) and records fp32 ``generate`` audio (zero-shot and with a continuation prompt,
  ``retry_badcase=False``).

Output: ``tests/fixtures/reference/lora/<name>/``: the adapter directory's two files, ``fixture.safetensors``
(the audio) and ``meta.json`` (cases, and the weights digest of the tiny checkpoint).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "server"))

from voxcpm.core import VoxCPM  # noqa: E402
from voxcpm.model.voxcpm import LoRAConfig as LoRAConfigV1  # noqa: E402
from voxcpm.model.voxcpm import VoxCPMModel  # noqa: E402
from voxcpm.model.voxcpm2 import LoRAConfig as LoRAConfigV2  # noqa: E402
from voxcpm.model.voxcpm2 import VoxCPM2Model  # noqa: E402

from voxwire.tiny.checkpoint import make_tiny_checkpoint, weights_digest  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "reference" / "lora"
PROMPTS = ROOT / "tests" / "fixtures" / "reference" / "model"
MODELS = {"voxcpm-16k": (VoxCPMModel, LoRAConfigV1, 40), "voxcpm2": (VoxCPM2Model, LoRAConfigV2, 14)}
CASES = [
    ("en", "Hello world, this is a test.", 11, {}),
    ("continuation", "Nice to meet you.", 21, {"prompt_wav_path": "prompt.wav", "prompt_text": "This is my voice."}),
]


def main() -> None:
    torch.set_num_threads(1)
    for name, (model_class, config_class, max_len) in MODELS.items():
        with tempfile.TemporaryDirectory() as tmp:
            record(name, model_class, config_class, max_len, Path(tmp))
        print(f"{name}: written to {OUT / name}")


def record(name: str, model_class: type, config_class: type, max_len: int, tmp: Path) -> None:
    checkpoint = make_tiny_checkpoint(tmp / name, name, seed=0)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "dtype": "float32", "device": "cpu"}))
    lora_config = config_class(
        enable_lm=True,
        enable_dit=True,
        enable_proj=True,
        r=8,
        alpha=16,
        target_modules_lm=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        target_modules_dit=["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    save_adapter(model_class, checkpoint, lora_config, out)

    ref = VoxCPM(
        str(checkpoint),
        enable_denoiser=False,
        optimize=False,
        device="cpu",
        lora_config=lora_config,
        lora_weights_path=str(out),
    )
    tensors: dict[str, torch.Tensor] = {}
    cases = []
    for key, text, seed, prompt in CASES:
        paths = {k: str(PROMPTS / name / v) if k.endswith("_path") else v for k, v in prompt.items()}
        torch.manual_seed(seed)
        wav = ref.generate(text, max_len=max_len, retry_badcase=False, **paths)
        tensors[f"generate.{key}"] = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32))
        cases.append({"key": key, "text": text, "seed": seed, "prompt": prompt, "samples": int(wav.shape[0])})
    save_file(tensors, str(out / "fixture.safetensors"))
    meta = {
        "reference": "voxcpm==2.0.3",
        "weights_digest": weights_digest(checkpoint),
        "max_len": max_len,
        "generate": cases,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def save_adapter(model_class: type, checkpoint: Path, lora_config: object, out: Path) -> None:
    """The reference's own LoRA layers with seeded random values, saved as its fine-tuning script saves."""
    model = model_class.from_local(str(checkpoint), optimize=False, training=True, lora_config=lora_config)
    generator = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("lora_A"):
                param.copy_(torch.randn(param.shape, generator=generator) / param.shape[1] ** 0.5)
            elif param_name.endswith("lora_B"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if "lora_" in k}
    save_file(state, str(out / "lora_weights.safetensors"))
    document = {"base_model": str(checkpoint.name), "lora_config": lora_config.model_dump()}
    (out / "lora_config.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
