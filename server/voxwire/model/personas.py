"""Many LoRA personas in one batch: unmerged adapters, stacked per layer, selected per row.

``PersonaBank`` replaces each targeted ``nn.Linear`` of a model by a ``PersonaLinear`` that keeps the
layer's own weight and bias (same state-dict keys) and holds every resident adapter of that layer stacked:
``A`` (slots, r_max, in), ``B`` (slots, out, r_max) and ``scaling`` (slots,), zero-padded to the bank's
``max_rank``. Slot 0 is "no persona" (all zeros), so a row without one adds an exact zero.

Which slot each row uses is a tensor (``PersonaRows.index``), not Python control flow, so a step with any
mix of personas is one static computation (one CUDA graph). A layer called on ``m * B`` rows (LocDiT's
CFG-doubled batch: the conditional rows, then the unconditional ones) sees the batch's index repeated
``m`` times block-wise. Each row's adapter is *selected* (gathered by its slot), never computed for every slot
and masked: a resident adapter holding NaN would turn a mask's zeros into NaN (0 x NaN = NaN) in every row.
With batch-invariant numerics (``kernels.batch_invariant``) the adapters run as row-tiled GEMMs over every
slot at once (a batched matmul's kernel may depend on the batch), and each row's own slot's part is gathered
from their outputs.

Adapters are graph inputs: the slot buffers of a layer are allocated once, when it is wrapped, and a persona
is loaded, swapped or removed by copying into them in place. ``reserve`` wraps the layers personas may adapt
before graphs are captured, and ``seal`` fixes that set: afterwards an adapter of any other layer is refused
(``UnreservedLayersError``) instead of changing the model under its captured graphs.

Unwrapping: once no persona needs a wrapped layer any more (none registered adapts it, and no request still
holds a removed one that does), the layer gets its plain ``nn.Linear`` back, so a model whose personas are all
gone computes exactly what it did before it had any. Only while the bank is not sealed, and never for layers
``reserve`` asked for: a sealed bank's layers are in captured graphs (which replay their slot buffers whatever
the module tree says) and could not be wrapped again, so there removal only zeroes the slot (an exact zero).

Residency: ``max_personas`` adapters live in device slots; more are registered on the host. ``acquire``
puts a persona in a slot (evicting the least recently used one that no running request holds) and counts
its users; ``release`` drops the count. A persona that is in use is never evicted or replaced. ``max_personas`` is
the capacity an engine's scheduler admits persona requests by (``engine.scheduler``, rules P1-P4), so a request
waits in its queue for a slot rather than reach ``acquire`` with every slot held (which is refused, a guard).
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
from voxwire.model.lora import LoRAAdapter, LoRAConfig, target_layers


class PersonaError(InvalidInputError):
    """A persona is unknown, all device slots are held by running requests, or an adapter does not fit."""


class UnreservedLayersError(PersonaError):
    """An adapter targets layers a sealed bank did not reserve (captured CUDA graphs do not contain them)."""


class PersonaInUseError(PersonaError):
    """Running requests still hold a persona of this name (removed, or about to be replaced)."""


class RankTooLargeError(PersonaError):
    """An adapter's rank is above the bank's ``max_rank``."""


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
        dtype, device = base.weight.dtype, base.weight.device
        self.lora_A: torch.Tensor
        self.lora_B: torch.Tensor
        self.scaling: torch.Tensor
        a = torch.zeros(slots, max_rank, self.in_features, dtype=dtype, device=device)
        self.register_buffer("lora_A", a, persistent=False)
        b = torch.zeros(slots, self.out_features, max_rank, dtype=dtype, device=device)
        self.register_buffer("lora_B", b, persistent=False)
        self.register_buffer("scaling", torch.zeros(slots, dtype=dtype, device=device), persistent=False)

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
            update = self._update_of_own_slot(flat, index).view(result.shape)
        else:  # gathered: each row reads its own slot's A and B only
            low = torch.bmm(flat, self.lora_A[index].transpose(1, 2))
            update = torch.bmm(low, self.lora_B[index].transpose(1, 2)).view(result.shape)
        return result + update * self.scaling[index].view(rows, *(1,) * (x.dim() - 1))

    def _update_of_own_slot(self, flat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """flat (rows, T, in) -> each row's ``B (A x)`` of its own slot (rows, T, out), from row-tiled GEMMs only:
        x times every slot's A, the row's own slot's part gathered, times every slot's B side by side, the row's
        own slot's part gathered. No other slot's values enter a row's result."""
        slots, rank, _ = self.lora_A.shape
        rows, tokens = flat.shape[:2]
        low = batch_invariant.linear(flat, self.lora_A.reshape(slots * rank, self.in_features))
        own = index.view(rows, 1, 1, 1)
        low = low.view(rows, tokens, slots, rank).gather(2, own.expand(rows, tokens, 1, rank)).squeeze(2)
        wide = batch_invariant.linear(low, self.lora_B.reshape(slots * self.out_features, rank))
        wide = wide.view(rows, tokens, slots, self.out_features)
        return wide.gather(2, own.expand(rows, tokens, 1, self.out_features)).squeeze(2)

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
        with args[0].lock:  # type: ignore[attr-defined]  # args[0] is the PersonaBank the method is of
            return method(*args, **kwargs)

    return wrapper


@dataclass
class _Resident:
    slot: int
    layers: frozenset[str]
    """The layers its adapter adapts (kept until its slot is freed, also after its persona is removed)."""
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
    sealed: bool = False
    """The adapted layers are fixed (``seal``): only their slot buffers' contents change from now on."""
    reserved: set[str] = field(default_factory=set)
    """Layers ``reserve`` adapted: they stay adapted with no persona on them."""
    originals: dict[str, nn.Linear] = field(default_factory=dict)
    """Each wrapped layer's own ``nn.Linear``, given back when no persona needs the layer (``_unwrap_unused``)."""

    def __post_init__(self) -> None:
        if self.max_personas < 1 or self.max_rank < 1:
            raise ValueError(f"max_personas={self.max_personas} and max_rank={self.max_rank} must be >= 1")

    @_locked
    def reserve(self, config: LoRAConfig) -> None:
        """Adapt now every layer ``config`` targets (its slot buffers, all zeros until a persona is loaded).

        Raises:
            UnreservedLayersError: the bank is sealed and some of them are not adapted yet."""
        layers = target_layers(self.model, config)
        self._check_reserved("these targets", layers)
        self._wrap(layers)
        self.reserved.update(layers)

    @_locked
    def seal(self) -> None:
        """Fix the adapted layers (graphs are captured over them): later adapters may only target these."""
        self.sealed = True

    @_locked
    def register(self, name: str, adapter: LoRAAdapter) -> None:
        """Make ``name`` available. Replacing a registered persona is refused while it is in use.

        Raises:
            RankTooLargeError: its rank is above ``max_rank``.
            PersonaInUseError: running requests hold a persona of this name.
            UnreservedLayersError: the bank is sealed and the adapter targets a layer it did not reserve."""
        if adapter.rank > self.max_rank:
            raise RankTooLargeError(f"persona {name!r} has rank {adapter.rank}, above max_rank={self.max_rank}")
        layers = target_layers(self.model, adapter.config)
        self._check_reserved(f"persona {name!r}", layers)
        current = self.resident.get(name)
        if current is not None and current.users:
            raise PersonaInUseError(f"persona {name!r} is in use by {current.users} request(s); retry later")
        self._wrap(layers)
        self.adapters[name] = adapter
        if current is not None:
            current.layers = frozenset(layers)
            self._write(current.slot, adapter)

    @_locked
    def remove(self, name: str) -> None:
        """Forget ``name``; requests already holding it keep its slot until they release it. Layers no persona
        needs any more are unwrapped (unless sealed or reserved)."""
        if self.adapters.pop(name, None) is None:
            raise PersonaError(f"unknown persona {name!r}")
        held = self.resident.get(name)
        if held is not None and not held.users:
            self._clear(self.resident.pop(name).slot)
        self._unwrap_unused()

    @_locked
    def acquire(self, name: str) -> int:
        """The device slot of ``name`` (loading it, evicting an unused one if needed); counts one user."""
        adapter = self.adapters.get(name)
        if adapter is None:
            raise PersonaError(f"unknown persona {name!r}")
        held = self.resident.get(name)
        if held is None:
            held = _Resident(self._free_slot(), frozenset(target_layers(self.model, adapter.config)))
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
            self._unwrap_unused()

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

    def _check_reserved(self, what: str, layers: dict[str, nn.Linear]) -> None:
        unreserved = sorted(path for path in layers if path not in self.layers)
        if self.sealed and unreserved:
            shown = ", ".join(unreserved[:4]) + (f" and {len(unreserved) - 4} more" if len(unreserved) > 4 else "")
            raise UnreservedLayersError(
                f"{what} adapts layers this model did not reserve before serving ({shown}); "
                "load a persona adapting them at start-up"
            )

    def _wrap(self, layers: dict[str, nn.Linear]) -> None:
        for path, linear in layers.items():
            if isinstance(linear, PersonaLinear):
                continue
            parent, _, attribute = path.rpartition(".")
            wrapped = PersonaLinear(linear, self.max_personas + 1, self.max_rank, self.rows)
            setattr(self.model.get_submodule(parent) if parent else self.model, attribute, wrapped)
            self.layers[path] = wrapped
            self.originals[path] = linear
            for name, held in self.resident.items():  # the new layer's slots for personas already resident
                self._write_layer(wrapped, path, held.slot, self.adapters.get(name))

    def _unwrap_unused(self) -> None:
        """Give their own ``nn.Linear`` back to the wrapped layers no persona needs (none registered adapts them,
        no slot still held holds one that does) and ``reserve`` did not ask for; never once sealed (graphs were
        captured over them, and a sealed bank could not wrap them again)."""
        if self.sealed:
            return
        needed = set(self.reserved)
        for adapter in self.adapters.values():
            needed.update(target_layers(self.model, adapter.config))
        for held in self.resident.values():
            needed.update(held.layers)
        for path in [path for path in self.layers if path not in needed]:
            wrapped, original = self.layers.pop(path), self.originals.pop(path)
            original.weight, original.bias = wrapped.weight, wrapped.bias  # the same tensors, cast or moved since
            parent, _, attribute = path.rpartition(".")
            setattr(self.model.get_submodule(parent) if parent else self.model, attribute, original)

    def _write(self, slot: int, adapter: LoRAAdapter) -> None:
        for path, layer in self.layers.items():
            self._write_layer(layer, path, slot, adapter)

    @staticmethod
    def _write_layer(layer: PersonaLinear, path: str, slot: int, adapter: LoRAAdapter | None) -> None:
        pair = adapter.weights.get(path) if adapter is not None else None
        scaling = adapter.config.scaling if adapter is not None else 0.0
        a, b = pair if pair is not None else (None, None)
        with torch.no_grad():
            layer.set_slot(slot, a, b, scaling)

    def _clear(self, slot: int) -> None:
        for layer in self.layers.values():
            with torch.no_grad():
                layer.set_slot(slot, None, None, 0.0)
