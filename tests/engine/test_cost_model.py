import pytest

from voxwire.engine.cost_model import StepCost


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
