import math

import pytest

from voxwire.engine.cost_model import StepCost, TrackedStepCost


def test_parse_reads_every_kind_of_term():
    cost = StepCost.parse("4ms + 0.17ms/row + 9.2us/token")
    assert cost.fixed_s == pytest.approx(4e-3)
    assert cost.per_row_s == pytest.approx(0.17e-3)
    assert cost.per_token_s == pytest.approx(9.2e-6)
    # 4 ms + 512 rows x 0.17 ms + 1000 tokens x 9.2 us
    assert cost.seconds(rows=512, prefill_tokens=1000) == pytest.approx(0.004 + 0.08704 + 0.0092)


def test_parse_terms_in_any_order_and_missing_kinds_are_zero():
    cost = StepCost.parse("0.1ms/row+120ms")
    assert (cost.fixed_s, cost.per_row_s, cost.per_token_s) == pytest.approx((0.12, 1e-4, 0.0))
    assert cost.seconds(200) == pytest.approx(0.14)


def test_round_trips_through_its_text():
    cost = StepCost.parse("4ms+0.17ms/row+9.2us/token")
    again = StepCost.parse(str(cost))
    assert (again.fixed_s, again.per_row_s, again.per_token_s) == pytest.approx(
        (cost.fixed_s, cost.per_row_s, cost.per_token_s)
    )


def test_sub_step_terms_price_each_timestep_bucket_a_step_holds_beyond_the_first_and_round_trip():
    """Issue 34, D4: a step whose rows fall in buckets 10 and 50 runs two sub-steps."""
    cost = StepCost.parse("4ms+1ms/row+5ms/substep@10+18ms/substep@50")
    assert dict(cost.substep_s) == pytest.approx({10: 0.005, 50: 0.018})
    assert cost.seconds(2) == cost.seconds(2, 0, [10, 10]) == cost.seconds(2, 0, [50, 40]) == pytest.approx(0.006)
    assert cost.seconds(2, 0, [10, 50]) == pytest.approx(0.006 + 0.018)
    assert TrackedStepCost(cost).seconds(2, 0, [10, 50]) == pytest.approx(0.024)
    again = StepCost.parse(str(cost))
    assert dict(again.substep_s) == pytest.approx(dict(cost.substep_s))
    with pytest.raises(ValueError, match="more than one substep@50 term"):
        StepCost.parse("1ms/substep@50+2ms/substep@50")
    with pytest.raises(ValueError, match="ascending"):
        StepCost(substep_s=((50, 0.01), (10, 0.01)))


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", "expected terms"),
        ("4ms+", "expected terms"),
        ("4 parsecs", "4parsecs"),
        ("4ms/user", "4ms/user"),
        ("-4ms", "-4ms"),
        ("4ms+5ms", "more than one fixed term"),
        ("1ms/row+2ms/row", "more than one row term"),
    ],
)
def test_bad_costs_are_refused_with_the_bad_term_named(text, names):
    with pytest.raises(ValueError, match="invalid") as raised:
        StepCost.parse(text)
    assert names in str(raised.value)


# ---- TrackedStepCost: the fit, scaled by the measured slowdown (fed durations, no clock) ----------------------------

FIT = StepCost.parse("10ms+5ms/row")


def test_a_tracked_cost_follows_a_slowdown_within_five_steps_and_recovers_as_fast():
    """Issue 29.3: on a machine that turns three times slower the prediction is three times the fit from the fifth
    slow step on (the median of the last nine), and back at the fit five steps after the machine recovers."""
    cost = TrackedStepCost(FIT)
    assert cost.seconds(4) == FIT.seconds(4) == pytest.approx(0.03)
    predictions = []
    for _ in range(6):
        cost.observe(4, 0, 3 * FIT.seconds(4))
        predictions.append(cost.seconds(4))
    assert predictions[:4] == [pytest.approx(0.03)] * 4  # four slow steps of nine: a minority
    assert predictions[4:] == [pytest.approx(0.09)] * 2
    assert cost.slowdown == pytest.approx(3.0)
    for _ in range(5):
        cost.observe(8, 0, FIT.seconds(8))  # any batch size: the ratio is the step's own
    assert cost.slowdown == pytest.approx(1.0) and cost.seconds(4) == pytest.approx(0.03)


def test_a_few_stray_slow_steps_move_nothing_and_a_stall_counts_as_at_most_twenty_times():
    cost = TrackedStepCost(FIT)
    for _ in range(4):
        cost.observe(1, 0, 100.0)  # four steps stalled for 100 s (a page storm, a debugger)
    assert cost.slowdown == 1.0
    cost.observe(1, 0, 100.0)
    assert cost.slowdown == 20.0  # a majority stalled: the most one step counts as
    for _ in range(9):
        cost.observe(1, 0, 0.0)  # a fit made on a busy machine: steps now far faster than it says
    assert cost.slowdown == 0.5


def test_a_tracked_cost_weighs_prefill_as_the_fit_does_and_skips_steps_the_fit_calls_free():
    cost = TrackedStepCost(StepCost.parse("1ms/token"))
    for _ in range(9):
        cost.observe(3, 0, 0.5)  # the fit says nothing about rows: no ratio to take
    assert cost.slowdown == 1.0
    for _ in range(5):
        cost.observe(0, 100, 0.2)  # 100 tokens: 100 ms predicted, 200 ms measured
    assert cost.seconds(0, 10) == pytest.approx(0.02)


@pytest.mark.parametrize("seconds", [-0.001, math.inf, math.nan])
def test_a_step_time_that_is_no_duration_is_refused(seconds):
    with pytest.raises(ValueError, match="step time"):
        TrackedStepCost(FIT).observe(1, 0, seconds)
