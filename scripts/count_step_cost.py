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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from voxwire.config import ModelConfig
from voxwire.kernels import grids, ops
from voxwire.model import minicpm
from voxwire.model.audio_vae import StreamingVAEDecoder
from voxwire.model.cfm import CfmSchedule
from voxwire.model.kv_cache import KVCache
from voxwire.model.voxcpm import DecodeState, PrefillBatch, VoxCPMModel
from voxwire.tiny.configs import ALL_CONFIGS

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
_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution", "matmul", "linear"}
_SCATTERS = {"index_put", "index_put_"}


@dataclass(frozen=True)
class Ceilings:
    """What a GPU does at best, per the figures stated with each field."""

    name: str
    tensor_flops: float  # bf16/fp16 dense GEMM FLOP/s
    fp32_flops: float  # fp32 GEMM/conv FLOP/s with TF32 off (the server never enables TF32)
    bandwidth: float  # HBM bytes/s
    cta_seconds: float  # per program (CTA): the rate the GPU schedules tiny blocks at, all SMs together
    graph_gap_seconds: float  # between launches replayed in one CUDA graph
    eager_aten_seconds: float  # host cost of one eager aten launch (prefill)
    eager_fused_seconds: float  # host cost of one eager fused custom op (Python custom op + Triton launcher)
    ttfa_allowance_seconds: float  # noise draw, engine/IPC hand-off and the first chunk's delivery

    def describe(self) -> str:
        return (
            f"{self.name}: {self.tensor_flops / 1e12:.0f} TFLOP/s bf16/fp16 GEMM, {self.fp32_flops / 1e12:.0f} TFLOP/s "
            f"fp32 (TF32 off), {self.bandwidth / 1e12:.1f} TB/s, {self.cta_seconds * 1e9:.1f} ns per CTA, "
            f"{self.graph_gap_seconds * 1e6:.1f} us per graph launch; eager {self.eager_aten_seconds * 1e6:.0f} us "
            f"per aten op, {self.eager_fused_seconds * 1e6:.0f} us per fused op; TTFA allowance "
            f"{self.ttfa_allowance_seconds * 1e3:.1f} ms"
        )


# H200 SXM: 790 TFLOP/s is the bf16 GEMM rate measured on the H200s this project uses (990 datasheet); 4.3 TB/s
# the measured copy rate (4.8 datasheet); fp32 at ~75 % of the 67 TFLOP/s FP32 datasheet rate; 0.4 ns per CTA
# is 2.5 M tiny blocks per ms over 132 SMs (the middle of the 1.5-3 M/ms the GPU-readiness review assumes);
# 1.5 us between graph-replayed kernels; eager launch costs as measured through torch's dispatcher and the
# custom-op + Triton launcher path.
CEILINGS = {
    "h200": Ceilings(
        name="h200",
        tensor_flops=790e12,
        fp32_flops=50e12,
        bandwidth=4.3e12,
        cta_seconds=0.4e-9,
        graph_gap_seconds=1.5e-6,
        eager_aten_seconds=5e-6,
        eager_fused_seconds=25e-6,
        ttfa_allowance_seconds=2e-3,
    )
}
# Elements per program of torch's elementwise and reduction kernels (128 threads x 4), and the output tile
# of a cuBLAS GEMM or cuDNN convolution: how their CTAs are counted.
_ATEN_ELEMENTS_PER_CTA = 512
_GEMM_TILE = 128


@dataclass(frozen=True)
class Launch:
    """One counted launch: where in the step, what it moved and computed, how many programs it ran."""

    phase: str  # model | vae | prefill
    part: str  # lm | dit | vae
    kind: str  # gemm | attention | other
    name: str
    moved: int
    flops: int
    ctas: int
    fp32: bool

    def seconds(self, ceilings: Ceilings) -> float:
        rate = ceilings.fp32_flops if self.fp32 else ceilings.tensor_flops
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
    """Bytes an op reads and writes. A scatter into a tensor (``index_put_``: a KV-cache write) touches
    only the written elements, not the whole destination it returns; a gather (``index``: a RoPE table
    lookup by position) reads only the elements it returns, not the whole table."""
    if name in ("index_put", "index_put_"):
        return 2 * _tensor_bytes(args[2]) + _tensor_bytes(args[1])
    if name == "index":
        return 2 * _tensor_bytes(out) + _tensor_bytes(args[1])
    return _tensor_bytes((args, kwargs)) + _tensor_bytes(out)


def _fused_ctas(name: str, args: tuple[Any, ...]) -> int:
    """Programs a fused op launches: its wrapper's grid (``voxwire.kernels.grids``)."""
    x = args[0]
    if name in ("rms_norm", "add_rms_norm"):
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
    else:
        raise ValueError(f"no grid known for fused op {name}")
    return math.prod(grid)


def _aten_ctas(name: str, args: tuple[Any, ...], out: Any) -> int:
    """Programs an aten op launches: a GEMM's or convolution's output tiles, else its output's elements over the
    elements one program handles. A scatter (``index_put_``: a KV-cache write) runs over the values it writes,
    not over the whole destination it returns."""
    written = args[2] if name in _SCATTERS else out
    leaves = [leaf for leaf in tree_flatten(written)[0] if isinstance(leaf, torch.Tensor)]
    if not leaves:
        return 1
    first = leaves[0]
    if name in ("mm", "addmm", "bmm", "baddbmm") and first.ndim >= 2:
        batch = math.prod(first.shape[:-2])
        return batch * grids.cdiv(first.size(-2), _GEMM_TILE) * grids.cdiv(first.size(-1), _GEMM_TILE)
    if name in ("convolution", "_convolution"):
        return grids.cdiv(first.numel(), _GEMM_TILE * _GEMM_TILE)
    return max(1, grids.cdiv(sum(leaf.numel() for leaf in leaves), _ATEN_ELEMENTS_PER_CTA))


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

    def record(
        self, name: str, moved: int, matmul: bool, flops: int = 0, ctas: int = 1, fp32: bool = False, kind: str = ""
    ) -> None:
        cost = self.costs.setdefault(self.phase, StepCost())
        cost.kernels += 1
        cost.bytes += moved
        if matmul:
            cost.matmul_bytes += moved
            cost.matmul_ops.add(name)
        cost.ops[name] += 1
        cost.op_bytes[name] += moved
        kind = kind or ("gemm" if matmul else "other")
        self.launches.append(Launch(self.phase, self.part, kind, name, moved, flops, ctas, fp32))

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
            flops = _flops(func, args, kwargs, out)
            self.record(f"{namespace}.{name}", moved, name in _MATMUL, flops, ctas, fp32)
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
        self.counter.record("attention", moved, matmul=True, flops=flops, ctas=ctas, fp32=fp32, kind="attention")
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
        positions = q.size(0) * min(block_tables.size(1) * k_cache.size(1), k_cache.size(0) * k_cache.size(1))
        live_kv = 2 * positions * k_cache.size(2) * k_cache.size(3) * k_cache.element_size()
        out = torch.empty_like(q)
        moved = 2 * _tensor_bytes(q) + live_kv + _tensor_bytes((block_tables, seq_lens))
        flops = 4 * positions * q.size(1) * q.size(2)
        ctas = q.size(0) * k_cache.size(2)
        counter.record("paged_decode_attention", moved, matmul=True, flops=flops, ctas=ctas, kind="attention")
        return out

    original = minicpm.decode_attention
    minicpm.decode_attention = one_kernel
    try:
        yield
    finally:
        minicpm.decode_attention = original


def build_model(config: ModelConfig, fused: bool, vae_dtype: torch.dtype) -> VoxCPMModel:
    """The model on meta as a server runs it: bf16 transformers; fused (q/k/v, gate/up) and with the VAE in
    ``vae_dtype`` on the CUDA path, else unfused with the fp32 VAE (the CPU path); frozen, as ``LoadedModel`` holds
    it (a weight that needs no gradient changes ``matmul``'s dispatch: a non-contiguous 3-D input then runs a
    ``bmm`` against the weight expanded to every row instead of a copy and one ``mm``)."""
    with torch.device("meta"):
        model = VoxCPMModel(config)
    model.cast_transformers(torch.bfloat16)
    if fused:
        model.fuse_projections()
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
) -> dict[str, StepCost]:
    """The cost of one decode step of ``batch`` rows at ``context`` cached positions each, for its two
    phases: ``model`` (the decode step) and ``vae`` (the streaming decode of the new patch)."""
    dtype = torch.bfloat16
    device = torch.device("meta")
    model = build_model(config, fused, vae_dtype)
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


def count_prefill(config: ModelConfig, tokens: int, vae_dtype: torch.dtype) -> CostCounter:
    """The launches of one zero-shot prefill of ``tokens`` positions (batch 1) on the CUDA path."""
    model = build_model(config, True, vae_dtype)
    meta, dtype = torch.device("meta"), torch.bfloat16
    batch = PrefillBatch(
        text_tokens=torch.empty(1, tokens, device=meta, dtype=torch.long),
        feats=torch.empty(1, tokens, config.patch_size, config.feat_dim, device=meta, dtype=dtype),
        text_mask=torch.empty(1, tokens, device=meta, dtype=dtype),
        audio_mask=torch.empty(1, tokens, device=meta, dtype=dtype),
        lengths=torch.empty(1, device=meta, dtype=torch.long),
        audio_positions=torch.empty(0, device=meta, dtype=torch.long),
    )
    base = KVCache.dedicated(config.lm_config, 1, tokens + 1, meta, dtype)
    residual = KVCache.dedicated(config.residual_lm, 1, tokens + 1, meta, dtype)
    counter = CostCounter()
    counter.phase = "prefill"
    with torch.no_grad(), ops.fused_on_meta(), counter, AttentionAsOneKernel(counter):
        model.prefill(batch, base, residual)
    return counter


# Roofline terms: (label, part, kinds) in print order.
_TERMS = [
    ("LM GEMMs (LocEnc, base + residual LM, projections, stop head)", "lm", ("gemm",)),
    ("DiT GEMMs (CFM velocity net, all passes)", "dit", ("gemm",)),
    ("attention (paged decode, LocEnc/DiT SDPA)", None, ("attention",)),
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
            "term": "launch gaps (one CUDA graph)",
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
    parser.add_argument("--prompt-tokens", type=int, default=40, help="prefill length for the time to first audio")
    parser.add_argument("--top", type=int, default=0, help="also print the N most frequent ops and their bytes")
    parser.add_argument(
        "--breakdown", type=int, default=0, help="also print, per phase, the N ops that move the most non-matmul bytes"
    )
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    args = parser.parse_args()
    config = ModelConfig.from_dict(ALL_CONFIGS[args.config], source=args.config)
    fused = args.fused or args.roofline is not None
    vae_dtype = getattr(torch, args.vae_dtype)
    ceilings = CEILINGS[args.roofline] if args.roofline else None
    if ceilings is not None:
        print(ceilings.describe())
        print(f"config {args.config}, bf16 transformers, VAE {args.vae_dtype}, {args.timesteps} CFM timesteps")
    rows = []
    summary: dict[str, Any] = {}
    for batch in (int(b) for b in args.batch.split(",")):
        counter = CostCounter()
        phases = count_step(config, batch, args.context, args.timesteps, fused, vae_dtype, counter)
        cost = phases["model"] + phases["vae"]
        row: dict[str, Any] = {"batch": batch, "fused": fused, **_figures(cost, batch)}
        row.update(
            {f"{phase}_{key}": value for phase in phases for key, value in _figures(phases[phase], batch).items()}
        )
        if ceilings is not None:
            terms = roofline(counter.launches, ceilings)
            row["roofline"] = terms
            row["step_ms"] = sum(term["ms"] for term in terms)
        rows.append(row)
        print(f"batch {batch:4d}  " + "  ".join(_describe(name, phases[name], batch) for name in ("model", "vae")))
        print(f"            {_describe('total', cost, batch)}")
        for name, count in cost.ops.most_common(args.top):
            print(f"    {count:6d}  {cost.op_bytes[name] / 1e6:10.1f} MB  {name}")
        for phase in ("model", "vae") if args.breakdown else ():
            print(f"  {phase}: non-matmul MB/row by op")
            for name, moved in phases[phase].non_matmul_op_bytes().most_common(args.breakdown):
                print(f"    {phases[phase].ops[name]:6d}  {moved / batch / 1e6:8.2f} MB/row  {name}")
        if ceilings is not None:
            print_roofline(batch, row["roofline"], row["step_ms"])
    if ceilings is not None:
        first_step = next((row["step_ms"] for row in rows if row["batch"] == 1), None)
        if first_step is None:
            first_step = sum(term["ms"] for term in roofline(_step_launches(config, args, vae_dtype), ceilings))
        prefill = prefill_ms(count_prefill(config, args.prompt_tokens, vae_dtype), ceilings)
        ttfa = prefill + first_step + ceilings.ttfa_allowance_seconds * 1e3
        summary = {"prefill_ms": prefill, "first_step_ms": first_step, "ttfa_ms": ttfa}
        print(
            f"single stream: time to first audio {ttfa:.2f} ms = prefill {prefill:.2f} ms (eager, "
            f"{args.prompt_tokens} tokens) + first step {first_step:.2f} ms (batch 1) + allowance "
            f"{ceilings.ttfa_allowance_seconds * 1e3:.2f} ms"
        )
    if args.json is not None:
        document = {"config": args.config, "context": args.context, "vae_dtype": args.vae_dtype, "rows": rows}
        args.json.write_text(json.dumps({**document, **summary}, indent=1))


def _step_launches(config: ModelConfig, args: argparse.Namespace, vae_dtype: torch.dtype) -> list[Launch]:
    counter = CostCounter()
    count_step(config, 1, args.context, args.timesteps, True, vae_dtype, counter)
    return counter.launches


if __name__ == "__main__":
    main()
