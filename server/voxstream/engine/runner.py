"""``ModelRunner``: the engine's ``Runner`` over a loaded VoxCPM model; the only engine module that
touches torch devices.

It owns a preallocated pool of ``num_slots`` rows: base-LM and residual-LM KV caches
(``max_length`` positions each), decode-state rows, and streaming-VAE state rows. Row r belongs to
whichever request the plan puts in slot r, and the scheduler keeps the live rows compacted at
``0..n-1``, so a step runs on views ``[:n]`` of the pool: no gathering, one shape per batch size.

Per request it keeps only host-side values: the noise stream of its seed (the seed contract, so a
request's audio does not depend on its neighbours), its guidance strength and timestep count.

Rows with different ``inference_timesteps`` share one step: the CFM sampler gives each row its own
time grid and masks a row once its grid is exhausted (``CfmSchedule``), so the step costs the longest
row's timesteps and nobody waits for a second pass. A step reads the device once, at its end (stop
flags, audio and patches together). On CUDA the step is replayed as a CUDA graph per batch bucket
(``cuda_graphs.StepGraphs``); on CPU the same step runs eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from voxstream.engine.cuda_graphs import StepGraphs, StepResult
from voxstream.engine.outputs import EMPTY_CHUNK, PrefillItem, RunnerOutput, StepPlan
from voxstream.engine.slots import SlotMove
from voxstream.errors import InvalidInputError
from voxstream.model.audio_vae import VAEStreamState
from voxstream.model.cfm import CfmSchedule
from voxstream.model.kv_cache import KVCache
from voxstream.model.voxcpm import DecodeState
from voxstream.prompt import InputSequence, VoicePrompt, build_sequence
from voxstream.sampling import NoiseStream, random_seed
from voxstream.tts import VoxCPM


@dataclass
class _RowRequest:
    """Host-side per-request values the decode step needs."""

    noise: NoiseStream
    cfg_value: float
    timesteps: int


class ModelRunner:
    """Runs ``StepPlan``s on a model. Not thread-safe: the engine thread is its only caller."""

    def __init__(
        self,
        tts: VoxCPM,
        num_slots: int,
        max_length: int | None = None,
        *,
        cuda_graphs: bool | None = None,
        max_timesteps: int = 100,
    ) -> None:
        """``cuda_graphs``: replay decode steps as CUDA graphs (default: on CUDA devices); ``max_timesteps``:
        the most CFM timesteps a request may ask for (sizes the graphs' static buffers)."""
        config = tts.config
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} is invalid: must be >= 1")
        self.tts = tts
        self.max_length = min(max_length or config.max_length, config.max_length)
        device, dtype = tts.device, tts.dtype
        self.base = KVCache(config.lm_config, num_slots, self.max_length, device, dtype)
        self.residual = KVCache(config.residual_lm, num_slots, self.max_length, device, dtype)
        hidden = config.lm_config.hidden_size
        self.state = DecodeState(
            lm_hidden=torch.zeros(num_slots, hidden, device=device, dtype=dtype),
            residual_hidden=torch.zeros(num_slots, hidden, device=device, dtype=dtype),
            cond=torch.zeros(num_slots, config.patch_size, config.feat_dim, device=device, dtype=dtype),
            positions=torch.zeros(num_slots, dtype=torch.long, device=device),
        )
        with torch.inference_mode():
            self.vae_state = tts.vae_decoder.new_state(num_slots)
        self.requests: dict[str, _RowRequest] = {}
        self._schedules: dict[tuple[int, ...], CfmSchedule] = {}
        use_graphs = device.type == "cuda" if cuda_graphs is None else cuda_graphs
        noise_shape = (config.feat_dim, config.patch_size)
        self.graphs = (
            StepGraphs(self._step, self.state.positions, noise_shape, dtype, max_timesteps) if use_graphs else None
        )

    @property
    def num_slots(self) -> int:
        return self.base.num_slots

    @staticmethod
    def bytes_per_slot(tts: VoxCPM, max_length: int | None = None) -> int:
        """Device memory one session's slot holds: both KV caches, decode state and VAE stream state."""
        config, dtype = tts.config, tts.dtype
        length = min(max_length or config.max_length, config.max_length)
        element = torch.empty((), dtype=dtype).element_size()
        kv = sum(KVCache.bytes_per_slot(lm, length, dtype) for lm in (config.lm_config, config.residual_lm))
        state = (2 * config.lm_config.hidden_size + config.patch_size * config.feat_dim) * element + 8
        with torch.inference_mode():
            vae = tts.vae_decoder.new_state(1).nbytes_per_stream
        return kv + state + vae

    @classmethod
    def slots_for_memory(cls, tts: VoxCPM, budget_bytes: int, max_length: int | None = None) -> int:
        """How many session slots fit in ``budget_bytes`` of device memory (at least one)."""
        per_slot = cls.bytes_per_slot(tts, max_length)
        if budget_bytes < per_slot:
            raise ValueError(
                f"a memory budget of {budget_bytes} bytes holds no session: one slot needs {per_slot} bytes "
                "(lower max_length or raise the budget)"
            )
        return budget_bytes // per_slot

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> RunnerOutput:
        for request_id in plan.released:
            self.requests.pop(request_id, None)
        for move in plan.moves:
            self._move(move)
        length_caps, errors = self._prefill(plan.prefills)
        if not plan.request_ids:
            return RunnerOutput(length_caps=length_caps, errors=errors)
        chunks, stop_flags, patches = self._decode(plan.request_ids, errors)
        return RunnerOutput(chunks, stop_flags, length_caps, errors, patches)

    # ---- plan phases ----
    def _move(self, move: SlotMove) -> None:
        src = torch.tensor([move.src], device=self.tts.device)
        dst = torch.tensor([move.dst], device=self.tts.device)
        self.base.move_rows(src, dst)
        self.residual.move_rows(src, dst)
        for buffer in self.state.as_tuple():
            buffer[dst] = buffer[src]
        self.vae_state.move_rows(src, dst)

    def _prefill(self, items: tuple[PrefillItem, ...]) -> tuple[dict[str, int], dict[str, str]]:
        """Prefill every admitted request in one right-padded batch; a bad request fails alone."""
        caps: dict[str, int] = {}
        errors: dict[str, str] = {}
        ready: list[tuple[PrefillItem, InputSequence]] = []
        for item in items:
            try:
                sequence, caps[item.request_id] = self._sequence(item)
            except InvalidInputError as exc:
                errors[item.request_id] = str(exc)
                continue
            ready.append((item, sequence))
        if not ready:
            return caps, errors
        sequences = [sequence for _, sequence in ready]
        slots = torch.tensor([item.slot for item, _ in ready], device=self.tts.device)
        width = max(sequence.length for sequence in sequences)
        config, device, dtype = self.tts.config, self.tts.device, self.tts.dtype
        scratch = [KVCache(lm, len(ready), width, device, dtype) for lm in (config.lm_config, config.residual_lm)]
        state = self.tts.model.prefill(
            self.tts.prefill_batch(sequences), scratch[0].rows(0, len(ready)), scratch[1].rows(0, len(ready))
        )
        for pool, fresh in zip((self.base, self.residual), scratch, strict=True):
            pool.tensor[:, :, slots, :, :width] = fresh.tensor
        for buffer, fresh_rows in zip(self.state.as_tuple(), state.as_tuple(), strict=True):
            buffer[slots] = fresh_rows
        self.vae_state.reset_rows(slots)
        for (_, sequence), slot in zip(ready, slots.tolist(), strict=True):
            self.tts.warm_vae(sequence, VAEStreamState([b[slot : slot + 1] for b in self.vae_state.buffers]))
        return caps, errors

    def _sequence(self, item: PrefillItem) -> tuple[InputSequence, int]:
        request = item.request
        prompt = request.prompt
        if prompt is not None and not isinstance(prompt, VoicePrompt):
            raise InvalidInputError(f"a request's prompt must be a VoicePrompt, got {type(prompt).__name__}")
        sequence = build_sequence(self.tts.tokenizer, self.tts.config, request.text, prompt)
        cap = self.tts.length_cap(sequence, request.params, self.max_length)
        seed = request.params.seed if request.params.seed is not None else random_seed()
        config = self.tts.config
        self.requests[item.request_id] = _RowRequest(
            noise=NoiseStream(seed, config.feat_dim, config.patch_size, self.tts.dtype, self.tts.device),
            cfg_value=request.params.cfg_value,
            timesteps=request.params.inference_timesteps,
        )
        return sequence, cap

    def _decode(
        self, request_ids: tuple[str, ...], errors: dict[str, str]
    ) -> tuple[tuple[np.ndarray, ...], tuple[bool, ...], tuple[np.ndarray, ...]]:
        """One patch for rows 0..n-1. A row whose prefill failed computes on zero noise and is ignored."""
        count = len(request_ids)
        config, device, dtype = self.tts.config, self.tts.device, self.tts.dtype
        rows = [self.requests.get(rid) for rid in request_ids]
        zero = torch.zeros((1, config.feat_dim, config.patch_size), dtype=dtype, device=device)
        noise = torch.cat([row.noise.next() if row is not None else zero for row in rows])
        cfg = torch.tensor([row.cfg_value if row is not None else 0.0 for row in rows], device=device)
        schedule = self._schedule(tuple(row.timesteps if row is not None else 1 for row in rows))
        run = self.graphs.run if self.graphs is not None else self._step
        patch, stop_logits, audio = run(count, noise, cfg, schedule)
        stops = (stop_logits.argmax(dim=-1) == 1).tolist()  # the step's one device read, with the audio below
        # Copies: with CUDA graphs these are views of static outputs that the next replay overwrites.
        audio_rows = audio.to("cpu", copy=True).numpy()
        patch_rows = patch.to("cpu", dtype=torch.float32, copy=True).numpy()
        chunks = tuple(EMPTY_CHUNK if rid in errors else audio_rows[i] for i, rid in enumerate(request_ids))
        return chunks, tuple(bool(s) for s in stops), tuple(patch_rows)

    def _step(self, count: int, noise: torch.Tensor, cfg: torch.Tensor, schedule: CfmSchedule) -> StepResult:
        """The batched step on pool rows ``0..count-1``: patch, stop logits, and the patch's audio."""
        patch, stop_logits = self.tts.model.decode_step(
            self.state.rows(0, count), self.base.rows(0, count), self.residual.rows(0, count), noise, cfg, schedule
        )
        return (
            patch,
            stop_logits,
            self.tts.vae_decoder.decode(patch.float().transpose(1, 2), self.vae_state.rows(count)),
        )

    def _schedule(self, steps: tuple[int, ...]) -> CfmSchedule:
        schedule = self._schedules.get(steps)
        if schedule is None:
            if len(self._schedules) > 256:  # batch compositions vary; keep the cache bounded
                self._schedules.clear()
            schedule = self._schedules[steps] = CfmSchedule.build(list(steps), self.tts.dtype, self.tts.device)
        return schedule
