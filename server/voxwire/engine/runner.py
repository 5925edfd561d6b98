"""``ModelRunner``: the engine's ``Runner`` over a loaded VoxCPM model; the only engine module that
touches torch devices.

State it owns, all preallocated on the model's device:

* the KV block pool (``engine.kv_pool``: ``KVCache`` for the base LM and for the residual LM, one block id
  space), sized by memory (``RunnerOptions.kv_cache_bytes``), not by sessions x max_length. Each block also
  holds one noise patch per position (see below);
* per slot (``num_slots`` rows plus one padding row): decode state, streaming-VAE state, block table,
  guidance strength and CFM timestep count.

A step decodes the plan's ``decode_slots``, any subset of occupied slots: their rows are gathered
into a batch (padded to a bucket size with the padding row), the model runs on the batch, and the
rows are scattered back. The KV is not gathered: attention reads each row's blocks in place, only
up to the row's length (``model.paged_attention``).

The seed contract without per-step generator calls: at prefill a request's whole noise stream (one
patch per step it may take, ``NoiseStream.take``) is drawn once and stored in its KV blocks, at the
position each step writes; the step gathers every row's noise by its position on the device.

LoRA personas: each request's persona gets a slot of the model's ``PersonaBank`` at prefill (released
with the request; the scheduler admits it only when its persona can have one, from ``persona_slots``), kept in a
per-slot table like the guidance strength; the step gathers the batch's
persona slots on the device and the adapted layers pick each row's adapter by them (``_Personas``). The
adapters are graph inputs: capturing seals the bank's layers, and loading a persona later only copies its
weights into their slot buffers, so nothing is captured again.

A row whose audio or patch is not finite (NaN or infinity: a broken persona, say) ends at once with an error
(``RunnerOutput.errors``) instead of speaking silence up to its length cap; other rows never see its values.

CFM time grids come from a device table indexed by each row's timestep count. A step's rows run in groups by
timestep bucket (``engine.timestep_buckets``), one sub-step per group, so a row asking for 50 timesteps costs 50
for itself, not for every row of the step; within a group rows with fewer timesteps are masked
(``CfmSchedule.ragged``). The real-time policy costs each row by its bucket (``row_weight``, measured with the step
cost by ``engine.calibration``, which times this runner's steps before it serves).

Batch-invariant numerics (``batch_invariant=True``, off by default: it costs speed): every model call runs
within ``kernels.batch_invariant``, whose GEMMs, convolutions and decode attention give each row the same bits
in any batch, and prompts are prefilled one at a time, so a session's audio is bit for bit what it is alone.

Per step (per timestep bucket of its rows) the host uploads one small array (the batch's slot indices) and reads
one array back (stop flags, audio and patches of every row together) into a host buffer that is reused once no
chunk views it; an admission step uploads each prefill's inputs, and the admitted rows' settings, in one copy
each (``voxwire.devices``). Every call runs with the runner's CUDA device current (``--devices cuda:0,cuda:1``).
On CUDA every (bucket, timesteps) step is captured as a CUDA graph at construction (``cuda_graphs.StepGraphs``),
before the server reports ready; on CPU the same step runs eagerly and reads only the live blocks of the batch's
longest row.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

import numpy as np
import torch

from voxwire import devices
from voxwire.chunk import EMPTY_AUDIO
from voxwire.engine import calibration
from voxwire.engine.blocks import blocks_for
from voxwire.engine.cost_model import StepCost
from voxwire.engine.cuda_graphs import StepGraphs, bucket_sizes
from voxwire.engine.engine_config import RunnerOptions
from voxwire.engine.kv_pool import KVPool, default_kv_bytes
from voxwire.engine.outputs import PrefillItem, RunnerOutput, StepPlan
from voxwire.engine.request import Prepared, Request
from voxwire.engine.timestep_buckets import bucket_of, timestep_buckets
from voxwire.engine.voice_cache import VoiceCache
from voxwire.errors import InvalidInputError
from voxwire.kernels.batch_invariant import batch_invariant as invariant_numerics
from voxwire.model.audio_vae import VAEStreamState
from voxwire.model.cfm import CfmSchedule
from voxwire.model.kv_cache import NULL_BLOCK
from voxwire.model.loaded import LoadedModel
from voxwire.model.personas import PersonaBank, PersonaError
from voxwire.model.voxcpm import DecodeState, PrefillBatch
from voxwire.prompt import VoicePrompt
from voxwire.sampling import NoiseStream, random_seed
from voxwire.sequence import InputSequence, PromptLayout, lay_out, sequence_length_cap
from voxwire.startup import Readiness, enter

NON_FINITE_OUTPUT = "the model produced NaN or infinite values for this request (a broken persona or voice?)"

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _on_device(method: Callable[Concatenate[ModelRunner, _P], _R]) -> Callable[Concatenate[ModelRunner, _P], _R]:
    """Run the method with the runner's CUDA device current in the calling thread (``voxwire.devices``): the
    engine thread, and every thread that calls in, starts on cuda:0."""

    @functools.wraps(method)
    def on_device(self: ModelRunner, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with devices.scope(self.cuda):
            return method(self, *args, **kwargs)

    return on_device


class _Personas:
    """The runner's side of LoRA personas: which bank slot each request holds, and the per-slot table of
    bank slots the step gathers (0: no adapter; padding rows stay 0)."""

    def __init__(self, tts: LoadedModel, rows: int) -> None:
        self.tts = tts
        self.table = torch.zeros(rows, dtype=torch.long, device=tts.device)
        self.held: dict[str, str] = {}  # request id -> persona name
        self.captured_layers: int | None = None
        """Adapted layers the captured graphs contain (None: no graphs captured)."""

    @property
    def bank(self) -> PersonaBank | None:
        """The model's bank, read each time: personas may be enabled after the runner was made."""
        return self.tts.personas

    @property
    def active(self) -> bool:
        """Adapted layers exist: every model call must say which adapter slot each row uses."""
        bank = self.bank
        return bank is not None and bool(bank.layers)

    @property
    def slots(self) -> int | None:
        """Personas the bank holds on the device at once; None without a bank."""
        bank = self.bank
        return None if bank is None else bank.max_personas

    def acquire(self, request_id: str, persona: str | None) -> int:
        """The bank slot of the request's persona (0 for none), held until ``release``."""
        if persona is None:
            return 0
        bank = self.bank
        if bank is None:
            raise PersonaError(f"unknown persona {persona!r}: this model has no personas loaded")
        if self.captured_layers is not None and len(bank.layers) != self.captured_layers:
            raise PersonaError(f"persona {persona!r} adapts layers added after this engine captured its CUDA graphs")
        slot = bank.acquire(persona)
        self.held[request_id] = persona
        return slot

    def release(self, request_ids: tuple[str, ...]) -> None:
        bank = self.bank
        for request_id in request_ids:
            persona = self.held.pop(request_id, None)
            if persona is not None and bank is not None:
                bank.release(persona)

    def select(self, slots: torch.Tensor) -> None:
        """Point the adapted layers at the bank slots of these rows (device-side, so graph-safe)."""
        if self.active:
            self.bank.rows.index = slots  # type: ignore[union-attr]  # active: the bank exists

    def seal(self) -> None:
        """Graphs are captured now: fix the adapted layers they will contain."""
        bank = self.bank
        if bank is not None:
            bank.seal()
        self.captured_layers = len(bank.layers) if bank is not None else 0


class ModelRunner:
    """Runs ``StepPlan``s on a model. Not thread-safe: the engine thread is its only caller."""

    def __init__(self, tts: LoadedModel, options: RunnerOptions) -> None:
        """Allocates every buffer (the KV pool sized by ``options``), captures the step graphs on CUDA and, with
        ``options.measure_cost``, measures the step cost: all before the first step."""
        config = tts.config
        num_slots, block_size = options.num_slots, options.block_size
        self.tts = tts
        self.cuda = devices.cuda_device(tts.device)  # the device of every device-wide call (None: not CUDA)
        self.block_size = block_size
        self.batch_invariant = options.batch_invariant
        self.max_length = min(options.max_length or config.max_length, config.max_length)
        self.pad_slot = num_slots  # the extra row padding rows gather from and scatter to
        device, dtype = tts.device, tts.dtype
        rows = num_slots + 1
        hidden = config.lm_config.hidden_size
        self.state = DecodeState(
            lm_hidden=torch.zeros(rows, hidden, device=device, dtype=dtype),
            residual_hidden=torch.zeros(rows, hidden, device=device, dtype=dtype),
            cond=torch.zeros(rows, config.patch_size, config.feat_dim, device=device, dtype=dtype),
            positions=torch.zeros(rows, dtype=torch.long, device=device),
        )
        with torch.inference_mode():
            self.vae_state = tts.vae_decoder.new_state(rows)
        self.table_width = blocks_for(self.max_length, block_size)
        self.block_tables = torch.zeros(rows, self.table_width, dtype=torch.int32, device=device)
        self.cfg = torch.zeros(rows, dtype=torch.float32, device=device)
        self.timesteps = torch.ones(rows, dtype=torch.long, device=device)
        self.personas = _Personas(tts, rows)
        # Host mirrors of what the step's shape depends on: the next position and timesteps per slot.
        self._positions = np.zeros(rows, dtype=np.int64)
        self._timesteps = np.ones(rows, dtype=np.int64)
        self.requests: set[str] = set()  # requests whose state this runner holds
        self.voice_cache = VoiceCache(options.voice_cache_bytes)
        self._build_schedule_tables(options.max_timesteps)
        self.index = torch.full((num_slots,), self.pad_slot, dtype=torch.long, device=device)
        self.max_timesteps = options.max_timesteps
        self.timestep_counts = timestep_buckets(options.max_timesteps, options.graph_timesteps)
        # One staging region per timestep bucket a step may run (each sub-step's upload reads its own, so
        # none is overwritten before its asynchronous copy ran).
        self._index_host = devices.host_buffer((len(self.timestep_counts) * num_slots,), torch.long, self.cuda)
        self._outputs = devices.HostOutputs((num_slots, self.packed_width), torch.float32, self.cuda)
        use_graphs = self.cuda is not None if options.cuda_graphs is None else options.cuda_graphs
        self.graphs = (
            StepGraphs(self._graph_step, bucket_sizes(num_slots), self.timestep_counts, self.cuda)
            if use_graphs
            else None
        )
        kv_cache_bytes = options.kv_cache_bytes
        enter(Readiness.SIZING_KV_POOL, "%d slots of %d positions on %s", num_slots, self.max_length, device)
        if kv_cache_bytes is None:
            slot_blocks = num_slots * self.table_width
            utilization = options.gpu_memory_utilization
            kv_cache_bytes = default_kv_bytes(tts, block_size, slot_blocks, utilization, self.cuda, self._largest_step)
        self.pool = KVPool.allocate(tts, kv_cache_bytes, block_size)
        logger.info("start-up: KV pool of %d blocks (%.1f MB)", self.pool.num_blocks, kv_cache_bytes / 1e6)
        if self.graphs is not None and self.cuda is not None:
            self.capture_graphs()
        self._step_cost: StepCost | None = None
        self._row_weights: dict[int, float] | None = None
        if options.measure_cost:
            self._step_cost, self._row_weights = self.measure_step_cost()

    @_on_device
    @torch.inference_mode()
    def capture_graphs(self) -> None:
        """Capture every step graph now (the constructor does on CUDA, so none is captured while serving)."""
        assert self.graphs is not None, "this runner does not use CUDA graphs"
        self.personas.seal()
        self.index.fill_(self.pad_slot)  # warm-up runs touch only the padding row
        captures, seconds = self.graphs.captures, self.graphs.capture_seconds
        enter(Readiness.CAPTURING_GRAPHS, "%d step graphs", self.graphs.count)
        self.graphs.capture_all()
        logger.info(
            "captured %d CUDA graphs (%d batch sizes x timesteps %s) in %.1f s",
            self.graphs.captures - captures,
            len(self.graphs.buckets),
            "/".join(map(str, self.graphs.timestep_counts)),
            self.graphs.capture_seconds - seconds,
        )

    # ---- step cost: what the real-time policy budgets with (``RealtimeRunner``) ----
    @property
    def step_cost(self) -> StepCost:
        if self._step_cost is None:
            # AttributeError: to ``isinstance(runner, RealtimeRunner)`` this runner then states no cost.
            raise AttributeError("this ModelRunner was built without measure_cost=True: it states no step cost")
        return self._step_cost

    def row_weight(self, timesteps: int) -> float:
        """What a row asking for ``timesteps`` costs, in rows at the default count (``step_cost``'s per-row
        term): its timestep bucket's measured per-row cost over the default's."""
        if self._row_weights is None:
            raise AttributeError("this ModelRunner was built without measure_cost=True: it states no row weights")
        return self._row_weights[int(bucket_of(self.timestep_counts, min(timesteps, self.max_timesteps)))]

    @property
    def chunk_seconds(self) -> float:
        return self.tts.samples_per_patch / self.tts.sample_rate

    @_on_device
    @torch.inference_mode()
    def measure_step_cost(self, repeats: int = 3) -> tuple[StepCost, dict[int, float]]:
        """This runner's step cost and row weights (``calibration.measure_step_cost``). Runs before any request:
        it borrows the calibration slot, the first KV blocks and the padding row (the idle rows), and leaves them
        as a new request expects them."""
        assert not self.requests, "measure the step cost before serving: it uses a slot and the first KV blocks"
        enter(Readiness.FITTING_STEP_COST, "timing decode and admission steps")
        measured = calibration.measure_step_cost(self, repeats)
        self.requests.clear()
        self.voice_cache = VoiceCache(self.voice_cache.capacity_bytes)  # without the calibration's voices
        slot, pad = calibration.CALIBRATION_SLOT, self.pad_slot
        self.block_tables[slot], self._positions[slot] = NULL_BLOCK, 0
        self.timesteps[pad], self._timesteps[pad], self._positions[pad] = 1, 1, 0
        return measured

    # ---- the steps calibration times (``calibration.CalibrationTarget``) ----
    def idle_step(self, rows: int, timesteps: int) -> tuple[int, Callable[[], object]]:
        """The rows a decode step of ``rows`` padding rows really runs (its graph's batch bucket), and that step;
        the padding rows run ``timesteps`` timesteps from now on."""
        pad = self.pad_slot
        self.timesteps[pad], self._timesteps[pad] = timesteps, timesteps
        if self.graphs is not None:
            rows = self.graphs.bucket(rows)
        slots = np.full(rows, pad, dtype=np.int64)
        return rows, lambda: self._run(slots)

    def admission_step(self, item: PrefillItem) -> Callable[[], object]:
        """``item``'s prefill, then its row's first decode step, as the engine runs an admission."""
        row = np.array([item.slot], dtype=np.int64)

        def admit() -> None:
            self._prefill((item,))
            self._run(row)

        return admit

    # ---- sizes ----
    @property
    def num_slots(self) -> int:
        return self.pad_slot

    @property
    def patch_shape(self) -> tuple[int, int]:
        config = self.tts.config
        return config.patch_size, config.feat_dim

    @property
    def persona_slots(self) -> int | None:
        """The bank's device slots for personas (``PersonaRunner``; read each time: personas may be enabled after
        the runner was made). The scheduler admits a persona request only when its persona can have one."""
        return self.personas.slots

    @property
    def num_kv_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def graph_captures(self) -> int:
        return 0 if self.graphs is None else self.graphs.captures

    @property
    def graph_capture_seconds(self) -> float:
        """Wall time spent capturing graphs (warm-up runs included), almost all of it before serving."""
        return 0.0 if self.graphs is None else self.graphs.capture_seconds

    def _largest_step(self, pool: KVPool) -> None:
        """The largest step (every slot at ``max_timesteps``) on ``pool``, keeping no reference to it: the default
        KV size is what is free around this step's activations on a minimal pool (``kv_pool.default_kv_bytes``)."""
        self.pool = pool
        with torch.inference_mode():
            self.index.fill_(self.pad_slot)
            self._graph_step(self.num_slots, self.max_timesteps)
        del self.pool

    def _build_schedule_tables(self, max_timesteps: int) -> None:
        """Row k of each table is the CFM grid of a request with k timesteps (row 0 unused)."""
        device, dtype = self.tts.device, self.tts.dtype
        full = CfmSchedule.build(list(range(1, max_timesteps + 1)), dtype, device)
        self.times_table = torch.cat([torch.zeros_like(full.times[:1]), full.times])
        self.deltas_table = torch.cat([torch.zeros_like(full.deltas[:1]), full.deltas])
        self.zero_init_table = torch.cat([torch.ones_like(full.zero_init[:1]), full.zero_init])

    # ---- admission ----
    def prepare(self, request: Request) -> Prepared:
        """Lay ``request`` out (``sequence.lay_out``: its one tokenization) and cap its length; its prefill reads
        both from the ``Prepared`` (``_Layout``)."""
        try:
            prompt = request.prompt
            if prompt is not None and not isinstance(prompt, VoicePrompt):
                raise InvalidInputError(f"a request's prompt must be a VoicePrompt, got {type(prompt).__name__}")
            steps = request.params.inference_timesteps
            if steps > self.max_timesteps:
                # The CFM grid tables (and the graphs) stop there; the engine's limits should be no higher.
                raise InvalidInputError(
                    f"inference_timesteps={steps} is invalid: the runner holds <= {self.max_timesteps}"
                )
            layout = lay_out(self.tts.tokenizer, self.tts.config, request.text, prompt)
            cap = sequence_length_cap(layout, request.params.max_len, self.max_length)
        except InvalidInputError as exc:
            return Prepared.refused(str(exc))
        return Prepared(layout.length, layout.length + cap, _Layout(layout, cap))

    # ---- plan phases ----
    @_on_device
    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> RunnerOutput:
        bank = self.personas.bank
        if bank is None:
            return self._execute(plan)
        with bank.lock:  # personas are added and removed from other threads between steps
            return self._execute(plan)

    def _execute(self, plan: StepPlan) -> RunnerOutput:
        self.requests.difference_update(plan.released)
        self.personas.release(plan.released)
        if plan.moves:
            self._move([move.src for move in plan.moves], [move.dst for move in plan.moves])
        length_caps, errors = self._prefill(plan.prefills)
        if not plan.request_ids:
            return RunnerOutput(length_caps=length_caps, errors=errors)
        return self._decode(plan, length_caps, errors)

    def _move(self, sources: list[int], targets: list[int]) -> None:
        # In order: a later move may read a row an earlier one wrote.
        for src, dst in zip(sources, targets, strict=True):
            for buffer in (
                *self.state.as_tuple(),
                *self.vae_state.buffers,
                self.block_tables,
                self.cfg,
                self.timesteps,
                self.personas.table,
            ):
                buffer[dst] = buffer[src]
            self._positions[dst], self._timesteps[dst] = self._positions[src], self._timesteps[src]

    def _prefill(self, items: tuple[PrefillItem, ...]) -> tuple[dict[str, int], dict[str, str]]:
        """Prefill every admitted request straight into its blocks, in one right-padded batch (one at a time with
        batch-invariant numerics: the padded length would change every shape); a bad request fails alone (its
        slot gets no blocks, so its decode row is skipped)."""
        caps: dict[str, int] = {}
        errors: dict[str, str] = {}
        ready: list[tuple[PrefillItem, InputSequence, int]] = []  # with each request's persona slot
        for item in items:
            try:
                layout, cap = _Layout.of(item)
                if layout.length + cap > len(item.blocks) * self.block_size:
                    raise InvalidInputError(f"request {item.request_id!r} was given too few KV blocks")
                persona = self.personas.acquire(item.request_id, item.request.persona)  # last
            except InvalidInputError as exc:  # PersonaError included
                errors[item.request_id] = str(exc)
                continue
            caps[item.request_id] = cap
            ready.append((item, layout.tensors(self.tts.config), persona))
        if not ready:
            return caps, errors
        with invariant_numerics(self.batch_invariant):
            for batch in [[row] for row in ready] if self.batch_invariant else [ready]:
                self._prefill_batch(batch)
            # Continuation prompts warm the VAE, one batch per context length (almost always one: every prompt of
            # ``decode_context_patches`` patches or more).
            warms: dict[int, list[tuple[int, torch.Tensor]]] = {}
            for item, sequence, _ in ready:
                context = sequence.decode_context
                if context.numel():
                    warms.setdefault(len(context), []).append((item.slot, context))
            # Every admitted row's settings, noise positions and VAE warm contexts in one upload.
            params = [item.request.params for item, _, _ in ready]
            noise_index, slots, cfg, timesteps, *warm_inputs = devices.upload(
                [
                    torch.from_numpy(
                        np.concatenate(
                            [self._noise_index(item, seq.length, caps[item.request_id]) for item, seq, _ in ready]
                        )
                    ),
                    torch.tensor([item.slot for item, _, _ in ready]),
                    torch.tensor([p.cfg_value for p in params], dtype=self.cfg.dtype),
                    torch.tensor([p.inference_timesteps for p in params], dtype=self.timesteps.dtype),
                    *(torch.tensor([slot for slot, _ in group]) for group in warms.values()),
                    *(torch.stack([context for _, context in group]) for group in warms.values()),
                ],
                self.tts.device,
                self.cuda,
            )
            self.cfg[slots], self.timesteps[slots] = cfg, timesteps
            for warm_slots, contexts in zip(warm_inputs[: len(warms)], warm_inputs[len(warms) :], strict=True):
                self._warm_vae(warm_slots, contexts)
            start = 0
            for item, sequence, _ in ready:
                request, slot, cap = item.request, item.slot, caps[item.request_id]
                self._store_noise(item, noise_index[start : start + cap])
                start += cap
                self._positions[slot], self._timesteps[slot] = sequence.length, request.params.inference_timesteps
                self.requests.add(item.request_id)
        return caps, errors

    def _warm_vae(self, slots: torch.Tensor, contexts: torch.Tensor) -> None:
        """Warm the (fresh) VAE streams of ``slots`` (R,) with their prompts' context patches (R, C, P, D), in one
        batch (``StreamingVAEDecoder.warm``)."""
        warmed = self.tts.vae_decoder.new_state(len(slots))
        self.tts.vae_decoder.warm(contexts, self.tts.dtype, warmed)
        self.vae_state.write_rows(slots, warmed)

    def _prefill_batch(self, rows: list[tuple[PrefillItem, InputSequence, int]]) -> None:
        """One right-padded prefill of these requests: their KV blocks, decode state and persona slots."""
        tables = torch.full((len(rows), self.table_width), NULL_BLOCK, dtype=torch.int32)
        for row, (item, _, _) in enumerate(rows):
            tables[row, : len(item.blocks)] = torch.tensor(item.blocks, dtype=torch.int32)
        sequences = [sequence for _, sequence, _ in rows]
        encodings = self._voice_encodings([(item.request.prompt, sequence) for item, sequence, _ in rows])
        # Built on the host, then every input of the prefill goes up in one copy (``devices.upload``).
        host = PrefillBatch.from_sequences(sequences, torch.device("cpu"), self.tts.dtype)
        fields = (host.text_tokens, host.feats, host.text_mask, host.audio_mask, host.lengths, host.audio_positions)
        tables, slots, personas, text_tokens, feats, text_mask, audio_mask, lengths, audio_positions = devices.upload(
            [
                tables,
                torch.tensor([item.slot for item, _, _ in rows]),
                torch.tensor([persona for _, _, persona in rows]),
                *fields,
            ],
            self.tts.device,
            self.cuda,
        )
        batch = PrefillBatch(text_tokens, feats, text_mask, audio_mask, lengths, audio_positions, encodings)
        self.personas.table[slots] = personas
        self.personas.select(self.personas.table[slots])
        state = self.tts.model.prefill(batch, self.pool.base.view(tables), self.pool.residual.view(tables))
        for buffer, fresh_rows in zip(self.state.as_tuple(), state.as_tuple(), strict=True):
            buffer[slots] = fresh_rows
        self.block_tables[slots] = tables
        self.vae_state.reset_rows(slots)

    def _voice_encodings(self, rows: list[tuple[VoicePrompt | None, InputSequence]]) -> torch.Tensor | None:
        """LocEnc's outputs for every audio position of the batch, row by row, from the voice cache or encoded
        now (encoder space: the persona-dependent projection into the LM happens in the prefill). The voices not
        cached are encoded together, in one LocEnc call over all their patches (each patch is a sequence of its own
        to LocEnc: one call instead of one per voice, issue 34), and each is cached; a voice used twice in the
        batch is encoded once. With batch-invariant numerics the runner prefills one request at a time, so each
        voice is then encoded by itself, and its encodings never depend on other requests, bit for bit."""
        voices = [(voice, sequence) for voice, sequence in rows if voice is not None]
        found: dict[str, torch.Tensor] = {}  # digest -> its encodings
        missing: dict[str, torch.Tensor] = {}  # digest -> the voice's patches (N, P, D) on the host
        for voice, sequence in voices:
            if voice.digest in found or voice.digest in missing:
                continue
            cached = self.voice_cache.get(voice.digest)
            if cached is None:
                missing[voice.digest] = sequence.feats[sequence.audio_mask.bool()]
            else:
                found[voice.digest] = cached
        if missing:
            patches = torch.cat(list(missing.values())).to(self.tts.device, self.tts.dtype)
            outputs = torch.split(self.tts.model.encode_patches(patches), [len(each) for each in missing.values()])
            for digest, embeds in zip(missing, outputs, strict=True):
                # A copy of its own: a view would keep the whole call's output alive in the cache.
                found[digest] = embeds.clone() if len(missing) > 1 else embeds
                self.voice_cache.put(digest, found[digest])
        return torch.cat([found[voice.digest] for voice, _ in voices]) if voices else None

    def _noise_index(self, item: PrefillItem, length: int, cap: int) -> np.ndarray:
        """Where in the noise pool step i of the request reads its noise: position length + i of its blocks."""
        positions = np.arange(length, length + cap)
        blocks = np.asarray(item.blocks, dtype=np.int64)[positions // self.block_size]
        return blocks * self.block_size + positions % self.block_size

    def _store_noise(self, item: PrefillItem, index: torch.Tensor) -> None:
        """Draw the request's noise for every step it may take (``index``: where each goes, on the device)."""
        config, seed = self.tts.config, item.request.params.seed
        stream = NoiseStream(
            random_seed() if seed is None else seed, config.feat_dim, config.patch_size, self.tts.dtype, self.tts.device
        )
        self.pool.noise[index] = stream.take(len(index))

    def _decode(self, plan: StepPlan, caps: dict[str, int], errors: dict[str, str]) -> RunnerOutput:
        """One patch for every decode row whose prefill did not fail; failed rows get an empty chunk."""
        if errors:
            rows = [i for i, rid in enumerate(plan.request_ids) if rid not in errors]
            slots = np.asarray(plan.decode_slots, dtype=np.int64)[rows]
        else:
            rows, slots = list(range(len(plan.request_ids))), np.asarray(plan.decode_slots, dtype=np.int64)
        if not rows:
            empty = len(plan.request_ids)
            return RunnerOutput((EMPTY_AUDIO,) * empty, (False,) * empty, caps, errors)
        stopped, broken, audio, patch = self._run(slots)
        for broken_row in np.flatnonzero(broken):
            errors[plan.request_ids[rows[broken_row]]] = NON_FINITE_OUTPUT
        patches = patch.reshape(len(rows), self.tts.config.patch_size, self.tts.config.feat_dim)
        if len(rows) == len(plan.request_ids):
            return RunnerOutput(tuple(audio), tuple(stopped.tolist()), caps, errors, tuple(patches))
        chunks, stops = [EMPTY_AUDIO] * len(plan.request_ids), [False] * len(plan.request_ids)
        patch_rows: list[np.ndarray] = [np.zeros_like(patches[0])] * len(plan.request_ids)
        for out_row, row in enumerate(rows):
            chunks[row], stops[row], patch_rows[row] = audio[out_row], bool(stopped[out_row]), patches[out_row]
        return RunnerOutput(tuple(chunks), tuple(stops), caps, errors, tuple(patch_rows))

    @property
    def packed_width(self) -> int:
        """Columns of a step's packed output per row: the stop flag, the non-finite flag, the audio samples and
        the patch (both flags 0 for a row that goes on, as a zeroed buffer reads)."""
        config = self.tts.config
        return 2 + config.samples_per_patch + config.patch_size * config.feat_dim

    def _run(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Run the batch of ``slots``, one sub-step per timestep bucket; returns its stop flags (n,) bool,
        whether each row's output is not finite (n,) bool, audio (n, samples) and patches (n, P*D), float32 arrays
        whose rows outlive the step."""
        buckets = bucket_of(self.timestep_counts, self._timesteps[slots])
        counts = np.unique(buckets)
        groups = [np.flatnonzero(buckets == count) for count in counts]
        parts = [slots[rows] for rows in groups]
        values = self._run_eager(parts) if self.graphs is None else self._replay(parts, counts.tolist())
        if len(groups) > 1:  # back into the order of ``slots`` (a copy: the buffer is free again at once)
            values = values[np.argsort(np.concatenate(groups))]
        self._positions[slots] += 1
        audio_end = 2 + self.tts.config.samples_per_patch
        return values[:, 0] != 0, values[:, 1] != 0, values[:, 2:audio_end], values[:, audio_end:]

    def _run_eager(self, groups: list[np.ndarray]) -> np.ndarray:
        """The packed outputs of each group of slots, one after the other, each group run at its own largest
        timestep count and reading only the blocks its longest row has reached."""
        outputs = []
        for slots in groups:
            count = len(slots)
            self.index[:count].copy_(torch.from_numpy(slots))
            width = blocks_for(int(self._positions[slots].max()) + 1, self.block_size)
            outputs.append(self._packed(count, int(self._timesteps[slots].max()), width))
        # On CPU these are fresh tensors of this step: their arrays are the chunks, no copy (one group).
        return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)).cpu().numpy()

    def _replay(self, groups: list[np.ndarray], buckets: list[int]) -> np.ndarray:
        """Replay each group's graph (the group's timestep bucket's) and read every output back with one wait for
        the device."""
        assert self.graphs is not None
        buffer = self._outputs.take()
        host = self._outputs.buffer(buffer)
        staged = done = 0
        for slots, timesteps in zip(groups, buckets, strict=True):
            count = len(slots)
            bucket = self.graphs.bucket(count)
            staging = self._index_host[staged : staged + bucket]
            staging[:count] = torch.from_numpy(slots)
            staging[count:] = self.pad_slot
            self.index[:bucket].copy_(staging, non_blocking=True)  # the sub-step's one upload
            packed = self.graphs.run(bucket, timesteps)[:count]
            # The sub-step's one read: the graph's output is overwritten by its next replay.
            host[done : done + count].copy_(packed, non_blocking=True)
            staged, done = staged + bucket, done + count
        if self.cuda is not None:
            torch.cuda.current_stream(self.cuda).synchronize()
        # The chunks are views of the buffer, which is not taken again while any of them lives.
        return self._outputs.lend(buffer)[:done]

    def _graph_step(self, bucket: int, timesteps: int) -> torch.Tensor:
        """The step over the whole block table, packed (what a graph captures)."""
        return self._packed(bucket, timesteps, self.table_width)

    def _packed(self, bucket: int, timesteps: int, width: int) -> torch.Tensor:
        """The step with its outputs packed into one (bucket, ``packed_width``) float32 tensor: stop flag,
        non-finite flag, audio, patch."""
        stopped, audio, patch = self._step(bucket, timesteps, width)
        flags = torch.stack([stopped.float(), _non_finite_rows(audio, patch).float()], dim=1)
        return torch.cat([flags, audio, patch.float().reshape(bucket, -1)], dim=1)

    def _step(self, bucket: int, timesteps: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batched step on the slots in ``index[:bucket]``, gathered and scattered back in place.

        Uses only device-side inputs (the index buffer and the per-slot tables), so a CUDA graph can
        capture it. Returns each row's stop flag (bucket,) bool, audio (bucket, samples) float32 and
        patch (bucket, P, D)."""
        index = self.index[:bucket]
        state = DecodeState(*(t.index_select(0, index) for t in self.state.as_tuple()))
        tables = self.block_tables.index_select(0, index)[:, :width]
        vae = VAEStreamState([b.index_select(0, index) for b in self.vae_state.buffers])
        steps = self.timesteps.index_select(0, index)
        schedule = CfmSchedule(
            times=self.times_table[steps, :timesteps],
            deltas=self.deltas_table[steps, :timesteps],
            steps=steps,
            zero_init=self.zero_init_table[steps],
            max_steps=timesteps,
            uniform_zero_init=1,  # every row skips at least its first step (CFG-Zero*)
            ragged=True,
        )
        flat = tables.gather(1, state.positions[:, None] // self.block_size)[:, 0].long() * self.block_size
        noise = self.pool.noise[flat + state.positions % self.block_size]
        self.personas.select(self.personas.table.index_select(0, index))
        cfg = self.cfg.index_select(0, index)
        with invariant_numerics(self.batch_invariant):
            patch, stop_logits = self.tts.model.decode_step(
                state, self.pool.base.view(tables), self.pool.residual.view(tables), noise, cfg, schedule
            )
            audio = self.tts.vae_decoder.decode(patch.float().transpose(1, 2), vae)
        pools, batch = (*self.state.as_tuple(), *self.vae_state.buffers), (*state.as_tuple(), *vae.buffers)
        for pool, rows in zip(pools, batch, strict=True):
            pool.index_copy_(0, index, rows)
            pool[self.pad_slot].zero_()  # padding rows start every step from zeros
        return stop_logits.argmax(dim=-1) == 1, audio, patch


@dataclass(frozen=True, slots=True)
class _Layout:
    """``ModelRunner``'s payload of a ``Prepared`` request: its layout and length cap, made once on ``add``."""

    layout: PromptLayout
    length_cap: int

    @staticmethod
    def of(item: PrefillItem) -> tuple[PromptLayout, int]:
        """The layout and length cap ``prepare`` made for ``item``.

        Raises:
            InvalidInputError: ``prepare`` refused the request (the reason), or it was prepared by another runner.
        """
        prepared = item.prepared
        if prepared.error is not None:
            raise InvalidInputError(prepared.error)
        payload = prepared.payload
        if not isinstance(payload, _Layout):
            raise InvalidInputError(f"request {item.request_id!r} was not prepared by this runner")
        return payload.layout, payload.length_cap


def _non_finite_rows(audio: torch.Tensor, patch: torch.Tensor) -> torch.Tensor:
    """(rows,) bool: whether the row's audio (rows, samples) or patch (rows, P, D) holds a NaN or an infinity."""
    return ~(torch.isfinite(audio).all(dim=1) & torch.isfinite(patch.flatten(1)).all(dim=1))
