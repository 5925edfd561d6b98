"""One-shot GPU check: what the server runs, measured on one CUDA device in at most 8 minutes.

The one call (from the repository root; the package need not be installed, nothing is downloaded, and neither
soundfile, soxr, opuslib, av, pyzmq nor websockets is needed)::

    PYTHONPATH=server python3 scripts/gpu_check.py --out "$OUT"

It writes ``$OUT/gpu_check.json`` (rewritten after every phase, so a run cut short still leaves the phases it
finished) and prints a summary. ``--out`` defaults to ``$OUT``, else a new temporary folder. The exit status is
0 when no phase failed. ``--smoke`` runs every phase on the CPU with the tiny ``voxcpm2`` model in well under a
minute (CUDA-only phases report "skipped: no CUDA"); CI runs it with the packages above unimportable.

The model is VoxCPM2 at its real shapes (``voxwire.tiny.configs``' ``voxcpm2-shape``, 2.29 B parameters) with
random weights made in memory in the published layout and loaded through the strict loader, with the server's
dtypes unless ``--dtype``/``--vae-dtype``: bfloat16 transformers, and on CUDA a float16 AudioVAE when its check
decode against float32 passes (``audio_vae.choose_vae_dtype``; ``build`` reports the dtype), else float32. TF32
stays as torch has it, as in the server (which never sets it): the flags are reported and must not change during
the run.

Phases, each timed and guarded (a failure is recorded and the others still run) within ``--budget-s``:

1. ``env``: Python, torch, Triton, the GPU and its capability, TF32 flags, attention, fused-op and noise paths (as
   the start-up probe chose them); on CUDA it fails unless the fused ops and decode attention run Triton.
2. ``build``: the model as ``voxwire serve`` builds it; weights memory.
3. ``fusion``: every attention runs q/k/v as one GEMM and every MLP gate/up as one (counted); fails otherwise.
4. ``correctness``: sessions with different texts, seeds, guidance and timestep counts, arriving at different
   steps, decoded together and each alone; on batch-invariant runners also a burst of at least 16 copies of them
   arriving at once (16 rows and more, where CUDA's reductions may order a row's sum differently). The gate: on
   batch-invariant runners (``--batch-invariant``) every session's audio, in both runs, is bit for bit its audio
   alone, and the burst ran 16 rows in a step. The default path's difference is reported, not gated (its
   GEMM kernels depend on the row count, and an FSQ rounding flip then diverges a session). On CUDA also the
   batch-invariant graph path against its eager path (reported).
5. ``server_setup``: the runner ``voxwire serve --max-sessions ROWS`` builds (``VoxCPMSpeech.new_runner``): time
   to ready split into KV sizing, graph capture (every key, timed) and step-cost measurement; the memory split
   (weights, KV pool, graph pool, free).
6. ``step_curve``: engine steps of c sessions for c in ``--curve`` (graph replay on CUDA), a linear fit, and
   the rows whose step fits the 160 ms of audio each step makes; beside each measured step the prediction of
   ``scripts/count_step_cost.py``'s step model (realistic and best case, this GPU's ceilings), which it calibrates.
7. ``timesteps_50``: the step at 50 CFM timesteps, alone and with one such session among the rest.
8. ``ttfa``: time from adding one request to an idle engine to its first audio.
9. ``kernel_shapes``: the fused ops' calls of one decode step at ``--rows`` rows, recorded on the meta device
   through the runner's own step, plus decode attention per LM layer.
10. ``kernel_timing`` (CUDA): each of those calls timed alone (ms, GB/s, CTAs from the profiler's launch grids).
11. ``profile``: ``torch.profiler`` of one eager decode step at ``--rows`` rows: top kernels (CUDA), top host ops.
12. ``admission_noise``: a request's noise for a 150-patch length cap as admission draws it (``NoiseStream.take``:
    one launch on CUDA when the start-up probe matched) and patch by patch: the path, both times, and the gate:
    the numbers are equal bit for bit.
"""

from __future__ import annotations

import argparse
import enum
import functools
import gc
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from voxwire.engine import Engine, EngineConfig, FinishReason, ParamLimits, Request, RunnerOptions, SynthesisParams
from voxwire.engine.blocks import blocks_for
from voxwire.engine.cuda_graphs import StepGraphs
from voxwire.engine.engine_config import DEFAULT_BLOCK_SIZE
from voxwire.engine.kv_pool import bytes_per_position
from voxwire.engine.runner import ModelRunner
from voxwire.kernels import ops
from voxwire.kernels.path import ENV_VAR, KernelPath, KernelPolicy, kernel_path, noise_path, probe_triton
from voxwire.loader import model_from_weights
from voxwire.model.audio_vae import fold_weight_norm, random_published_state_dict
from voxwire.model.minicpm import MiniCPMAttention, MiniCPMMLP
from voxwire.model.paged_attention import attention_path
from voxwire.model_config import ModelConfig
from voxwire.sampling import NoiseStream
from voxwire.serving.server_config import ServerConfig
from voxwire.speech_model import VoxCPMSpeech
from voxwire.text.tokenizer import TextTokenizer
from voxwire.tiny.checkpoint import random_model_weights
from voxwire.tiny.configs import ALL_CONFIGS
from voxwire.tiny.tokenizer_files import write_tiny_tokenizer
from voxwire.tts import VoxCPM

RESULTS_FILE = "gpu_check.json"
REALTIME_STEP_MS = 160.0
"""Audio one step makes per session (VoxCPM2: 4 latent frames of 40 ms): a step must fit in it."""

TEXTS = [
    "Hello there, how are you today?",
    "The weather is lovely this afternoon, isn't it?",
    "今天天气很好。",
    "Numbers like 3.14 are read aloud.",
    "A short one.",
    "Streaming speech, one patch at a time.",
    "VoxCPM 语音合成 in real time!",
    "The last of eight different sentences.",
]


# ---------------------------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class Plan:
    """What to measure, and how much of it."""

    device: torch.device
    config: str
    dtype: str | None
    vae_dtype: str | None
    rows: int
    """The server's ``--max-sessions``, and the batch the kernels and the profile run at."""
    curve: tuple[int, ...]
    patches: int
    """Patches per session in the timed engine runs."""
    correctness_sessions: int
    correctness_patches: int
    context: int
    """Live KV positions per row for the decode-attention kernel."""
    kernel_repeats: int
    ttfa_repeats: int
    budget_s: float

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


GPU_CURVE = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 640, 768)


def make_plan(args: argparse.Namespace) -> Plan:
    smoke = args.smoke
    rows = args.rows or (4 if smoke else 768)
    if args.curve:
        curve = tuple(int(c) for c in args.curve.split(","))
    else:
        curve = (*(c for c in (1, 2, 4) if c < rows), rows) if smoke else GPU_CURVE
    return Plan(
        device=torch.device(args.device or ("cpu" if smoke else "cuda")),
        config=args.config or ("voxcpm2" if smoke else "voxcpm2-shape"),
        dtype=args.dtype,
        vae_dtype=args.vae_dtype,
        rows=rows,
        curve=curve,
        patches=args.patches or (2 if smoke else 8),
        correctness_sessions=3 if smoke else 8,
        correctness_patches=2 if smoke else 8,
        context=32 if smoke else 256,
        kernel_repeats=2 if smoke else 10,
        ttfa_repeats=2 if smoke else 5,
        budget_s=args.budget_s or (240.0 if smoke else 450.0),
    )


def server_runner(tts: VoxCPM, sessions: int) -> ModelRunner:
    """The runner the server builds for ``sessions`` slots, through the server's own code."""
    runner = VoxCPMSpeech(tts).new_runner(ServerConfig.of(max_sessions=sessions).engine.runner_options())
    assert isinstance(runner, ModelRunner)
    return runner


# ---------------------------------------------------------------------------------------------------------------
# Phases: each runs guarded and timed, and the JSON is rewritten after it


class PhaseStatus(str, enum.Enum):
    OK = "ok"
    FAILED = "failed"
    """It ran, and a check in it failed."""
    ERROR = "error"
    """It raised."""
    SKIPPED = "skipped"


class Skipped(Exception):
    """Raised by a phase that cannot run here; the message says why."""


@dataclass
class Outcome:
    """A phase's figures, and the checks it failed (none: it passed)."""

    result: dict[str, Any]
    failures: list[str] = field(default_factory=list)


class Report:
    """The run's results: phases in order, written to ``path`` after each one."""

    def __init__(self, path: Path, plan: Plan) -> None:
        self.path = path
        self.began = time.perf_counter()
        self.deadline = self.began + plan.budget_s
        self.data: dict[str, Any] = {
            "command": " ".join(sys.argv),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "plan": {k: str(v) if isinstance(v, torch.device) else v for k, v in asdict(plan).items()},
            "phases": {},
        }

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def run(self, name: str, phase: Callable[[], Outcome], needs: str | None = None) -> Outcome | None:
        """Run ``phase`` unless ``needs`` says why it cannot; record its status, figures and time."""
        began = time.perf_counter()
        print(f"\n== {name}", flush=True)
        entry: dict[str, Any]
        outcome = None
        try:
            if needs is not None:
                raise Skipped(needs)
            if self.remaining() <= 0:
                raise Skipped("time budget spent")
            outcome = phase()
            status = PhaseStatus.FAILED if outcome.failures else PhaseStatus.OK
            entry = {"status": status.value, "result": outcome.result}
            if outcome.failures:
                entry["failures"] = outcome.failures
        except Skipped as skip:
            entry = {"status": PhaseStatus.SKIPPED.value, "reason": f"skipped: {skip}"}
        except Exception as exc:  # a phase's failure must not stop the others
            entry = {"status": PhaseStatus.ERROR.value, "error": f"{type(exc).__name__}: {exc}"}
            entry["traceback"] = traceback.format_exc(limit=-12)
        try:
            release_device_memory()
        except Exception as exc:  # a device error the phase left behind: the next phases will say more
            entry["release_error"] = f"{type(exc).__name__}: {exc}"
        entry["seconds"] = round(time.perf_counter() - began, 3)
        self.data["phases"][name] = entry
        print(describe_phase(name, entry), flush=True)
        self.write()
        return outcome

    def write(self) -> None:
        self.data["total_seconds"] = round(time.perf_counter() - self.began, 3)
        self.path.write_text(json.dumps(self.data, indent=1, default=str) + "\n", encoding="utf-8")


def release_device_memory() -> None:
    """On CUDA, collect discarded runners (a captured graph holds its runner's step method: a reference cycle) and
    hand their cached blocks back, so the next runner sizes its KV pool from what is really free."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------------------------
# env


def tf32_flags() -> dict[str, Any]:
    """Torch's TF32 settings, in both APIs (the server sets none of them)."""
    flags: dict[str, Any] = {
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    for name, backend in (("cuda_matmul", torch.backends.cuda.matmul), ("cudnn_conv", torch.backends.cudnn.conv)):
        precision = getattr(backend, "fp32_precision", None)
        if precision is not None:
            flags[f"{name}_fp32_precision"] = precision
    return flags


def fused_ops_fallback(device: torch.device) -> str:
    """Why the fused ops and decode attention run plain torch on the CUDA ``device``: the policy, or what the
    start-up probe (``kernels.path.probe_triton``) finds wrong when it runs again."""
    if KernelPolicy.from_env() is KernelPolicy.TORCH:
        return f"{ENV_VAR}=torch"
    return probe_triton(device) or "the start-up probe failed, though it passes when run again"


def noise_draws(device: torch.device) -> str:
    """How a request's noise is drawn at admission on ``device`` (``NoiseStream.take``)."""
    return noise_path(device).value if device.type == "cuda" else "one randn call (CPU)"


def check_env(plan: Plan) -> Outcome:
    if plan.cuda and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: run on a GPU machine, or pass --smoke for the CPU smoke run")
    try:
        import triton

        triton_version = triton.__version__
    except ImportError as exc:
        triton_version = f"not importable: {exc}"
    fused_path = kernel_path(plan.device)  # what the model's fused ops and decode attention run: the probe's choice
    result: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton_version,
        "numpy": np.__version__,
        "device": str(plan.device),
        "tf32": tf32_flags(),
        "attention_path": attention_path(plan.device),
        "fused_ops": fused_path.value,
        "noise": noise_draws(plan.device),
    }
    failures = []
    if plan.cuda:
        if fused_path is not KernelPath.TRITON:
            result["fused_ops_fallback"] = fused_ops_fallback(plan.device)
            failures.append(
                f"the fused ops and decode attention run plain torch on {plan.device}, not the server's Triton "
                f"kernels: {result['fused_ops_fallback']}"
            )
        props = torch.cuda.get_device_properties(plan.device)
        result["gpu"] = {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 2),
            "driver_cuda": torch._C._cuda_getDriverVersion() if hasattr(torch._C, "_cuda_getDriverVersion") else None,
        }
        if result["tf32"]["cuda_matmul_allow_tf32"]:
            failures.append("TF32 matmuls are on: the server never turns them on, so these are not its numbers")
    return Outcome(result, failures)


# ---------------------------------------------------------------------------------------------------------------
# build and fusion


def tiny_tokenizer() -> TextTokenizer:
    with tempfile.TemporaryDirectory() as tmp:
        write_tiny_tokenizer(Path(tmp))
        return TextTokenizer.from_dir(tmp)


def model_config(name: str) -> ModelConfig:
    return ModelConfig.from_dict(ALL_CONFIGS[name], source=name)


def build_model(plan: Plan) -> tuple[VoxCPM, dict[str, Any]]:
    """Random weights in the published layout (bf16 main file, weight-norm VAE), loaded as ``load_model`` loads
    a checkpoint with the server's dtypes."""
    config = model_config(plan.config)
    began = time.perf_counter()
    main = {k: v.to(torch.bfloat16) for k, v in random_model_weights(config, seed=0).items()}
    vae = fold_weight_norm(random_published_state_dict(config.audio_vae_config, config.vae_variant, seed=0))
    made = time.perf_counter()
    allocated_before = torch.cuda.memory_allocated(plan.device) if plan.cuda else 0
    tts = model_from_weights(
        config, tiny_tokenizer(), main, vae, device=plan.device, dtype=plan.dtype, vae_dtype=plan.vae_dtype
    )
    del main, vae
    sync(plan.device)
    info = {
        "config": plan.config,
        "parameters": sum(p.numel() for p in tts.model.parameters()),
        "dtype": str(tts.dtype),
        "vae_dtype": str(tts.model.audio_vae.dtype),
        "random_weights_seconds": round(made - began, 2),
        "load_seconds": round(time.perf_counter() - made, 2),
        "weights_bytes": model_bytes(tts),
    }
    if plan.cuda:
        # More than the model's own storages: tensors the model no longer uses are kept alive.
        info["allocated_bytes_after_build"] = torch.cuda.memory_allocated(plan.device) - allocated_before
    return tts, info


def model_bytes(tts: VoxCPM) -> int:
    """Bytes of every storage the model's parameters and buffers live in, each once (fused projections are views
    into one storage)."""
    storages = {}
    for tensor in (*tts.model.parameters(), *tts.model.buffers()):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


class GemmCounter(TorchDispatchMode):
    """Counts matrix products reaching the dispatcher (``linear`` arrives whole in inference mode, as ``mm``
    otherwise)."""

    def __init__(self) -> None:
        super().__init__()
        self.gemms = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if func.overloadpacket.__name__ in ("linear", "mm", "addmm"):
            self.gemms += 1
        return func(*args, **(kwargs or {}))


@torch.inference_mode()
def check_fusion(tts: VoxCPM) -> Outcome:
    """Runs every attention and MLP module of the model on one token and counts its GEMMs: fused, an attention
    runs two (q/k/v, then o_proj) and an MLP two (gate/up, then down_proj)."""
    unfused = []
    modules = 0
    for name, module in tts.model.named_modules():
        if not isinstance(module, (MiniCPMAttention, MiniCPMMLP)):
            continue
        modules += 1
        first = module.q_proj if isinstance(module, MiniCPMAttention) else module.gate_proj
        x = torch.zeros(1, 1, first.in_features, device=first.weight.device, dtype=first.weight.dtype)
        with GemmCounter() as counter:
            if isinstance(module, MiniCPMAttention):
                module(x, None, False)
            else:
                module(x)
        if counter.gemms != 2:
            unfused.append(f"{name} ({counter.gemms} GEMMs)")
    result = {"modules_checked": modules, "unfused": unfused[:20], "unfused_count": len(unfused)}
    failures = [f"{len(unfused)} of {modules} modules run unfused projections, e.g. {unfused[:3]}"] if unfused else []
    if not modules:
        failures.append("no attention or MLP module found")
    return Outcome(result, failures)


# ---------------------------------------------------------------------------------------------------------------
# engine runs


@dataclass
class EngineRun:
    audio: dict[str, np.ndarray]
    first_chunk_s: dict[str, float]
    """Seconds from the run's start to each request's first chunk."""
    steps: list[tuple[float, int]]
    """Each engine step's seconds and the sessions it decoded."""


def new_engine(runner: ModelRunner, waiting: int) -> Engine:
    """A FIFO engine over ``runner``: every running session decodes every step (no real-time skipping)."""
    return Engine(
        runner,
        EngineConfig(
            max_running=runner.num_slots,
            max_waiting=max(waiting, 1),
            max_prefill_tokens_per_step=1 << 20,
            limits=ParamLimits(max_inference_timesteps=runner.max_timesteps),
        ),
    )


def run_engine(runner: ModelRunner, arrivals: dict[int, list[Request]]) -> EngineRun:
    """Add each step's arrivals, step until every request finished; raises on a failed request."""
    engine = new_engine(runner, sum(len(r) for r in arrivals.values()))
    chunks: dict[str, list[np.ndarray]] = {}
    first: dict[str, float] = {}
    steps: list[tuple[float, int]] = []
    start = time.perf_counter()
    step = 0
    while step <= max(arrivals, default=0) or engine.has_work():
        for request in arrivals.get(step, []):
            engine.add(request)
        began = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        steps.append((now - began, sum(1 for out in outputs if out.audio.size)))
        for out in outputs:
            if out.finish_reason is FinishReason.ERROR:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            if out.audio.size:
                chunks.setdefault(out.request_id, []).append(out.audio)
                first.setdefault(out.request_id, now - start)
        step += 1
    return EngineRun({rid: np.concatenate(c) for rid, c in chunks.items()}, first, steps)


def same_length_requests(prefix: str, count: int, patches: int, timesteps: int = 10) -> list[Request]:
    params = [
        SynthesisParams(seed=10_000 + i, min_len=patches, max_len=patches, inference_timesteps=timesteps)
        for i in range(count)
    ]
    return [Request(f"{prefix}-{i}", TEXTS[i % len(TEXTS)], params[i]) for i in range(count)]


def pool_bytes(tts: VoxCPM, slots: int, max_length: int) -> int:
    """A KV pool with room for ``slots`` sessions of ``max_length`` positions (and the null block)."""
    return (1 + slots * blocks_for(max_length, DEFAULT_BLOCK_SIZE)) * DEFAULT_BLOCK_SIZE * bytes_per_position(tts)


AUX_MAX_LENGTH = 256
"""Positions per session of the correctness and profiling runners (prompts of a sentence, a few patches)."""


def aux_runner(tts: VoxCPM, slots: int, *, graphs: bool, batch_invariant: bool = False) -> ModelRunner:
    """A runner with a small KV pool: ``slots`` sessions of ``AUX_MAX_LENGTH`` positions, graphs for 10 timesteps."""
    return ModelRunner(
        tts,
        RunnerOptions(
            num_slots=slots,
            max_length=AUX_MAX_LENGTH,
            kv_cache_bytes=pool_bytes(tts, slots, AUX_MAX_LENGTH),
            cuda_graphs=graphs,
            max_timesteps=10,
            batch_invariant=batch_invariant,
        ),
    )


# ---------------------------------------------------------------------------------------------------------------
# correctness


def mixed_requests(count: int, patches: int) -> dict[int, list[Request]]:
    """``count`` sessions with different texts, seeds, guidance, timestep counts and lengths, arriving over the
    first four steps."""
    requests = []
    for i in range(count):
        length = patches + i % 3
        params = SynthesisParams(
            seed=10 + i,
            cfg_value=1.0 + 0.3 * i,
            inference_timesteps=(10, 6, 10, 4)[i % 4],
            min_len=length - 2,
            max_len=length,
        )
        requests.append(Request(f"s{i}", TEXTS[i % len(TEXTS)], params))
    third = max(count // 3, 1)
    return {0: requests[:third], 1: requests[third : 2 * third], 3: requests[2 * third :]}


BURST_SESSIONS = 16
"""Sessions of the correctness gate's burst, all arriving at once: from 16 rows on, torch's CUDA reductions may
order a row's sum differently than in a smaller batch (ATen's ``ReduceConfig``), and the mixed arrivals run fewer."""


def burst_of_copies(arrivals: dict[int, list[Request]], sessions: int) -> dict[str, Request]:
    """At least ``sessions`` copies of the arriving requests (same texts, seeds and settings, ids of their own), by
    id; ``each_alone`` of the originals is what each copy must sound like."""
    originals = [request for requests in arrivals.values() for request in requests]
    rounds = -(-sessions // len(originals))
    return {f"{r.request_id}-copy{k}": r for k in range(rounds) for r in originals}


def each_alone(runner: ModelRunner, arrivals: dict[int, list[Request]]) -> dict[str, np.ndarray]:
    audio = {}
    for requests in arrivals.values():
        for request in requests:
            audio.update(run_engine(runner, {0: [request]}).audio)
    return audio


def compare(left: dict[str, np.ndarray], right: dict[str, np.ndarray], samples_per_patch: int) -> dict[str, Any]:
    """Bitwise comparison of two runs' audio, session by session."""
    identical, mismatched = 0, []
    max_abs, first_patch = 0.0, None
    for rid, a in sorted(left.items()):
        b = right.get(rid)
        if b is None or a.shape != b.shape:
            mismatched.append(rid)
            continue
        differs = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
        if not differs.size:
            identical += 1
            continue
        max_abs = max(max_abs, float(np.nanmax(np.abs(a - b))))
        patch = int(differs[0]) // samples_per_patch
        first_patch = patch if first_patch is None else min(first_patch, patch)
    return {
        "sessions": len(left),
        "bit_identical": identical,
        "length_mismatches": mismatched,
        "max_abs_diff": max_abs,
        "first_differing_patch": first_patch,
    }


def check_correctness(tts: VoxCPM, plan: Plan) -> Outcome:
    arrivals = mixed_requests(plan.correctness_sessions, plan.correctness_patches)
    spp = tts.samples_per_patch
    result: dict[str, Any] = {"sessions": plan.correctness_sessions}
    copies = burst_of_copies(arrivals, BURST_SESSIONS)
    for path, invariant in (("batch_invariant", True), ("default", False)):
        slots = max(plan.correctness_sessions, len(copies)) if invariant else plan.correctness_sessions
        runner = aux_runner(tts, slots, graphs=plan.cuda, batch_invariant=invariant)
        batched = run_engine(runner, arrivals)
        alone = each_alone(aux_runner(tts, 1, graphs=plan.cuda, batch_invariant=invariant), arrivals)
        result[path] = {"batched_vs_alone": compare(batched.audio, alone, spp)}
        if path == "batch_invariant":
            burst = run_engine(runner, {0: [replace(request, request_id=cid) for cid, request in copies.items()]})
            expected = {cid: alone[request.request_id] for cid, request in copies.items()}
            result[path]["burst_vs_alone"] = {
                **compare(burst.audio, expected, spp),
                "widest_step_sessions": max(sessions for _, sessions in burst.steps),
            }
            if plan.cuda:
                eager = run_engine(aux_runner(tts, slots, graphs=False, batch_invariant=True), arrivals)
                result[path]["graphs_vs_eager"] = compare(batched.audio, eager.audio, spp)
            else:
                result[path]["graphs_vs_eager"] = "skipped: no CUDA"
        del runner
        release_device_memory()
    mixed, burst_gate = result["batch_invariant"]["batched_vs_alone"], result["batch_invariant"]["burst_vs_alone"]
    failures = []
    if mixed["bit_identical"] != mixed["sessions"]:
        failures.append(f"batch-invariant runner: batched differs from alone: {mixed}")
    if burst_gate["bit_identical"] != burst_gate["sessions"]:
        failures.append(f"batch-invariant runner: a burst of {len(copies)} differs from alone: {burst_gate}")
    if burst_gate["widest_step_sessions"] < BURST_SESSIONS:
        failures.append(f"the burst decoded at most {burst_gate['widest_step_sessions']} sessions in a step")
    rule = f"batch-invariant: every session bit-identical batched (mixed arrivals; a burst of {len(copies)}) and alone"
    result["gate"] = {"rule": rule, "passed": not failures}
    return Outcome(result, failures)


# ---------------------------------------------------------------------------------------------------------------
# kernels: the fused ops' calls of one step, recorded on meta, timed on CUDA


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)

    @property
    def distinct_bytes(self) -> int:
        """Bytes of the distinct elements it views (a broadcast dimension, stride 0, counts once)."""
        elements = math.prod(size for size, stride in zip(self.shape, self.stride, strict=True) if stride)
        return elements * self.dtype.itemsize

    def make(self, device: torch.device) -> torch.Tensor:
        """A tensor of this layout holding random values (integers: zeros)."""
        if not all(self.shape):
            return torch.empty(self.shape, dtype=self.dtype, device=device)
        extent = 1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.stride, strict=True))
        storage = torch.empty(extent, dtype=self.dtype, device=device)
        storage.normal_() if self.dtype.is_floating_point else storage.zero_()
        return storage.as_strided(self.shape, self.stride)

    def __str__(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')}{list(self.shape)}"


@dataclass(frozen=True)
class KernelCall:
    """One launch of a ``torch.ops.voxwire`` fused op (one Triton kernel on CUDA) as the step calls it."""

    label: str
    args: tuple[Any, ...]
    """``TensorSpec``s and the call's other arguments."""
    bytes: int
    """Distinct input bytes plus output bytes: what the launch must move at least."""

    def shapes(self) -> str:
        return ", ".join(str(a) for a in self.args if isinstance(a, TensorSpec))

    def launcher(self, device: torch.device) -> Callable[[], object]:
        """A call with fresh tensors of the recorded layouts on ``device``."""
        op = getattr(torch.ops.voxwire, self.label.removeprefix("voxwire::"))
        args = [a.make(device) if isinstance(a, TensorSpec) else a for a in self.args]
        return lambda: op(*args)


@dataclass(frozen=True)
class DecodeAttentionCall:
    """One launch of the paged decode-attention kernel: q (rows, Hq, D) over ``live`` positions per row."""

    q: TensorSpec
    cache: TensorSpec
    """Each of the key and value pools (num_blocks, block_size, Hkv, D)."""
    tables: TensorSpec
    live: int
    label: str = "paged_decode_attention"

    @property
    def bytes(self) -> int:
        rows, _, head_dim = self.q.shape
        kv_heads = self.cache.shape[2]
        moved = 2 * rows * self.live * kv_heads * head_dim * self.cache.dtype.itemsize
        return 2 * self.q.distinct_bytes + moved + self.tables.distinct_bytes + rows * 4

    def shapes(self) -> str:
        return f"q {self.q}, K/V {self.cache}, tables {self.tables}, {self.live} live positions"

    def launcher(self, device: torch.device) -> Callable[[], object]:
        from voxwire.kernels.paged_decode import paged_decode_attention

        q, keys, values = self.q.make(device), self.cache.make(device), self.cache.make(device)
        rows, width = self.tables.shape
        tables = torch.arange(1, 1 + rows * width, device=device, dtype=torch.int32).view(rows, width)
        lengths = torch.full((rows,), self.live, device=device, dtype=torch.int32)
        scale = 1 / math.sqrt(self.q.shape[-1])
        return lambda: paged_decode_attention(q, keys, values, tables, lengths, scale)


KernelLaunch = KernelCall | DecodeAttentionCall


def _tensor_bytes(values: Any) -> int:
    leaves, _ = tree_flatten(values)
    return sum(leaf.numel() * leaf.element_size() for leaf in leaves if isinstance(leaf, torch.Tensor))


class FusedOpRecorder(TorchDispatchMode):
    """Counts the calls of ``torch.ops.voxwire`` ops (one Triton launch each on CUDA) by their arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[KernelCall] = Counter()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.namespace == "voxwire":
            specs = tuple(TensorSpec.of(a) if isinstance(a, torch.Tensor) else a for a in args)
            moved = sum(s.distinct_bytes for s in specs if isinstance(s, TensorSpec)) + _tensor_bytes(out)
            self.calls[KernelCall(func.name(), specs, moved)] += 1
        return out


def meta_twin(tts: VoxCPM) -> VoxCPM:
    """The same model on the meta device (no memory), built by the same loader with the same dtypes."""
    state = {k: v.to("meta") for k, v in tts.model.state_dict().items()}
    prefix = "audio_vae."
    main = {k: v for k, v in state.items() if not k.startswith(prefix)}
    vae = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
    return model_from_weights(
        tts.config, tts.tokenizer, main, vae, device="meta", dtype=tts.dtype, vae_dtype=tts.model.audio_vae.dtype
    )


def decode_attention_calls(tts: VoxCPM, rows: int, context: int) -> Counter[KernelLaunch]:
    """Decode attention as the paged Triton kernel runs it: once per layer of each LM, ``context`` live positions
    per row, each row's blocks its own."""
    calls: Counter[KernelLaunch] = Counter()
    per_row = blocks_for(context, DEFAULT_BLOCK_SIZE)
    for lm in (tts.config.lm_config, tts.config.residual_lm):
        q = (rows, lm.num_attention_heads, lm.head_dim)
        cache = (1 + rows * per_row, DEFAULT_BLOCK_SIZE, lm.num_key_value_heads, lm.head_dim)
        call = DecodeAttentionCall(
            TensorSpec(q, contiguous_strides(q), tts.dtype),
            TensorSpec(cache, contiguous_strides(cache), tts.dtype),
            TensorSpec((rows, per_row), (per_row, 1), torch.int32),
            context,
        )
        calls[call] += lm.num_hidden_layers
    return calls


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def record_kernel_calls(tts: VoxCPM, plan: Plan) -> Counter[KernelLaunch]:
    """The kernel launches of one decode step of ``plan.rows`` rows at 10 timesteps: the runner's own step
    function (what the graphs capture) run on the meta twin, with the fused ops on their CUDA path."""
    twin = meta_twin(tts)
    per_block = DEFAULT_BLOCK_SIZE * bytes_per_position(twin)
    runner = ModelRunner(
        twin, RunnerOptions(num_slots=plan.rows, kv_cache_bytes=2 * per_block, cuda_graphs=True, max_timesteps=10)
    )
    assert runner.graphs is not None
    recorder = FusedOpRecorder()
    with torch.inference_mode(), ops.fused_on_meta(), recorder:
        runner.graphs.step(plan.rows, 10)
    return Counter[KernelLaunch](recorder.calls) + decode_attention_calls(tts, plan.rows, plan.context)


def kernel_shapes(calls: Counter[KernelLaunch], plan: Plan) -> Outcome:
    per_op: Counter[str] = Counter()
    for call, count in calls.items():
        per_op[call.label] += count
    result = {
        "rows": plan.rows,
        "timesteps": 10,
        "context": plan.context,
        "launches_per_step": sum(calls.values()),
        "distinct_calls": len(calls),
        "launches_per_op": dict(per_op.most_common()),
        "calls": [
            {"op": call.label, "shapes": call.shapes(), "per_step": count, "bytes": call.bytes}
            for call, count in calls.most_common()
        ],
    }
    failures = [] if calls else ["no fused-op call recorded"]
    return Outcome(result, failures)


def profiled_kernels(work: Callable[[], object], device: torch.device) -> list[dict[str, Any]]:
    """The CUDA kernels ``work`` launches, from a profiler trace: name, duration (us) and launch grid."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        sync(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text(encoding="utf-8")).get("traceEvents", [])
    return [
        {"name": e["name"], "us": float(e.get("dur", 0.0)), "grid": e.get("args", {}).get("grid")}
        for e in events
        if e.get("cat") == "kernel"
    ]


def ctas(grid: Any) -> int | None:
    return math.prod(grid) if isinstance(grid, list) and grid else None


def time_kernels(calls: Counter[KernelLaunch], report: Report, plan: Plan) -> Outcome:
    """Each recorded call, alone, ``plan.kernel_repeats`` times after a warm-up (the JIT compile), timed by the
    profiler's kernel durations (device time, no launch overhead); the calls costing most per step go first."""
    order = sorted(calls.items(), key=lambda item: -item[0].bytes * item[1])
    rows, truncated = [], False
    for call, per_step in order:
        if report.remaining() < 5:
            truncated = True
            break
        launch = call.launcher(plan.device)
        launch()
        sync(plan.device)
        kernels = profiled_kernels(lambda launch=launch: [launch() for _ in range(plan.kernel_repeats)], plan.device)
        seconds = sum(k["us"] for k in kernels) / plan.kernel_repeats / 1e6
        grids = [ctas(k["grid"]) for k in kernels]
        rows.append(
            {
                "op": call.label,
                "shapes": call.shapes(),
                "per_step": per_step,
                "ms": seconds * 1e3,
                "ms_per_step": seconds * 1e3 * per_step,
                "gb_per_s": call.bytes / seconds / 1e9 if seconds else None,
                "ctas": sum(g for g in grids if g) // plan.kernel_repeats if all(grids) else None,
                "kernels": sorted({k["name"] for k in kernels}),
            }
        )
        del launch
    rows.sort(key=lambda r: -r["ms_per_step"])
    result = {
        "rows": plan.rows,
        "repeats": plan.kernel_repeats,
        "ms_per_step_total": sum(r["ms_per_step"] for r in rows),
        "ctas_per_step_total": sum((r["ctas"] or 0) * r["per_step"] for r in rows),
        "timed": rows,
        "truncated_by_budget": truncated,
    }
    return Outcome(result, [f"no kernel launched for {r['op']} {r['shapes']}" for r in rows if not r["kernels"]])


# ---------------------------------------------------------------------------------------------------------------
# profile of one eager step


def profile_step(tts: VoxCPM, plan: Plan, top: int = 15) -> Outcome:
    """One decode-only step of ``plan.rows`` sessions on an eager runner (every kernel visible), profiled."""
    from torch.profiler import ProfilerActivity, profile

    runner = aux_runner(tts, plan.rows, graphs=False)
    engine = new_engine(runner, plan.rows)
    for request in same_length_requests("profile", plan.rows, 3):
        engine.add(request)
    engine.step()  # admission, the first patch, and any JIT compilation
    sync(plan.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if plan.cuda else [])
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=activities) as prof:
            began = time.perf_counter()
            outputs = engine.step()
            sync(plan.device)
            wall = time.perf_counter() - began
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text(encoding="utf-8")).get("traceEvents", [])
    engine.abort_all()
    engine.step()
    if len(outputs) != plan.rows:
        raise RuntimeError(f"the profiled step decoded {len(outputs)} rows, not {plan.rows}")
    host = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    result: dict[str, Any] = {
        "rows": plan.rows,
        "step_wall_ms": wall * 1e3,
        "top_host_ops": [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3} for e in host],
    }
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not plan.cuda:
        result["top_kernels"] = "skipped: no CUDA"
        return Outcome(result)
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        by_name.setdefault(event["name"], []).append(float(event.get("dur", 0.0)))
    busy = sum(sum(d) for d in by_name.values())
    result.update(
        {
            "kernels_per_step": len(kernels),
            "device_busy_ms": busy / 1e3,
            "top_kernels": [
                {"kernel": name[:160], "launches": len(d), "ms": sum(d) / 1e3, "share": sum(d) / busy if busy else 0}
                for name, d in sorted(by_name.items(), key=lambda item: -sum(item[1]))[:top]
            ],
        }
    )
    return Outcome(result, [] if kernels else ["the profiler saw no CUDA kernel"])


# ---------------------------------------------------------------------------------------------------------------
# the server's runner: setup, capture, memory


@dataclass
class SetupTimes:
    """Marks taken while a runner is built (``timed_setup``)."""

    began: float = 0.0
    capture_began: float | None = None
    capture_ended: float | None = None
    reserved_before_capture: int = 0
    reserved_after_capture: int = 0
    keys: list[dict[str, Any]] = field(default_factory=list)
    cost_seconds: float | None = None
    last_mark: float = 0.0
    untimed: list[str] = field(default_factory=list)


@contextmanager
def timed_setup(device: torch.device) -> Iterator[SetupTimes]:
    """While a runner is built, time ``StepGraphs.capture_all`` and each key it captures (its warm-up step and its
    capture, up to the device finishing them), and ``ModelRunner.measure_step_cost``; the code that runs is the
    engine's own. A method that is no longer there is left untimed and named in ``untimed``."""
    times = SetupTimes(began=time.perf_counter())
    cuda = device.type == "cuda"

    # Each is called as a method with the original second: (self, original, *arguments).
    def timed_capture_all(graphs: StepGraphs, capture_all: Callable[..., None]) -> None:
        sync(device)
        times.capture_began = times.last_mark = time.perf_counter()
        times.reserved_before_capture = torch.cuda.memory_reserved(device) if cuda else 0
        capture_all(graphs)
        sync(device)
        times.capture_ended = time.perf_counter()
        times.reserved_after_capture = torch.cuda.memory_reserved(device) if cuda else 0

    def timed_add(graphs: StepGraphs, add: Callable[..., None], bucket: int, timesteps: int) -> None:
        add(graphs, bucket, timesteps)
        sync(device)
        now = time.perf_counter()
        times.keys.append({"bucket": bucket, "timesteps": timesteps, "seconds": now - times.last_mark})
        times.last_mark = now

    def timed_measure(runner: ModelRunner, measure: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        cost = measure(runner, *args, **kwargs)
        times.cost_seconds = time.perf_counter() - began
        return cost

    with ExitStack() as stack:
        for owner, name, timed in (
            (StepGraphs, "capture_all", timed_capture_all),
            (StepGraphs, "_add", timed_add),
            (ModelRunner, "measure_step_cost", timed_measure),
        ):
            original = getattr(owner, name, None)
            if original is None:
                times.untimed.append(f"{owner.__name__}.{name}")
                continue
            stack.enter_context(mock.patch.object(owner, name, functools.partialmethod(timed, original)))
        yield times


def graph_pool_bytes(runner: ModelRunner) -> int | None:
    """Bytes of the segments of the graphs' private memory pool (None: the allocator does not say)."""
    if runner.graphs is None or runner.graphs.pool is None:
        return None
    pool = tuple(runner.graphs.pool)  # type: ignore[arg-type]
    segments = torch.cuda.memory_snapshot()
    if not segments or "segment_pool_id" not in segments[0]:
        return None
    return sum(s["total_size"] for s in segments if tuple(s["segment_pool_id"]) == pool)


def memory_split(tts: VoxCPM, runner: ModelRunner, times: SetupTimes, device: torch.device) -> dict[str, Any]:
    kv = runner.pool.base.tensor.nbytes + runner.pool.residual.tensor.nbytes + runner.pool.noise.nbytes
    weights = model_bytes(tts)
    split: dict[str, Any] = {"weights_gib": weights / 2**30, "kv_pool_gib": kv / 2**30}
    if device.type != "cuda":
        return {**split, "device_memory": "skipped: no CUDA"}
    free, total = torch.cuda.mem_get_info(device)
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    pool = graph_pool_bytes(runner)
    return {
        **split,
        "graph_pool_gib": None if pool is None else pool / 2**30,
        "reserved_during_capture_gib": (times.reserved_after_capture - times.reserved_before_capture) / 2**30,
        "other_allocated_gib": (allocated - weights - kv) / 2**30,
        "allocated_gib": allocated / 2**30,
        "reserved_gib": reserved / 2**30,
        "free_gib": free / 2**30,
        "total_gib": total / 2**30,
    }


def build_server_runner(tts: VoxCPM, plan: Plan) -> tuple[ModelRunner, Outcome]:
    with timed_setup(plan.device) as times:
        runner = server_runner(tts, plan.rows)
    ready = time.perf_counter()
    captured = times.capture_began is not None and times.capture_ended is not None
    setup: dict[str, Any] = {
        "sessions": plan.rows,
        "max_length": runner.max_length,
        "max_timesteps": runner.max_timesteps,
        "seconds_to_ready": ready - times.began,
        "step_cost_seconds": times.cost_seconds,
        "kv_blocks": runner.num_kv_blocks - 1,
        "block_size": runner.block_size,
        "untimed": times.untimed,
    }
    failures = [f"could not time {name}: it is no longer there" for name in times.untimed]
    try:
        setup["memory"] = memory_split(tts, runner, times, plan.device)
    except Exception as exc:  # the runner is still measured by the next phases
        setup["memory"] = f"{type(exc).__name__}: {exc}"
        failures.append(f"memory split: {setup['memory']}")
    if captured:
        assert times.capture_began is not None and times.capture_ended is not None
        seconds = [k["seconds"] for k in times.keys]
        per_timesteps: Counter[int] = Counter()
        for key in times.keys:
            per_timesteps[key["timesteps"]] += key["seconds"]
        setup.update(
            {
                "before_capture_seconds": times.capture_began - times.began,
                "capture_seconds": times.capture_ended - times.capture_began,
                "keys_captured": len(times.keys),
                "capture_seconds_by_timesteps": dict(per_timesteps),
                "slowest_keys": sorted(times.keys, key=lambda k: -k["seconds"])[:5],
                "key_seconds_median": statistics.median(seconds) if seconds else None,
                "keys": times.keys,
            }
        )
    else:
        setup["capture"] = "not timed" if plan.cuda else "skipped: no CUDA"
    if plan.cuda and (not captured or runner.graph_captures != len(times.keys)):
        failures.append(f"{runner.graph_captures} graphs captured, {len(times.keys)} timed")
    return runner, Outcome(setup, failures)


# ---------------------------------------------------------------------------------------------------------------
# timed engine runs on the server's runner


def timed_run(runner: ModelRunner, requests: list[Request]) -> dict[str, Any]:
    """All ``requests`` admitted together: the first step prefills them, the steps after it that decode every
    session are the step time."""
    captures = runner.graph_captures
    start = time.perf_counter()
    run = run_engine(runner, {0: requests})
    wall = time.perf_counter() - start
    decode = [seconds for seconds, rows in run.steps[1:] if rows == len(requests)] or [run.steps[0][0]]
    return {
        "sessions": len(requests),
        "step_ms_median": statistics.median(decode) * 1e3,
        "step_ms_min": min(decode) * 1e3,
        "first_step_ms": run.steps[0][0] * 1e3,
        "decode_steps": len(decode),
        "audio_seconds": sum(a.size for a in run.audio.values()) / runner.tts.sample_rate,
        "wall_seconds": wall,
        "graph_captures_during_run": runner.graph_captures - captures,
    }


def linear_fit(points: list[tuple[int, float]]) -> dict[str, Any]:
    """step_ms = fixed + per_row * rows, least squares, and the rows a step of ``REALTIME_STEP_MS`` holds."""
    if len(points) < 2:
        return {"fit": "needs two batch sizes"}
    rows = np.array([p[0] for p in points], dtype=np.float64)
    ms = np.array([p[1] for p in points], dtype=np.float64)
    per_row, fixed = np.polyfit(rows, ms, 1)
    fitting = [r for r, m in points if m <= REALTIME_STEP_MS]
    return {
        "fixed_ms": float(fixed),
        "per_row_ms": float(per_row),
        "rows_at_160ms_fit": max(0, int((REALTIME_STEP_MS - fixed) // per_row)) if per_row > 0 else None,
        "largest_measured_rows_within_160ms": max(fitting) if fitting else 0,
    }


def step_cost_model() -> ModuleType:
    """``scripts/count_step_cost.py``, this script's neighbour, loaded from its path (the folder of a script run by
    path need not be on ``sys.path``)."""
    name = "count_step_cost"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


class StepPrediction:
    """What the step model of ``scripts/count_step_cost.py`` predicts for a step of the curve: this runner's model
    shape and VAE dtype, this GPU's ceilings, no admissions (the timed steps make none)."""

    def __init__(self, runner: ModelRunner, plan: Plan) -> None:
        cost = step_cost_model()
        self.device = torch.cuda.get_device_name(plan.device) if plan.cuda else f"{plan.device} (no GPU)"
        self.ceilings = cost.ceilings_for(self.device)
        model = runner.tts.model
        self.model = cost.StepModel(
            runner.tts.config,
            model.audio_vae.dtype,
            self.ceilings,
            dit_fp8=model.dit_runs_fp8 and not runner.batch_invariant,
        )

    def __call__(self, rows: int, context: int) -> Any:
        """The estimate (``count_step_cost.StepEstimate``) of a step of ``rows`` rows at ``context`` live positions."""
        return self.model.estimate(rows, context)


def curve_context(runner: ModelRunner, requests: list[Request], patches: int) -> int:
    """Live KV positions per row over a timed run's decode steps, on average: the prompt and half the patches (the
    requests' texts repeat after ``TEXTS``)."""
    prompts = (runner.prepare(r).prompt_positions for r in requests[: len(TEXTS)])
    return round(statistics.mean(prompts)) + (patches + 1) // 2


def step_curve(runner: ModelRunner, plan: Plan, report: Report) -> Outcome:
    points, truncated = [], False
    try:
        predict: StepPrediction | None = StepPrediction(runner, plan)
        cost_model: dict[str, Any] = {"device": predict.device, "ceilings": predict.ceilings.name}
    except Exception as exc:  # the measured curve matters more than the prediction beside it
        predict, cost_model = None, {"error": f"{type(exc).__name__}: {exc}"}
    for count in (c for c in plan.curve if c <= runner.num_slots):
        if report.remaining() < 10:
            truncated = True
            break
        requests = same_length_requests(f"curve{count}", count, plan.patches)
        point = timed_run(runner, requests)
        points.append(point)
        predicted = ""
        if predict is not None:
            try:
                point["model_context"] = curve_context(runner, requests, plan.patches)
                estimate = predict(count, point["model_context"])
                point["model_realistic_ms"], point["model_best_ms"] = estimate.realistic_ms, estimate.best_ms
                cost_model["largest"] = estimate.as_dict()  # its terms, for the calibration
                predicted = f"; model {estimate.realistic_ms:.1f} realistic, {estimate.best_ms:.1f} best"
            except Exception as exc:
                point["model_error"] = f"{type(exc).__name__}: {exc}"
        print(
            f"  {count:4d} rows: step {point['step_ms_median']:8.1f} ms (min {point['step_ms_min']:.1f}), "
            f"first step {point['first_step_ms']:.0f} ms{predicted}",
            flush=True,
        )
    fit = linear_fit([(p["sessions"], p["step_ms_median"]) for p in points])
    captured = sum(p["graph_captures_during_run"] for p in points)
    result = {"patches": plan.patches, "points": points, "fit": fit, "truncated_by_budget": truncated}
    result["cost_model"] = cost_model
    failures = [f"{captured} graphs captured while serving"] if captured else []
    return Outcome(result, failures)


def timesteps_50(runner: ModelRunner, plan: Plan) -> Outcome:
    """The step at 50 timesteps (every row then runs the 50-timestep graph), against 10."""
    if runner.max_timesteps < 50:
        raise Skipped(f"the runner holds at most {runner.max_timesteps} timesteps")
    patches = min(plan.patches, 3)
    rows = runner.num_slots
    mixed = same_length_requests("mixed10", rows - 1, patches) + same_length_requests("mixed50", 1, patches, 50)
    runs = {
        "one_row_t10": timed_run(runner, same_length_requests("one10", 1, patches)),
        "one_row_t50": timed_run(runner, same_length_requests("one50", 1, patches, 50)),
        "all_rows_t10": timed_run(runner, same_length_requests("all10", rows, patches)),
        "all_rows_t50": timed_run(runner, same_length_requests("all50", rows, patches, 50)),
        "one_t50_among_t10": timed_run(runner, mixed),
    }
    result: dict[str, Any] = {name: run["step_ms_median"] for name, run in runs.items()}
    result["rows"] = rows
    result["t50_over_t10_all_rows"] = runs["all_rows_t50"]["step_ms_median"] / runs["all_rows_t10"]["step_ms_median"]
    result["runs"] = runs
    captured = sum(run["graph_captures_during_run"] for run in runs.values())
    return Outcome(result, [f"{captured} graphs captured while serving"] if captured else [])


def time_to_first_audio(runner: ModelRunner, plan: Plan) -> Outcome:
    """One request on an idle engine, from ``add`` to its first chunk; the first (cold) one reported apart."""
    samples = []
    for i in range(plan.ttfa_repeats + 1):
        engine = new_engine(runner, 1)
        params = SynthesisParams(seed=i, min_len=0, max_len=2)
        began = time.perf_counter()
        engine.add(Request(f"ttfa-{i}", TEXTS[i % len(TEXTS)], params))
        steps = 0
        while True:
            outputs = engine.step()
            steps += 1
            if any(out.finish_reason is FinishReason.ERROR for out in outputs):
                raise RuntimeError(f"the TTFA request failed: {outputs}")
            if any(out.audio.size for out in outputs):
                break
        samples.append({"ms": (time.perf_counter() - began) * 1e3, "steps": steps})
        engine.abort_all()
        while engine.has_work():
            engine.step()
    warm = [s["ms"] for s in samples[1:]]
    return Outcome(
        {"cold_ms": samples[0]["ms"], "ms_median": statistics.median(warm), "ms_max": max(warm), "samples": samples}
    )


def admission_noise(tts: VoxCPM, plan: Plan, patches: int = 150, repeats: int = 5) -> Outcome:
    """A request's noise for ``patches`` steps drawn as admission draws it, and patch by patch; the gate: equal."""
    config = tts.config

    def stream() -> NoiseStream:
        return NoiseStream(20261204, config.feat_dim, config.patch_size, tts.dtype, tts.device)

    def at_once() -> torch.Tensor:
        return stream().take(patches)

    def one_by_one() -> torch.Tensor:
        draws = stream()
        return torch.cat([draws.next() for _ in range(patches)])

    result: dict[str, Any] = {"path": noise_draws(tts.device), "patches": patches}
    for name, draw in (("take_ms", at_once), ("patch_by_patch_ms", one_by_one)):
        draw()  # the first launch compiles or loads its kernel
        samples = []
        for _ in range(repeats):
            sync(plan.device)
            began = time.perf_counter()
            draw()
            sync(plan.device)
            samples.append((time.perf_counter() - began) * 1e3)
        result[name] = statistics.median(samples)
    result["equal"] = torch.equal(at_once(), one_by_one())
    return Outcome(result, [] if result["equal"] else ["NoiseStream.take differs from its draws one by one"])


# ---------------------------------------------------------------------------------------------------------------
# summary


def describe_phase(name: str, entry: dict[str, Any]) -> str:
    status = entry["status"]
    line = f"   {name}: {status} ({entry.get('seconds', 0):.1f} s)"
    if status == PhaseStatus.SKIPPED.value:
        return f"{line}: {entry['reason']}"
    if status == PhaseStatus.ERROR.value:
        return f"{line}: {entry['error']}"
    if status == PhaseStatus.FAILED.value:
        return f"{line}: " + "; ".join(entry["failures"])
    return line


def summary(data: dict[str, Any]) -> str:
    phases = data["phases"]

    def result(name: str) -> dict[str, Any]:
        entry = phases.get(name, {})
        return entry.get("result", {}) if entry.get("status") in ("ok", "failed") else {}

    lines = ["", "==== voxwire gpu_check summary ===="]
    env = result("env")
    if env:
        gpu = env.get("gpu", {})
        lines.append(
            f"env: torch {env['torch']} (CUDA {env['torch_cuda']}), Triton {env['triton']}, "
            f"{gpu.get('name', env['device'])} sm_{gpu.get('capability', '-')}, attention {env['attention_path']}, "
            f"fused ops {env['fused_ops']}, noise {env['noise']}"
        )
        lines.append(f"     TF32: {env['tf32']}")
    build = result("build")
    if build:
        lines.append(
            f"model: {build['config']}, {build['parameters'] / 1e9:.2f} B parameters, {build['dtype']} / VAE "
            f"{build['vae_dtype']}, weights {build['weights_bytes'] / 2**30:.2f} GiB"
            + (
                f" (allocated by the build: {build['allocated_bytes_after_build'] / 2**30:.2f} GiB)"
                if "allocated_bytes_after_build" in build
                else ""
            )
        )
    fusion = result("fusion")
    if fusion:
        lines.append(f"fusion: {fusion['modules_checked'] - fusion['unfused_count']}/{fusion['modules_checked']} fused")
    correctness = result("correctness")
    if correctness:
        invariant = correctness["batch_invariant"]["batched_vs_alone"]
        burst = correctness["batch_invariant"]["burst_vs_alone"]
        default = correctness["default"]["batched_vs_alone"]
        lines.append(
            f"correctness gate (batch-invariant, batched == alone bit for bit): "
            f"{'PASS' if correctness['gate']['passed'] else 'FAIL'} ({invariant['bit_identical']}/"
            f"{invariant['sessions']} identical; burst {burst['bit_identical']}/{burst['sessions']}, up to "
            f"{burst['widest_step_sessions']} rows a step); default path: "
            f"{default['bit_identical']}/{default['sessions']} identical, max |diff| {default['max_abs_diff']:.3g}, "
            f"first differing patch {default['first_differing_patch']}, length mismatches "
            f"{len(default['length_mismatches'])} (reported)"
        )
    shapes = result("kernel_shapes")
    if shapes:
        lines.append(
            f"kernel launches per step at {shapes['rows']} rows: {shapes['launches_per_step']} fused-op and "
            f"decode-attention launches ({shapes['distinct_calls']} distinct calls)"
        )
    timing = result("kernel_timing")
    if timing:
        lines.append(
            f"kernels at {timing['rows']} rows: {timing['ms_per_step_total']:.1f} ms per step, "
            f"{timing['ctas_per_step_total'] / 1e6:.2f} M CTAs per step; top:"
        )
        for row in timing["timed"][:12]:
            gbs = f"{row['gb_per_s']:.0f}" if row["gb_per_s"] else "-"
            lines.append(
                f"   {row['op']:<28} x{row['per_step']:<4} {row['ms']:8.3f} ms  {row['ms_per_step']:7.2f} ms/step  "
                f"{gbs:>6} GB/s  {row['ctas']} CTAs  {row['shapes']}"
            )
    profile = result("profile")
    if profile.get("top_kernels") and isinstance(profile["top_kernels"], list):
        lines.append(
            f"eager step at {profile['rows']} rows: {profile['kernels_per_step']} kernels, device busy "
            f"{profile['device_busy_ms']:.1f} ms, wall {profile['step_wall_ms']:.1f} ms; top kernels:"
        )
        for row in profile["top_kernels"][:8]:
            lines.append(f"   {row['ms']:8.2f} ms {row['share']:5.1%} x{row['launches']:<5} {row['kernel'][:90]}")
    setup = result("server_setup")
    if setup:
        memory = setup["memory"] if isinstance(setup["memory"], dict) else {}
        lines.append(
            f"server runner ({setup['sessions']} sessions): ready in {setup['seconds_to_ready']:.1f} s "
            f"(capture {setup.get('capture_seconds', 0):.1f} s for {setup.get('keys_captured', 0)} keys, "
            f"step-cost {setup['step_cost_seconds'] or 0:.1f} s)"
        )
        lines.append(
            "   memory GiB: " + ", ".join(f"{k[:-4]} {v:.2f}" for k, v in memory.items() if isinstance(v, float))
        )
    curve = result("step_curve")
    if curve:
        fit = curve["fit"]
        lines.append(
            "step curve: " + ", ".join(f"{p['sessions']}: {p['step_ms_median']:.1f}" for p in curve["points"]) + " ms"
        )
        predicted = [p for p in curve["points"] if "model_realistic_ms" in p]
        if predicted:
            lines.append(
                f"   cost model ({curve['cost_model']['ceilings']} ceilings), realistic / best: "
                + ", ".join(
                    f"{p['sessions']}: {p['model_realistic_ms']:.1f} / {p['model_best_ms']:.1f}" for p in predicted
                )
                + " ms"
            )
        if "per_row_ms" in fit:
            lines.append(
                f"   fit {fit['fixed_ms']:.2f} ms + {fit['per_row_ms']:.4f} ms/row -> {fit['rows_at_160ms_fit']} rows "
                f"in 160 ms (measured: {fit['largest_measured_rows_within_160ms']})"
            )
    t50 = result("timesteps_50")
    if t50:
        lines.append(
            f"T=50: {t50['rows']} rows {t50['all_rows_t50']:.1f} ms vs T=10 {t50['all_rows_t10']:.1f} ms "
            f"(x{t50['t50_over_t10_all_rows']:.2f}); one T=50 among T=10 {t50['one_t50_among_t10']:.1f} ms; "
            f"one row {t50['one_row_t50']:.1f} ms vs {t50['one_row_t10']:.1f} ms"
        )
    ttfa = result("ttfa")
    if ttfa:
        lines.append(
            f"TTFA one stream: {ttfa['ms_median']:.1f} ms median, {ttfa['ms_max']:.1f} max (cold {ttfa['cold_ms']:.0f})"
        )
    noise = result("admission_noise")
    if noise:
        lines.append(
            f"admission noise ({noise['patches']} patches, {noise['path']}): {noise['take_ms']:.2f} ms vs patch by "
            f"patch {noise['patch_by_patch_ms']:.2f} ms, equal: {noise['equal']}"
        )
    bad = {n: e["status"] for n, e in phases.items() if e["status"] in ("failed", "error")}
    skipped = {n: e["reason"] for n, e in phases.items() if e["status"] == "skipped"}
    if skipped:
        lines.append(f"skipped: {skipped}")
    lines.append(f"RESULT: {'FAIL ' + str(bad) if bad else 'OK'}, {data['total_seconds']:.0f} s")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for gpu_check.json (default: $OUT, else a new temp folder)")
    parser.add_argument("--smoke", action="store_true", help="the CPU smoke run: tiny model, few rows")
    parser.add_argument("--config", help="a voxwire.tiny.configs name (default voxcpm2-shape; smoke: voxcpm2)")
    parser.add_argument("--device", help="default cuda (smoke: cpu)")
    parser.add_argument("--dtype", help="transformer dtype (default: the server's, bfloat16 on CUDA)")
    parser.add_argument(
        "--vae-dtype",
        help="AudioVAE dtype (default: the server's: on CUDA float16 when its check decode passes, else float32)",
    )
    parser.add_argument("--rows", type=int, help="the server's --max-sessions and the kernels' batch (default 768)")
    parser.add_argument("--curve", help="comma-separated session counts of the step curve")
    parser.add_argument("--patches", type=int, help="patches per session in the timed runs (default 8)")
    parser.add_argument("--budget-s", type=float, help="time budget of the whole run (default 450 s; smoke 240 s)")
    return parser.parse_args(argv)


def output_folder(out: Path | None) -> Path:
    folder = out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(tempfile.mkdtemp(prefix="gpu_check-")))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    if args.smoke:
        # One thread: on a shared CI machine, other jobs make a multi-threaded op wait on its slowest thread
        # (a step of the tiny model then takes seconds instead of a tenth of one).
        torch.set_num_threads(1)
    report = Report(output_folder(args.out) / RESULTS_FILE, plan)
    print(f"voxwire gpu_check: {plan.config} on {plan.device}, {plan.rows} rows; results in {report.path}", flush=True)
    env = report.run("env", lambda: check_env(plan))
    tf32_before = tf32_flags()
    built: list[VoxCPM] = []

    def build() -> Outcome:
        tts, info = build_model(plan)
        built.append(tts)
        return Outcome(info)

    needs_cuda = None if plan.cuda else "no CUDA"
    report.run("build", build, needs=None if env is not None else "no usable device (env did not finish)")
    needs_model = None if built else "needs the model (build did not finish)"
    tts = built[0] if built else None
    report.run("fusion", lambda: check_fusion(tts), needs=needs_model)
    report.run("correctness", lambda: check_correctness(tts, plan), needs=needs_model)
    # The server's runner first (the capacity figures matter most if the budget runs out); it holds most of the
    # device's memory, so it goes before the phases that build their own.
    runners: list[ModelRunner] = []

    def setup() -> Outcome:
        runner, outcome = build_server_runner(tts, plan)
        runners.append(runner)
        return outcome

    report.run("server_setup", setup, needs=needs_model)
    needs_runner = needs_model or (None if runners else "needs the server's runner (server_setup did not finish)")
    report.run("step_curve", lambda: step_curve(runners[0], plan, report), needs=needs_runner)
    report.run("timesteps_50", lambda: timesteps_50(runners[0], plan), needs=needs_runner)
    report.run("ttfa", lambda: time_to_first_audio(runners[0], plan), needs=needs_runner)
    runners.clear()
    release_device_memory()
    recorded: list[Counter[KernelLaunch]] = []

    def shapes() -> Outcome:
        recorded.append(record_kernel_calls(tts, plan))
        return kernel_shapes(recorded[0], plan)

    report.run("kernel_shapes", shapes, needs=needs_model)
    report.run(
        "kernel_timing",
        lambda: time_kernels(recorded[0], report, plan),
        needs=needs_cuda or needs_model or (None if recorded else "needs the kernel shapes"),
    )
    recorded.clear()
    report.run("profile", lambda: profile_step(tts, plan), needs=needs_model)
    report.run("admission_noise", lambda: admission_noise(tts, plan), needs=needs_model)
    tf32_after = tf32_flags()
    report.data["tf32_unchanged"] = tf32_after == tf32_before
    report.write()
    try:
        print(summary(report.data), flush=True)
    except Exception as exc:  # every figure is in the JSON already; the summary only formats some of them
        print(f"the summary failed ({type(exc).__name__}: {exc}); the results are in {report.path}", flush=True)
    bad = [e for e in report.data["phases"].values() if e["status"] in ("failed", "error")]
    return 1 if bad or not report.data["tf32_unchanged"] else 0


if __name__ == "__main__":
    sys.exit(main())
