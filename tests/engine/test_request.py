"""Request values, parameter validation, status enums and the per-step finish rule."""

from __future__ import annotations

import math

import pytest

from voxwire.engine import EngineConfig, ParamLimits, Request, RequestStatus, SynthesisParams
from voxwire.engine.request import FINISH_REASONS, Prepared, RequestRecord
from voxwire.protocol.wire import MAX_SEED, ProtocolError, Start


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"cfg_value": math.nan}, "cfg_value", id="cfg nan"),
        pytest.param({"cfg_value": math.inf}, "cfg_value", id="cfg inf"),
        pytest.param({"cfg_value": "2"}, "cfg_value", id="cfg str"),
        pytest.param({"inference_timesteps": 0}, "inference_timesteps", id="timesteps 0"),
        pytest.param({"inference_timesteps": 2.5}, "inference_timesteps", id="timesteps float"),
        pytest.param({"min_len": -1}, "min_len", id="min_len negative"),
        pytest.param({"max_len": 0}, "max_len", id="max_len 0"),
        pytest.param({"max_len": True}, "max_len", id="max_len bool"),
        pytest.param({"seed": -1}, "seed", id="seed negative"),
    ],
)
def test_invalid_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}="):
        SynthesisParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"playback_lead_s": -0.1}, "playback_lead_s", id="lead negative"),
        pytest.param({"playback_due": math.inf}, "playback_due", id="due inf"),
        pytest.param({"playback_speed": 0.0}, "playback_speed", id="speed 0"),
        pytest.param({"playback_speed": math.nan}, "playback_speed", id="speed nan"),
        pytest.param({"playback_speed": "2"}, "playback_speed", id="speed str"),
    ],
)
def test_invalid_playback_inputs_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}="):
        Request("r", "hello", **kwargs)


def test_the_seed_bound_is_the_wire_protocols():
    """One bound for a seed, whatever the transport: a request and a WebSocket ``start`` refuse the same seeds."""
    SynthesisParams(seed=MAX_SEED - 1)
    Start(seed=MAX_SEED - 1).check()
    with pytest.raises(ValueError, match=r"^seed="):
        SynthesisParams(seed=MAX_SEED)
    with pytest.raises(ProtocolError, match="seed"):
        Start(seed=MAX_SEED).check()


def test_default_params_are_the_reference_defaults():
    params = SynthesisParams()
    assert (params.cfg_value, params.inference_timesteps, params.min_len, params.max_len) == (2.0, 10, 2, 4096)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"cfg_value": 10.5}, "cfg_value", id="cfg above"),
        pytest.param({"cfg_value": -0.1}, "cfg_value", id="cfg below"),
        pytest.param({"inference_timesteps": 101}, "inference_timesteps", id="timesteps above"),
    ],
)
def test_limits_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}="):
        ParamLimits().check(SynthesisParams(**kwargs))


def test_limits_are_configurable():
    ParamLimits(max_cfg_value=20.0).check(SynthesisParams(cfg_value=15.0))
    with pytest.raises(ValueError, match="max_inference_timesteps"):
        ParamLimits(max_inference_timesteps=0)
    with pytest.raises(ValueError, match="cfg_value"):
        ParamLimits(min_cfg_value=3.0, max_cfg_value=1.0)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        pytest.param(("", "hi"), "request_id", id="empty id"),
        pytest.param(("r", "   "), "text", id="blank text"),
    ],
)
def test_invalid_request_names_the_field(args, field):
    with pytest.raises(ValueError, match=rf"^{field}="):
        Request(*args)


@pytest.mark.parametrize("name", ["max_running", "max_waiting", "max_prefill_tokens_per_step"])
def test_engine_config_rejects_non_positive_knobs(name):
    with pytest.raises(ValueError, match=rf"EngineConfig\.{name}=0"):
        EngineConfig(**{name: 0})


def test_status_order_and_finish_reasons():
    finished = [s for s in RequestStatus if s.is_finished]
    assert not RequestStatus.WAITING.is_finished and not RequestStatus.RUNNING.is_finished
    assert set(FINISH_REASONS) == set(finished)
    assert [r.value for r in FINISH_REASONS.values()] == ["stop", "length", "aborted", "error", "busy"]


def _record(min_len: int, cap: int, step_index: int) -> RequestRecord:
    record = RequestRecord(Request("r", "hi", SynthesisParams(min_len=min_len)), Prepared(3, 3 + cap))
    record.length_cap, record.step_index = cap, step_index
    return record


@pytest.mark.parametrize(
    ("min_len", "cap", "i", "stop", "expected"),
    [
        pytest.param(2, 100, 2, True, RequestStatus.RUNNING, id="stop ignored at i == min_len"),
        pytest.param(2, 100, 3, True, RequestStatus.FINISHED_STOPPED, id="stop counts once i > min_len"),
        pytest.param(2, 100, 3, False, RequestStatus.RUNNING, id="no stop flag"),
        pytest.param(2, 10, 9, False, RequestStatus.FINISHED_LENGTH, id="last patch under the cap"),
        pytest.param(2, 10, 8, False, RequestStatus.RUNNING, id="before the cap"),
        pytest.param(2, 10, 9, True, RequestStatus.FINISHED_STOPPED, id="stop wins over length"),
        pytest.param(5, 1, 0, True, RequestStatus.FINISHED_LENGTH, id="cap of one patch"),
    ],
)
def test_finish_rule(min_len, cap, i, stop, expected):
    assert _record(min_len, cap, i).status_after(stop) is expected
