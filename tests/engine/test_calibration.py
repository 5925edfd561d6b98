"""The runner's measured step cost: the fit recovers a linear cost, ignores a stray slow run and never goes
negative; a real (tiny) runner states a cost the real-time engine accepts, and measuring leaves it serving as
if it never had."""

from __future__ import annotations

import numpy as np
import pytest

import voxwire
from voxwire.engine import Chunk, Engine, EngineConfig, Request, RunnerOptions, SynthesisParams
from voxwire.engine.calibration import CostSample, fit_step_cost, spread, time_step
from voxwire.engine.cost_model import StepCost
from voxwire.engine.runner import ModelRunner
from voxwire.tiny.checkpoint import make_tiny_checkpoint
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


@pytest.fixture(scope="module")
def tts(tmp_path_factory: pytest.TempPathFactory) -> VoxCPM:
    return voxwire.load_model(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "v2", "voxcpm2"), device="cpu")


def speak(runner: ModelRunner, realtime: bool = False) -> list[Chunk]:
    engine = Engine(runner, EngineConfig(max_running=runner.num_slots, realtime=realtime))
    text = "Measured or not, the same words."
    engine.add(Request("r", text, len(runner.tts.tokenizer.encode(text)) + 1, SynthesisParams(seed=7, max_len=12)))
    outputs: list[Chunk] = []
    now = 0.0
    while engine.has_work():
        outputs += engine.step(now)
        engine.mark_sent(now)
        now += 0.01
    return outputs


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
