"""A ``ModelRunner``'s KV block pool, and how big it is.

The pool is one block id space over three device tensors: the base LM's and the residual LM's keys and values
(``KVCache``), and one noise patch per position (the runner draws a request's noise at prefill and stores each
patch at the position whose step reads it). Sessions share the pool by the positions they reach, so it is sized
by memory, not by sessions x max_length (``RunnerOptions.kv_cache_bytes``, ``--kv-cache-gb``), or by default
(``default_kv_bytes``):

* on CUDA, what is free after the weights and the largest step's activations, times ``gpu_memory_utilization``.
  The largest step (every slot, the most timesteps) runs once on a minimal pool and its peak is measured, so the
  activations, and the graphs' memory pool that the largest step bounds, are taken out of the free memory first;
* on other devices, room for every slot at its longest (the dense equivalent).

``bytes_per_position`` and ``bytes_per_slot`` are what capacity planning reads (docs/architecture.md).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch

from voxwire import devices
from voxwire.model.kv_cache import KVCache
from voxwire.model.loaded import LoadedModel


def bytes_per_position(tts: LoadedModel) -> int:
    """Pool memory one position of one session takes: both LMs' keys and values, and a noise value."""
    config, dtype = tts.config, tts.dtype
    element = torch.empty((), dtype=dtype).element_size()
    kv = sum(KVCache.bytes_per_position(lm, dtype) for lm in (config.lm_config, config.residual_lm))
    return kv + config.feat_dim * config.patch_size * element


def bytes_per_slot(tts: LoadedModel) -> int:
    """Memory one batch row holds outside the block pool: decode state, VAE state, table and settings."""
    config, dtype = tts.config, tts.dtype
    element = torch.empty((), dtype=dtype).element_size()
    state = (2 * config.lm_config.hidden_size + config.patch_size * config.feat_dim) * element + 8
    with torch.inference_mode():
        vae = tts.vae_decoder.new_state(1).nbytes_per_stream
    return state + vae


@dataclass(frozen=True, eq=False)
class KVPool:
    """The block pool's device tensors: ``noise`` is (num_blocks * block_size, feat_dim, patch_size)."""

    base: KVCache
    residual: KVCache
    noise: torch.Tensor

    @classmethod
    def allocate(cls, tts: LoadedModel, kv_cache_bytes: int, block_size: int) -> KVPool:
        """As many blocks of ``block_size`` positions as ``kv_cache_bytes`` holds, on the model's device.

        Raises:
            ValueError: fewer than two blocks (block 0 is the null block, so one would hold no session).
        """
        per_block = block_size * bytes_per_position(tts)
        num_blocks = kv_cache_bytes // per_block
        if num_blocks < 2:
            raise ValueError(
                f"a KV cache of {kv_cache_bytes} bytes holds no session: one block of {block_size} positions "
                f"takes {per_block} bytes and one more is reserved (raise --kv-cache-gb)"
            )
        config, device, dtype = tts.config, tts.device, tts.dtype
        return cls(
            KVCache(config.lm_config, num_blocks, block_size, device, dtype),
            KVCache(config.residual_lm, num_blocks, block_size, device, dtype),
            torch.zeros(num_blocks * block_size, config.feat_dim, config.patch_size, device=device, dtype=dtype),
        )

    @property
    def num_blocks(self) -> int:
        return self.base.num_blocks


def default_kv_bytes(
    tts: LoadedModel,
    block_size: int,
    slot_blocks: int,
    utilization: float,
    cuda: torch.device | None,
    largest_step: Callable[[KVPool], object],
) -> int:
    """The pool's size when none is given (see the module docstring).

    Args:
        slot_blocks: blocks every slot at its longest takes together (the dense size, without the null block).
        utilization: the fraction of the device's memory the process may use in all.
        cuda: the runner's CUDA device (None: not CUDA, the dense size).
        largest_step: runs the runner's largest step on the pool it is given and keeps no reference to it.

    Raises:
        ValueError: on CUDA, no memory left for even a minimal pool.
    """
    per_block = block_size * bytes_per_position(tts)
    if cuda is None:
        return per_block * (1 + slot_blocks)
    with devices.scope(cuda):
        pool = KVPool.allocate(tts, 2 * per_block, block_size)
        torch.cuda.synchronize(cuda)
        torch.cuda.reset_peak_memory_stats(cuda)
        before = torch.cuda.memory_allocated(cuda)
        largest_step(pool)
        torch.cuda.synchronize(cuda)
        activations = torch.cuda.max_memory_allocated(cuda) - before
        del pool
        # Runners dropped but not yet collected (a reference cycle somewhere) still hold their KV pools:
        # free them before reading what is free, or this pool is sized around them.
        gc.collect()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(cuda)
    budget = int(free - (1 - utilization) * total) - 2 * activations
    if budget < 2 * per_block:
        raise ValueError(
            f"no device memory left for the KV cache ({free} bytes free, {activations} needed for activations): "
            "lower --max-sessions or raise --gpu-memory-utilization"
        )
    return budget
