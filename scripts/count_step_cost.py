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
of ``voxwire.kernels.ops`` (one Triton launch each), and the VAE in float16 (``--vae-dtype float16``; bf16 moves
the same bytes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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

from voxwire.config import ModelConfig
from voxwire.kernels import ops
from voxwire.model import minicpm
from voxwire.model.audio_vae import StreamingVAEDecoder
from voxwire.model.cfm import CfmSchedule
from voxwire.model.kv_cache import KVCache
from voxwire.model.voxcpm import DecodeState, VoxCPMModel
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


class CostCounter(TorchDispatchMode):
    """Counts every launching aten op (and custom op) that reaches the dispatcher, per phase of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.costs: dict[str, StepCost] = {}
        self.phase = "model"

    def record(self, name: str, moved: int, matmul: bool) -> None:
        cost = self.costs.setdefault(self.phase, StepCost())
        cost.kernels += 1
        cost.bytes += moved
        if matmul:
            cost.matmul_bytes += moved
            cost.matmul_ops.add(name)
        cost.ops[name] += 1
        cost.op_bytes[name] += moved

    def __torch_dispatch__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name not in _NO_LAUNCH:
            moved = _moved_bytes(name, args, kwargs, out)
            self.record(f"{func.__module__.split('.')[-1]}.{name}", moved, name in _MATMUL)
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
        query, value = args[0], args[2]
        batch, heads, length, _ = query.shape
        # Flash kernels write (B, T, H, D) and return it transposed, so the caller's transpose back is free.
        out = query.new_empty(batch, length, heads, value.size(-1)).transpose(1, 2)
        self.counter.record("attention", _tensor_bytes((args, kwargs)) + _tensor_bytes(out), matmul=True)
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
        counter.record("paged_decode_attention", moved, matmul=True)
        return out

    original = minicpm.decode_attention
    minicpm.decode_attention = one_kernel
    try:
        yield
    finally:
        minicpm.decode_attention = original


def count_step(config: ModelConfig, batch: int, context: int, timesteps: int, fused: bool) -> dict[str, StepCost]:
    """The cost of one decode step of ``batch`` rows at ``context`` cached positions each, for its two
    phases: ``model`` (the decode step) and ``vae`` (the streaming decode of the new patch)."""
    dtype = torch.bfloat16
    device = torch.device("meta")
    with device:
        model = VoxCPMModel(config)
    model.cast_transformers(dtype)
    if fused:
        model.fuse_projections()
        model.audio_vae.to(torch.float16)
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
    counter = CostCounter()
    with ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(ops.fused_on_meta(fused))
        if fused:
            stack.enter_context(paged_kernel_decode(counter))
        stack.enter_context(counter)
        stack.enter_context(AttentionAsOneKernel(counter))
        patch, _ = model.decode_step(state, base, residual, noise, cfg, schedule)
        counter.phase = "vae"
        vae.decode(patch.float().transpose(1, 2), vae_state)  # as the runner calls it
    return counter.costs


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
    parser.add_argument("--top", type=int, default=0, help="also print the N most frequent ops and their bytes")
    parser.add_argument(
        "--breakdown", type=int, default=0, help="also print, per phase, the N ops that move the most non-matmul bytes"
    )
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    args = parser.parse_args()
    config = ModelConfig.from_dict(ALL_CONFIGS[args.config], source=args.config)
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        phases = count_step(config, batch, args.context, args.timesteps, args.fused)
        cost = phases["model"] + phases["vae"]
        row: dict[str, Any] = {"batch": batch, "fused": args.fused, **_figures(cost, batch)}
        row.update(
            {f"{phase}_{key}": value for phase in phases for key, value in _figures(phases[phase], batch).items()}
        )
        rows.append(row)
        print(f"batch {batch:4d}  " + "  ".join(_describe(name, phases[name], batch) for name in ("model", "vae")))
        print(f"            {_describe('total', cost, batch)}")
        for name, count in cost.ops.most_common(args.top):
            print(f"    {count:6d}  {cost.op_bytes[name] / 1e6:10.1f} MB  {name}")
        for phase in ("model", "vae") if args.breakdown else ():
            print(f"  {phase}: non-matmul MB/row by op")
            for name, moved in phases[phase].non_matmul_op_bytes().most_common(args.breakdown):
                print(f"    {phases[phase].ops[name]:6d}  {moved / batch / 1e6:8.2f} MB/row  {name}")
    if args.json is not None:
        args.json.write_text(json.dumps({"config": args.config, "context": args.context, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
