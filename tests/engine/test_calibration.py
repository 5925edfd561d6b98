"""The runner's measured step cost: the fit recovers a linear cost, ignores a stray slow run and never goes
negative; calibration times the shapes it needs (decode batches, admissions that fit) and recovers a runner's cost
and its timestep buckets' row weights; a real (tiny) runner states a cost the real-time engine accepts, and
measuring leaves it serving as if it never had."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from voxwire.engine import Chunk, Engine, EngineConfig, Prepared, Request, RunnerOptions, SynthesisParams
from voxwire.engine.calibration import (
    CALIBRATION_SLOT,
    CostSample,
    fit_step_cost,
    measure_step_cost,
    spread,
    time_step,
)
from voxwire.engine.cost_model import StepCost
from voxwire.engine.cuda_graphs import bucket_sizes
from voxwire.engine.outputs import PrefillItem
from voxwire.engine.runner import ModelRunner
from voxwire.engine.timestep_buckets import bucket_of
from voxwire.tts import VoxCPM

SHAPES = [(1, 0), (4, 0), (16, 0), (1, 20), (1, 80), (1, 250)]


def samples_of(cost: StepCost, shapes: list[tuple[int, int]] = SHAPES, repeats: int = 3) -> list[CostSample]:
    return [CostSample(r, t, cost.seconds(r, t)) for r, t in shapes for _ in range(repeats)]


def assert_close(fitted: StepCost, expected: StepCost) -> None:
    got = (fitted.fixed_s, fitted.per_row_s, fitted.per_token_s)
    want = (expected.fixed_s, expected.per_row_s, expected.per_token_s)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


def test_the_fit_recovers_a_linear_cost() -> None:
    cost = StepCost.parse("4ms+0.17ms/row+9.2us/token")
    assert_close(fit_step_cost(samples_of(cost)), cost)


def test_a_stray_slow_run_does_not_move_the_fit() -> None:
    cost = StepCost.parse("30ms+2ms/row+50us/token")
    samples = samples_of(cost)
    samples[0] = CostSample(1, 0, 100 * cost.seconds(1))  # one of three runs at batch 1 hit a page fault
    assert_close(fit_step_cost(samples), cost)


def test_a_term_the_data_would_make_negative_is_zero_and_the_rest_refit() -> None:
    # Longer prompts measured slightly faster (noise on a term that costs next to nothing).
    samples = [CostSample(r, 0, 0.010 + 0.001 * r) for r in (1, 4, 16)]
    samples += [CostSample(1, t, 0.011 - 1e-6 * t) for t in (20, 80, 250)]
    fitted = fit_step_cost(samples)
    assert fitted.per_token_s == 0.0
    assert fitted.fixed_s > 0 and fitted.per_row_s > 0
    # Times that fall with the batch size too: the model is a constant, never a negative slope.
    flat = fit_step_cost([CostSample(r, 0, 0.02 - 0.0001 * r) for r in (1, 8, 64)])
    assert flat.per_row_s == 0.0 and flat.per_token_s == 0.0 and flat.fixed_s > 0


@pytest.mark.parametrize("bad", [[], [CostSample(1, 0, float("nan"))], [CostSample(1, 0, -1.0)]])
def test_no_or_invalid_timings_are_refused(bad: list[CostSample]) -> None:
    with pytest.raises(ValueError):
        fit_step_cost(bad)


def test_shapes_and_timing_helpers() -> None:
    assert spread(1, 16) == (1, 4, 16)
    assert spread(5, 5) == (5,)
    calls: list[int] = []
    ticks = iter(range(100))
    times = time_step(lambda: calls.append(1), 3, clock=lambda: float(next(ticks)))
    assert len(calls) == 4 and times == [1.0, 1.0, 1.0]  # one untimed warm-up run, then three timed


class VirtualTarget:
    """A ``CalibrationTarget`` whose steps take ``cost`` on a virtual clock, a row costing in proportion to its
    timestep bucket (one at 50 timesteps five times one at 10); idle steps run as CUDA graph buckets."""

    def __init__(
        self,
        cost: StepCost,
        slots: int = 20,
        max_length: int = 512,
        words_fit: bool = True,
        substep_s: dict[int, float] | None = None,
    ) -> None:
        self.cost, self.num_slots, self.max_length, self.words_fit = cost, slots, max_length, words_fit
        self.substep_s = substep_s or {}  # a bucket's sub-step fixed cost when it is not the cost's fixed part
        self.num_kv_blocks, self.block_size, self.timestep_counts = 100, 16, (4, 10, 50)
        self.patch_shape = (2, 3)
        self.now = 0.0
        self.idle_rows: set[int] = set()
        self.admitted: list[PrefillItem] = []

    def clock(self) -> float:
        return self.now

    def idle_step(self, rows: int, timesteps: int) -> tuple[int, Callable[[], object]]:
        graph = min(b for b in bucket_sizes(self.num_slots) if b >= rows)
        bucket = int(bucket_of(self.timestep_counts, timesteps))
        fixed = self.substep_s.get(bucket, self.cost.fixed_s)

        def step() -> None:
            self.idle_rows.add(graph)
            self.now += self.cost.seconds(graph * bucket / 10) - self.cost.fixed_s + fixed

        return graph, step

    def admission_step(self, item: PrefillItem) -> Callable[[], object]:
        tokens = item.prepared.prompt_positions

        def step() -> None:
            self.admitted.append(item)
            self.now += self.cost.seconds(1, tokens)

        return step

    def prepare(self, request: Request) -> Prepared:
        if not self.words_fit:
            return Prepared.refused("the input does not fit")
        prompt = request.prompt
        voiced = 0 if prompt is None or prompt.audio_patches is None else len(prompt.audio_patches)
        positions = 2 * len(request.text.split()) + 3 + voiced
        return Prepared(positions, positions + request.params.max_len)


def test_calibration_recovers_the_cost_and_each_buckets_row_weight() -> None:
    cost = StepCost.parse("4ms+0.17ms/row+9.2us/token")
    target = VirtualTarget(cost)
    fitted, weights = measure_step_cost(target, clock=target.clock)
    assert_close(fitted, cost)
    assert weights == pytest.approx({4: 0.4, 10: 1.0, 50: 5.0})
    assert target.idle_rows == {1, 4, 20}  # 1, the middle and the largest batch (all graph buckets here)


def test_a_step_with_rows_in_two_timestep_buckets_is_priced_with_the_second_sub_steps_fixed_cost() -> None:
    """Issue 34, D4: a step of T=10 rows and one T=50 row runs two sub-steps; the second's fixed cost (18 ms here,
    against 4 ms at T=10) is charged, not just the T=50 row's weight. Calibration reads the sub-step cost off one
    row at T=50 less that row's per-row cost, which is measured at the largest batch with the default bucket's fixed
    part taken off, so it reads (18 - 4) ms / slots less: what the row's weight already charges."""
    slots, cost = 768, StepCost.parse("4ms+0.17ms/row+9.2us/token")
    target = VirtualTarget(cost, slots=slots, substep_s={50: 0.018})
    fitted, weights = measure_step_cost(target, clock=target.clock)
    rows = 3 * weights[10] + weights[50]
    one_bucket = fitted.seconds(rows, 20)
    assert fitted.seconds(rows, 20, [10, 10, 10]) == one_bucket
    second = 0.018 - 0.014 / slots
    assert fitted.seconds(rows, 20, [10, 50, 10, 10]) - one_bucket == pytest.approx(second, rel=1e-9)
    assert fitted.seconds(rows, 20, [50]) == one_bucket  # one bucket: one sub-step, the fixed part's
    # A count between buckets runs in the next one up (7 in 10, 30 in 50), one above the largest in the largest.
    assert fitted.seconds(rows, 20, [7, 30]) == fitted.seconds(rows, 20, [10, 60]) == fitted.seconds(rows, 20, [10, 50])
    assert fitted.seconds(rows, 20, [4, 10, 50]) - one_bucket == pytest.approx(0.004 + second, rel=1e-9)


def test_calibration_admits_prompts_that_fit_the_calibration_slot_and_its_blocks() -> None:
    target = VirtualTarget(StepCost.parse("1ms+1us/token"), max_length=64)
    measure_step_cost(target, clock=target.clock)
    lengths = {item.prepared.prompt_positions for item in target.admitted}
    assert len(lengths) >= 2 and max(lengths) < 64
    for item in target.admitted:
        length = item.prepared.prompt_positions
        assert item.slot == CALIBRATION_SLOT and item.blocks[0] == 1  # block 0 is the null block
        assert len(item.blocks) * target.block_size >= length + 1  # the prompt and the patch it decodes


def voice_patches(target: VirtualTarget) -> list[np.ndarray]:
    """The audio patches of each admission's continuation prompt, in the order they were admitted."""
    prompts = [item.request.prompt for item in target.admitted]
    return [prompt.audio_patches for prompt in prompts if prompt is not None and prompt.audio_patches is not None]


def test_calibration_times_admissions_with_a_continuation_prompt_each_run_another_voice() -> None:
    """Issue 34, D5: the cost of admitting a continuation prompt (its LocEnc encode and VAE warm) is in the fit, and
    never read off a voice cached by the run before."""
    target = VirtualTarget(StepCost.parse("1ms+1us/token"))
    measure_step_cost(target, repeats=3, clock=target.clock)
    voices = voice_patches(target)
    assert len(voices) == 4  # one untimed run and three timed
    assert len({patches.tobytes() for patches in voices}) == 4
    assert {patches.shape for patches in voices} == {(32, 2, 3)}
    # A runner too short for 32 patches is timed with one.
    short = VirtualTarget(StepCost.parse("1ms+1us/token"), max_length=40)
    measure_step_cost(short, clock=short.clock)
    assert {len(patches) for patches in voice_patches(short)} == {1}


def test_a_runner_too_short_for_any_prompt_is_calibrated_on_decode_steps_alone() -> None:
    target = VirtualTarget(StepCost.parse("3ms+0.5ms/row"), words_fit=False)
    fitted, _ = measure_step_cost(target, clock=target.clock)
    assert not target.admitted
    assert_close(fitted, StepCost.parse("3ms+0.5ms/row"))


def speak(runner: ModelRunner, realtime: bool = False) -> list[Chunk]:
    engine = Engine(runner, EngineConfig(max_running=runner.num_slots, realtime=realtime))
    text = "Measured or not, the same words."
    engine.add(Request("r", text, SynthesisParams(seed=7, max_len=12)))
    outputs: list[Chunk] = []
    now = 0.0
    while engine.has_work():
        outputs += engine.step(now)
        engine.mark_sent(now)
        now += 0.01
    return outputs


@pytest.mark.slow
@pytest.mark.isa
def test_a_measured_runner_states_its_cost_and_serves_as_if_never_measured(tts: VoxCPM) -> None:
    measured = ModelRunner(tts, RunnerOptions(num_slots=4, max_length=256, measure_cost=True))
    cost = measured.step_cost
    assert cost.fixed_s >= 0 and cost.per_row_s >= 0 and cost.per_token_s >= 0
    assert cost.seconds(4, 100) > 0
    assert measured.chunk_seconds == tts.samples_per_patch / tts.sample_rate
    assert not measured.requests

    plain = ModelRunner(tts, RunnerOptions(num_slots=4, max_length=256))
    with pytest.raises(ValueError, match="step cost"):
        Engine(plain, EngineConfig(max_running=4, realtime=True))
    expected = speak(plain)
    for outputs in (speak(measured), speak(measured, realtime=True)):
        assert [o.finish_reason for o in outputs] == [o.finish_reason for o in expected]
        np.testing.assert_array_equal(
            np.concatenate([o.audio for o in outputs]), np.concatenate([o.audio for o in expected])
        )
