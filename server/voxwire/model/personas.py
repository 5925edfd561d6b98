"""Many LoRA personas in one batch: unmerged adapters, stacked per layer, selected per row.

``PersonaBank.attach`` replaces each targeted ``nn.Linear`` of a model by a ``PersonaLinear`` that keeps the
layer's own weight and bias (same state-dict keys) and holds every resident adapter of that layer stacked:
``A`` (slots, r_max, in), ``B`` (slots, out, r_max) and ``scaling`` (slots,), zero-padded to the bank's
``max_rank``. Slot 0 is "no persona" (all zeros), so a row without one adds an exact zero.

Which slot each row uses is a tensor (``PersonaRows.index``), not Python control flow, so a step with any
mix of personas is one static computation (one CUDA graph). A layer called on ``m * B`` rows (LocDiT's
CFG-doubled batch: the conditional rows, then the unconditional ones) sees the batch's index repeated
``m`` times block-wise. With batch-invariant numerics (``kernels.batch_invariant``) the per-row adapters run as
GEMMs over every slot at once, each row's other slots zeroed, so that a row's update does not depend on the
batch (a batched matmul's kernel may).

Residency: ``max_personas`` adapters live in device slots; more are registered on the host. ``acquire``
puts a persona in a slot (evicting the least recently used one that no running request holds) and counts
its users; ``release`` drops the count. A persona that is in use is never evicted or replaced.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from voxwire.errors import InvalidInputError
from voxwire.kernels import batch_invariant
from voxwire.model.lora import LoRAAdapter, target_layers


class PersonaError(InvalidInputError):
    """A persona is unknown, all device slots are held by running requests, or an adapter does not fit."""


@dataclass
class PersonaRows:
    """The per-row slot index the wrapped layers read: set before every model call that should apply
    adapters; ``None`` means no row has a persona (the layers then compute the plain linear)."""

    index: torch.Tensor | None = None


class PersonaLinear(nn.Linear):
    """``nn.Linear`` plus per-row stacked adapters, in the reference's order of operations:
    ``linear(x, W, b) + linear(linear(x, A), B) * scaling``."""

    def __init__(self, base: nn.Linear, slots: int, max_rank: int, rows: PersonaRows) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.rows = rows
        like = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.register_buffer("lora_A", torch.zeros(slots, max_rank, self.in_features, **like), persistent=False)
        self.register_buffer("lora_B", torch.zeros(slots, self.out_features, max_rank, **like), persistent=False)
        self.register_buffer("scaling", torch.zeros(slots, **like), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = F.linear(x, self.weight, self.bias)
        index = self.rows.index
        if index is None:
            return result
        rows = x.size(0)
        if rows % index.numel():
            raise ValueError(f"{rows} rows cannot follow a persona index of {index.numel()} rows")
        index = index.repeat(rows // index.numel())
        flat = x.reshape(rows, -1, self.in_features)
        if batch_invariant.active():
            update = self._update_of_every_slot(flat, index).view(result.shape)
        else:
            low = torch.bmm(flat, self.lora_A[index].transpose(1, 2))
            update = torch.bmm(low, self.lora_B[index].transpose(1, 2)).view(result.shape)
        return result + update * self.scaling[index].view(rows, *(1,) * (x.dim() - 1))

    def _update_of_every_slot(self, flat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """flat (rows, T, in) -> each row's ``B (A x)`` of its own slot (rows, T, out), from row-tiled GEMMs only:
        x times every slot's A, the other slots' part zeroed, times every slot's B side by side."""
        slots, rank, _ = self.lora_A.shape
        low = batch_invariant.linear(flat, self.lora_A.reshape(slots * rank, self.in_features))
        own = (index[:, None] == torch.arange(slots, device=index.device)).to(low.dtype)  # (rows, slots)
        low = (low.view(*flat.shape[:2], slots, rank) * own[:, None, :, None]).flatten(2)
        return batch_invariant.linear(low, self.lora_B.permute(1, 0, 2).reshape(self.out_features, slots * rank))

    def set_slot(self, slot: int, a: torch.Tensor | None, b: torch.Tensor | None, scaling: float) -> None:
        """Write one adapter (or zeros when ``a``/``b`` are None: this persona does not target the layer)."""
        self.lora_A[slot].zero_()
        self.lora_B[slot].zero_()
        if a is None or b is None:
            self.scaling[slot] = 0.0
            return
        rank = a.size(0)
        self.lora_A[slot, :rank].copy_(a)
        self.lora_B[slot, :, :rank].copy_(b)
        # The reference casts its scaling buffer with the model, so it is rounded to the model dtype too.
        self.scaling[slot] = scaling


P = ParamSpec("P")
R = TypeVar("R")


def _locked(method: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with args[0].lock:  # type: ignore[attr-defined]
            return method(*args, **kwargs)

    return wrapper


@dataclass
class _Resident:
    slot: int
    users: int = 0


@dataclass
class PersonaBank:
    """Registered personas (host), the resident ones (device slots), and the model's wrapped layers."""

    model: nn.Module
    max_personas: int
    max_rank: int
    rows: PersonaRows = field(default_factory=PersonaRows)
    layers: dict[str, PersonaLinear] = field(default_factory=dict)
    adapters: dict[str, LoRAAdapter] = field(default_factory=dict)
    resident: OrderedDict[str, _Resident] = field(default_factory=OrderedDict)  # least recently used first
    lock: threading.RLock = field(default_factory=threading.RLock)
    """Held by every method that changes the bank, and by an engine runner for a whole step."""

    def __post_init__(self) -> None:
        if self.max_personas < 1 or self.max_rank < 1:
            raise ValueError(f"max_personas={self.max_personas} and max_rank={self.max_rank} must be >= 1")

    @property
    def generation(self) -> int:
        """Changes when layers are wrapped (captured CUDA graphs of the model must then be re-captured)."""
        return len(self.layers)

    @_locked
    def register(self, name: str, adapter: LoRAAdapter) -> None:
        """Make ``name`` available. Replacing a registered persona is refused while it is in use."""
        if adapter.rank > self.max_rank:
            raise PersonaError(f"persona {name!r} has rank {adapter.rank}, above max_rank={self.max_rank}")
        current = self.resident.get(name)
        if current is not None and current.users:
            raise PersonaError(f"persona {name!r} is in use by {current.users} request(s); remove it later")
        self._wrap(adapter)
        self.adapters[name] = adapter
        if current is not None:
            self._write(current.slot, adapter)

    @_locked
    def remove(self, name: str) -> None:
        """Forget ``name``; requests already holding it keep its slot until they release it."""
        if self.adapters.pop(name, None) is None:
            raise PersonaError(f"unknown persona {name!r}")
        held = self.resident.get(name)
        if held is not None and not held.users:
            self._clear(self.resident.pop(name).slot)

    @_locked
    def acquire(self, name: str) -> int:
        """The device slot of ``name`` (loading it, evicting an unused one if needed); counts one user."""
        adapter = self.adapters.get(name)
        if adapter is None:
            raise PersonaError(f"unknown persona {name!r}")
        held = self.resident.get(name)
        if held is None:
            held = _Resident(self._free_slot())
            self._write(held.slot, adapter)
            self.resident[name] = held
        self.resident.move_to_end(name)
        held.users += 1
        return held.slot

    @_locked
    def release(self, name: str) -> None:
        held = self.resident[name]
        held.users -= 1
        if not held.users and name not in self.adapters:  # removed while in use: free it now
            self._clear(self.resident.pop(name).slot)

    def users(self, name: str) -> int:
        held = self.resident.get(name)
        return held.users if held is not None else 0

    def _free_slot(self) -> int:
        taken = {held.slot for held in self.resident.values()}
        free = [slot for slot in range(1, self.max_personas + 1) if slot not in taken]
        if free:
            return free[0]
        for name, held in self.resident.items():
            if not held.users:
                del self.resident[name]
                return held.slot
        raise PersonaError(f"all {self.max_personas} persona slots are in use by running requests; retry later")

    def _wrap(self, adapter: LoRAAdapter) -> None:
        for path, linear in target_layers(self.model, adapter.config).items():
            if isinstance(linear, PersonaLinear):
                continue
            parent, _, attribute = path.rpartition(".")
            wrapped = PersonaLinear(linear, self.max_personas + 1, self.max_rank, self.rows)
            setattr(self.model.get_submodule(parent) if parent else self.model, attribute, wrapped)
            self.layers[path] = wrapped
            for name, held in self.resident.items():  # the new layer's slots for personas already resident
                self._write_layer(wrapped, path, held.slot, self.adapters.get(name))

    def _write(self, slot: int, adapter: LoRAAdapter) -> None:
        for path, layer in self.layers.items():
            self._write_layer(layer, path, slot, adapter)

    @staticmethod
    def _write_layer(layer: PersonaLinear, path: str, slot: int, adapter: LoRAAdapter | None) -> None:
        pair = adapter.weights.get(path) if adapter is not None else None
        scaling = adapter.config.scaling if adapter is not None else 0.0
        with torch.no_grad():
            layer.set_slot(slot, *(pair if pair is not None else (None, None)), scaling)

    def _clear(self, slot: int) -> None:
        for layer in self.layers.values():
            with torch.no_grad():
                layer.set_slot(slot, None, None, 0.0)
