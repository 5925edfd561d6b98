"""Engine.step() with a fake runner: finish reasons, aborts, runner failures, and no leaked slots."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from voxwire.engine import Engine, EngineConfig, FinishReason, Prepared, RunnerOutput, StepPlan


def _drain(engine: Engine, limit: int = 1000) -> list:
    outputs = []
    for _ in range(limit):
        if not engine.has_work():
            return outputs
        outputs += engine.step()
    raise AssertionError("engine did not drain")


def _stream_of(outputs, rid):
    return [o for o in outputs if o.request_id == rid]


def test_new_session_gets_its_first_chunk_in_the_step_that_admits_it(make_engine, make_request, chunk_of):
    engine, runner = make_engine()
    engine.add(make_request("a"))
    [output] = engine.step()
    assert output.request_id == "a" and output.finish_reason is None
    np.testing.assert_array_equal(output.audio, chunk_of("a", 0))
    assert runner.plans[0].prefills[0].request.text == "hello world"


def test_length_cap_ends_the_stream_after_cap_chunks(make_engine, make_request, chunk_of):
    engine, _ = make_engine()
    engine.add(make_request("a", max_len=5))  # text cap 76, max_len 5
    outputs = _drain(engine)
    assert [o.finish_reason for o in outputs] == [None] * 4 + [FinishReason.LENGTH]
    for i, output in enumerate(outputs):
        np.testing.assert_array_equal(output.audio, chunk_of("a", i))


def test_stop_flag_counts_only_after_min_len(make_engine, make_request):
    engine, _ = make_engine(stop=lambda rid, i: True)
    engine.add(make_request("a", min_len=3))
    outputs = _drain(engine)
    assert len(outputs) == 5 and outputs[-1].finish_reason is FinishReason.STOP  # i = 4 is the first i > 3


def test_abort_mid_stream_frees_the_slot_and_silences_the_id(make_engine, make_request):
    engine, runner = make_engine()
    engine.add(make_request("a"))
    engine.add(make_request("b"))
    for _ in range(3):
        engine.step()
    assert engine.abort("a") and not engine.abort("a")
    assert engine.num_running == 1  # freed at once, before the next step
    final = _stream_of(engine.step(), "a")
    assert [(o.finish_reason, o.audio.size) for o in final] == [(FinishReason.ABORTED, 0)]
    assert runner.plans[-1].released == ("a",) and "a" not in runner.rows
    later = _drain(engine)
    assert not _stream_of(later, "a") and later[-1].request_id == "b"
    assert runner.is_empty


def test_abort_of_a_waiting_request_never_reaches_the_runner(make_engine, make_request):
    engine, runner = make_engine(config={"max_running": 1})
    engine.add(make_request("a"))
    engine.add(make_request("b"))
    engine.step()
    assert engine.abort("b") and engine.num_waiting == 0
    assert [o.finish_reason for o in _stream_of(engine.step(), "b")] == [FinishReason.ABORTED]
    assert all(p.request_id != "b" for plan in runner.plans for p in plan.prefills)


def test_prefill_error_fails_only_that_request(make_engine, make_request):
    engine, runner = make_engine(prefill_error=lambda r: "text has no tokens" if r.text == "bad" else None)
    engine.add(make_request("a"))
    engine.add(make_request("x", text="bad"))
    outputs = engine.step()
    assert [(o.request_id, o.finish_reason, o.error) for o in outputs] == [
        ("a", None, None),
        ("x", FinishReason.ERROR, "text has no tokens"),
    ]
    assert engine.num_running == 1
    _drain(engine)
    assert runner.is_empty


def test_row_error_mid_stream_fails_only_that_row(make_engine, make_request):
    engine, _ = make_engine(row_error=lambda rid, i: "nan in latents" if (rid, i) == ("a", 2) else None)
    engine.add(make_request("a"))
    engine.add(make_request("b"))
    outputs = _drain(engine)
    assert [o.finish_reason for o in _stream_of(outputs, "a")] == [None, None, FinishReason.ERROR]
    assert _stream_of(outputs, "b")[-1].finish_reason is FinishReason.LENGTH


def test_runner_exception_fails_every_session_of_the_step_and_frees_their_slots(make_engine, make_request):
    engine, runner = make_engine(fail=lambda plan: len(plan.request_ids) == 2, config={"max_running": 2})
    for rid in "abc":
        engine.add(make_request(rid))
    outputs = engine.step()  # a and b are admitted, then the forward pass fails
    assert {o.request_id for o in outputs} == {"a", "b"}
    assert all(o.finish_reason is FinishReason.ERROR and "injected runner failure" in o.error for o in outputs)
    assert engine.num_running == 0 and engine.num_waiting == 1
    assert runner.plans[-1].moves == ()  # released highest slot first: nothing to compact
    rest = _drain(engine)
    assert {o.request_id for o in rest} == {"c"} and rest[-1].finish_reason is FinishReason.LENGTH
    assert runner.is_empty


def test_a_request_is_prepared_once_when_it_is_added_and_its_prefill_carries_that(make_engine, make_request):
    """The runner lays each request out once (``Runner.prepare``), on ``add``; waiting, admitted and prefilled it is
    never laid out again (FakeRunner checks that each prefill carries the ``Prepared`` made for its request)."""
    engine, runner = make_engine(config={"max_running": 1})
    for rid in "abc":
        engine.add(make_request(rid, max_len=2))
    assert runner.prepared == ["a", "b", "c"]
    outputs = _drain(engine)
    assert {o.request_id for o in outputs if o.finished} == {"a", "b", "c"}
    assert runner.prepared == ["a", "b", "c"]


def test_a_streams_first_chunk_reports_its_prompt_positions(make_engine, make_request):
    """What the runner laid out (FakeRunner: a position per character) reaches the caller once, on the first chunk:
    the frontends report it (the SSE ``usage``) without measuring the text themselves."""
    engine, _ = make_engine()
    engine.add(make_request("a", "twelve chars", max_len=3))
    assert [o.prompt_positions for o in _drain(engine)] == [12, None, None]


class _ScriptedRunner:
    """Answers every plan with ``respond(plan)``, right or wrong."""

    num_slots = 4
    num_kv_blocks = 1024
    block_size = 16
    graph_captures = 0
    graph_capture_seconds = 0.0

    def __init__(self, respond) -> None:
        self.respond = respond

    def prepare(self, request) -> Prepared:
        return Prepared(10, 10)

    def execute(self, plan: StepPlan) -> RunnerOutput:
        return self.respond(plan)


def _good_chunk(plan):
    return tuple(np.zeros(4, np.float32) for _ in plan.request_ids)


def test_each_steps_outputs_share_its_wall_clock_timing_and_batch(make_engine, make_request):
    delay = 0.002
    engine, runner = make_engine(delay=delay, config={"max_running": 2})
    engine.add(make_request("a", max_len=2))
    engine.add(make_request("b", max_len=4))
    engine.add(make_request("c", max_len=1))  # waits for a's slot
    steps = []
    for _ in range(4):
        before = time.time_ns()
        outputs = engine.step()
        after = time.time_ns()
        step = outputs[-1].step
        assert step is not None and all(output.step is step for output in outputs)  # one object per step
        assert before <= step.started_ns < step.ended_ns <= after
        assert step.duration_ns >= delay * 1e9  # the forward pass is inside the step's time
        assert step.rows == len(runner.plans[-1].request_ids)
        steps.append(step)
    assert [step.rows for step in steps] == [2, 2, 2, 1]  # c takes a's slot for one patch
    assert all(later.started_ns >= earlier.ended_ns for earlier, later in itertools.pairwise(steps))


def test_outputs_no_forward_pass_made_have_no_step(make_engine, make_request):
    engine, _ = make_engine(fail=lambda plan: "b" in plan.request_ids, config={"max_running": 1})
    engine.add(make_request("a", max_len=1))
    engine.add(make_request("b"))
    engine.add(make_request("c"))
    assert [output.step is not None for output in engine.step()] == [True]  # a's only patch
    engine.abort("c")
    outputs = engine.step()  # c was aborted while it waited; b's forward pass fails
    assert [(o.request_id, o.finish_reason, o.step) for o in outputs] == [
        ("c", FinishReason.ABORTED, None), ("b", FinishReason.ERROR, None),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("respond", "message"),
    [
        pytest.param(lambda plan: RunnerOutput((), (), {"a": 9}), "one per decode row", id="no chunks"),
        pytest.param(lambda plan: RunnerOutput(_good_chunk(plan), (False,)), "do not match", id="no length cap"),
        pytest.param(lambda plan: RunnerOutput((np.zeros(4),), (False,), {"a": 9}), "1-D float32", id="float64 chunk"),
        pytest.param(
            lambda plan: RunnerOutput((np.zeros((1, 4), np.float32),), (False,), {"a": 9}), "1-D", id="2-D chunk"
        ),
        pytest.param(lambda plan: RunnerOutput(_good_chunk(plan), (False,), {"a": 0}), ">= 1", id="zero cap"),
    ],
)
def test_runner_output_that_breaks_the_contract_fails_the_step(respond, message, make_request):
    engine = Engine(_ScriptedRunner(respond), EngineConfig(max_running=4))
    engine.add(make_request("a"))
    [output] = engine.step()
    assert output.finish_reason is FinishReason.ERROR and message in output.error
    assert engine.num_running == 0


def test_a_prefill_that_succeeds_and_then_fails_its_first_decode_is_an_error(make_request):
    def respond(plan):
        return RunnerOutput((np.zeros(0, np.float32),), (False,), {"a": 9}, {"a": "decode failed"})

    engine = Engine(_ScriptedRunner(respond), EngineConfig(max_running=4))
    engine.add(make_request("a"))
    [output] = engine.step()
    assert (output.finish_reason, output.error) == (FinishReason.ERROR, "decode failed")


def test_engine_rejects_more_running_than_runner_slots(make_engine):
    with pytest.raises(ValueError, match=r"max_running=9 .* only 8 slots"):
        make_engine(config={"max_running": 9})


def test_add_checks_the_configured_limits(make_engine, make_request):
    engine, _ = make_engine()
    with pytest.raises(ValueError, match=r"^cfg_value=11"):
        engine.add(make_request("a", cfg_value=11.0))
    assert not engine.has_work()


def test_housekeeping_of_the_last_session_is_flushed(make_engine, make_request):
    engine, runner = make_engine()
    engine.add(make_request("a", max_len=1))
    engine.step()
    assert not engine.has_unfinished() and engine.has_work()
    assert engine.step() == [] and runner.plans[-1].released == ("a",)
    assert runner.is_empty and not engine.has_work()


def test_arrivals_never_skip_running_sessions(make_engine, make_request):
    engine, runner = make_engine(config={"max_prefill_tokens_per_step": 20})
    engine.add(make_request("a"))
    engine.step()
    for i in range(6):
        engine.add(make_request(f"n{i}", "fifteen letters"))
        engine.add(make_request(f"m{i}", "fifteen letters"))
        outputs = engine.step()
        assert "a" in {o.request_id for o in outputs}
        assert len(runner.plans[-1].prefills) == 1  # 15 + 15 > 20: one admission per step
