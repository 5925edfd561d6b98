"""Which implementation the fused ops and decode attention run on a device, decided once per device.

On CUDA the first use (``select`` at model load, so before any capture or serving) imports Triton and
probes it: each kernel family compiles, launches on a few values and must match its plain-torch oracle.
Then every fused op and decode attention take the Triton path together, or, if the probe failed, the
plain-torch path together, with a warning that says why (a Triton that imports but cannot compile, a
driver it cannot load, a wrong result); ``VOXWIRE_KERNELS=triton`` turns that warning into a start-up
error, ``VOXWIRE_KERNELS=torch`` skips Triton. The choice is logged either way.

The same start-up decides how a request's CFM noise is drawn on a CUDA device (``noise_path``): in one
launch of ``kernels.noise`` when the fused ops run on Triton and that kernel's numbers equal patch-by-patch
``torch.randn`` bit for bit on this device, else one ``torch.randn`` launch per patch (the same numbers,
slower), with a warning that says where they differed.

Off CUDA nothing here imports Triton, and ``select`` keeps torch from importing it either: torch's
``torch._dynamo`` (which the Python meta kernels of many ops import on first use, e.g. while a model is
built on the meta device) imports Triton just to see whether it is installed. Loaded in a process that
never launches a kernel, that costs start-up time and, at exit, nanobind's reports of "leaked" Triton
objects.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

ENV_VAR = "VOXWIRE_KERNELS"


class KernelPath(enum.Enum):
    TRITON = "triton"
    TORCH = "torch"


class KernelPolicy(enum.Enum):
    """``VOXWIRE_KERNELS``: ``auto`` (default: Triton when its probe passes, else plain torch with a warning),
    ``triton`` (Triton or a start-up error), ``torch`` (plain torch, Triton never imported)."""

    AUTO = "auto"
    TRITON = "triton"
    TORCH = "torch"

    @classmethod
    def from_env(cls) -> KernelPolicy:
        value = os.environ.get(ENV_VAR, cls.AUTO.value).strip().lower()
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(policy.value for policy in cls)
            raise ValueError(f"{ENV_VAR}={value!r} is not one of {choices}") from None


class TritonUnavailableError(RuntimeError):
    """``VOXWIRE_KERNELS=triton`` on a CUDA device where the Triton kernels cannot run."""


Probe = Callable[[torch.device], str | None]


class NoisePath(enum.Enum):
    """How a request's noise patches are drawn on a device; both give the numbers of ``voxwire.sampling``."""

    ONE_LAUNCH = "one launch per request"
    PER_PATCH = "one launch per patch"


_paths: dict[torch.device, KernelPath] = {}
_noise_paths: dict[torch.device, NoisePath] = {}
_lock = threading.Lock()


def select(device: torch.device | str) -> KernelPath:
    """Decide (once) and log the kernel path of ``device``; call at start-up, before any CUDA graph capture."""
    device = torch.device(device)
    if device.type != "cuda":
        keep_triton_out_of_torch()
    chosen = kernel_path(device)
    noise_path(device)
    return chosen


def _named(device: torch.device) -> torch.device:
    """A CUDA device with its index: "cuda" is the current device, the one its tensors will name."""
    return torch.device("cuda", torch.cuda.current_device()) if device.index is None else device


def kernel_path(device: torch.device) -> KernelPath:
    """The path of ``device``: plain torch off CUDA; on CUDA decided at the first call and kept."""
    if device.type != "cuda":
        return KernelPath.TORCH
    device = _named(device)
    with _lock:
        if device not in _paths:
            with torch.cuda.device(device):  # the probe's kernels launch on the current device, not their tensors'
                _paths[device] = decide(device, KernelPolicy.from_env(), probe_triton)
        return _paths[device]


def uses_triton(device: torch.device) -> bool:
    """Whether the fused ops and decode attention run their Triton kernels on ``device``."""
    return device.type == "cuda" and kernel_path(device) is KernelPath.TRITON


def decide(device: torch.device, policy: KernelPolicy, probe: Probe) -> KernelPath:
    """The path for ``device`` under ``policy``, probing Triton unless the policy rules it out; logged."""
    if policy is KernelPolicy.TORCH:
        logger.info("kernels on %s: plain torch (%s=torch)", device, ENV_VAR)
        return KernelPath.TORCH
    failure = probe(device)
    if failure is None:
        logger.info("kernels on %s: Triton (fused ops and paged decode attention; probe compiled and matched)", device)
        return KernelPath.TRITON
    if policy is KernelPolicy.TRITON:
        raise TritonUnavailableError(f"the Triton kernels cannot run on {device} ({ENV_VAR}=triton): {failure}")
    logger.warning(
        "kernels on %s: plain torch for the fused ops and decode attention, because Triton cannot run them: %s. "
        "Expect several times the memory traffic per step (decode attention gathers the whole block-table width); "
        "set %s=triton to make this a start-up error",
        device,
        failure,
        ENV_VAR,
    )
    return KernelPath.TORCH


def noise_path(device: torch.device) -> NoisePath:
    """How noise is drawn on ``device``: patch by patch off CUDA (``voxwire.sampling`` has its own rule for the
    CPU) and where the fused ops run plain torch; on a Triton device decided at the first call and kept."""
    if not uses_triton(device):
        return NoisePath.PER_PATCH
    device = _named(device)
    with _lock:
        if device not in _noise_paths:
            with torch.cuda.device(device):
                _noise_paths[device] = decide_noise(device, probe_noise)
        return _noise_paths[device]


def decide_noise(device: torch.device, probe: Probe) -> NoisePath:
    """One launch per request when ``probe`` finds its numbers equal to eager ``torch.randn``'s; logged."""
    failure = probe(device)
    if failure is None:
        logger.info("noise on %s: %s (it matched torch.randn bit for bit)", device, NoisePath.ONE_LAUNCH.value)
        return NoisePath.ONE_LAUNCH
    logger.warning(
        "noise on %s: %s, because the one-launch kernel's numbers differ from torch.randn's here: %s. The audio is "
        "the same; each admission costs one small launch per patch of its length cap",
        device,
        NoisePath.PER_PATCH.value,
        failure,
    )
    return NoisePath.PER_PATCH


# A seed with both 32-bit halves set, since the generator's key is both.
_NOISE_PROBE_SEED = (7 << 32) | 0x9E3779B9
_NOISE_PROBE_SHAPES = ((64, 4), (64, 2))  # a patch of VoxCPM 1.5 and 2, and of VoxCPM-0.5B
NOISE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # every dtype a model runs in

EagerNoise = Callable[[int, int, int, tuple[int, ...], torch.dtype, torch.device], torch.Tensor]


def eager_randn_calls(
    seed: int, first_call: int, calls: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``(calls, *shape)``: calls ``first_call`` .. of ``torch.randn(shape)`` on a generator seeded with ``seed``,
    drawn one by one; raises if a call does not move the generator's offset as ``kernels.noise`` assumes."""
    from voxwire.kernels.noise import CALL_OFFSET

    generator = torch.Generator(device).manual_seed(seed)
    for _ in range(first_call):
        torch.randn(shape, generator=generator, device=device, dtype=dtype)
    if generator.get_offset() != first_call * CALL_OFFSET:
        raise ValueError(f"{first_call} randn calls moved the generator's offset to {generator.get_offset()}")
    return torch.stack([torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(calls)])


def probe_noise(
    device: torch.device, eager: EagerNoise = eager_randn_calls, dtypes: tuple[torch.dtype, ...] = NOISE_DTYPES
) -> str | None:
    """None when ``kernels.noise`` draws, on ``device``, exactly the numbers of ``eager`` calls from the middle of a
    stream, for each of ``dtypes`` and each patch shape; else what differed."""
    try:
        from voxwire.kernels import noise

        skipped, calls = 3, 5
        for dtype in dtypes:
            for shape in _NOISE_PROBE_SHAPES:
                expected = eager(_NOISE_PROBE_SEED, skipped, calls, shape, dtype, device)
                drawn = noise.patch_noise(_NOISE_PROBE_SEED, skipped, calls, shape, dtype, device)
                if not torch.equal(drawn, expected):
                    differ = int((drawn != expected).sum())
                    return f"{differ} of {expected.numel()} {dtype} numbers of {calls} calls of shape {shape} differ"
    except Exception as exc:  # a kernel that cannot compile or launch here, a generator that moves otherwise
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def probe_triton(device: torch.device) -> str | None:
    """None when the Triton kernels import, compile, launch and match their oracles on ``device`` (one of each
    kind: a reduction, an elementwise op, the paged attention's dots and the small-sequence attention's); else what
    went wrong."""
    try:
        from voxwire.kernels import fused, paged_decode, reference, small_attention

        generator = torch.Generator().manual_seed(0)
        x, weight = torch.randn(3, 64, generator=generator), torch.randn(64, generator=generator)
        checks = [(fused.rms_norm(x.to(device), weight.to(device), 1e-5), reference.rms_norm(x, weight, 1e-5))]
        gate, up = torch.randn(2, 3, 48, generator=generator).unbind(0)
        checks.append((fused.silu_mul(gate.to(device), up.to(device)), reference.silu_mul(gate, up)))
        # Two rows of two 5-position blocks each, all live: the oracle is SDPA over the rows laid out flat.
        q = torch.randn(2, 4, 16, generator=generator)
        k_cache, v_cache = torch.randn(2, 4, 5, 2, 16, generator=generator).unbind(0)
        tables, lengths = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.tensor([10, 10], dtype=torch.int32)
        q_d, k_d, v_d, tables_d, lengths_d = (t.to(device) for t in (q, k_cache, v_cache, tables, lengths))
        got = paged_decode.paged_decode_attention(q_d, k_d, v_d, tables_d, lengths_d, 0.25)
        k, v = (cache.view(2, 10, 2, 16).transpose(1, 2) for cache in (k_cache, v_cache))
        expected = F.scaled_dot_product_attention(q[:, :, None], k, v, scale=0.25, enable_gqa=True)[:, :, 0]
        checks.append((got, expected))
        # Two rows of 3 tokens, 2 query heads per kv head, bidirectional: the small-sequence attention kernel.
        q, k, v = torch.randn(3, 2, 4, 3, 16, generator=generator).unbind(0)
        k, v = k[:, :2], v[:, :2]
        got = small_attention.small_attention(q.to(device), k.to(device), v.to(device), 0.25).transpose(1, 2)
        checks.append((got, F.scaled_dot_product_attention(q, k, v, scale=0.25, enable_gqa=True)))
        for got, expected in checks:
            torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)
    except Exception as exc:  # a broken install fails in any of many ways: ImportError, a compiler error, ...
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def keep_triton_out_of_torch() -> None:
    """Import ``torch._dynamo`` now, with Triton hidden, so torch records it as absent instead of importing it.

    For processes that run no Triton kernel. Only ``torch``'s own record is affected: the interpreter tests
    and a later ``select`` of a CUDA device import Triton themselves. A no-op once either is imported.
    """
    if "triton" in sys.modules or "torch._dynamo" in sys.modules:
        return
    sys.modules["triton"] = None  # type: ignore[assignment]  # ``import triton`` raises ImportError
    try:
        import torch._dynamo  # noqa: F401
    finally:
        del sys.modules["triton"]
