"""LoRA adapters in the reference's fine-tuning format (PyPI voxcpm 2.0.3), loaded unchanged and strictly.

A checkpoint is a directory with ``lora_config.json`` (``{"base_model": ..., "lora_config": {...}}``) and
``lora_weights.safetensors`` or, when safetensors was not available to the trainer, ``lora_weights.ckpt``
(``torch.save`` of the bare state dict or of ``{"state_dict": ...}``; read with ``weights_only=True``).

Which layers carry an adapter follows the reference's rules, from the config alone:

* ``enable_lm``: every ``nn.Linear`` in ``base_lm`` and ``residual_lm`` whose attribute name is in
  ``target_modules_lm`` (default the attention's ``q/k/v/o_proj``);
* ``enable_dit``: the same inside ``feat_decoder.estimator`` with ``target_modules_dit``;
* ``enable_proj``: the model's own ``nn.Linear`` attributes named in ``target_proj_modules`` (one that
  the architecture lacks, such as ``fusion_concat_proj`` on v1, is skipped as the reference skips it).

Each such layer needs ``<layer>.lora_A`` ``(r, in)`` and ``<layer>.lora_B`` ``(out, r)``; keys may carry
``torch.compile``'s ``._orig_mod.`` segment. The output is ``W x + b + (alpha / r) * B (A x)``; dropout is a
training-time setting and is ignored. Unlike the reference (which skips keys it cannot place and leaves
missing ones at their initial values) every missing partner, unknown key, wrong shape or rank mismatch is
reported together in one ``ModelLoadError``.

Values are checked too, since a diverged training run really does write NaN adapters and one bad adapter must
never reach the model: every weight must be finite with ``|w| <= MAX_LORA_WEIGHT`` (1e3; trained LoRA weights
are O(0.01-1), so this only refuses absurd files) and ``alpha`` finite with ``|alpha| <= MAX_LORA_ALPHA`` (1e4;
common values are 8-256). ``dropout`` (ignored) must still be a probability.

With ``max_rank`` the rank is checked before any weight is read: the config's ``r``, then each ``lora_A``'s and
``lora_B``'s shape from the safetensors header (``LoRATooLargeError``), so an oversized file costs no memory.

Every refusal is a ``LoRALoadError``: its text names the folder and everything wrong, for whoever owns the files;
its ``public`` form says what is wrong without the folder's path, the operating system's reasons, or the values
and unknown keys of ``lora_config.json``, for a server's clients (``serving.speech.persona_names``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from voxwire.errors import ModelLoadError
from voxwire.protocol.wire import is_finite_number

CONFIG_FILE = "lora_config.json"
SAFETENSORS_FILE = "lora_weights.safetensors"
CKPT_FILE = "lora_weights.ckpt"
_COMPILE_SEGMENT = "._orig_mod."
# Layers whose calls see the batch's rows in order (possibly repeated block-wise, as the CFG-doubled
# LocDiT rows are). The LocDiT time MLPs run on (row, timestep) pairs flattened row-major, which per-row
# adapters cannot follow, so they cannot carry one.
_UNSUPPORTED_DIT_PREFIXES = ("time_mlp.", "delta_time_mlp.")
MAX_LORA_WEIGHT = 1e3
"""Largest ``|w|`` of any ``lora_A``/``lora_B`` element accepted."""
MAX_LORA_ALPHA = 1e4
"""Largest ``|alpha|`` accepted."""


class LoRALoadError(ModelLoadError):
    """A LoRA checkpoint cannot be used. ``str``: every detail (the folder, values, the OS's reason); ``public``:
    what is wrong in terms of the format only (no path, no file contents but the weights' names and shapes)."""

    def __init__(self, public: str, detail: str | None = None) -> None:
        super().__init__(detail if detail is not None else public)
        self.public = public


class LoRATooLargeError(LoRALoadError):
    """The adapter's rank is above the ``max_rank`` accepted."""


@dataclass(frozen=True)
class LoRAConfig:
    """``lora_config.json``'s ``lora_config`` object; defaults are the reference's."""

    enable_lm: bool = False
    enable_dit: bool = False
    enable_proj: bool = False
    r: int = 8
    alpha: float = 16
    dropout: float = 0.0
    target_modules_lm: tuple[str, ...] = ("q_proj", "v_proj", "k_proj", "o_proj")
    target_modules_dit: tuple[str, ...] = ("q_proj", "v_proj", "k_proj", "o_proj")
    target_proj_modules: tuple[str, ...] = ("enc_to_lm_proj", "lm_to_dit_proj", "res_to_dit_proj", "fusion_concat_proj")

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    @classmethod
    def from_file(cls, path: Path) -> LoRAConfig:
        """Raises ``LoRALoadError`` (its ``public`` form names the file by its name only)."""
        name = path.name
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            unreadable = f"{name} cannot be read as JSON"
            raise LoRALoadError(unreadable, f"{path}: cannot read the LoRA config ({exc})") from exc
        section = document.get("lora_config") if isinstance(document, dict) else None
        if not isinstance(section, dict):
            expected = 'expected an object with a "lora_config" object'
            raise LoRALoadError(f"{name}: {expected}", f"{path}: {expected}")
        known = {f.name: f for f in fields(cls)}
        unknown = [key for key in section if key not in known]
        problems = [f"unknown field {key!r}" for key in unknown]
        public: list[str] = [f"{len(unknown)} unknown field(s) (the fields are {', '.join(known)})"] if unknown else []
        values: dict[str, object] = {}
        for key, value in section.items():
            if key not in known:
                continue
            default = known[key].default
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, tuple):
                ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
                value = tuple(value) if ok else value
            elif key == "r":
                ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
            else:
                within, expected = _NUMBERS[key]
                ok = is_finite_number(value) and within(float(value))
                if not ok:
                    problems.append(f"{key}={value!r} must be {expected}")
                    public.append(f"{key} must be {expected}")
                    continue
            if not ok:
                problems.append(f"{key}={value!r} has the wrong type or value")
                public.append(f"{key} has the wrong type or value")
            values[key] = value
        if problems:
            raise LoRALoadError(f"{name}: " + "; ".join(public), f"{path}: " + "; ".join(problems))
        return cls(**values)  # type: ignore[arg-type]  # each value's type checked above


_NUMBERS: dict[str, tuple[Callable[[float], bool], str]] = {
    "alpha": (lambda alpha: abs(alpha) <= MAX_LORA_ALPHA, f"a finite number with |alpha| <= {MAX_LORA_ALPHA:g}"),
    "dropout": (lambda dropout: 0 <= dropout < 1, "a number in [0, 1)"),
}
"""The config's number fields: each one's bound and how it is stated."""


@dataclass(frozen=True)
class LoRAAdapter:
    """One loaded adapter: per targeted layer (its module path in the model), ``A`` (r, in) and ``B`` (out, r)
    in float32 on the host."""

    source: str
    config: LoRAConfig
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def rank(self) -> int:
        return self.config.r


def target_layers(model: nn.Module, config: LoRAConfig) -> dict[str, nn.Linear]:
    """The layers ``config`` puts an adapter on, by module path, following the reference's rules."""
    found: dict[str, nn.Linear] = {}
    scopes = []
    if config.enable_lm:
        scopes += [("base_lm", config.target_modules_lm), ("residual_lm", config.target_modules_lm)]
    if config.enable_dit:
        scopes.append(("feat_decoder.estimator", config.target_modules_dit))
    for scope, names in scopes:
        root = model.get_submodule(scope)
        for path, module in root.named_modules():
            if isinstance(module, nn.Linear) and path.rsplit(".", 1)[-1] in names:
                found[f"{scope}.{path}"] = module
    if config.enable_proj:
        for name in config.target_proj_modules:
            module = getattr(model, name, None)
            if isinstance(module, nn.Linear):
                found[name] = module
    return found


def load_lora(directory: str | os.PathLike[str], model: nn.Module, max_rank: int | None = None) -> LoRAAdapter:
    """Read and check a LoRA checkpoint directory against ``model``'s layers (and its rank against ``max_rank``,
    before reading the weights).

    Raises:
        LoRATooLargeError: the rank is above ``max_rank``.
        LoRALoadError: a file is missing or unreadable, or the weights do not match the config and model
            (the message lists every offending key).
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise LoRALoadError("not a LoRA checkpoint directory", f"{folder}: not a LoRA checkpoint directory")
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        missing = f"{CONFIG_FILE} is missing (the reference's fine-tuning script writes it)"
        raise LoRALoadError(missing, f"{folder}: {missing}")
    config = LoRAConfig.from_file(config_path)
    if max_rank is not None:
        _check_rank(folder, config, max_rank)
    state = _read_weights(folder)
    layers = target_layers(model, config)
    problems = [
        f"{path}: LocDiT time-embedding layers cannot carry a per-request adapter"
        for path in layers
        if path.removeprefix("feat_decoder.estimator.").startswith(_UNSUPPORTED_DIT_PREFIXES)
    ]
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for raw_key, tensor in state.items():
        key = raw_key.replace(_COMPILE_SEGMENT, ".")
        layer, _, part = key.rpartition(".")
        if layer not in layers or part not in ("lora_A", "lora_B"):
            problems.append(f"{raw_key}: unknown key (no layer targeted by {CONFIG_FILE} has it)")
            continue
        pairs.setdefault(layer, {})[part] = tensor
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for path, linear in layers.items():
        found = pairs.get(path, {})
        missing_parts = [part for part in ("lora_A", "lora_B") if part not in found]
        if missing_parts:
            problems += [f"{path}.{part}: missing" for part in missing_parts]
            continue
        a, b = found["lora_A"], found["lora_B"]
        problems += _shape_problems(path, a, b, config.r, linear) or _value_problems(path, a, b)
        weights[path] = (a.float(), b.float())
    if problems:
        listing = f"LoRA weights do not match {CONFIG_FILE} and the model:\n  " + "\n  ".join(problems)
        raise LoRALoadError(listing, f"{folder}: {listing}")
    return LoRAAdapter(str(folder), config, weights)


def _check_rank(folder: Path, config: LoRAConfig, max_rank: int) -> None:
    """Refuse a rank above ``max_rank``: the config's ``r``, then every ``lora_A``/``lora_B`` shape in the
    safetensors header (read without the weights; a ``.ckpt`` pickle has no header: it is checked once loaded)."""
    ranks = {f"r={config.r} in {CONFIG_FILE}": config.r}
    safetensors_path = folder / SAFETENSORS_FILE
    if safetensors_path.is_file():
        try:
            with safe_open(str(safetensors_path), framework="pt") as header:
                for key in header.keys():  # noqa: SIM118 (a safetensors handle is not a mapping)
                    shape = header.get_slice(key).get_shape()
                    part = key.rpartition(".")[2]
                    if len(shape) == 2 and part in ("lora_A", "lora_B"):
                        ranks[f"{key} {tuple(shape)}"] = shape[0] if part == "lora_A" else shape[1]
        except (SafetensorError, OSError) as exc:
            unreadable = f"{SAFETENSORS_FILE} cannot be read as safetensors"
            raise LoRALoadError(unreadable, f"{safetensors_path}: cannot read ({exc})") from exc
    for where, rank in ranks.items():
        if rank > max_rank:
            too_large = f"rank {rank} ({where}) is above the largest accepted, max_rank={max_rank}"
            raise LoRATooLargeError(too_large, f"{folder}: {too_large}")


def _shape_problems(path: str, a: torch.Tensor, b: torch.Tensor, rank: int, linear: nn.Linear) -> list[str]:
    problems = []
    if a.dim() != 2 or b.dim() != 2:
        return [f"{path}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} must be matrices"]
    if a.shape[0] != rank or b.shape[1] != rank:
        problems.append(f"{path}: rank {a.shape[0]} (lora_A) / {b.shape[1]} (lora_B), config says r={rank}")
    if a.shape[1] != linear.in_features:
        problems.append(f"{path}.lora_A: shape {tuple(a.shape)}, expected ({rank}, {linear.in_features})")
    if b.shape[0] != linear.out_features:
        problems.append(f"{path}.lora_B: shape {tuple(b.shape)}, expected ({linear.out_features}, {rank})")
    if not (a.is_floating_point() and b.is_floating_point()):
        problems.append(f"{path}: lora_A/lora_B must be floating point")
    return problems


def _value_problems(path: str, a: torch.Tensor, b: torch.Tensor) -> list[str]:
    problems = []
    for part, tensor in (("lora_A", a), ("lora_B", b)):
        values = tensor.detach().float()
        bad = int((~torch.isfinite(values)).sum())
        if bad:
            problems.append(f"{path}.{part}: {bad} value(s) are NaN or infinite (a diverged training run?)")
            continue
        largest = float(values.abs().max()) if values.numel() else 0.0
        if largest > MAX_LORA_WEIGHT:
            problems.append(f"{path}.{part}: |w| reaches {largest:.3g}, above the bound {MAX_LORA_WEIGHT:g}")
    return problems


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    safetensors_path, ckpt_path = folder / SAFETENSORS_FILE, folder / CKPT_FILE
    if safetensors_path.is_file():
        try:
            return load_file(str(safetensors_path))
        except (SafetensorError, OSError) as exc:
            unreadable = f"{SAFETENSORS_FILE} cannot be read as safetensors"
            raise LoRALoadError(unreadable, f"{safetensors_path}: cannot read ({exc})") from exc
    if not ckpt_path.is_file():
        neither = f"neither {SAFETENSORS_FILE} nor {CKPT_FILE} is there"
        raise LoRALoadError(neither, f"{folder}: {neither}")
    try:
        loaded = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises many types for a corrupt or unsafe pickle
        unreadable = f"{CKPT_FILE} cannot be read as a weights-only torch checkpoint"
        raise LoRALoadError(unreadable, f"{ckpt_path}: cannot read ({exc})") from exc
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        expected = "expected a state dict of tensors (bare or under 'state_dict')"
        raise LoRALoadError(f"{CKPT_FILE}: {expected}", f"{ckpt_path}: {expected}")
    return loaded
