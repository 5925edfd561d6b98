"""The CUDA code path of the runner and engine, run without a GPU: meta tensors stand in for cuda:1.

``voxwire.devices.cuda_device`` is pointed at cuda:1 for meta tensors, so the runner takes every CUDA branch
(graph capture and replay, pinned staging, the KV sizing profile, one sync per step) while nothing is
computed. ``torch.cuda`` is replaced by a recorder, and every aten op is watched. A run fails on:

* a device mismatch: a ``torch.cuda`` call for another device than the runner's, or a fused op (a Triton
  kernel, which launches on the current device whatever its tensors' device) or a captured op issued while
  another device is current;
* a host sync, an upload or a read-back, or an RNG op inside a graph capture (a graph would not repeat
  them); meta tensors raise by themselves on ``.item()``, ``.tolist()``, ``nonzero`` and boolean masks;
* a CPU tensor (other than a 0-dim scalar) entering a device op, which CUDA refuses and meta allows.

It runs capture, decode-only and admission steps with voice prompts and ragged timestep counts, a LoRA
persona, and a voice encode, for the three released architectures' shapes (``server/voxwire/tiny``), and
checks the per-step traffic: one upload, one read-back and one sync per timestep bucket of a decode step. The
one-utterance API computes with its device current, and voice encoding runs on a stream of its own.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from voxwire import devices
from voxwire.engine import Engine, EngineConfig, Request, RunnerOptions, SynthesisParams
from voxwire.engine import runner as runner_module
from voxwire.engine.runner import ModelRunner
from voxwire.kernels import ops
from voxwire.model.lora import LoRAAdapter, LoRAConfig, target_layers
from voxwire.model.voxcpm import VoxCPMModel
from voxwire.model_config import ModelConfig
from voxwire.prompt import VoicePrompt
from voxwire.text.tokenizer import TextTokenizer
from voxwire.tiny.configs import ALL_CONFIGS
from voxwire.tiny.tokenizer_files import write_tiny_tokenizer
from voxwire.tts import VoxCPM

CUDA = torch.device("cuda", 1)
aten = torch.ops.aten


@dataclass
class Trace:
    """What the fake CUDA runtime and the op watcher saw."""

    current: int = 0  # the current device's index, as the CUDA runtime would keep it (per thread)
    stream: FakeSideStream | None = None  # the stream made current (``torch.cuda.stream``); None: the default
    capturing: bool = False
    violations: list[str] = field(default_factory=list)
    uploads: int = 0
    reads: int = 0
    syncs: int = 0
    captures: int = 0
    pinned: set[int] = field(default_factory=set)  # data pointers of the host buffers made pinned
    fused_ops: set[str] = field(default_factory=set)  # the Triton kernels (custom ops) and fp8 GEMMs dispatched

    def fail(self, what: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(what)

    def need(self, name: str, device: Any = None) -> None:
        """A ``torch.cuda`` call: for the runner's device, named or current."""
        index = self.current if device is None else torch.device(device).index
        if index is None:
            index = self.current
        if index != CUDA.index:
            self.fail(f"torch.cuda.{name} for cuda:{index}, the runner is on {CUDA}")

    def counts(self) -> tuple[int, int, int]:
        return self.uploads, self.reads, self.syncs


class FakeStream:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace

    def synchronize(self) -> None:
        self.trace.need("Stream.synchronize")
        if self.trace.capturing:
            self.trace.fail("a stream sync inside a graph capture")
        self.trace.syncs += 1


class FakeSideStream:
    """A stream made with ``torch.cuda.Stream``: its device, and the streams it was made to wait for."""

    def __init__(self, device: Any) -> None:
        self.device = torch.device(device)
        self.waited_for: list[object] = []

    def wait_stream(self, other: object) -> None:
        self.waited_for.append(other)


def fake_cuda(trace: Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace the ``torch.cuda`` calls the runner makes with recorders of the device they act on."""
    local = threading.local()

    @contextlib.contextmanager
    def device(where: Any) -> Iterator[None]:
        previous = getattr(local, "current", 0)
        trace.current = local.current = torch.device(where).index
        try:
            yield
        finally:
            trace.current = local.current = previous

    def recorder(name: str, result: Any = None, sync: bool = False) -> Any:
        def call(device: Any = None) -> Any:
            trace.need(name, device)
            if sync:
                if trace.capturing:
                    trace.fail(f"torch.cuda.{name} inside a graph capture")
                trace.syncs += 1
            return result

        return call

    class FakeGraph:
        def replay(self) -> None:
            trace.need("CUDAGraph.replay")

    @contextlib.contextmanager
    def graph(cuda_graph: FakeGraph, pool: object = None, stream: object = None, **kwargs: object) -> Iterator[None]:
        trace.need("graph")
        assert kwargs.get("capture_error_mode") == "thread_local"
        trace.capturing, trace.captures = True, trace.captures + 1
        try:
            yield
        finally:
            trace.capturing = False

    def graph_pool_handle() -> object:
        trace.need("graph_pool_handle")
        return object()

    def side_stream(device: Any) -> FakeSideStream:
        trace.need("Stream", device)
        return FakeSideStream(device)

    @contextlib.contextmanager
    def stream(made: FakeSideStream) -> Iterator[None]:
        previous, trace.stream = trace.stream, made
        try:
            yield
        finally:
            trace.stream = previous

    for name, value in {
        "device": device,
        "current_device": lambda: trace.current,
        "synchronize": recorder("synchronize", sync=True),
        "reset_peak_memory_stats": recorder("reset_peak_memory_stats"),
        "memory_allocated": recorder("memory_allocated", 1 << 30),
        "max_memory_allocated": recorder("max_memory_allocated", 3 << 30),
        "mem_get_info": recorder("mem_get_info", (100 << 30, 141 << 30)),
        "empty_cache": lambda: trace.need("empty_cache"),
        "current_stream": lambda device=None: (trace.need("current_stream", device), FakeStream(trace))[1],
        "graph_pool_handle": graph_pool_handle,
        "CUDAGraph": FakeGraph,
        "graph": graph,
        "Stream": side_stream,
        "stream": stream,
    }.items():
        monkeypatch.setattr(torch.cuda, name, value)

    def host_buffer(shape: tuple[int, ...], dtype: torch.dtype, cuda: torch.device | None) -> torch.Tensor:
        assert cuda == CUDA, "a host buffer for the device path must be made pinned"
        tensor = torch.zeros(shape, dtype=dtype)  # no pinned allocator without CUDA: remembered as pinned
        trace.pinned.add(tensor.untyped_storage().data_ptr())
        return tensor

    monkeypatch.setattr(devices, "cuda_device", lambda where: CUDA if where.type == "meta" else None)
    monkeypatch.setattr(devices, "host_buffer", host_buffer)


class DeviceOpWatcher(TorchDispatchMode):
    """Checks every aten op against the rules of the module docstring; read-backs return zeros (no stop)."""

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        trace = self.trace
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if func is aten.copy_.default and args[0].device.type == "cpu" and args[1].is_meta:
            self._transfer("read-back", args[0], bool(kwargs.get("non_blocking", args[2] if len(args) > 2 else False)))
            trace.reads += 1
            return args[0].zero_()
        if func is aten.copy_.default and args[0].is_meta and args[1].device.type == "cpu" and args[1].dim():
            self._transfer("upload", args[1], bool(kwargs.get("non_blocking", args[2] if len(args) > 2 else False)))
            trace.uploads += 1
        elif func in (aten._to_copy.default, aten.to.dtype_layout) and kwargs.get("device") is not None:
            target = torch.device(kwargs["device"]).type
            if target == "meta" and args[0].device.type == "cpu" and args[0].dim():
                self._transfer("upload", args[0], kwargs.get("non_blocking", False))
                trace.uploads += 1
            if target == "cpu" and args[0].is_meta:  # a blocking read (``.cpu()``): zeros stand in
                if trace.capturing:
                    trace.fail("a read-back inside a graph capture")
                trace.reads += 1
                return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        elif any(t.is_meta for t in tensors):
            # aten ops run on their tensors' device; a Triton kernel (the fused custom ops) and a capture run on
            # the current one.
            if func.namespace == "voxwire" or func is aten._scaled_mm.default:
                trace.fused_ops.add(func.name())
            if (func.namespace == "voxwire" or trace.capturing) and trace.current != CUDA.index:
                trace.fail(f"{func} ran with cuda:{trace.current} current, its tensors are on {CUDA}")
            if any(t.device.type == "cpu" and t.dim() for t in tensors):
                trace.fail(f"a CPU tensor entered {func}")
            if trace.capturing and torch.Tag.nondeterministic_seeded in func.tags and draws(func, args, kwargs):
                trace.fail(f"RNG ({func}) inside a graph capture")
        return func(*args, **kwargs)

    def _transfer(self, kind: str, host: torch.Tensor, non_blocking: bool) -> None:
        if self.trace.capturing:
            self.trace.fail(f"an {kind} inside a graph capture")
        if non_blocking and host.untyped_storage().data_ptr() not in self.trace.pinned:
            self.trace.fail(f"a non-blocking {kind} from pageable memory (the host may change it before it ran)")


def draws(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a seeded op draws random numbers here: attention is tagged seeded for its dropout, off at 0."""
    if func is aten.scaled_dot_product_attention.default:
        return float(kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)) != 0.0
    return True


class MetaNoise:
    """``NoiseStream`` on meta (a CUDA generator needs CUDA): the same shapes, nothing drawn."""

    def __init__(self, seed: int, feat_dim: int, patch_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.shape, self.dtype, self.device = (feat_dim, patch_size), dtype, device

    def take(self, count: int) -> torch.Tensor:
        return torch.empty((count, *self.shape), dtype=self.dtype, device=self.device)


def meta_model(name: str, tokenizer: TextTokenizer) -> VoxCPM:
    """A released architecture's shapes on meta (fewer layers), as the loader leaves a model on an fp8-capable GPU:
    bf16 transformers, fused projections, LocDiT's GEMMs in fp8, float32 VAE."""
    # Every dimension as released, but one or two layers per stack: the path is the same, repeated less.
    shapes = copy.deepcopy(ALL_CONFIGS[name])
    shapes["lm_config"]["num_hidden_layers"] = 2
    shapes["residual_lm_num_layers"] = 1
    shapes["encoder_config"]["num_layers"] = shapes["dit_config"]["num_layers"] = 1
    config = ModelConfig.from_dict(shapes, source=name)
    with torch.device("meta"):
        model = VoxCPMModel(config)
    model.cast_transformers(torch.bfloat16)
    model.fuse_projections()
    model.quantize_dit_fp8()
    return VoxCPM(config, model, tokenizer, name=name)


def persona(tts: VoxCPM) -> LoRAAdapter:
    """A rank-4 adapter on every layer the reference's defaults target (LM, DiT and projections)."""
    config = LoRAConfig(enable_lm=True, enable_dit=True, enable_proj=True, r=4)
    layers = target_layers(tts.model, config)
    weights = {
        path: (torch.randn(4, layer.in_features), torch.randn(layer.out_features, 4)) for path, layer in layers.items()
    }
    return LoRAAdapter("synthetic", config, weights)


def voice(tts: VoxCPM, patches: int) -> VoicePrompt:
    config = tts.config
    return VoicePrompt(text="a voice", audio_patches=torch.randn(patches, config.patch_size, config.feat_dim))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    folder = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(Path(folder))
    return TextTokenizer.from_dir(folder)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["voxcpm-0.5b-shape", "voxcpm-1.5-shape", "voxcpm2-shape"])
def test_the_cuda_path_runs_on_its_own_device_without_syncs_or_rng_in_capture(
    name: str, tokenizer: TextTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = Trace()
    fake_cuda(trace, monkeypatch)
    monkeypatch.setattr(runner_module, "NoiseStream", MetaNoise)
    tts = meta_model(name, tokenizer)
    if name == "voxcpm2-shape":
        bank = tts.enable_personas(max_personas=2, max_rank=4)
        bank.register("p", persona(tts))
        # Made resident now: writing an adapter into its device slot (issue 21.9's part) is not an admission's.
        bank.acquire("p")
        bank.release("p")
    watcher = DeviceOpWatcher(trace)
    with ops.fused_on_meta(), watcher:
        runner = ModelRunner(
            tts, RunnerOptions(num_slots=2, max_length=96, max_timesteps=10, graph_timesteps=(4,), measure_cost=True)
        )
        assert trace.captures == len(runner.graphs.buckets) * 2 == runner.graph_captures  # type: ignore[union-attr]
        engine = Engine(runner, EngineConfig(max_running=2))

        def admit(rid: str, timesteps: int, prompt: VoicePrompt | None = None, who: str | None = None) -> None:
            params = SynthesisParams(max_len=4, min_len=0, seed=1, inference_timesteps=timesteps)
            engine.add(Request(rid, "hello there", params, prompt=prompt, persona=who))

        admit("plain", 10)
        admit("voiced", 4, voice(tts, 3), "p" if tts.personas is not None else None)
        before = trace.counts()
        engine.step()  # an admission step: two prefills, then both rows in two timestep buckets
        admission = [a - b for a, b in zip(trace.counts(), before, strict=True)]
        # Uploads: the prefill's inputs (one), the rows' settings, noise positions and VAE warm contexts (one: the
        # voice's warm rides with the settings, issue 34 D5), one slot index per bucket; one read-back per bucket
        # and one sync.
        assert admission == [4, 2, 1], admission
        before = trace.counts()
        engine.step()  # decode only: buckets 4 and 10
        assert [a - b for a, b in zip(trace.counts(), before, strict=True)] == [2, 2, 1]
        admit("ragged", 7)  # joins when a row frees
        while engine.has_work():
            engine.step()
        clip = np.zeros(4 * tts.model.audio_vae.encoder_hop, dtype=np.float32)
        tts.encode_audio(clip, tts.model.audio_vae.sample_rate)  # the voice encoder, off the engine thread
    assert trace.captures == runner.graph_captures, "a graph was captured while serving"
    # LocEnc's and LocDiT's attention runs the small-sequence kernel with RoPE inside, in the captured step and at
    # admission (a persona's adapters on LocDiT's q/k/v: RoPE, then the kernel).
    assert "voxwire::small_rope_attention" in trace.fused_ops, sorted(trace.fused_ops)
    if tts.personas is not None:
        assert "voxwire::small_attention" in trace.fused_ops, sorted(trace.fused_ops)
    # LocDiT's GEMMs run in fp8: their inputs quantized per row by the norms and SiLU*mul that make them (the
    # attention output by a kernel of its own, unless a persona's adapter wraps o_proj: then it runs its own GEMM),
    # then cuBLAS's scaled GEMM.
    fp8 = {"voxwire::add_rms_norm_fp8", "voxwire::silu_mul_fp8", "aten::_scaled_mm"}
    if tts.personas is None:
        fp8.add("voxwire::quantize_rows_fp8")
    assert fp8 <= trace.fused_ops, sorted(trace.fused_ops)
    assert not trace.violations, "\n".join(trace.violations)


def test_the_one_utterance_api_computes_on_its_device_and_hands_chunks_over_on_the_callers(
    tiny_tts: VoxCPM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34, D6: ``stream`` (and ``generate``) run the model with its device current, as the runner does (fused
    ops launch on the current device, cuda:0 on a fresh thread); between chunks the caller's device is current.
    The tiny CPU model stands in for one on cuda:1 (``devices.cuda_device`` says so), recording the current device
    at each model call."""
    trace = Trace()
    fake_cuda(trace, monkeypatch)
    monkeypatch.setattr(devices, "cuda_device", lambda where: CUDA)
    computed: list[int] = []
    for owner, name in ((tiny_tts.model, "prefill"), (tiny_tts.model, "decode_step"), (tiny_tts.vae_decoder, "decode")):
        original = getattr(owner, name)

        def recorded(*args: Any, original: Any = original, **kwargs: Any) -> Any:
            computed.append(trace.current)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorded)
    held = [trace.current for _ in tiny_tts.stream("Hello there.", SynthesisParams(seed=0, max_len=3, min_len=0))]
    assert held and computed
    assert set(computed) == {CUDA.index}, computed
    assert set(held) == {0}, "a chunk was handed over with the model's device left current"
    assert not trace.violations, "\n".join(trace.violations)


def test_voice_encoding_runs_on_a_stream_of_its_own(tokenizer: TextTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34, D12: ``encode_audio`` (called off the engine's thread) runs on a side stream of its device, made once
    and made to wait for what was queued before it (the weights), so the engine's steps on the default stream and
    the encode do not queue behind each other; the thread's stream is its own again after."""
    trace = Trace()
    fake_cuda(trace, monkeypatch)
    tts = meta_model("voxcpm2-shape", tokenizer)
    vae = tts.model.audio_vae
    encode = vae.encode
    encoded_on: list[tuple[int, FakeSideStream | None]] = []

    def recorded(audio: torch.Tensor) -> torch.Tensor:
        encoded_on.append((trace.current, trace.stream))
        return encode(audio)

    monkeypatch.setattr(vae, "encode", recorded)
    clip = np.zeros(4 * vae.encoder_hop, dtype=np.float32)
    with ops.fused_on_meta(), DeviceOpWatcher(trace):
        for _ in range(2):
            tts.encode_audio(clip, vae.sample_rate)
    (device, stream), again = encoded_on
    assert again == (device, stream) and device == CUDA.index
    assert isinstance(stream, FakeSideStream) and stream.device == CUDA
    assert len(stream.waited_for) == 1 and isinstance(stream.waited_for[0], FakeStream)
    assert trace.stream is None
    assert not trace.violations, "\n".join(trace.violations)
