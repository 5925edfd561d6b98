"""Count the kernels (launches) and bytes of one batched decode step on the meta device.

    python scripts/count_step_cost.py --config voxcpm2-shape --batch 1,64 [--fused] [--json out.json]

The step is the engine's: ``VoxCPMModel.decode_step`` (CFM sampler, stop head, both LMs advanced by
one position) and the streaming VAE decode of the new patch. It runs on ``meta`` tensors, so nothing
is computed and any size fits; every aten op that reaches the dispatcher counts as one launch except
those that only make views, and its bytes are what it reads plus what it writes (each input and
output tensor's ``numel * element_size``: an upper bound for broadcast inputs, exact otherwise).
Matmul-class ops (GEMMs, convolutions, attention products) are reported apart from the rest: their
bytes are weights and activations a fusion cannot remove. The KV caches hold ``--context`` positions,
what a length-aware attention reads per row.

``--fused`` selects the path as it runs on CUDA: q/k/v and gate/up as one GEMM each, the fused ops
of ``voxwire.kernels.ops`` (one Triton launch each), and the VAE in ``--vae-dtype`` (default float16, what
``load_model`` picks on CUDA; bfloat16 moves the same bytes, float32 twice as many).

``--roofline h200`` (implies ``--fused``) turns the counts into milliseconds. Every launch is bound by the
slowest of its bytes at the HBM rate, its FLOPs at the tensor-core rate of its dtype, and its programs
(CTAs) at a block-scheduling rate; a step adds a gap per launch (it replays as one CUDA graph). Terms are
summed per part of the step (LM, DiT, attention, VAE), then the total, at each ``--batch``. Time to first
audio of a lone stream is the eager prefill (zero-shot, ``--prompt-tokens``: host launch cost or device
time, whichever is larger) plus the first step at batch 1 plus a fixed allowance for noise, IPC and the
first chunk's delivery. These are counted estimates with stated ceilings, not timings.

That column is a best case: every GEMM at the best rate measured on an 8192-cubed GEMM, every byte at one long
copy's rate, attention by its useful FLOPs. ``--roofline`` also prints a **realistic** column, the figure to
plan capacity with, and a per-term table that states what each of its terms assumes (``Efficiencies``,
``Workload``): GEMMs by their shape (output tiles wave-quantized over the SMs, split-K, a K-dependent epilogue
share), bandwidth derated by the kind of kernel, attention priced by the tiles it really runs (LocEnc's and
LocDiT's small-sequence kernel: a row's stacked query heads padded to 64-128 rows by 16 keys; SDPA, the prefill's:
whole flash tiles), the paged kernel's block walk, the Snake kernels' instruction issue, each
non-GEMM kernel's ramp and tail, the runner's gather/scatter and packed output (counted through
``ModelRunner``'s own step on meta), the admissions a step makes at steady state (a batched eager prefill, noise
draws, eager LocEnc encodes of continuation prompts and their one batched VAE warm) and the host's gap between
steps; with
``--bucket T:ROWS`` also a second timestep bucket's sub-step. It is an estimate, not a measurement: no GPU has
run it. ``gpu_check.py``'s step curve prints its prediction beside each measured step, which calibrates it.
Both totals are printed with the rows whose step fits the 160 ms of audio it makes.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import functools
import json
import math
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from voxwire.engine.cuda_graphs import bucket_sizes
from voxwire.engine.engine_config import DEFAULT_BLOCK_SIZE, RunnerOptions
from voxwire.engine.kv_pool import bytes_per_position
from voxwire.engine.runner import ModelRunner
from voxwire.kernels import grids, ops
from voxwire.model import minicpm
from voxwire.model.audio_vae import StreamingVAEDecoder
from voxwire.model.cfm import CfmSchedule
from voxwire.model.kv_cache import KVCache
from voxwire.model.loaded import LoadedModel
from voxwire.model.voxcpm import DecodeState, PrefillBatch, VoxCPMModel
from voxwire.model_config import ModelConfig
from voxwire.text.tokenizer import TextTokenizer
from voxwire.tiny.configs import ALL_CONFIGS
from voxwire.tiny.tokenizer_files import write_tiny_tokenizer

# Ops that return a view (or metadata) and launch nothing.
_NO_LAUNCH = {
    "view",
    "_unsafe_view",
    "_reshape_alias",
    "reshape",
    "alias",
    "as_strided",
    "t",
    "transpose",
    "permute",
    "expand",
    "slice",
    "select",
    "split",
    "split_with_sizes",
    "chunk",
    "unbind",
    "squeeze",
    "unsqueeze",
    "flatten",
    "detach",
    "lift_fresh",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "_local_scalar_dense",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_same_size",
}
_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "convolution", "_convolution", "matmul", "linear"}
_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"}
_CONVOLUTIONS = {"convolution", "_convolution"}
_SCATTERS = {"index_put", "index_put_", "index_copy", "index_copy_"}
# How the realistic column prices a non-GEMM launch (``Efficiencies.bandwidth_share``), by op name.
_ROW_KERNELS = {
    "rms_norm",
    "add_rms_norm",
    "silu_mul",
    "quantize_rows_fp8",
    "rms_norm_fp8",
    "add_rms_norm_fp8",
    "silu_mul_fp8",
}
_LOW_OCCUPANCY_KERNELS = {"rope_qk", "conv_transpose_out"}
_SNAKE_KERNELS = {"snake", "snake_with_past", "add_snake_with_past"}
_INDEXED = {"index", "index_select", "index_put", "index_put_", "index_copy", "index_copy_", "gather", "embedding"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "argmax", "all", "any", "_softmax", "cumsum", "prod"}


@dataclass(frozen=True)
class Ceilings:
    """What a GPU does at best, per the figures stated with each field."""

    name: str
    tensor_flops: float  # bf16/fp16 dense GEMM FLOP/s
    fp32_flops: float  # fp32 GEMM/conv FLOP/s with TF32 off (the server never enables TF32)
    fp8_flops: float  # e4m3 GEMM FLOP/s through torch._scaled_mm (row-wise scales, bf16 out)
    bandwidth: float  # HBM bytes/s
    cta_seconds: float  # per program (CTA): the rate the GPU schedules tiny blocks at, all SMs together
    graph_gap_seconds: float  # between launches replayed in one CUDA graph
    eager_aten_seconds: float  # host cost of one eager aten launch (prefill)
    eager_fused_seconds: float  # host cost of one eager fused custom op (Python custom op + Triton launcher)
    ttfa_allowance_seconds: float  # noise draw, engine/IPC hand-off and the first chunk's delivery

    def describe(self) -> str:
        return (
            f"{self.name}: {self.tensor_flops / 1e12:.0f} TFLOP/s bf16/fp16 GEMM, {self.fp8_flops / 1e12:.0f} TFLOP/s "
            f"fp8 (_scaled_mm), {self.fp32_flops / 1e12:.0f} TFLOP/s fp32 (TF32 off), "
            f"{self.bandwidth / 1e12:.1f} TB/s, {self.cta_seconds * 1e9:.1f} ns per CTA, "
            f"{self.graph_gap_seconds * 1e6:.1f} us per graph launch; eager {self.eager_aten_seconds * 1e6:.0f} us "
            f"per aten op, {self.eager_fused_seconds * 1e6:.0f} us per fused op; TTFA allowance "
            f"{self.ttfa_allowance_seconds * 1e3:.1f} ms"
        )


# H200 SXM: 790 TFLOP/s is the bf16 GEMM rate measured on the H200s this project uses (990 datasheet); 4.3 TB/s
# the measured copy rate (4.8 datasheet); fp32 at ~75 % of the 67 TFLOP/s FP32 datasheet rate; 0.4 ns per CTA
# is 2.5 M tiny blocks per ms over 132 SMs (the middle of the 1.5-3 M/ms the GPU-readiness review assumes);
# 1.5 us between graph-replayed kernels; eager launch costs as measured through torch's dispatcher and the
# custom-op + Triton launcher path. fp8: 1170 TFLOP/s is an 8192-cubed e4m3 GEMM through PyTorch's ``_scaled_mm``
# (bf16 out, fp32 accumulation), measured at 1170-1180 on Hopper GPUs in a public cuBLASLt cross-check report
# (gitea.d-robotics.cc/han.zhao/test_gpu_scripts, reports_cublaslt_fp8_crosscheck_20260524.md; cuBLASLt called
# directly reached 1600-1630 there): the path this project calls, not the 1979 datasheet rate. Not measured here.
H200 = Ceilings(
    name="h200",
    tensor_flops=790e12,
    fp32_flops=50e12,
    fp8_flops=1170e12,
    bandwidth=4.3e12,
    cta_seconds=0.4e-9,
    graph_gap_seconds=1.5e-6,
    eager_aten_seconds=5e-6,
    eager_fused_seconds=25e-6,
    ttfa_allowance_seconds=2e-3,
)
CEILINGS = {
    "h200": H200,
    # H100 SXM: the same GH100 compute as the H200 (132 SMs, the same clocks), so everything but the memory is the
    # H200's; 3.0 TB/s is 90 % of its 3.35 TB/s datasheet bandwidth, as the H200's 4.3 is of 4.8 (no copy was
    # measured on an H100).
    "h100": dataclasses.replace(H200, name="h100", bandwidth=3.0e12),
}


def ceilings_for(device_name: str) -> Ceilings:
    """The ceilings of the GPU called ``device_name`` (``torch.cuda.get_device_name``): the H200's unless it names an
    H100 (a PCIe H100 has fewer SMs and less bandwidth: its predictions are then too low)."""
    return CEILINGS["h100"] if "H100" in device_name.upper() else CEILINGS["h200"]


# Elements per program of torch's elementwise and reduction kernels (128 threads x 4), and the output tile
# of a cuBLAS GEMM or cuDNN convolution: how their CTAs are counted.
_ATEN_ELEMENTS_PER_CTA = 512
_GEMM_TILE = 128


@dataclass(frozen=True)
class Launch:
    """One counted launch: where in the step, what it moved and computed, how many programs it ran."""

    phase: str  # model | vae | prefill | runner | admission
    part: str  # lm | dit | vae
    kind: str  # gemm | attention | other
    name: str
    moved: int
    flops: int
    ctas: int
    fp32: bool
    pricing: str = "elementwise"
    """How the realistic column prices it (``Efficiencies.bandwidth_share``'s keys): gemm, conv, streaming,
    depthwise, sdpa, small_attention, paged, row, low_occupancy, snake, indexed, reduction or elementwise."""
    dims: tuple[int, ...] = ()
    """What that pricing needs: (batch, M, N, K) of a GEMM or convolution, (batch, heads, queries, keys, head
    dim) of SDPA, (programs, query rows, keys, head dim) of the small-attention kernel's tiles, (programs, positions
    each walks, positions per block) of the paged kernel, elements written by a Snake kernel."""
    fp8: bool = False
    """A GEMM on e4m3 operands (``torch._scaled_mm``): priced at the ceiling's fp8 rate."""

    def seconds(self, ceilings: Ceilings) -> float:
        rate = ceilings.fp8_flops if self.fp8 else ceilings.fp32_flops if self.fp32 else ceilings.tensor_flops
        return max(self.moved / ceilings.bandwidth, self.flops / rate, self.ctas * ceilings.cta_seconds)


@dataclass
class StepCost:
    """What one step launched and moved."""

    kernels: int = 0
    bytes: int = 0
    matmul_bytes: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    op_bytes: Counter[str] = field(default_factory=Counter)
    matmul_ops: set[str] = field(default_factory=set)

    @property
    def non_matmul_bytes(self) -> int:
        return self.bytes - self.matmul_bytes

    def __add__(self, other: StepCost) -> StepCost:
        return StepCost(
            self.kernels + other.kernels,
            self.bytes + other.bytes,
            self.matmul_bytes + other.matmul_bytes,
            self.ops + other.ops,
            self.op_bytes + other.op_bytes,
            self.matmul_ops | other.matmul_ops,
        )

    def non_matmul_op_bytes(self) -> Counter[str]:
        """Bytes per op name, matmul-class ops left out."""
        return Counter({name: moved for name, moved in self.op_bytes.items() if name not in self.matmul_ops})


def _tensor_bytes(values: Any) -> int:
    leaves, _ = tree_flatten(values)
    return sum(leaf.numel() * leaf.element_size() for leaf in leaves if isinstance(leaf, torch.Tensor))


def _moved_bytes(name: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
    """Bytes an op reads and writes. A scatter into a tensor (``index_put_``: a KV-cache write; ``index_copy_``: the
    runner's state rows put back) touches only the written elements, not the whole destination it returns; a
    gather (``index``: a RoPE table lookup by position; ``index_select``: the runner's state rows of a step) reads
    only the elements it returns, not the whole table."""
    if name in _SCATTERS:
        written, index = _scattered(name, args)
        return 2 * _tensor_bytes(written) + _tensor_bytes(index)
    if name in ("index", "index_select"):
        return 2 * _tensor_bytes(out) + _tensor_bytes(args[1 if name == "index" else 2])
    return _tensor_bytes((args, kwargs)) + _tensor_bytes(out)


def _scattered(name: str, args: tuple[Any, ...]) -> tuple[Any, Any]:
    """A scatter's values written and its indices: ``index_put_(self, indices, values)``,
    ``index_copy_(self, dim, index, source)``."""
    return (args[2], args[1]) if name in ("index_put", "index_put_") else (args[3], args[2])


def _fused_ctas(name: str, args: tuple[Any, ...]) -> int:
    """Programs a fused op launches: its wrapper's grid (``voxwire.kernels.grids``)."""
    x = args[0]
    if name in ("rms_norm", "add_rms_norm", "quantize_rows_fp8", "rms_norm_fp8", "add_rms_norm_fp8", "silu_mul_fp8"):
        grid: tuple[int, ...] = grids.rms_norm_grid(x.numel() // x.size(-1))
    elif name == "silu_mul":
        grid = grids.silu_mul_grid(x.numel() // x.size(-1), x.size(-1))
    elif name == "rope_qk":
        grid = grids.rope_grid(x.size(0), x.size(2))
    elif name == "snake":
        grid = grids.row_tiles(x.size(0) * x.size(1), x.size(2))[0]
    elif name in ("snake_with_past", "add_snake_with_past"):
        past = args[-1]
        grid = grids.row_tiles(x.size(0) * x.size(1), past.size(-1) + x.size(2))[0]
    elif name == "conv_transpose_out":
        grid = grids.row_tiles(x.size(0) * x.size(2), x.size(1) * x.size(3))[0]
    elif name in ("small_attention", "small_rope_attention"):
        grid = grids.small_attention_grid(x.size(0), _small_attention_heads(name, args)[1])
    else:
        raise ValueError(f"no grid known for fused op {name}")
    return math.prod(grid)


def _small_attention_heads(name: str, args: tuple[Any, ...]) -> tuple[int, int]:
    """(query heads, kv heads) of a small-attention launch: q and k apart, or stacked before RoPE (the RoPE variant's
    q_and_k and its query-head count)."""
    if name == "small_rope_attention":
        q_heads = args[4]
        return q_heads, args[0].size(1) - q_heads
    return args[0].size(1), args[1].size(1)


def _small_attention_dims(name: str, args: tuple[Any, ...]) -> tuple[int, int, int, int]:
    """(programs, query rows, keys, head dim) of a small-attention launch: its grid and the tile each program runs
    (``grids.small_attention_tile``: the row's stacked query heads by its keys, each padded)."""
    batch, _, length, head_dim = args[0].shape
    q_heads, kv_heads = _small_attention_heads(name, args)
    tile = grids.small_attention_tile(q_heads // kv_heads, length, head_dim)
    assert tile is not None, "ops.attention runs the kernel only where it has a tile"
    return math.prod(grids.small_attention_grid(batch, kv_heads)), *tile, head_dim


def small_attention_flops(dims: tuple[int, ...]) -> int:
    """The MMA work a small-attention launch runs, padding included: per program, scores (rows x keys x head dim)
    and the weighted values (rows x head dim x keys), 2 FLOPs a multiply-add."""
    programs, rows, keys, head_dim = dims
    return 4 * programs * rows * keys * head_dim


def _aten_ctas(name: str, args: tuple[Any, ...], out: Any) -> int:
    """Programs an aten op launches: a GEMM's or convolution's output tiles, else its output's elements over the
    elements one program handles. A scatter (``index_put_``: a KV-cache write) runs over the values it writes,
    not over the whole destination it returns."""
    written = _scattered(name, args)[0] if name in _SCATTERS else out
    leaves = [leaf for leaf in tree_flatten(written)[0] if isinstance(leaf, torch.Tensor)]
    if not leaves:
        return 1
    first = leaves[0]
    if name in _GEMMS and first.ndim >= 2:
        batch = math.prod(first.shape[:-2])
        return batch * grids.cdiv(first.size(-2), _GEMM_TILE) * grids.cdiv(first.size(-1), _GEMM_TILE)
    if name in _CONVOLUTIONS:
        return grids.cdiv(first.numel(), _GEMM_TILE * _GEMM_TILE)
    return max(1, grids.cdiv(sum(leaf.numel() for leaf in leaves), _ATEN_ELEMENTS_PER_CTA))


def _pricing(name: str, fused: bool, args: tuple[Any, ...], out: Any) -> tuple[str, tuple[int, ...]]:
    """How the realistic column prices a launch, and the dimensions it needs (``Launch.pricing``, ``Launch.dims``)."""
    if name in _GEMMS:
        a, b = (args[0], args[1]) if name in ("mm", "bmm", "_scaled_mm") else (args[1], args[2])
        batch = a.size(0) if a.ndim == 3 else 1
        return "gemm", (batch, a.size(-2), b.size(-1), a.size(-1))
    if name in _CONVOLUTIONS:
        weight, groups = args[1], args[8]
        if groups > 1:
            return "depthwise", ()
        # An implicit GEMM: every output position of every row against the flattened (channel, tap) weights.
        return "conv", (1, out.size(0) * out.size(-1), weight.size(0), weight[0].numel())
    if fused:
        if name in _ROW_KERNELS:
            return "row", ()
        if name in _LOW_OCCUPANCY_KERNELS:
            return "low_occupancy", ()
        if name in _SNAKE_KERNELS:
            return "snake", (tree_flatten(out)[0][0].numel(),)
        if name in ("small_attention", "small_rope_attention"):
            return "small_attention", _small_attention_dims(name, args)
        raise ValueError(f"no pricing known for fused op {name}")
    if name in _INDEXED:
        return "indexed", ()
    return ("reduction" if name in _REDUCTIONS else "elementwise"), ()


def _flops(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
    counter = flop_registry.get(getattr(func, "overloadpacket", None))
    return int(counter(*args, **(kwargs or {}), out_val=out)) if counter is not None else 0


class CostCounter(TorchDispatchMode):
    """Counts every launching aten op (and custom op) that reaches the dispatcher, per phase of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.costs: dict[str, StepCost] = {}
        self.launches: list[Launch] = []
        self.phase = "model"
        self.part = "lm"
        self.counting = True

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Launches inside are not counted (another part of the step, counted on its own)."""
        self.counting = False
        try:
            yield
        finally:
            self.counting = True

    def record(
        self,
        name: str,
        moved: int,
        matmul: bool,
        flops: int = 0,
        ctas: int = 1,
        fp32: bool = False,
        kind: str = "",
        pricing: str = "elementwise",
        dims: tuple[int, ...] = (),
        fp8: bool = False,
    ) -> None:
        if not self.counting:
            return
        cost = self.costs.setdefault(self.phase, StepCost())
        cost.kernels += 1
        cost.bytes += moved
        if matmul:
            cost.matmul_bytes += moved
            cost.matmul_ops.add(name)
        cost.ops[name] += 1
        cost.op_bytes[name] += moved
        kind = kind or ("gemm" if matmul else "other")
        self.launches.append(Launch(self.phase, self.part, kind, name, moved, flops, ctas, fp32, pricing, dims, fp8))

    def __torch_dispatch__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name not in _NO_LAUNCH:
            namespace = func.__module__.split(".")[-1]
            moved = _moved_bytes(name, args, kwargs, out)
            fused = func.namespace == "voxwire" if hasattr(func, "namespace") else False
            ctas = _fused_ctas(name, args) if fused else _aten_ctas(name, args, out)
            inputs = [leaf for leaf in tree_flatten(args)[0] if isinstance(leaf, torch.Tensor)]
            fp32 = bool(inputs) and inputs[0].dtype == torch.float32
            fp8 = name == "_scaled_mm"
            pricing, dims = _pricing(name, fused, args, out)
            if pricing == "small_attention":  # its products as the tiles it runs: both columns charge the padding
                matmul, kind, flops = True, "attention", small_attention_flops(dims)
            else:
                matmul, kind, flops = name in _MATMUL, "", _flops(func, args, kwargs, out)
            self.record(f"{namespace}.{name}", moved, matmul, flops, ctas, fp32, kind, pricing, dims, fp8)
        return out


class AttentionAsOneKernel(TorchFunctionMode):
    """``scaled_dot_product_attention`` as the one fused kernel (flash, or the paged decode kernel) it is on
    CUDA: on meta it would decompose into the MATH backend's ops. Its bytes are q, k, v (and a mask) read
    and the output written. The output is shaped only (nothing is computed on meta anyway)."""

    def __init__(self, counter: CostCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if func is not F.scaled_dot_product_attention:
            return func(*args, **(kwargs or {}))
        query, key, value = args[0], args[1], args[2]
        batch, heads, length, head_dim = query.shape
        # Flash kernels write (B, T, H, D) and return it transposed, so the caller's transpose back is free.
        out = query.new_empty(batch, length, heads, value.size(-1)).transpose(1, 2)
        flops = 4 * batch * heads * length * key.size(-2) * head_dim
        ctas = batch * heads * grids.cdiv(length, _GEMM_TILE)
        moved = _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        fp32 = query.dtype == torch.float32
        dims = (batch, heads, length, key.size(-2), head_dim)
        self.counter.record("attention", moved, True, flops, ctas, fp32, "attention", "sdpa", dims)
        return out


@contextmanager
def paged_kernel_decode(counter: CostCounter) -> Iterator[None]:
    """Decode attention as the paged Triton kernel runs it on CUDA: one launch reading q, each row's live
    K/V (its ``seq_len`` positions) and its block table, writing the output. (Off CUDA the model gathers
    the blocks and calls SDPA, which is what the counter would otherwise see.)"""

    def one_kernel(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        # Meta tensors hold no lengths: every row is taken to be as long as the table is wide.
        per_row = min(block_tables.size(1) * k_cache.size(1), k_cache.size(0) * k_cache.size(1))
        positions = q.size(0) * per_row
        live_kv = 2 * positions * k_cache.size(2) * k_cache.size(3) * k_cache.element_size()
        out = torch.empty_like(q)
        moved = 2 * _tensor_bytes(q) + live_kv + _tensor_bytes((block_tables, seq_lens))
        flops = 4 * positions * q.size(1) * q.size(2)
        ctas = q.size(0) * k_cache.size(2)
        # Each program (row, kv head) walks its row's positions a block at a time.
        dims = (ctas, per_row, k_cache.size(1))
        counter.record("paged_decode_attention", moved, True, flops, ctas, False, "attention", "paged", dims)
        return out

    original = minicpm.decode_attention
    minicpm.decode_attention = one_kernel
    try:
        yield
    finally:
        minicpm.decode_attention = original


def build_model(config: ModelConfig, fused: bool, vae_dtype: torch.dtype, dit_fp8: bool = True) -> VoxCPMModel:
    """The model on meta as a server runs it: bf16 transformers; fused (q/k/v, gate/up), LocDiT's GEMMs in fp8
    (``dit_fp8``: the loader's default on an H100/H200) and with the VAE in ``vae_dtype`` on the CUDA path, else
    unfused with the fp32 VAE (the CPU path); frozen, as ``LoadedModel`` holds it (a weight that needs no gradient
    changes ``matmul``'s dispatch: a non-contiguous 3-D input then runs a ``bmm`` against the weight expanded to every
    row instead of a copy and one ``mm``)."""
    with torch.device("meta"):
        model = VoxCPMModel(config)
    model.cast_transformers(torch.bfloat16)
    if fused:
        model.fuse_projections()
        if dit_fp8:
            model.quantize_dit_fp8()
        model.audio_vae.to(vae_dtype)
    return model.eval().requires_grad_(False)


@contextmanager
def dit_part(model: VoxCPMModel, counter: CostCounter) -> Iterator[None]:
    """Launches inside the CFM sampler (LocDiT, all passes) count as the ``dit`` part, the rest of the model
    as ``lm``."""

    def enter(*_: Any) -> None:
        counter.part = "dit"

    def leave(*_: Any) -> None:
        counter.part = "lm"

    handles = [
        model.feat_decoder.register_forward_pre_hook(enter),
        model.feat_decoder.register_forward_hook(leave),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def count_step(
    config: ModelConfig,
    batch: int,
    context: int,
    timesteps: int,
    fused: bool,
    vae_dtype: torch.dtype = torch.float16,
    counter: CostCounter | None = None,
    model: VoxCPMModel | None = None,
) -> dict[str, StepCost]:
    """The cost of one decode step of ``batch`` rows at ``context`` cached positions each, for its two
    phases: ``model`` (the decode step) and ``vae`` (the streaming decode of the new patch). ``model``: one
    ``build_model`` made already (``fused`` and ``vae_dtype`` are then its own)."""
    dtype = torch.bfloat16
    device = torch.device("meta")
    model = model if model is not None else build_model(config, fused, vae_dtype)
    base = KVCache.dedicated(config.lm_config, batch, context + 1, device, dtype)
    residual = KVCache.dedicated(config.residual_lm, batch, context + 1, device, dtype)
    hidden = config.lm_config.hidden_size
    state = DecodeState(
        lm_hidden=torch.empty(batch, hidden, device=device, dtype=dtype),
        residual_hidden=torch.empty(batch, hidden, device=device, dtype=dtype),
        cond=torch.empty(batch, config.patch_size, config.feat_dim, device=device, dtype=dtype),
        positions=torch.full((batch,), context, device=device, dtype=torch.long),
    )
    noise = torch.empty(batch, config.feat_dim, config.patch_size, device=device, dtype=dtype)
    cfg = torch.empty(batch, device=device)
    # Built outside the step (the runner reads it from device tables), ragged as the runner's always is.
    schedule = dataclasses.replace(CfmSchedule.build([timesteps] * batch, dtype, device), ragged=True)
    vae = StreamingVAEDecoder(model.audio_vae)
    vae_state = vae.new_state(batch)
    counter = counter if counter is not None else CostCounter()
    with ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(ops.fused_on_meta(fused))
        if fused:
            stack.enter_context(paged_kernel_decode(counter))
        stack.enter_context(dit_part(model, counter))
        stack.enter_context(counter)
        stack.enter_context(AttentionAsOneKernel(counter))
        patch, _ = model.decode_step(state, base, residual, noise, cfg, schedule)
        counter.phase, counter.part = "vae", "vae"
        vae.decode(patch.float().transpose(1, 2), vae_state)  # as the runner calls it
    return counter.costs


def count_prefill(
    config: ModelConfig, tokens: int, vae_dtype: torch.dtype, rows: int = 1, model: VoxCPMModel | None = None
) -> CostCounter:
    """The launches of one zero-shot prefill of ``rows`` prompts of ``tokens`` positions on the CUDA path."""
    model = model if model is not None else build_model(config, True, vae_dtype)
    meta, dtype = torch.device("meta"), torch.bfloat16
    batch = PrefillBatch(
        text_tokens=torch.empty(rows, tokens, device=meta, dtype=torch.long),
        feats=torch.empty(rows, tokens, config.patch_size, config.feat_dim, device=meta, dtype=dtype),
        text_mask=torch.empty(rows, tokens, device=meta, dtype=dtype),
        audio_mask=torch.empty(rows, tokens, device=meta, dtype=dtype),
        lengths=torch.empty(rows, device=meta, dtype=torch.long),
        audio_positions=torch.empty(0, device=meta, dtype=torch.long),
    )
    base = KVCache.dedicated(config.lm_config, rows, tokens + 1, meta, dtype)
    residual = KVCache.dedicated(config.residual_lm, rows, tokens + 1, meta, dtype)
    counter = CostCounter()
    counter.phase = "prefill"
    with torch.no_grad(), ops.fused_on_meta(), counter, AttentionAsOneKernel(counter):
        model.prefill(batch, base, residual)
    return counter


def count_continuation(model: VoxCPMModel, patches: int) -> CostCounter:
    """The launches a step's continuation prompts add at their admission, in one LocEnc call over all their
    ``patches`` audio patches as the runner encodes them (``ModelRunner._voice_encodings``: a new voice each time,
    the voice cache cannot hold it)."""
    config, meta = model.config, torch.device("meta")
    counter = CostCounter()
    counter.phase = "admission"
    with torch.no_grad(), ops.fused_on_meta(), counter, AttentionAsOneKernel(counter):
        model.encode_patches(
            torch.empty(patches, config.patch_size, config.feat_dim, device=meta, dtype=torch.bfloat16)
        )
    return counter


def count_warm(model: VoxCPMModel, rows: int, context: int) -> CostCounter:
    """The launches of one step's VAE warm (``ModelRunner._warm_vae``): its ``rows`` continuation prompts' last
    ``context`` patches, decoded together."""
    config, meta = model.config, torch.device("meta")
    counter = CostCounter()
    counter.phase = "admission"
    vae = StreamingVAEDecoder(model.audio_vae)
    state = vae.new_state(rows)
    with torch.no_grad(), ops.fused_on_meta(), counter, AttentionAsOneKernel(counter):
        counter.part = "vae"
        vae.warm(torch.empty(rows, context, config.patch_size, config.feat_dim, device=meta), torch.bfloat16, state)
    return counter


_GAPS = "launch gaps (one CUDA graph)"
# Roofline terms: (label, part, kinds) in print order.
_TERMS = [
    ("LM GEMMs (LocEnc, base + residual LM, projections, stop head)", "lm", ("gemm",)),
    ("DiT GEMMs (CFM velocity net, all passes)", "dit", ("gemm",)),
    ("attention (paged decode, LocEnc/DiT small-sequence kernel)", None, ("attention",)),
    ("LM non-GEMM (norms, RoPE, SiLU*mul, adds, copies)", "lm", ("other",)),
    ("DiT non-GEMM", "dit", ("other",)),
    ("VAE convolutions / conv-transpose GEMMs", "vae", ("gemm",)),
    ("VAE non-GEMM (Snake, layout, adds)", "vae", ("other",)),
]


def roofline(launches: list[Launch], ceilings: Ceilings) -> list[dict[str, Any]]:
    """Per term: launches, GFLOP, GB, millions of CTAs and milliseconds; then the graph's launch gaps."""
    rows = []
    for label, part, kinds in _TERMS:
        chosen = [launch for launch in launches if launch.kind in kinds and (part is None or launch.part == part)]
        rows.append(
            {
                "term": label,
                "kernels": len(chosen),
                "gflop": sum(launch.flops for launch in chosen) / 1e9,
                "gb": sum(launch.moved for launch in chosen) / 1e9,
                "mctas": sum(launch.ctas for launch in chosen) / 1e6,
                "ms": sum(launch.seconds(ceilings) for launch in chosen) * 1e3,
            }
        )
    rows.append(
        {
            "term": _GAPS,
            "kernels": len(launches),
            "gflop": 0.0,
            "gb": 0.0,
            "mctas": 0.0,
            "ms": len(launches) * ceilings.graph_gap_seconds * 1e3,
        }
    )
    return rows


def prefill_ms(counter: CostCounter, ceilings: Ceilings) -> float:
    """An eager prefill: its launches are issued by the host while the device runs them, so it takes the
    larger of the two."""
    host = sum(
        ceilings.eager_fused_seconds if launch.name.startswith("voxwire.") else ceilings.eager_aten_seconds
        for launch in counter.launches
    )
    device = sum(launch.seconds(ceilings) for launch in counter.launches)
    return max(host, device) * 1e3


def print_roofline(batch: int, terms: list[dict[str, Any]], total_ms: float) -> None:
    print(f"roofline at batch {batch}:")
    print(f"  {'term':64s} {'kernels':>7s} {'GFLOP':>10s} {'GB':>9s} {'M CTAs':>8s} {'ms':>8s}")
    for term in terms:
        print(
            f"  {term['term']:64s} {term['kernels']:7d} {term['gflop']:10.1f} {term['gb']:9.2f} "
            f"{term['mctas']:8.2f} {term['ms']:8.2f}"
        )
    print(f"  {'total step':64s} {'':7s} {'':10s} {'':9s} {'':8s} {total_ms:8.2f}")


# ---------------------------------------------------------------------------------------------------------------
# The realistic column: the same launches as a real GPU runs them, by estimate

STEP_BUDGET_MS = 160.0
"""The audio one step makes per row (VoxCPM2: a patch of 4 latent frames of 40 ms): a step must fit in it."""


@dataclass(frozen=True)
class GemmTile:
    """An output tile of a GEMM, computed by one SM at a time, and its mainloop rate against a 128x256 tile."""

    rows: int
    cols: int
    rate: float


def _bandwidth_shares() -> dict[str, float]:
    # Each kernel kind's share of the ceiling's copy bandwidth (one long copy: 4.3 TB/s on the H200), estimates:
    # TMA-fed GEMM operands and flash attention's tiles stream nearly as a copy; aten's vectorized elementwise
    # kernels (adds, casts, cat) the same; one-row-per-program Triton kernels (norms, SiLU*mul: 4-8 KB each) and
    # reductions lose their ramp per program; GEMMs too thin for the tensor cores and cuDNN's channels-first
    # convolutions stream with strided reads; the Snake kernels read and write row tiles; the paged kernel walks
    # 16-position blocks through a table (512 B rows); gathers and scatters move rows of a few hundred bytes;
    # depthwise k7 convolutions re-read their window; RoPE and the conv-transpose output kernel run at 144-156
    # registers a thread, 12 warps per SM (GPU readiness review, D11): too few loads in flight to fill HBM; the
    # small-attention kernel's programs load a whole tile (~28 KB at the DiT's), compute, then store (~22 KB), two
    # resident per SM (117 registers x 256 threads, sm_90 ptxas), so an SM's loads pause while it computes.
    return {
        "gemm": 0.9,
        "conv": 0.8,
        "streaming": 0.8,
        "sdpa": 0.9,
        "small_attention": 0.7,
        "paged": 0.7,
        "elementwise": 0.9,
        "row": 0.8,
        "reduction": 0.75,
        "snake": 0.85,
        "indexed": 0.6,
        "depthwise": 0.6,
        "low_occupancy": 0.6,
    }


@dataclass(frozen=True)
class Efficiencies:
    """Where the realistic column departs from the ceilings. Each figure is an estimate from the rule or source
    stated with it; none was measured on this project's GPUs. gpu_check's step curve prints this model's
    prediction beside each measured step (and its profile the top kernels): the first GPU run calibrates them."""

    sms: int = 132
    """SMs a GEMM's tiles are spread over (H100 SXM and H200: 132)."""
    tiles: tuple[GemmTile, ...] = (
        GemmTile(128, 256, 1.0),
        GemmTile(256, 128, 1.0),
        GemmTile(128, 128, 0.9),
        GemmTile(64, 256, 0.8),
        GemmTile(64, 128, 0.7),
    )
    """The output tiles a GEMM library picks from (the one that finishes first) and their mainloop rates: a rule of
    thumb, falling with a tile's operand reuse tm*tn/(tm+tn) (85, 64, 51, 43) less than in proportion, since the
    L2 feeds a 128x128 tile nearly at full rate."""
    max_split_k: int = 4
    """The most slices K is cut into when a GEMM has too few tiles to fill the SMs (each slice at least
    ``min_tensor_k`` deep; the fp32 partials are written and read back)."""
    epilogue_k: int = 128
    """A tile's fixed cost in K steps: the pipeline's fill and the store of its output tile (at the per-SM share
    of HBM an output tile takes ~185 steps' time; a persistent kernel hides about half): a GEMM of depth K runs
    at K / (K + this) of its mainloop rate."""
    min_tensor_k: int = 256
    """Below this depth (or ``min_tensor_side``) a GEMM or convolution streams its operands: priced by its bytes."""
    min_tensor_side: int = 64
    """Below this M or N (a wgmma tile's least M) a GEMM streams its operands: priced by its bytes."""
    sustained_clock: float = 0.92
    """Tensor-core rates in steps run back to back against the short benchmarks the rates come from (10
    repetitions behind the 790 TFLOP/s ceiling): clocks fall under sustained power (~1.75 against 1.98 GHz)."""
    conv_rate: float = 0.85
    """A 1x1 convolution (cuDNN, channels-first half-precision data) against a GEMM of its implicit shape."""
    attention_tile: tuple[int, int] = (128, 64)
    """(queries, keys) a flash kernel computes per program: FlashAttention-2's forward tile at head dim 128
    (PyTorch's flash backend). Every (row, head) runs whole tiles: DiT's 11 tokens and LocEnc's 5 cost 128 x 64."""
    attention_flops: float = 350e12
    """FlashAttention-2's forward rate on an H100 SXM at head dim 128, counted over its tiles' padded work (the
    FlashAttention-3 paper's measurements: ~35 % of the dense peak, mma.sync rather than wgmma)."""
    small_attention_flops: float = 100e12
    """The small-attention kernel's rate over its padded tiles (``kernels.small_attention``: a row's stacked query
    heads, 128 rows at the DiT, against 16 keys). Its dots run on fp32 operands at TF32 precision (exact for
    half-precision values): ~20 % of the H100/H200's 495 TFLOP/s dense TF32 peak, as the tiles are 16 wide (the
    scores' N, the weighted sum's K). An estimate: gpu_check's kernel timing measures the kernel."""
    bandwidth_share: dict[str, float] = field(default_factory=_bandwidth_shares)
    """Each kernel kind's share of the ceiling's copy bandwidth (``Launch.pricing``; see ``_bandwidth_shares``)."""
    ramp_seconds: float = 1.0e-6
    """Each launch outside the GEMMs' wave model: its first programs starting and its last draining, beyond the
    graph's gap (the GPU readiness review: 1-2 us)."""
    paged_block_seconds: float = 0.7e-6
    """One block of the paged kernel's walk when latency bounds it: one dependent HBM round trip (table entry,
    then keys and values)."""
    paged_resident: int = 8
    """Paged-attention programs resident on an SM at once (4 warps, 4-26 KB of shared memory each)."""
    snake_instructions: int = 40
    """Instructions per element of a Snake kernel: libdevice's precise sinf (~25 on its fast path) and Snake's
    arithmetic, conversions and 2-D index math (~15): issue, not bandwidth, may bound it."""
    lanes_per_sm: int = 128
    """Instructions an SM issues per clock (4 schedulers x 32 lanes)."""
    clock_hz: float = 1.75e9
    """The SM clock under sustained load (boost 1.98 GHz)."""
    d2h_bandwidth: float = 50e9
    """The step's packed outputs read back to pinned host memory (PCIe Gen5 x16: 64 GB/s raw)."""
    host_step_seconds: float = 0.3e-3
    """The host's fixed work per step while the GPU idles: the index upload, the graph launch, waking after the
    sync, the scheduler's plan."""
    host_row_seconds: float = 2.5e-6
    """The engine's host work per row per step, measured on CPU at 768 sessions with the model stubbed out
    (docs/performance.md, "Engine host work per step"); the CPU's gather/scatter it includes stands for the
    hand-off of each row's audio to the frontends, which it leaves out."""

    @functools.cached_property
    def reference_share(self) -> float:
        """The share of the mainloop rate these rules give the 8192-cubed GEMM the ceilings' rates were measured on."""
        return self.share_at_8192(self.epilogue_k)

    def share_at_8192(self, epilogue_k: float) -> float:
        side = 8192
        return 2 * side**3 / self.gemm_seconds((1, side, side, side), 1.0, math.inf, epilogue_k)

    def fp8_epilogue_k(self, ceilings: Ceilings) -> float:
        """``epilogue_k`` of an fp8 GEMM: the same fixed time per tile (its fill and its bf16 output's store) is more
        K steps of a mainloop that runs ``fp8_flops / tensor_flops`` times as fast."""
        return self.epilogue_k * ceilings.fp8_flops / ceilings.tensor_flops

    def tensor_rate(self, ceilings: Ceilings, fp32: bool, fp8: bool = False) -> float:
        """The whole GPU's mainloop rate, sustained: the ceiling's GEMM rate over ``reference_share`` (for fp8, its
        own share at its epilogue)."""
        if fp8:
            return ceilings.fp8_flops / self.share_at_8192(self.fp8_epilogue_k(ceilings)) * self.sustained_clock
        ceiling = ceilings.fp32_flops if fp32 else ceilings.tensor_flops
        return ceiling / self.reference_share * self.sustained_clock

    def gemm_seconds(
        self, dims: tuple[int, ...], rate: float, bandwidth: float, epilogue_k: float | None = None
    ) -> float:
        """The MMA time of a GEMM (batch, M, N, K) at ``rate`` FLOP/s over the whole GPU: the tile and split of K
        that finish first, each in whole waves over the SMs (a wave's last tiles leave SMs idle), K's split
        partials written and read at ``bandwidth``; a tile's fixed cost is ``epilogue_k`` K steps (default
        ``self.epilogue_k``)."""
        epilogue = self.epilogue_k if epilogue_k is None else epilogue_k
        batch, m, n, k = dims
        per_sm = rate / self.sms
        best = math.inf
        for tile in self.tiles:
            tiles = batch * grids.cdiv(m, tile.rows) * grids.cdiv(n, tile.cols)
            for split in range(1, self.max_split_k + 1):
                depth = grids.cdiv(k, split)
                if split > 1 and depth < self.min_tensor_k:
                    break
                waves = grids.cdiv(tiles * split, self.sms)
                mma = waves * 2 * tile.rows * tile.cols * (depth + epilogue) / (per_sm * tile.rate)
                partials = 2 * (split - 1) * batch * m * n * 4 / bandwidth
                best = min(best, mma + partials)
        return best

    def padded_attention_flops(self, dims: tuple[int, ...]) -> int:
        """The MMA work SDPA's tiles run: every (row, head) a whole number of tiles of queries by keys."""
        batch, heads, queries, keys, head_dim = dims
        tile_q, tile_k = self.attention_tile
        padded = grids.cdiv(queries, tile_q) * tile_q * grids.cdiv(keys, tile_k) * tile_k
        return 4 * batch * heads * padded * head_dim

    def pricing(self, launch: Launch) -> str:
        """The launch's kind as priced: a GEMM or convolution too thin for the tensor cores streams."""
        if launch.pricing in ("gemm", "conv"):
            _, m, n, k = launch.dims
            if k < self.min_tensor_k or min(m, n) < self.min_tensor_side:
                return "streaming"
        return launch.pricing

    def seconds(self, launch: Launch, ceilings: Ceilings) -> float:
        """A launch's time on the GPU, without the graph's gap and the ramp (their own terms): its bytes at its
        kind's bandwidth, its programs at the ceiling's rate, or the work its kind is bound by, whichever is
        longest."""
        kind = self.pricing(launch)
        bandwidth = ceilings.bandwidth * self.bandwidth_share[kind]
        # Nothing runs its useful FLOPs faster than the tensor cores' sustained rate.
        computed = launch.flops / self.tensor_rate(ceilings, launch.fp32, launch.fp8)
        floor = max(launch.moved / bandwidth, launch.ctas * ceilings.cta_seconds, computed)
        if kind in ("gemm", "conv"):
            rate = self.tensor_rate(ceilings, launch.fp32, launch.fp8) * (self.conv_rate if kind == "conv" else 1.0)
            epilogue = self.fp8_epilogue_k(ceilings) if launch.fp8 else None
            return max(floor, self.gemm_seconds(launch.dims, rate, bandwidth, epilogue))
        if kind == "sdpa":
            return max(floor, self.padded_attention_flops(launch.dims) / (self.attention_flops * self.sustained_clock))
        if kind == "small_attention":  # its FLOPs are already its tiles' padded work
            return max(floor, launch.flops / (self.small_attention_flops * self.sustained_clock))
        if kind == "paged":
            programs, positions, block = launch.dims
            waves = grids.cdiv(programs, self.sms * self.paged_resident)
            return max(floor, waves * grids.cdiv(positions, block) * self.paged_block_seconds)
        if kind == "snake":
            return max(floor, launch.dims[0] * self.snake_instructions / (self.sms * self.lanes_per_sm * self.clock_hz))
        return floor

    def ramps(self, launch: Launch) -> bool:
        """Whether the launch pays ``ramp_seconds``: all but tensor-core GEMMs, whose waves model their tails."""
        return self.pricing(launch) not in ("gemm", "conv")

    def launch_seconds(self, launch: Launch, ceilings: Ceilings) -> float:
        """A launch's time with its ramp (for eager work, whose gaps are the host's)."""
        return self.seconds(launch, ceilings) + (self.ramp_seconds if self.ramps(launch) else 0.0)

    def assumption(self, launches: list[Launch], ceilings: Ceilings) -> str:
        """What the realistic column assumes for these launches, in one line."""
        kinds = Counter(self.pricing(launch) for launch in launches)
        said = []
        if kinds["gemm"] or kinds["conv"]:
            rate = self.tensor_rate(ceilings, any(launch.fp32 for launch in launches))
            tiles = "/".join(f"{tile.rows}x{tile.cols}" for tile in self.tiles)
            fp8 = sum(1 for launch in launches if launch.fp8)
            said.append(
                f"best of {tiles} tiles in waves over {self.sms} SMs, split-K <= {self.max_split_k}, "
                f"K/(K+{self.epilogue_k}) at {rate / 1e12:.0f} TFLOP/s"
                + (
                    f" ({fp8} in fp8: K/(K+{self.fp8_epilogue_k(ceilings):.0f}) at "
                    f"{self.tensor_rate(ceilings, False, fp8=True) / 1e12:.0f} TFLOP/s)"
                    if fp8
                    else ""
                )
                + (f", 1x1 conv x{self.conv_rate}" if kinds["conv"] else "")
            )
        if kinds["sdpa"]:
            tile_q, tile_k = self.attention_tile
            said.append(
                f"whole {tile_q}x{tile_k} flash tiles per (row, head), padded work at "
                f"{self.attention_flops * self.sustained_clock / 1e12:.0f} TFLOP/s"
            )
        if kinds["small_attention"]:
            said.append(
                "one tile per (row, kv head): its query heads stacked against its keys, padded work at "
                f"{self.small_attention_flops * self.sustained_clock / 1e12:.0f} TFLOP/s"
            )
        if kinds["paged"]:
            said.append(f">= {self.paged_block_seconds * 1e6:.1f} us per block walked, {self.paged_resident}/SM")
        if kinds["snake"]:
            said.append(f"Snake >= {self.snake_instructions} instr/element at {self.clock_hz / 1e9:.2f} GHz")
        shares = ", ".join(f"{kind} x{self.bandwidth_share[kind]}" for kind, _ in kinds.most_common())
        ramped = sum(count for kind, count in kinds.items() if kind not in ("gemm", "conv"))
        return "; ".join(
            [*said, f"bytes at {shares}" + (f"; +{self.ramp_seconds * 1e6:.0f} us ramp" if ramped else "")]
        )

    def describe(self, ceilings: Ceilings) -> str:
        tiles = ", ".join(f"{tile.rows}x{tile.cols} x{tile.rate}" for tile in self.tiles)
        shares = ", ".join(f"{kind} {share}" for kind, share in self.bandwidth_share.items())
        tile_q, tile_k = self.attention_tile
        return (
            f"realistic (estimates, to calibrate with gpu_check): GEMM tiles {tiles} over {self.sms} SMs, split-K <= "
            f"{self.max_split_k}, K/(K+{self.epilogue_k}), {self.tensor_rate(ceilings, False) / 1e12:.0f} TFLOP/s "
            f"mainloop (the {ceilings.tensor_flops / 1e12:.0f} measured at 8192^3 by these rules, x"
            f"{self.sustained_clock} sustained); GEMMs with K < {self.min_tensor_k} or a side < "
            f"{self.min_tensor_side} stream; 1x1 conv x{self.conv_rate}; SDPA in {tile_q}x{tile_k} tiles at "
            f"{self.attention_flops / 1e12:.0f} TFLOP/s; small-sequence attention kernel's tiles at "
            f"{self.small_attention_flops / 1e12:.0f} TFLOP/s; bandwidth shares: {shares}; ramp "
            f"{self.ramp_seconds * 1e6:.1f} us; paged {self.paged_block_seconds * 1e6:.1f} us/block; Snake "
            f"{self.snake_instructions} instr/element at {self.clock_hz / 1e9:.2f} GHz; D2H "
            f"{self.d2h_bandwidth / 1e9:.0f} GB/s; host {self.host_step_seconds * 1e3:.1f} ms + "
            f"{self.host_row_seconds * 1e6:.1f} us/row per step"
        )


EFFICIENCIES = Efficiencies()


@dataclass(frozen=True)
class Workload:
    """The admissions a step makes at steady state: scripts/simulate_load.py's default traffic (a stream is 1-3
    sentences, each one request)."""

    request_patches: float = 37.5
    """Steps one request runs (a sentence of 15-60 patches, uniform): a step of R rows admits R / this."""
    prompt_positions: int = 89
    """Prefill positions of one request (64 voice-prompt positions and 2/3 of its patches in text)."""
    continuation_share: float = 0.5
    """Requests that continue a stream (every sentence after its first; a stream's first is taken to be zero-shot):
    their prompt carries the previous sentence's patches, which the runner encodes with LocEnc and warms the VAE
    with, one request at a time. A voice prompt on first sentences too would warm every admission."""

    def admissions(self, rows: int) -> float:
        return rows / self.request_patches


@dataclass(frozen=True)
class Term:
    """One line of the realistic table: the best case's milliseconds and the realistic ones, and why."""

    name: str
    best_ms: float
    realistic_ms: float
    assumption: str


@dataclass(frozen=True)
class StepEstimate:
    """A step of ``rows`` rows, term by term."""

    rows: int
    terms: tuple[Term, ...]

    @property
    def best_ms(self) -> float:
        return sum(term.best_ms for term in self.terms)

    @property
    def realistic_ms(self) -> float:
        return sum(term.realistic_ms for term in self.terms)

    def as_dict(self) -> dict[str, Any]:
        terms = [dataclasses.asdict(term) for term in self.terms]
        return {"rows": self.rows, "best_ms": self.best_ms, "realistic_ms": self.realistic_ms, "terms": terms}


# The realistic column's terms over the model step's launches, in print order (the best case's, attention split).
_STEP_TERMS: list[tuple[str, Callable[[Launch], bool]]] = [
    (_TERMS[0][0], lambda launch: launch.part == "lm" and launch.kind == "gemm"),
    (_TERMS[1][0], lambda launch: launch.part == "dit" and launch.kind == "gemm"),
    (
        "LocEnc / DiT attention (small-sequence kernel, SDPA)",
        lambda launch: launch.pricing in ("sdpa", "small_attention"),
    ),
    ("paged decode attention", lambda launch: launch.pricing == "paged"),
    (_TERMS[3][0], lambda launch: launch.part == "lm" and launch.kind == "other"),
    (_TERMS[4][0], lambda launch: launch.part == "dit" and launch.kind == "other"),
    (_TERMS[5][0], lambda launch: launch.part == "vae" and launch.kind == "gemm"),
    (_TERMS[6][0], lambda launch: launch.part == "vae" and launch.kind == "other"),
]


def _tiny_tokenizer() -> TextTokenizer:
    with tempfile.TemporaryDirectory() as folder:
        write_tiny_tokenizer(Path(folder))
        return TextTokenizer.from_dir(folder)


class StepModel:
    """The server's step at any batch, counted on meta and priced twice: at the ceilings (the best case, today's
    roofline) and by ``Efficiencies`` (realistic). With a ``workload`` the realistic column also charges the
    admissions of a step at steady state; without, a step of decode rows only (what gpu_check's step curve times)."""

    def __init__(
        self,
        config: ModelConfig,
        vae_dtype: torch.dtype,
        ceilings: Ceilings,
        efficiencies: Efficiencies = EFFICIENCIES,
        workload: Workload | None = None,
        dit_fp8: bool = True,
    ) -> None:
        self.config = config
        self.ceilings = ceilings
        self.efficiencies = efficiencies
        self.workload = workload
        self.model = build_model(config, True, vae_dtype, dit_fp8)
        # The runner takes a loaded model; its step never tokenizes, so any tokenizer does.
        self.tts = LoadedModel(config, self.model, _tiny_tokenizer(), "meta")
        self._runner: ModelRunner | None = None
        self._counters: dict[tuple[int, int, int], CostCounter] = {}
        self._runner_launches: dict[tuple[int, int], list[Launch]] = {}
        self._prefills: dict[tuple[int, int], list[Launch]] = {}
        self._continuations: dict[int, list[Launch]] = {}
        self._warms: dict[int, list[Launch]] = {}

    def step_counter(self, rows: int, context: int, timesteps: int) -> CostCounter:
        """``count_step``'s counter for the model step and the VAE decode (counted once per shape)."""
        key = (rows, context, timesteps)
        if key not in self._counters:
            counter = CostCounter()
            count_step(self.config, rows, context, timesteps, True, counter=counter, model=self.model)
            self._counters[key] = counter
        return self._counters[key]

    def runner(self, rows: int, timesteps: int) -> ModelRunner:
        """A runner on meta with at least ``rows`` slots (its buffers hold no memory; its KV pool two blocks)."""
        runner = self._runner
        if runner is None or runner.num_slots < rows or runner.max_timesteps < timesteps:
            slots, most = (
                (rows, timesteps)
                if runner is None
                else (max(rows, runner.num_slots), max(timesteps, runner.max_timesteps))
            )
            per_block = DEFAULT_BLOCK_SIZE * bytes_per_position(self.tts)
            options = RunnerOptions(slots, kv_cache_bytes=2 * per_block, cuda_graphs=True, max_timesteps=most)
            runner = self._runner = ModelRunner(self.tts, options)
        return runner

    def runner_launches(self, rows: int, timesteps: int) -> list[Launch]:
        """What the runner's graph runs around the model step: gathering the rows' state, tables and noise,
        scattering the state back and packing the outputs (``ModelRunner``'s own step on meta, the model step and
        the VAE decode left uncounted: ``step_counter`` counts those)."""
        key = (rows, timesteps)
        if key not in self._runner_launches:
            runner = self.runner(rows, timesteps)
            assert runner.graphs is not None
            counter = CostCounter()
            counter.phase = "runner"

            def uncounted(method: Callable[..., Any]) -> Callable[..., Any]:
                def call(*args: Any, **kwargs: Any) -> Any:
                    with counter.paused():
                        return method(*args, **kwargs)

                return call

            decoder = self.tts.vae_decoder
            with ExitStack() as stack:
                stack.enter_context(torch.inference_mode())  # as the runner's buffers were made
                stack.enter_context(ops.fused_on_meta())
                stack.enter_context(mock.patch.object(self.model, "decode_step", uncounted(self.model.decode_step)))
                stack.enter_context(mock.patch.object(decoder, "decode", uncounted(decoder.decode)))
                stack.enter_context(counter)
                runner.graphs.step(rows, timesteps)
            self._runner_launches[key] = counter.launches
        return self._runner_launches[key]

    def prefill_launches(self, rows: int, positions: int) -> list[Launch]:
        key = (rows, positions)
        if key not in self._prefills:
            self._prefills[key] = count_prefill(self.config, positions, torch.bfloat16, rows, self.model).launches
        return self._prefills[key]

    def continuation_launches(self, patches: int) -> list[Launch]:
        if patches not in self._continuations:
            self._continuations[patches] = count_continuation(self.model, patches).launches
        return self._continuations[patches]

    def warm_launches(self, rows: int) -> list[Launch]:
        if rows not in self._warms:
            self._warms[rows] = count_warm(self.model, rows, self.config.decode_context_patches).launches
        return self._warms[rows]

    def eager_seconds(self, launches: list[Launch]) -> float:
        """Eager launches: the host issues them while the device runs them, so the longer of the two."""
        ceilings = self.ceilings
        host = sum(
            ceilings.eager_fused_seconds if launch.name.startswith("voxwire.") else ceilings.eager_aten_seconds
            for launch in launches
        )
        return max(host, sum(self.efficiencies.launch_seconds(launch, ceilings) for launch in launches))

    def graph_terms(self, rows: int, context: int, timesteps: int, runner: bool = True) -> list[Term]:
        """One graph's terms: the model step's launches, the graph's gaps, the ramps and (``runner``) the runner's
        own launches."""
        ceilings, efficiencies = self.ceilings, self.efficiencies
        launches = self.step_counter(rows, context, timesteps).launches
        terms = []
        for label, chosen in _STEP_TERMS:
            these = [launch for launch in launches if chosen(launch)]
            best = sum(launch.seconds(ceilings) for launch in these) * 1e3
            realistic = sum(efficiencies.seconds(launch, ceilings) for launch in these) * 1e3
            terms.append(Term(label, best, realistic, efficiencies.assumption(these, ceilings)))
        gaps = len(launches) * ceilings.graph_gap_seconds * 1e3
        terms.append(Term(_GAPS, gaps, gaps, f"{ceilings.graph_gap_seconds * 1e6:.1f} us per launch"))
        ramped = sum(1 for launch in launches if efficiencies.ramps(launch))
        terms.append(
            Term(
                "ramp and tail of launches outside the GEMM wave model",
                0.0,
                ramped * efficiencies.ramp_seconds * 1e3,
                f"{ramped} launches x {efficiencies.ramp_seconds * 1e6:.1f} us",
            )
        )
        if runner:
            own = self.runner_launches(rows, timesteps)
            seconds = sum(efficiencies.launch_seconds(launch, ceilings) for launch in own)
            seconds += len(own) * ceilings.graph_gap_seconds
            terms.append(
                Term(
                    "runner: gather/scatter of the rows' state, noise, packed output",
                    0.0,
                    seconds * 1e3,
                    f"{len(own)} launches of ModelRunner's step (counted on meta), priced as above with gaps",
                )
            )
        return terms

    def best_ms(self, rows: int, context: int, timesteps: int = 10, buckets: tuple[tuple[int, int], ...] = ()) -> float:
        """The best case alone (cheaper than ``estimate``: the model step's launches only)."""
        return self._estimate(rows, context, timesteps, buckets, realistic=False).best_ms

    def estimate(
        self, rows: int, context: int, timesteps: int = 10, buckets: tuple[tuple[int, int], ...] = ()
    ) -> StepEstimate:
        """A step of ``rows`` rows at ``context`` live positions each, ``timesteps`` CFM timesteps but for
        ``buckets``' (timesteps, rows): each such group runs its own sub-step, its graph bucket's rows."""
        return self._estimate(rows, context, timesteps, buckets, realistic=True)

    def _estimate(
        self, rows: int, context: int, timesteps: int, buckets: tuple[tuple[int, int], ...], realistic: bool
    ) -> StepEstimate:
        main = rows - sum(count for _, count in buckets)
        terms = self.graph_terms(main, context, timesteps, runner=realistic)
        sizes = bucket_sizes(rows)
        for bucket_timesteps, count in buckets:
            graph_rows = sizes[bisect.bisect_left(sizes, count)]
            sub = self.graph_terms(graph_rows, context, bucket_timesteps, runner=realistic)
            terms.append(
                Term(
                    f"sub-step: {count} rows at {bucket_timesteps} timesteps (graph of {graph_rows} rows)",
                    sum(term.best_ms for term in sub),
                    sum(term.realistic_ms for term in sub),
                    "its own graph: every term above again at its size, the fixed costs (weights, launches) included",
                )
            )
        if realistic:
            if self.workload is not None:
                terms += self.admission_terms(rows, self.workload)
            terms += self.host_terms(rows)
        return StepEstimate(rows, tuple(terms))

    def admission_terms(self, rows: int, workload: Workload) -> list[Term]:
        """What a step's admissions add at steady state (``ModelRunner._prefill``): one right-padded prefill of
        them all, each one's noise, one LocEnc encode of all their continuation prompts and one VAE warm of them
        all, eager."""
        ceilings = self.ceilings
        admitted = workload.admissions(rows)
        together = max(1, math.ceil(admitted))
        prefill = self.prefill_launches(together, workload.prompt_positions)
        # Fewer than one a step: a prefill in that share of the steps.
        prefill_ms = min(1.0, admitted) * self.eager_seconds(prefill) * 1e3
        noise_ms = admitted * (ceilings.eager_fused_seconds + ceilings.eager_aten_seconds) * 1e3
        patches = round(workload.request_patches)
        continued = admitted * workload.continuation_share
        encoded = max(1, math.ceil(continued))
        continuation = self.continuation_launches(encoded * patches)
        # Fewer than one a step: an encode in that share of the steps.
        continuation_ms = min(1.0, continued) * self.eager_seconds(continuation) * 1e3
        warm = self.warm_launches(encoded)
        # Fewer than one a step: a warm in that share of the steps.
        warm_ms = min(1.0, continued) * self.eager_seconds(warm) * 1e3
        per_request = f"{admitted:.1f} admissions per step ({rows} rows / {workload.request_patches:g} steps a request)"
        return [
            Term(
                "admissions: one batched eager prefill",
                0.0,
                prefill_ms,
                f"{per_request}: {together} x {workload.prompt_positions} positions, {len(prefill)} launches, host "
                f"({ceilings.eager_aten_seconds * 1e6:.0f} us aten, {ceilings.eager_fused_seconds * 1e6:.0f} us "
                "fused) or device, whichever is longer",
            ),
            Term("admissions: noise draws", 0.0, noise_ms, "one draw and one store per request, eager"),
            Term(
                "admissions: continuation prompts (LocEnc encode)",
                0.0,
                continuation_ms,
                f"{workload.continuation_share:.0%} of admissions, together: one LocEnc call over {encoded} x "
                f"{patches} patches, {len(continuation)} launches",
            ),
            Term(
                "admissions: continuation prompts (one batched VAE warm)",
                0.0,
                warm_ms,
                f"the step's continuations together, {self.config.decode_context_patches} patches each: "
                f"{len(warm)} launches",
            ),
        ]

    def host_terms(self, rows: int) -> list[Term]:
        """The host's gap between steps, with the GPU idle: the packed outputs read back, the engine's work."""
        efficiencies = self.efficiencies
        width = self.runner(rows, 1).packed_width
        read_back_ms = rows * width * 4 / efficiencies.d2h_bandwidth * 1e3
        engine_ms = (efficiencies.host_step_seconds + rows * efficiencies.host_row_seconds) * 1e3
        return [
            Term(
                "host: packed outputs read back",
                0.0,
                read_back_ms,
                f"{width} float32 a row at {efficiencies.d2h_bandwidth / 1e9:.0f} GB/s",
            ),
            Term(
                "host: engine work between steps",
                0.0,
                engine_ms,
                f"{efficiencies.host_step_seconds * 1e3:.1f} ms + {efficiencies.host_row_seconds * 1e6:.1f} us a row",
            ),
        ]


def rows_within(cost_ms: Callable[[int], float], budget_ms: float, least: int, limit: int) -> int:
    """The most rows (from ``least`` up to ``limit``) whose step ``cost_ms`` fits ``budget_ms``, by bisection (a
    step never gets cheaper with more rows); ``least - 1`` when none does."""
    if cost_ms(least) > budget_ms:
        return least - 1
    if cost_ms(limit) <= budget_ms:
        return limit
    fits, over = least, limit
    while over - fits > 1:
        middle = (fits + over) // 2
        if cost_ms(middle) <= budget_ms:
            fits = middle
        else:
            over = middle
    return fits


def print_estimate(estimate: StepEstimate) -> None:
    print(f"realistic at batch {estimate.rows} (an estimate: each term's assumption beside it):")
    print(f"  {'term':64s} {'best ms':>8s} {'real ms':>8s}  assumption")
    for term in estimate.terms:
        print(f"  {term.name:64s} {term.best_ms:8.2f} {term.realistic_ms:8.2f}  {term.assumption}")
    print(f"  {'total step, best and realistic':64s} {estimate.best_ms:8.2f} {estimate.realistic_ms:8.2f}")


def _figures(cost: StepCost, batch: int) -> dict[str, int]:
    return {
        "kernels": cost.kernels,
        "bytes": cost.bytes,
        "matmul_bytes": cost.matmul_bytes,
        "non_matmul_bytes": cost.non_matmul_bytes,
        "non_matmul_bytes_per_row": cost.non_matmul_bytes // batch,
    }


def _describe(name: str, cost: StepCost, batch: int) -> str:
    return (
        f"{name}: {cost.kernels:5d} kernels, {cost.bytes / 1e6:9.1f} MB, "
        f"non-matmul {cost.non_matmul_bytes / batch / 1e6:7.1f} MB/row"
    )


def _bucket(text: str) -> tuple[int, int]:
    """``T:ROWS`` -> (timesteps, rows), both at least 1."""
    timesteps, _, rows = text.partition(":")
    try:
        bucket = int(timesteps), int(rows)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not T:ROWS (two whole numbers)") from None
    if min(bucket) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: timesteps and rows must be at least 1")
    return bucket


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="voxcpm2-shape", help="a voxwire.tiny.configs.ALL_CONFIGS name")
    parser.add_argument("--batch", default="1,64", help="comma-separated batch sizes")
    parser.add_argument("--context", type=int, default=256, help="cached positions per row (live KV length)")
    parser.add_argument("--timesteps", type=int, default=10, help="CFM timesteps per patch")
    parser.add_argument("--fused", action="store_true", help="count the fused path as it runs on CUDA")
    parser.add_argument(
        "--vae-dtype", choices=("float16", "bfloat16", "float32"), default="float16", help="the VAE's dtype when fused"
    )
    parser.add_argument("--roofline", choices=sorted(CEILINGS), help="milliseconds per term at these ceilings")
    parser.add_argument(
        "--dit-bf16",
        action="store_true",
        help="count LocDiT's GEMMs in bf16 (a GPU without fp8, a batch-invariant server) instead of fp8 when fused",
    )
    parser.add_argument("--prompt-tokens", type=int, default=40, help="prefill length for the time to first audio")
    parser.add_argument("--top", type=int, default=0, help="also print the N most frequent ops and their bytes")
    parser.add_argument(
        "--breakdown", type=int, default=0, help="also print, per phase, the N ops that move the most non-matmul bytes"
    )
    parser.add_argument(
        "--bucket",
        type=_bucket,
        action="append",
        default=[],
        metavar="T:ROWS",
        help="ROWS of the batch's rows run T timesteps, as their own sub-step (repeatable)",
    )
    workload = Workload()
    parser.add_argument(
        "--request-patches",
        type=float,
        default=workload.request_patches,
        help="steps a request runs: a step of R rows admits R / this (realistic column)",
    )
    parser.add_argument(
        "--admission-positions",
        type=int,
        default=workload.prompt_positions,
        help="prefill positions of an admitted request (realistic column)",
    )
    parser.add_argument(
        "--continuation-share",
        type=float,
        default=workload.continuation_share,
        help="share of admissions that continue a stream: a LocEnc encode each, one VAE warm a step (realistic column)",
    )
    parser.add_argument("--fit-limit", type=int, default=4096, help="the most rows the 160 ms fit searches")
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    args = parser.parse_args()
    config = ModelConfig.from_dict(ALL_CONFIGS[args.config], source=args.config)
    fused = args.fused or args.roofline is not None
    vae_dtype = getattr(torch, args.vae_dtype)
    ceilings = CEILINGS[args.roofline] if args.roofline else None
    buckets = tuple(args.bucket)
    batches = [int(b) for b in args.batch.split(",")]
    least = 1 + sum(count for _, count in buckets)
    if min(batches) < least:
        parser.error(f"--bucket takes {least - 1} rows: every --batch must have at least {least}")
    workload = Workload(args.request_patches, args.admission_positions, args.continuation_share)
    step_model = (
        StepModel(config, vae_dtype, ceilings, EFFICIENCIES, workload, not args.dit_bf16)
        if ceilings is not None
        else None
    )
    if ceilings is not None:
        print(ceilings.describe())
        print(EFFICIENCIES.describe(ceilings))
        dit = "LocDiT GEMMs in bf16" if args.dit_bf16 else "LocDiT GEMMs in fp8"
        print(f"config {args.config}, bf16 transformers, {dit}, VAE {args.vae_dtype}, {args.timesteps} CFM timesteps")
    rows = []
    summary: dict[str, Any] = {}
    estimates: list[StepEstimate] = []
    for batch in batches:
        if step_model is not None:
            counter = step_model.step_counter(batch, args.context, args.timesteps)
        else:
            counter = CostCounter()
            model = build_model(config, fused, vae_dtype, not args.dit_bf16)
            count_step(config, batch, args.context, args.timesteps, fused, vae_dtype, counter, model)
        phases = counter.costs
        cost = phases["model"] + phases["vae"]
        row: dict[str, Any] = {"batch": batch, "fused": fused, **_figures(cost, batch)}
        row.update(
            {f"{phase}_{key}": value for phase in phases for key, value in _figures(phases[phase], batch).items()}
        )
        if step_model is not None:
            terms = roofline(counter.launches, step_model.ceilings)
            row["roofline"] = terms
            row["step_ms"] = sum(term["ms"] for term in terms)
            estimates.append(step_model.estimate(batch, args.context, args.timesteps, buckets))
            row.update({key: value for key, value in estimates[-1].as_dict().items() if key != "rows"})
        rows.append(row)
        print(f"batch {batch:4d}  " + "  ".join(_describe(name, phases[name], batch) for name in ("model", "vae")))
        print(f"            {_describe('total', cost, batch)}")
        for name, count in cost.ops.most_common(args.top):
            print(f"    {count:6d}  {cost.op_bytes[name] / 1e6:10.1f} MB  {name}")
        for phase in ("model", "vae") if args.breakdown else ():
            print(f"  {phase}: non-matmul MB/row by op")
            for name, moved in phases[phase].non_matmul_op_bytes().most_common(args.breakdown):
                print(f"    {phases[phase].ops[name]:6d}  {moved / batch / 1e6:8.2f} MB/row  {name}")
        if step_model is not None:
            print_roofline(batch, row["roofline"], row["step_ms"])
            print_estimate(estimates[-1])
    if step_model is not None:
        ceilings = step_model.ceilings
        first_step = next((row["step_ms"] for row in rows if row["batch"] == 1), None)
        if first_step is None:
            first_step = sum(
                term["ms"]
                for term in roofline(step_model.step_counter(1, args.context, args.timesteps).launches, ceilings)
            )
        prefill = prefill_ms(count_prefill(config, args.prompt_tokens, vae_dtype, model=step_model.model), ceilings)
        ttfa = prefill + first_step + ceilings.ttfa_allowance_seconds * 1e3
        summary = {"prefill_ms": prefill, "first_step_ms": first_step, "ttfa_ms": ttfa}
        print(
            f"single stream: time to first audio {ttfa:.2f} ms = prefill {prefill:.2f} ms (eager, "
            f"{args.prompt_tokens} tokens) + first step {first_step:.2f} ms (batch 1) + allowance "
            f"{ceilings.ttfa_allowance_seconds * 1e3:.2f} ms"
        )
        summary.update(_fit(step_model, max(estimates, key=lambda e: e.rows), args, buckets, least))
    if args.json is not None:
        document = {
            "config": args.config,
            "context": args.context,
            "vae_dtype": args.vae_dtype,
            "dit_fp8": fused and not args.dit_bf16,
            "rows": rows,
        }
        args.json.write_text(json.dumps({**document, **summary}, indent=1))


def _fit(
    step_model: StepModel,
    largest: StepEstimate,
    args: argparse.Namespace,
    buckets: tuple[tuple[int, int], ...],
    least: int,
) -> dict[str, Any]:
    """Both totals at the largest batch asked, and the rows whose step fits ``STEP_BUDGET_MS`` by each."""
    context, timesteps, limit = args.context, args.timesteps, args.fit_limit
    fits = {
        "best": rows_within(lambda r: step_model.best_ms(r, context, timesteps, buckets), STEP_BUDGET_MS, least, limit),
        "realistic": rows_within(
            lambda r: step_model.estimate(r, context, timesteps, buckets).realistic_ms, STEP_BUDGET_MS, least, limit
        ),
        "searched_up_to": limit,
    }
    print(
        f"step of {largest.rows} rows: best case {largest.best_ms:.2f} ms, realistic {largest.realistic_ms:.2f} ms "
        "(an estimate: no GPU has run it)"
    )
    print(
        f"rows whose step fits {STEP_BUDGET_MS:.0f} ms: best case {fits['best']}, realistic {fits['realistic']}"
        + (f" (the search stops at {limit})" if limit in (fits["best"], fits["realistic"]) else "")
    )
    return {
        "ceilings": step_model.ceilings.name,
        "at_batch": largest.rows,
        "best_ms": largest.best_ms,
        "realistic_ms": largest.realistic_ms,
        "rows_in_160ms": fits,
        "assumptions": {
            "efficiencies": dataclasses.asdict(step_model.efficiencies),
            "workload": dataclasses.asdict(step_model.workload) if step_model.workload is not None else None,
        },
    }


if __name__ == "__main__":
    main()
