"""scripts/count_step_cost.py runs end to end on a tiny config, shows what fusion removes, and prices the step twice:
the best case and a realistic column whose every term follows its stated rule."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from tests.script_modules import load_script

from voxwire.model_config import ModelConfig
from voxwire.tiny.configs import ALL_CONFIGS

ROOT = Path(__file__).parents[2]


def count(tmp_path: Path, *flags: str, config: str = "voxcpm2", batch: str = "1,4") -> list[dict]:
    out = tmp_path / "cost.json"
    command = [sys.executable, str(ROOT / "scripts" / "count_step_cost.py"), "--config", config, "--batch", batch]
    result = subprocess.run([*command, *flags, "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text())["rows"]


@pytest.mark.slow
def test_fused_path_launches_fewer_kernels_and_moves_fewer_bytes(tmp_path: Path) -> None:
    unfused, fused = count(tmp_path), count(tmp_path, "--fused")
    assert [row["batch"] for row in unfused] == [row["batch"] for row in fused] == [1, 4]
    for before, after in zip(unfused, fused, strict=True):
        assert before["kernels"] == before["model_kernels"] + before["vae_kernels"]
        assert before["bytes"] == before["matmul_bytes"] + before["non_matmul_bytes"]
        assert after["kernels"] < before["kernels"] / 2
        assert after["non_matmul_bytes_per_row"] < before["non_matmul_bytes_per_row"] / 2
    # Launches do not grow with the batch: a step is the same kernels at any size.
    assert abs(fused[0]["kernels"] - fused[1]["kernels"]) <= 0.02 * fused[0]["kernels"]


@pytest.mark.slow
def test_voxcpm2_step_meets_the_kernel_and_traffic_targets(tmp_path: Path) -> None:
    """The review's targets for the CUDA path at VoxCPM2's shape: <= 2,500 kernels per step, <= 130 MB of
    model and <= 80 MB of VAE non-matmul traffic per row, alone and batched."""
    rows = count(tmp_path, "--fused", config="voxcpm2-shape", batch="1,64")
    for row in rows:
        assert row["kernels"] <= 2500
        assert row["model_non_matmul_bytes_per_row"] <= 130e6
        assert row["vae_non_matmul_bytes_per_row"] <= 80e6


def roofline_of(tmp_path: Path, config: str, batch: str, *flags: str) -> tuple[dict, str]:
    out = tmp_path / "roofline.json"
    command = [sys.executable, str(ROOT / "scripts" / "count_step_cost.py"), "--config", config]
    command += ["--roofline", "h200", "--batch", batch, *flags, "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text()), result.stdout


def roofline(tmp_path: Path, *flags: str) -> tuple[dict, str]:
    return roofline_of(tmp_path, "voxcpm2-shape", "768", *flags)


@pytest.mark.slow
def test_roofline_of_the_default_configuration_fits_768_streams(tmp_path: Path) -> None:
    """The counted best case of the server's default CUDA configuration (bf16 transformers, float16 VAE, fused
    kernels): one step of 768 rows within the 160 ms a 160 ms patch allows, and a lone stream's first audio
    within 25 ms. The printed total is the sum of the printed terms. (The realistic column, the capacity figure,
    is at least that.)"""
    document, printed = roofline(tmp_path)
    (row,) = document["rows"]
    assert row["batch"] == 768 and document["vae_dtype"] == "float16"
    assert row["step_ms"] == sum(term["ms"] for term in row["roofline"])
    assert row["step_ms"] <= 160.0, row["roofline"]
    assert document["ttfa_ms"] <= 25.0, document
    total_line = next(line for line in printed.splitlines() if line.strip().startswith("total step"))
    assert float(total_line.split()[-1]) == round(row["step_ms"], 2)
    assert f"time to first audio {document['ttfa_ms']:.2f} ms" in printed
    assert all(term["ms"] > 0 for term in row["roofline"])
    assert document["realistic_ms"] >= document["best_ms"] == pytest.approx(row["step_ms"])
    fits = document["rows_in_160ms"]
    assert 0 < fits["realistic"] <= fits["best"] < fits["searched_up_to"]


# ---------------------------------------------------------------------------------------------------------------
# The realistic column (issue 34): never below the best case, each term as its rule says


@pytest.fixture(scope="module")
def cost() -> ModuleType:
    return load_script(ROOT / "scripts" / "count_step_cost.py", "count_step_cost")


def step_model(cost: ModuleType, config: str = "voxcpm2", vae_dtype: torch.dtype = torch.float16, **workload: Any):
    model_config = ModelConfig.from_dict(ALL_CONFIGS[config], source=config)
    return cost.StepModel(model_config, vae_dtype, cost.CEILINGS["h200"], workload=cost.Workload(**workload))


@pytest.mark.parametrize("config", ["voxcpm2", "voxcpm-16k", "voxcpm2-b"])
@pytest.mark.parametrize("vae_dtype", [torch.float16, torch.float32])
def test_the_realistic_column_is_never_below_the_best_case(
    cost: ModuleType, config: str, vae_dtype: torch.dtype
) -> None:
    model = step_model(cost, config, vae_dtype)
    for rows, buckets in ((1, ()), (3, ()), (40, ()), (9, ((50, 2),))):
        estimate = model.estimate(rows, context=24, buckets=buckets)
        assert estimate.realistic_ms >= estimate.best_ms > 0
        for term in estimate.terms:
            assert term.realistic_ms >= term.best_ms >= 0, term
            assert term.assumption, term
        # The best column is the roofline's: the same launches at the same ceilings.
        launches = model.step_counter(rows - sum(n for _, n in buckets), 24, 10).launches
        roofline = sum(term["ms"] for term in cost.roofline(launches, model.ceilings))
        sub_steps = sum(term.best_ms for term in estimate.terms if term.name.startswith("sub-step"))
        assert estimate.best_ms == pytest.approx(roofline + sub_steps)


def sdpa(cost: ModuleType, queries: int, keys: int, rows: int = 1536) -> Any:
    heads, head_dim = 16, 128
    dims = (rows, heads, queries, keys, head_dim)
    flops = 4 * rows * heads * queries * keys * head_dim
    moved = 2 * 3 * rows * heads * max(queries, keys) * head_dim
    return cost.Launch("model", "dit", "attention", "attention", moved, flops, rows * heads, False, "sdpa", dims)


def test_attention_is_priced_by_the_whole_tiles_it_runs(cost: ModuleType) -> None:
    """DiT's 11 tokens and LocEnc's 5 each run one whole 128 x 64 flash tile per (row, head): they cost what 64
    tokens cost, and one key past the tile costs a second tile."""
    efficiencies, h200 = cost.EFFICIENCIES, cost.CEILINGS["h200"]
    tile_q, tile_k = efficiencies.attention_tile
    whole = efficiencies.seconds(sdpa(cost, tile_k, tile_k), h200)
    assert efficiencies.seconds(sdpa(cost, 11, 11), h200) == whole
    assert efficiencies.seconds(sdpa(cost, 5, 5), h200) == whole
    assert efficiencies.padded_attention_flops((1, 1, 11, 11, 128)) == 4 * tile_q * tile_k * 128
    assert efficiencies.padded_attention_flops((1, 1, 11, tile_k + 1, 128)) == 2 * 4 * tile_q * tile_k * 128
    # The best case charges the bytes and the useful work, not the tiles.
    assert sdpa(cost, 11, 11).seconds(h200) < whole / 5


def test_locenc_and_dit_attention_are_counted_as_the_small_kernels_tiles(cost: ModuleType) -> None:
    """On the fused path LocEnc's and LocDiT's attention is the small-sequence kernel (with RoPE inside: issue 34
    item 7): one program per (row, kv head) running its stacked query heads padded to a power of two (at least 16)
    against its keys padded to 16. Both columns charge that padded work; no SDPA and no RoPE launch of their own is
    left in LocEnc and LocDiT."""
    config = ModelConfig.from_dict(ALL_CONFIGS["voxcpm2"], source="voxcpm2")
    counter = cost.CostCounter()
    cost.count_step(config, 3, 24, 10, True, counter=counter)
    assert not [launch for launch in counter.launches if launch.pricing == "sdpa"]
    small = [launch for launch in counter.launches if launch.name == "voxwire.small_rope_attention"]
    assert not [launch for launch in counter.launches if launch.part == "dit" and launch.name == "voxwire.rope_qk"]
    # The tiny VoxCPM2: 4 query heads over 2 kv heads of 16 dims. LocDiT: 2 layers x 9 passes (10 timesteps,
    # CFG-Zero* skips the first) over 2 x 3 rows, 2 x 11 query rows padded to 32; LocEnc: 1 layer over 3 rows (the
    # step's patches), 2 x 5 query rows padded to 16. Keys padded to 16.
    expected = {("dit", (12, 32, 16, 16)): 18, ("lm", (6, 16, 16, 16)): 1}
    assert Counter((launch.part, launch.dims) for launch in small) == expected
    for launch in small:
        programs, rows, keys, head_dim = launch.dims
        assert launch.kind == "attention" and launch.ctas == programs
        assert launch.flops == 4 * programs * rows * keys * head_dim


def test_the_small_attention_kernel_costs_a_fraction_of_sdpas_padded_tiles(cost: ModuleType) -> None:
    """VoxCPM2's DiT attention at 768 rows (1,536 with CFG): the kernel's 128 x 16 tiles per (row, kv head) against
    SDPA's 128 x 64 per (row, head); realistic at least the best case, and bound by its bytes at these tiles."""
    efficiencies, h200 = cost.EFFICIENCIES, cost.CEILINGS["h200"]
    programs, rows, keys, head_dim = 1536 * 2, 128, 16, 128
    moved = 2 * (1536 * 16 * 11 * head_dim * 2) + 2 * (1536 * 2 * 11 * head_dim * 2)  # q read, out written; k, v
    dims = (programs, rows, keys, head_dim)
    flops = cost.small_attention_flops(dims)
    kernel = cost.Launch("model", "dit", "attention", "n", moved, flops, programs, False, "small_attention", dims)
    realistic = efficiencies.seconds(kernel, h200)
    assert realistic >= kernel.seconds(h200)
    assert realistic == moved / (h200.bandwidth * efficiencies.bandwidth_share["small_attention"])
    assert realistic < efficiencies.seconds(sdpa(cost, 11, 11), h200) / 5


def test_gemm_time_follows_waves_and_depth(cost: ModuleType) -> None:
    efficiencies = cost.EFFICIENCIES
    sms = efficiencies.sms
    full_wave = (1, 128 * sms, 256, 4096)  # one 128 x 256 tile per SM
    one_more = (1, 128 * sms + 1, 256, 4096)
    rate = 1e15

    def per_flop(dims: tuple[int, ...]) -> float:
        return efficiencies.gemm_seconds(dims, rate, math.inf) / (2 * math.prod(dims))

    # A row past a full wave leaves most SMs idle in the next one: more time per FLOP.
    assert per_flop(one_more) > 1.3 * per_flop(full_wave)
    # K's rule: a tile costs K + epilogue_k steps.
    deep, shallow = (1, 128 * sms, 256, 4096), (1, 128 * sms, 256, 1024)
    ratio = efficiencies.gemm_seconds(deep, rate, math.inf) / efficiencies.gemm_seconds(shallow, rate, math.inf)
    assert ratio == pytest.approx((4096 + efficiencies.epilogue_k) / (1024 + efficiencies.epilogue_k))
    # The rules give the 8192-cubed GEMM the ceiling was measured on exactly the ceiling, before the sustained clock.
    h200 = cost.CEILINGS["h200"]
    side = (1, 8192, 8192, 8192)
    reference = 2 * 8192**3 / efficiencies.gemm_seconds(side, efficiencies.tensor_rate(h200, False), math.inf)
    assert reference == pytest.approx(h200.tensor_flops * efficiencies.sustained_clock)


@pytest.mark.parametrize("kind", ["elementwise", "row", "low_occupancy", "indexed", "reduction", "depthwise", "paged"])
def test_memory_bound_launches_run_at_their_kinds_share_of_the_bandwidth(cost: ModuleType, kind: str) -> None:
    efficiencies, h200 = cost.EFFICIENCIES, cost.CEILINGS["h200"]
    moved = 10**9
    dims = (1, 16, 16) if kind == "paged" else ()
    launch = cost.Launch("model", "lm", "other", "op", moved, 0, 1, False, kind, dims)
    assert efficiencies.seconds(launch, h200) == moved / (h200.bandwidth * efficiencies.bandwidth_share[kind])
    assert efficiencies.seconds(launch, h200) > launch.seconds(h200)


def test_kv_writes_are_charged_for_what_they_write(cost: ModuleType) -> None:
    """A KV-cache write (``index_put_``) runs over the positions it writes: its programs and bytes do not grow with
    the cache it writes into (they did: 3 ms of a 768-row step at context 256, more at longer ones)."""
    config = ModelConfig.from_dict(ALL_CONFIGS["voxcpm2"], source="voxcpm2")

    def writes(context: int) -> list[tuple[int, int]]:
        counter = cost.CostCounter()
        cost.count_step(config, 2, context, 10, True, counter=counter)
        return [(launch.ctas, launch.moved) for launch in counter.launches if launch.name == "aten.index_put_"]

    short, long = writes(16), writes(1024)
    assert short and short == long


def test_the_step_is_counted_with_the_weights_frozen_as_served(cost: ModuleType) -> None:
    """The server's model needs no gradients, which changes how ``matmul`` dispatches some projections."""
    config = ModelConfig.from_dict(ALL_CONFIGS["voxcpm2"], source="voxcpm2")
    model = cost.build_model(config, True, torch.float16)
    assert not model.training and not any(parameter.requires_grad for parameter in model.parameters())


def test_admissions_scale_with_the_rows_each_step_admits(cost: ModuleType) -> None:
    model = step_model(cost, request_patches=10.0, continuation_share=0.5)

    def admission_terms(rows: int, workload: Any) -> dict[str, float]:
        return {term.name: term.realistic_ms for term in model.admission_terms(rows, workload)}

    twenty, forty = admission_terms(20, model.workload), admission_terms(40, model.workload)
    noise = "admissions: noise draws"
    continued, warm = (
        "admissions: continuation prompts (LocEnc encode)",
        "admissions: continuation prompts (one batched VAE warm)",
    )
    assert forty[noise] == pytest.approx(2 * twenty[noise]) and twenty[noise] > 0
    # Issue 34 item 7: the step's continuation prompts are encoded together, in one LocEnc call over all their
    # patches (10 a request here), not one call each.
    patches = round(model.workload.request_patches)
    assert twenty[continued] == pytest.approx(model.eager_seconds(model.continuation_launches(patches)) * 1e3)
    assert forty[continued] == pytest.approx(model.eager_seconds(model.continuation_launches(2 * patches)) * 1e3)
    assert 0 < forty[continued] < 2 * twenty[continued]
    assert len(model.continuation_launches(2 * patches)) == len(model.continuation_launches(patches))
    assert admission_terms(20, cost.Workload(10.0, 89, 0.0))[continued] == 0
    # D5: the step's continuations warm the VAE in one batch: one warm of two rows, not two warms of one.
    assert twenty[warm] == pytest.approx(model.eager_seconds(model.warm_launches(1)) * 1e3)
    assert forty[warm] == pytest.approx(model.eager_seconds(model.warm_launches(2)) * 1e3)
    assert forty[warm] < 2 * twenty[warm]
    assert len(model.warm_launches(2)) == len(model.warm_launches(1))
    assert admission_terms(20, cost.Workload(10.0, 89, 0.0))[warm] == 0
    # A step's admissions prefill together, in one eager prefill (no cheaper than its host's launches); with fewer
    # than one a step, that share of the steps prefills one.
    prefill = "admissions: one batched eager prefill"
    positions = model.workload.prompt_positions
    assert twenty[prefill] == pytest.approx(model.eager_seconds(model.prefill_launches(2, positions)) * 1e3)
    assert forty[prefill] < 2 * twenty[prefill]
    one = model.eager_seconds(model.prefill_launches(1, positions)) * 1e3
    assert admission_terms(5, model.workload)[prefill] == pytest.approx(one / 2)


def test_another_timestep_bucket_pays_its_own_sub_step(cost: ModuleType) -> None:
    """D4: one row at 50 timesteps runs its own graph: its fixed cost (every launch of the step again, the
    weights read again) is charged, not just a row's share."""
    model = step_model(cost)
    alone = model.estimate(8, 24)
    mixed = model.estimate(8, 24, buckets=((50, 1),))
    (sub_step,) = [term for term in mixed.terms if term.name.startswith("sub-step")]
    gaps = sum(term.realistic_ms for term in model.graph_terms(1, 24, 50) if term.name.startswith("launch gaps"))
    assert sub_step.realistic_ms == pytest.approx(sum(term.realistic_ms for term in model.graph_terms(1, 24, 50)))
    assert mixed.realistic_ms - alone.realistic_ms > gaps > 0


def test_rows_within_finds_the_last_row_that_fits(cost: ModuleType) -> None:
    def linear(rows: int) -> float:
        return 10.0 + 0.5 * rows

    assert cost.rows_within(linear, 160.0, 1, 4096) == 300
    assert cost.rows_within(linear, 5.0, 1, 4096) == 0
    assert cost.rows_within(linear, 1e9, 1, 4096) == 4096
    assert cost.rows_within(linear, 160.0, 3, 4096) == 300


def test_the_json_has_both_totals_and_the_rows_that_fit(tmp_path: Path) -> None:
    document, printed = roofline_of(tmp_path, "voxcpm2", "4", "--fit-limit", "64")
    (row,) = document["rows"]
    assert document["best_ms"] == row["best_ms"] and document["realistic_ms"] == row["realistic_ms"]
    assert row["realistic_ms"] == pytest.approx(sum(term["realistic_ms"] for term in row["terms"]))
    assert row["best_ms"] == pytest.approx(sum(term["best_ms"] for term in row["terms"]))
    assert row["best_ms"] == pytest.approx(row["step_ms"])  # today's roofline
    fits = document["rows_in_160ms"]
    assert fits == {"best": 64, "realistic": 64, "searched_up_to": 64}  # a tiny model: every row searched fits
    assert f"best case {row['best_ms']:.2f} ms, realistic {row['realistic_ms']:.2f} ms" in printed
    assert "rows whose step fits 160 ms: best case 64, realistic 64" in printed
    assert document["assumptions"]["workload"]["request_patches"] > 0


def test_the_ceilings_follow_the_gpu_name(cost: ModuleType) -> None:
    assert cost.ceilings_for("NVIDIA H100 80GB HBM3").name == "h100"
    assert cost.ceilings_for("NVIDIA H200").name == "h200"
    assert cost.ceilings_for("cpu (no GPU)").name == "h200"


@pytest.mark.slow
def test_768_voxcpm2_rows_fit_the_step_by_the_realistic_estimate(cost: ModuleType) -> None:
    """Issue 34 item 7: VoxCPM2 at 768 rows with the default configuration (fp8 LocDiT GEMMs, float16 VAE,
    admissions at steady state) fits the 160 ms of audio a step makes by the realistic estimate (153.8 ms when
    written, 204.1 before fp8 DiT GEMMs, the fused quantizers, RoPE inside the small-attention kernel and one LocEnc
    encode a step); the best case stays below it."""
    model = step_model(cost, config="voxcpm2-shape")
    estimate = model.estimate(768, 256)
    assert estimate.best_ms < estimate.realistic_ms <= cost.STEP_BUDGET_MS
