"""``load_model``: a published VoxCPM checkpoint (local folder or Hugging Face id) -> a ready ``VoxCPM``.

Files, as the releases ship them: ``config.json``; ``model.safetensors`` or ``pytorch_model.bin``
(bare state dict or ``{"state_dict": ...}``); ``audiovae.safetensors`` or ``audiovae.pth`` (weight-norm
``weight_g``/``weight_v`` pairs, folded here once); ``tokenizer.json``. Loading is strict, unlike the
reference's ``strict=False``: every missing, unexpected or mis-shaped key is reported in one error that
names the file, and nothing is half-loaded (the model is only returned once every check passed).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from voxwire import devices
from voxwire.errors import ModelLoadError
from voxwire.kernels import path as kernel_path
from voxwire.model.audio_vae import choose_vae_dtype, fold_weight_norm
from voxwire.model.voxcpm import VoxCPMModel
from voxwire.model_config import ConfigError, ModelConfig
from voxwire.startup import Readiness, enter
from voxwire.text.tokenizer import TextTokenizer, TokenizerError
from voxwire.tts import VoxCPM

StateDict = dict[str, torch.Tensor]

DEMO_SOURCE = "demo"
logger = logging.getLogger(__name__)

_HF_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CHECKPOINT_FILES = [
    "config.json",
    "model.safetensors",
    "pytorch_model.bin",
    "audiovae.safetensors",
    "audiovae.pth",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
]
_VAE_PREFIX = "audio_vae."


def load_model(
    source: str | os.PathLike[str],
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    vae_dtype: str | torch.dtype | None = None,
    dit_fp8: bool | None = None,
) -> VoxCPM:
    """Load a checkpoint.

    Args:
        source: a local folder, a Hugging Face model id such as ``openbmb/VoxCPM2`` (downloaded through
            ``huggingface_hub``, which honours its cache and ``HF_HUB_OFFLINE``), or ``"demo"``: a tiny
            random checkpoint made once in the cache folder (it speaks noise; announced as a warning).
        device: ``"cuda"``, ``"cpu"``, ... (default: CUDA when available, else CPU).
        dtype: dtype of the transformer parts (default: bfloat16 on CUDA, as the reference runs, and
            float32 elsewhere).
        vae_dtype: dtype the AudioVAE computes in. Default: float32 off CUDA, as the reference; on CUDA
            float16 (half the memory traffic) when this checkpoint's VAE passes a check decode against
            float32 (``audio_vae.choose_vae_dtype``), else float32.
        dit_fp8: run LocDiT's decoder GEMMs in fp8 e4m3 (``VoxCPMModel.quantize_dit_fp8``). Default: on a CUDA
            device with fp8 tensor cores (compute capability 8.9 or later) with half-precision transformers,
            off elsewhere (``dit_fp8_default``).

    Raises:
        ModelLoadError: the folder, a file, the config or the weights cannot make a model.
        TritonUnavailableError: ``VOXWIRE_KERNELS=triton`` and the Triton kernels cannot run on the device.
    """
    kernel_path.select(torch.device(device) if device is not None else default_device())
    enter(Readiness.LOADING_WEIGHTS, "from %s", source)
    if str(source) == DEMO_SOURCE:
        from voxwire.tiny.checkpoint import demo_checkpoint

        logger.warning("using the DEMO model (tiny random weights): its audio is NOISE; give a real checkpoint")
        source = demo_checkpoint()
    folder = resolve_source(source)
    try:
        config = ModelConfig.from_file(_require(folder, "config.json"))
    except ConfigError as exc:
        raise ModelLoadError(str(exc)) from exc
    try:
        tokenizer = TextTokenizer.from_dir(folder)
    except TokenizerError as exc:
        raise ModelLoadError(str(exc)) from exc
    if tokenizer.vocab_size > config.lm_config.vocab_size:
        raise ModelLoadError(
            f"{folder}: tokenizer has {tokenizer.vocab_size} entries but lm_config.vocab_size is "
            f"{config.lm_config.vocab_size}"
        )
    main_file, main = _read_main_weights(folder)
    vae_file, vae = _read_vae_weights(folder)
    return model_from_weights(
        config,
        tokenizer,
        main,
        vae,
        device=device,
        dtype=dtype,
        vae_dtype=vae_dtype,
        dit_fp8=dit_fp8,
        name=str(source),
        sources=(main_file, vae_file),
    )


def model_from_weights(
    config: ModelConfig,
    tokenizer: TextTokenizer,
    main: StateDict,
    vae: StateDict,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    vae_dtype: str | torch.dtype | None = None,
    dit_fp8: bool | None = None,
    name: str = "voxcpm",
    sources: tuple[Path, Path] = (Path("model"), Path("audiovae")),
) -> VoxCPM:
    """A ``VoxCPM`` from in-memory weights: ``main`` as in model.safetensors, ``vae`` with weight norm folded.

    Keys and shapes are checked strictly (errors name ``sources``). Used by ``load_model`` and by tools that
    build random models without writing files.
    """
    target = torch.device(device) if device is not None else default_device()
    kernel_path.select(target)  # before the model exists: decided once, logged, the same for every kernel
    model_dtype = _resolve_dtype(dtype, target)
    logger.info("start-up: building the model on %s (%s)", target, model_dtype)
    model = _build(config, target, model_dtype)
    _check_keys(model, main, sources[0], lambda key: not key.startswith(_VAE_PREFIX), "")
    _check_keys(model, vae, sources[1], lambda key: key.startswith(_VAE_PREFIX), _VAE_PREFIX)
    model.load_state_dict({**main, **{_VAE_PREFIX + k: v for k, v in vae.items()}}, strict=True)
    model.fuse_projections()
    quantize = dit_fp8_default(target, model_dtype) if dit_fp8 is None else dit_fp8
    if quantize:
        model.quantize_dit_fp8()
    if vae_dtype is None:
        with devices.scope(devices.cuda_device(target)):  # its check decode's kernels launch on the current device
            model.audio_vae.to(choose_vae_dtype(model.audio_vae, config.patch_size, target))
    else:
        model.audio_vae.to(_resolve_dtype(vae_dtype, target))
    return VoxCPM(config, model, tokenizer, name=name)


def dit_fp8_default(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether LocDiT's GEMMs run in fp8 when the caller did not say: on CUDA devices with fp8 tensor cores (compute
    capability 8.9 and later: ``torch._scaled_mm``) when the transformers are in half precision. Its audio error
    against the bf16 DiT is of the order of the bf16 DiT's own against float32 (docs/performance.md, "FP8 DiT GEMMs
    error"); a float32 model is asked for exactness, so it keeps its GEMMs."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_source(source: str | os.PathLike[str]) -> Path:
    """A local checkpoint folder, downloading a Hugging Face id first when ``source`` is not a folder."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    text = str(source)
    if path.exists():
        raise ModelLoadError(f"{text} is a file; give the checkpoint folder that holds config.json")
    if not _HF_REPO_ID.match(text) or text.startswith((".", "/", "~")):
        raise ModelLoadError(f"model folder not found: {text}")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=text, allow_patterns=_CHECKPOINT_FILES))
    except LocalEntryNotFoundError as exc:
        raise ModelLoadError(
            f"{text} is not in the Hugging Face cache and cannot be downloaded now "
            f"(offline, or HF_HUB_OFFLINE=1): {exc}"
        ) from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot download {text} from Hugging Face: {exc}") from exc


def _resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "float32": torch.float32,
        "fp32": torch.float32,
    }
    if dtype not in names:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {', '.join(names)}")
    return names[dtype]


def _require(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise ModelLoadError(f"{folder}: missing {name}")
    return path


def _read_main_weights(folder: Path) -> tuple[Path, StateDict]:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name, _read_state_dict(folder / name)
    raise ModelLoadError(f"{folder}: missing model weights (model.safetensors or pytorch_model.bin)")


def _read_vae_weights(folder: Path) -> tuple[Path, StateDict]:
    for name in ("audiovae.safetensors", "audiovae.pth"):
        if (folder / name).is_file():
            state = _read_state_dict(folder / name)
            try:
                return folder / name, fold_weight_norm(state)
            except ValueError as exc:
                raise ModelLoadError(f"{folder / name}: {exc}") from exc
    raise ModelLoadError(f"{folder}: missing AudioVAE weights (audiovae.safetensors or audiovae.pth)")


def _read_state_dict(path: Path) -> StateDict:
    state: object
    logger.info("start-up: reading %s (%.0f MB)", path, path.stat().st_size / 1e6)
    try:
        if path.suffix == ".safetensors":
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, EOFError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read weights, the file is truncated or corrupt ({exc})") from exc
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelLoadError(f"{path}: expected a state dict of tensors (bare or under 'state_dict')")
    return state


def _build(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> VoxCPMModel:
    """Allocate the model on ``device`` without random initialisation (the weights overwrite everything)."""
    with torch.device("meta"):
        model = VoxCPMModel(config)
    model.cast_transformers(dtype)
    model = model.to_empty(device=device)
    for module in model.modules():
        init = getattr(module, "init_nonpersistent_buffers", None)
        if init is not None:
            init()
    return model.eval()


def _check_keys(model: VoxCPMModel, state: StateDict, path: Path, belongs: Callable[[str], bool], prefix: str) -> None:
    """Every key of the file's part of the model present, nothing extra, every shape equal: else one error."""
    expected = {k[len(prefix) :]: v.shape for k, v in model.state_dict().items() if belongs(k)}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshaped = sorted(
        f"{k}: file {tuple(state[k].shape)} != model {tuple(expected[k])}"
        for k in set(state) & set(expected)
        if state[k].shape != expected[k]
    )
    problems = [
        f"{label} ({len(keys)}): {', '.join(keys[:20])}{' ...' if len(keys) > 20 else ''}"
        for label, keys in (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", misshaped))
        if keys
    ]
    if problems:
        raise ModelLoadError(f"{path} does not match config.json: " + "; ".join(problems))
