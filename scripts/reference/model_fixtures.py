"""Golden fixtures for the whole model, recorded from the reference implementation (PyPI voxcpm 2.0.3).

Runs in the reference environment (``bash scripts/reference/setup_env.sh``), never in voxwire's:

    .venv-reference/bin/python scripts/reference/model_fixtures.py

For each tiny checkpoint made by ``voxwire.tiny.checkpoint.make_tiny_checkpoint`` it records, with
the reference code:

* fp32 module outputs on fixed random inputs (base LM prefill and step, residual LM, LocEnc, LocDiT,
  the CFM sampler, FSQ, stop head);
* fp32 ``VoxCPM.generate`` audio for several texts and seeds (zero-shot, continuation prompt, and on
  voxcpm2 a reference clip alone and with a continuation prompt, and a designed voice: the text its CLI's
  ``build_final_text`` makes of a control, as ``voxcpm design`` does), ``retry_badcase=False``;
* bf16 per-step traces of ``generate`` (lm_hidden, residual hidden, stop logits, noise, patch), for
  teacher-forced comparison.

Outputs go to ``tests/fixtures/reference/model/<name>/``: ``fixture.safetensors``, ``meta.json`` and the
prompt clips. The weights digest in ``meta.json`` ties the fixture to the generator's output.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "server"))

from voxcpm.cli import build_final_text  # noqa: E402
from voxcpm.core import VoxCPM  # noqa: E402

from voxwire.tiny.checkpoint import make_tiny_checkpoint, weights_digest  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "reference" / "model"
# Per tiny model: the generate() length limit (keeps the fixture small).
CASES = {"voxcpm-16k": 40, "voxcpm-44k": 9, "voxcpm2": 14, "voxcpm2-b": 20}
TEXTS = {
    "en": ("Hello world, this is a test.", 11),
    "zh": ("今天天气很好，我们去公园散步吧。", 12),
    "mixed": ("VoxCPM 语音合成 works in real time!", 13),
}
PROMPT_TEXT = "This is my voice."
TARGET = "Nice to meet you."
DESIGN = ("  A warm, gentle female voice, slightly husky  ", "Hello there, how are you today?")
"""(control, words) of the designed case: the control with spaces around it, which the reference strips."""


def main() -> None:
    torch.set_num_threads(1)
    for name, max_len in CASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            record(name, max_len, Path(tmp))
        print(f"{name}: written to {OUT / name}")


def record(name: str, max_len: int, tmp: Path) -> None:
    fp32_dir = make_tiny_checkpoint(tmp / "fp32", name, seed=0)
    config = json.loads((fp32_dir / "config.json").read_text())
    (fp32_dir / "config.json").write_text(json.dumps({**config, "dtype": "float32", "device": "cpu"}))
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    meta: dict = {"reference": "voxcpm==2.0.3", "weights_digest": weights_digest(fp32_dir), "max_len": max_len}

    ref = VoxCPM(str(fp32_dir), enable_denoiser=False, optimize=False, device="cpu")
    model = ref.tts_model
    is_v2 = config["architecture"] == "voxcpm2"
    tensors |= record_modules(model, is_v2)
    clips = write_clips(model, out, is_v2)
    meta["generate"] = record_generate(ref, clips, max_len, is_v2, tensors)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "fixture.safetensors"))
    (out / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@torch.inference_mode()
def record_modules(model: torch.nn.Module, is_v2: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    cfg = model.config
    hidden, patch, dim = cfg.lm_config.hidden_size, cfg.patch_size, cfg.feat_dim
    hd = cfg.dit_config.hidden_dim
    t: dict[str, torch.Tensor] = {}
    for lm_name in ("base_lm", "residual_lm"):
        lm = getattr(model, lm_name)
        x = torch.randn(2, 7, hidden, generator=g)
        out, kv = lm(x, is_causal=True)
        step_in = torch.randn(2, hidden, generator=g)
        lm.setup_cache(2, cfg.max_length, "cpu", torch.float32)
        lm.kv_cache.fill_caches(kv)
        step_out = lm.forward_step(step_in, torch.tensor([lm.kv_cache.step()]))
        t |= {
            f"module.{lm_name}.input": x,
            f"module.{lm_name}.output": out,
            f"module.{lm_name}.step_input": step_in,
            f"module.{lm_name}.step_output": step_out,
        }
        lm.setup_cache(1, cfg.max_length, "cpu", torch.float32)
    patches = torch.randn(2, 3, patch, dim, generator=g)
    t |= {"module.feat_encoder.input": patches, "module.feat_encoder.output": model.feat_encoder(patches)}
    x = torch.randn(3, dim, patch, generator=g)
    mu = torch.randn(3, hd * (2 if is_v2 else 1), generator=g)
    time = torch.rand(3, generator=g)
    cond = torch.randn(3, dim, patch, generator=g)
    dt = torch.zeros(3)
    t |= {
        "module.estimator.x": x,
        "module.estimator.mu": mu,
        "module.estimator.t": time,
        "module.estimator.cond": cond,
        "module.estimator.output": model.feat_decoder.estimator(x, mu, time, cond, dt),
    }
    for steps, cfg_value, seed in ((10, 2.0, 5), (4, 1.5, 6)):
        mu1 = torch.randn(1, hd * (2 if is_v2 else 1), generator=g)
        cond1 = torch.randn(1, dim, patch, generator=g)
        torch.manual_seed(seed)
        sample = model.feat_decoder(mu=mu1, n_timesteps=steps, patch_size=patch, cond=cond1, cfg_value=cfg_value)
        key = f"module.cfm.{steps}"
        t |= {
            f"{key}.mu": mu1,
            f"{key}.cond": cond1,
            f"{key}.output": sample,
            f"{key}.seed": torch.tensor(seed),
            f"{key}.cfg": torch.tensor(cfg_value),
        }
    h = torch.randn(3, hidden, generator=g)
    t |= {
        "module.fsq.input": h,
        "module.fsq.output": model.fsq_layer(h),
        "module.stop.output": model.stop_head(model.stop_actn(model.stop_proj(h))),
    }
    return t


def write_clips(model: torch.nn.Module, out: Path, is_v2: bool) -> dict[str, Path]:
    """Deterministic voice clips at the VAE's input rate (so neither side resamples)."""
    rate = model.audio_vae.sample_rate
    clips = {}
    for name, seconds, freq in (("prompt", 0.37, 180.0), ("reference", 0.29, 240.0)):
        if name == "reference" and not is_v2:
            continue
        n = int(rate * seconds)
        time = np.arange(n) / rate
        wave = 0.4 * np.sin(2 * np.pi * freq * time) * np.sin(np.pi * time / seconds) + 0.05 * np.sin(
            2 * np.pi * 3.1 * freq * time
        )
        path = out / f"{name}.wav"
        soundfile.write(str(path), wave.astype(np.float32), rate, subtype="PCM_16")
        clips[name] = path
    return clips


def generate_cases(clips: dict[str, Path], is_v2: bool) -> list[tuple[str, str, int, dict]]:
    cases = [(key, text, seed, {}) for key, (text, seed) in TEXTS.items()]
    cases.append(("continuation", TARGET, 21, {"prompt_wav_path": str(clips["prompt"]), "prompt_text": PROMPT_TEXT}))
    if is_v2:
        cases.append(("reference", TARGET, 22, {"reference_wav_path": str(clips["reference"])}))
        cases.append(
            (
                "reference_continuation",
                TARGET,
                23,
                {
                    "reference_wav_path": str(clips["reference"]),
                    "prompt_wav_path": str(clips["prompt"]),
                    "prompt_text": PROMPT_TEXT,
                },
            )
        )
        cases.append(("design", build_final_text(DESIGN[1], DESIGN[0]), 24, {}))
    return cases


def record_generate(
    ref: VoxCPM, clips: dict[str, Path], max_len: int, is_v2: bool, tensors: dict[str, torch.Tensor]
) -> list[dict]:
    cases = []
    for key, text, seed, prompt in generate_cases(clips, is_v2):
        torch.manual_seed(seed)
        wav = ref.generate(text, max_len=max_len, retry_badcase=False, **prompt)
        tensors[f"generate.{key}"] = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32))
        case = {"key": key, "text": text, "seed": seed, "prompt": _prompt_meta(prompt), "samples": int(wav.shape[0])}
        if key == "design":
            case |= {"control": DESIGN[0], "words": DESIGN[1]}
        cases.append(case)
    return cases


def _prompt_meta(prompt: dict) -> dict:
    return {k: (Path(v).name if k.endswith("_path") else v) for k, v in prompt.items()}


if __name__ == "__main__":
    main()
