"""Compile every Triton kernel the model launches for sm_90 with Triton's own compiler, launching nothing.

    python tests/kernels/compile_sm90.py out.json

Run as its own process (``TRITON_INTERPRET`` unset): Triton's active driver is replaced by one that reports
an H100/H200 target (``GPUTarget("cuda", 90, 32)``), and every kernel launch is turned into a warm-up,
which specializes the kernel on its arguments exactly as a launch would (dtypes, ``== 1`` and ``% 16``
integer and pointer attributes, constexprs), compiles it to a cubin through Triton's pipeline and its
bundled ptxas, and returns without running it. The model then runs on meta tensors with the fused path
selected, its fused ops routed to the real wrappers of ``voxwire.kernels.fused`` and decode attention to
``voxwire.kernels.paged_decode``, so each kernel compiles for the call sites and dtypes the server has:
the decode step and the streaming VAE decode at 1, 3 and 768 rows, a prefill of two voice-prompted rows
(LocEnc included), the VAE encode of a one-second clip, the VAE warm-up decode and a request's noise drawn
at admission, for each release shape and each (model, VAE) dtype pair. The JSON lists every distinct
specialization compiled and every failure.

Triton's own ptxas run (``-v``) reports each specialization's registers per thread and spills (its log, which
Triton prints with ``knobs.nvidia.dump_ptxas_log``, is read here; the run compiles in an empty cache, so each
specialization runs ptxas): the JSON records them per kernel variant, the run prints them per kernel, and a
variant that spills registers to local memory is a failure (exit status 1, as for a kernel that does not compile).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from voxwire.kernels import fused, noise, ops, paged_decode, small_attention
from voxwire.kernels.path import NOISE_DTYPES
from voxwire.model import minicpm
from voxwire.model.audio_vae import StreamingVAEDecoder
from voxwire.model.cfm import CfmSchedule
from voxwire.model.kv_cache import KVCache
from voxwire.model.voxcpm import DecodeState, PrefillBatch, VoxCPMModel
from voxwire.model_config import ModelConfig
from voxwire.tiny.configs import RELEASE_SHAPES

TARGET = GPUTarget("cuda", 90, 32)
# (model dtype, VAE dtype): the server's CUDA default (float16 VAE after its check decode), its float32-VAE
# fallback, an all-bf16 server (--vae-dtype bfloat16), and gpu_check's fp32 correctness pass.
DTYPES = [
    (torch.bfloat16, torch.float16),
    (torch.bfloat16, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32),
]
DECODE_BATCHES = (1, 3, 768)
BLOCK_SIZE = 16  # the runner's default


class Sm90Driver:
    """Triton's active driver as a compiler needs it: the target, a device and a stream; no GPU behind it."""

    def get_current_target(self) -> GPUTarget:
        return TARGET

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("meta")


@dataclasses.dataclass(frozen=True)
class Resources:
    """What ptxas reports for one compiled kernel variant: registers per thread, bytes spilled to local memory
    (stores and loads), its stack frame, and the warps it launches with."""

    num_warps: int
    registers: int
    spill_bytes: int
    stack_bytes: int


_PTXAS_COUNTS = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads.*?"
    r"Used (?P<registers>\d+) registers",
    re.DOTALL,
)


def resources(ptxas_log: str, num_warps: int) -> Resources:
    """The counts in the ptxas ``-v`` log of one kernel's compile."""
    counts = _PTXAS_COUNTS.search(ptxas_log)
    if counts is None:
        raise RuntimeError(f"no ptxas -v counts in the compile's log (found in a cache?):\n{ptxas_log}")
    spills = int(counts["stores"]) + int(counts["loads"])
    return Resources(num_warps, int(counts["registers"]), spills, int(counts["stack"]))


@dataclasses.dataclass
class Compiled:
    """The distinct specializations compiled per kernel, each by its compiled binary's hash, with its resources."""

    seen: dict[str, dict[str, Resources]] = dataclasses.field(default_factory=dict)

    def table(self) -> str:
        """Per kernel: its variants, their registers per thread and warps, spills and stack (min-max)."""

        def span(values: list[int]) -> str:
            return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"

        lines = [f"{'kernel':<28} {'variants':>8} {'registers':>10} {'warps':>6} {'spill B':>8} {'stack B':>8}"]
        for kernel, variants in sorted(self.seen.items()):
            each = list(variants.values())
            lines.append(
                f"{kernel:<28} {len(each):>8} {span([v.registers for v in each]):>10} "
                f"{span([v.num_warps for v in each]):>6} {span([v.spill_bytes for v in each]):>8} "
                f"{span([v.stack_bytes for v in each]):>8}"
            )
        return "\n".join(lines)


def compile_instead_of_launching(compiled: Compiled) -> Callable[[], None]:
    """Make ``kernel[grid](...)`` compile (warm-up) and record the specialization; returns the undo."""
    original = JITFunction.__getitem__

    def warm(self: JITFunction, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            log = io.StringIO()
            with contextlib.redirect_stdout(log):  # Triton prints ptxas's report there
                kernel = self.run(*args, grid=grid, warmup=True, **kwargs)
            if not kernel.asm.get("cubin"):
                raise RuntimeError(f"{self.fn.__name__} compiled to no cubin")
            variants = compiled.seen.setdefault(self.fn.__name__, {})
            if kernel.hash not in variants:
                variants[kernel.hash] = resources(log.getvalue(), kernel.metadata.num_warps)

        return launch

    JITFunction.__getitem__ = warm  # type: ignore[method-assign]

    def undo() -> None:
        JITFunction.__getitem__ = original  # type: ignore[method-assign]

    return undo


def route_fused_ops_to_wrappers() -> Callable[[], None]:
    """The model's fused ops (custom ops on CUDA, shape-only on meta) straight to the Triton wrappers (LocEnc's and
    LocDiT's attention included), and decode attention to the paged kernel's wrapper; returns the undo."""
    names = (
        "rms_norm",
        "add_rms_norm",
        "rope_qk",
        "silu_mul",
        "snake",
        "snake_with_past",
        "add_snake_with_past",
        "conv_transpose_out",
        "quantize_rows_fp8",
        "rms_norm_fp8",
        "add_rms_norm_fp8",
        "silu_mul_fp8",
    )
    import voxwire.kernels.custom_ops  # noqa: F401  (registered first, so the routing below replaces them)

    namespace, attention = torch.ops.voxwire, minicpm.decode_attention
    wrappers = {name: getattr(fused, name) for name in names}
    torch.ops.voxwire = SimpleNamespace(
        **wrappers,
        small_attention=small_attention.small_attention,
        small_rope_attention=small_attention.small_rope_attention,
    )
    minicpm.decode_attention = paged_decode.paged_decode_attention

    def undo() -> None:
        torch.ops.voxwire, minicpm.decode_attention = namespace, attention

    return undo


def build(config: ModelConfig, dtype: torch.dtype, vae_dtype: torch.dtype) -> VoxCPMModel:
    with torch.device("meta"):
        model = VoxCPMModel(config)
    model.cast_transformers(dtype)
    model.fuse_projections()
    if dtype != torch.float32:  # as the loader on an H100/H200 (``loader.dit_fp8_default``)
        model.quantize_dit_fp8()
    model.audio_vae.to(vae_dtype)
    return model


def decode_step(model: VoxCPMModel, config: ModelConfig, batch: int, dtype: torch.dtype) -> None:
    """The engine's step: CFM sampler, stop head, both LMs advanced one position, the patch's streaming VAE
    decode, at 256 cached positions per row."""
    meta = torch.device("meta")
    base = KVCache.dedicated(config.lm_config, batch, 257, meta, dtype, BLOCK_SIZE)
    residual = KVCache.dedicated(config.residual_lm, batch, 257, meta, dtype, BLOCK_SIZE)
    hidden = config.lm_config.hidden_size
    state = DecodeState(
        lm_hidden=torch.empty(batch, hidden, device=meta, dtype=dtype),
        residual_hidden=torch.empty(batch, hidden, device=meta, dtype=dtype),
        cond=torch.empty(batch, config.patch_size, config.feat_dim, device=meta, dtype=dtype),
        positions=torch.full((batch,), 256, device=meta, dtype=torch.long),
    )
    noise = torch.empty(batch, config.feat_dim, config.patch_size, device=meta, dtype=dtype)
    schedule = dataclasses.replace(CfmSchedule.build([10] * batch, dtype, meta), ragged=True)
    patch, _ = model.decode_step(state, base, residual, noise, torch.empty(batch, device=meta), schedule)
    vae = StreamingVAEDecoder(model.audio_vae)
    vae.decode(patch.float().transpose(1, 2), vae.new_state(batch))


def prefill(model: VoxCPMModel, config: ModelConfig, dtype: torch.dtype) -> None:
    """Two rows of 37 positions, 12 of them voice-prompt patches (LocEnc runs over the batch)."""
    meta, rows, length, audio = torch.device("meta"), 2, 37, 12
    batch = PrefillBatch(
        text_tokens=torch.empty(rows, length, device=meta, dtype=torch.long),
        feats=torch.empty(rows, length, config.patch_size, config.feat_dim, device=meta, dtype=dtype),
        text_mask=torch.empty(rows, length, device=meta, dtype=dtype),
        audio_mask=torch.empty(rows, length, device=meta, dtype=dtype),
        lengths=torch.empty(rows, device=meta, dtype=torch.long),
        audio_positions=torch.empty(rows * audio, device=meta, dtype=torch.long),
    )
    base = KVCache.dedicated(config.lm_config, rows, length, meta, dtype, BLOCK_SIZE)
    residual = KVCache.dedicated(config.residual_lm, rows, length, meta, dtype, BLOCK_SIZE)
    model.prefill(batch, base, residual)


def vae_encode_and_warm(model: VoxCPMModel, config: ModelConfig, dtype: torch.dtype) -> None:
    """A one-second voice clip encoded, and a prompt's 12 context patches run through a fresh stream."""
    meta = torch.device("meta")
    model.audio_vae.encode(torch.empty(1, config.audio_vae_config.sample_rate, device=meta))
    vae = StreamingVAEDecoder(model.audio_vae)
    vae.warm(torch.empty(12, config.patch_size, config.feat_dim, device=meta), dtype, vae.new_state(1))


def admission_noise(config: ModelConfig) -> None:
    """A request's noise for its whole length cap, drawn at admission in one launch (``NoiseStream.take``), in
    every dtype the start-up probe draws it in."""
    for dtype in NOISE_DTYPES:
        # Seeds and first calls on both sides of 2**31 and 2**32: one specialization per dtype all the same.
        for seed, first_call in ((1, 0), (2**31 + 5, 3), (2**40 + 1, 2**32 + 7)):
            shape = (config.feat_dim, config.patch_size)
            noise.patch_noise(seed, first_call, 150, shape, dtype, torch.device("meta"))


def main() -> int:
    out = Path(sys.argv[1])
    driver.set_active(Sm90Driver())  # type: ignore[arg-type]
    knobs.nvidia.dump_ptxas_log = True
    knobs.cache.dir = tempfile.mkdtemp(prefix="compile-sm90-")  # every specialization compiled, none cached
    unroute = route_fused_ops_to_wrappers()
    compiled = Compiled()
    undo = compile_instead_of_launching(compiled)
    failures: list[dict[str, str]] = []
    started = time.perf_counter()
    try:
        for name, raw in RELEASE_SHAPES.items():
            config = ModelConfig.from_dict(raw, source=name)
            for dtype, vae_dtype in DTYPES:
                model = build(config, dtype, vae_dtype)
                sites: list[tuple[str, Callable[[], None]]] = [
                    *((f"decode B={b}", partial(decode_step, model, config, b, dtype)) for b in DECODE_BATCHES),
                    ("prefill", partial(prefill, model, config, dtype)),
                    ("vae encode + warm", partial(vae_encode_and_warm, model, config, dtype)),
                    ("admission noise", partial(admission_noise, config)),
                ]
                for site, run in sites:
                    try:
                        with torch.no_grad(), ops.fused_on_meta():
                            run()
                    except Exception as exc:  # every failure is reported, not just the first
                        failures.append(
                            {
                                "config": name,
                                "dtypes": f"{dtype}/{vae_dtype}",
                                "site": site,
                                "error": "".join(traceback.format_exception(exc)).strip()[-3000:],
                            }
                        )
    finally:
        undo()
        unroute()
    spills = [
        {"kernel": kernel, "variant": key, **dataclasses.asdict(used)}
        for kernel, variants in sorted(compiled.seen.items())
        for key, used in variants.items()
        if used.spill_bytes
    ]
    result = {
        "triton": triton.__version__,
        "target": {"backend": TARGET.backend, "arch": TARGET.arch, "warp_size": TARGET.warp_size},
        "seconds": time.perf_counter() - started,
        "specializations": {kernel: len(variants) for kernel, variants in sorted(compiled.seen.items())},
        "resources": {
            kernel: [dataclasses.asdict(used) for used in variants.values()]
            for kernel, variants in sorted(compiled.seen.items())
        },
        "spills": spills,
        "failures": failures,
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"Triton {triton.__version__}, sm_90a, per kernel over its variants:\n{compiled.table()}")
    return 1 if failures or spills else 0


if __name__ == "__main__":
    sys.exit(main())
