"""bf16 per-step traces of the reference's ``generate`` (PyPI voxcpm 2.0.3), recorded on the machine that runs
the test which compares them.

bf16 results depend on the CPU's kernels (AVX-512 BF16/AMX and AVX2 builds round differently), so these
traces are never committed: ``tests/model/test_reference_parity.py`` runs this script in the reference
environment (``bash scripts/reference/setup_env.sh``) on its own machine, with its own thread count and
kernel settings, and compares voxwire's teacher-forced bf16 steps with them:

    .venv-reference/bin/python scripts/reference/bf16_traces.py OUT_DIR --keys en,continuation --threads 1

For every tiny checkpoint with committed model fixtures (``tests/fixtures/reference/model/<name>/``) and
every recorded ``generate`` case whose key is in ``--keys``, it runs the reference's bf16 ``generate`` with
the case's text, seed and prompt clips and records per step: the LM hidden state and the residual hidden
state that condition the patch, the stop logits, the CFM noise and the sampled patch. Output:
``OUT_DIR/<name>.safetensors`` (``trace.<key>.<field>``) and ``OUT_DIR/<name>.json`` (the cases).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "server"))

from voxcpm.core import VoxCPM  # noqa: E402

from voxwire.tiny.checkpoint import make_tiny_checkpoint, weights_digest  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "model"
FIELDS = ("lm_hidden", "residual_hidden", "stop_logits", "noise", "patch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--keys", required=True, help="comma-separated generate case keys to trace")
    parser.add_argument("--threads", type=int, required=True, help="torch threads (match the comparing process)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    keys = set(args.keys.split(","))
    for folder in sorted(p for p in FIXTURES.iterdir() if (p / "meta.json").is_file()):
        with tempfile.TemporaryDirectory() as tmp:
            record(folder, keys, Path(tmp), args.out)


def record(folder: Path, keys: set[str], tmp: Path, out: Path) -> None:
    name = folder.name
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    checkpoint = make_tiny_checkpoint(tmp / name, name, seed=0)
    if weights_digest(checkpoint) != meta["weights_digest"]:
        raise SystemExit(f"{name}: make_tiny_checkpoint no longer makes the fixture's checkpoint")
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "device": "cpu"}))
    ref = VoxCPM(str(checkpoint), enable_denoiser=False, optimize=False, device="cpu")
    tensors: dict[str, torch.Tensor] = {}
    cases = []
    for case in meta["generate"]:
        if case["key"] not in keys:
            continue
        prompt = {k: str(folder / v) if k.endswith("_path") else v for k, v in case["prompt"].items()}
        log = trace_generate(ref, case["text"], case["seed"], meta["max_len"], prompt)
        tensors |= {f"trace.{case['key']}.{field}": value for field, value in log.items()}
        cases.append({**case, "steps": int(log["patch"].shape[0])})
    save_file(tensors, str(out / f"{name}.safetensors"))
    (out / f"{name}.json").write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")


def trace_generate(ref: VoxCPM, text: str, seed: int, max_len: int, prompt: dict) -> dict[str, torch.Tensor]:
    """What conditions each patch, and the patch itself, for every step of one ``generate`` call."""
    model = ref.tts_model
    log: dict[str, list[torch.Tensor]] = {field: [] for field in FIELDS}
    undo = [
        _record_input(model.lm_to_dit_proj, log["lm_hidden"]),
        _record_input(model.res_to_dit_proj, log["residual_hidden"]),
        _record_output(model.stop_head, log["stop_logits"]),
        _record_output(model.feat_decoder, log["patch"]),
        _record_randn(log["noise"]),
    ]
    try:
        torch.manual_seed(seed)
        ref.generate(text, max_len=max_len, retry_badcase=False, **prompt)
    finally:
        for restore in undo:
            restore()
    return {field: torch.cat(values).float().contiguous() for field, values in log.items()}


def _record_input(module: torch.nn.Module, sink: list[torch.Tensor]) -> Callable[[], None]:
    """Record the first argument of every call (the hidden state a projection reads)."""
    return _wrap_forward(module, lambda args, value: sink.append(args[0].clone()))


def _record_output(module: torch.nn.Module, sink: list[torch.Tensor]) -> Callable[[], None]:
    return _wrap_forward(module, lambda args, value: sink.append(value.clone()))


def _wrap_forward(module: torch.nn.Module, record: Callable[[tuple, torch.Tensor], None]) -> Callable[[], None]:
    real = module.forward

    def forward(*args: object, **kwargs: object) -> torch.Tensor:
        value = real(*args, **kwargs)
        record(args, value)
        return value

    module.forward = forward
    return lambda: delattr(module, "forward")


def _record_randn(sink: list[torch.Tensor]) -> Callable[[], None]:
    """Record every torch.randn draw (the CFM's noise is the only one during generate)."""
    real = torch.randn

    def randn(*args: object, **kwargs: object) -> torch.Tensor:
        value = real(*args, **kwargs)
        sink.append(value.clone())
        return value

    torch.randn = randn
    return lambda: setattr(torch, "randn", real)


if __name__ == "__main__":
    main()
