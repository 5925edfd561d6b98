"""The flags of the simulator, the Opus settings and the process split make a valid config or a clear error."""

from __future__ import annotations

import pytest

from voxwire.cli.main import build_parser, main
from voxwire.cli.serve import config_from_args
from voxwire.engine.cost_model import StepCost
from voxwire.serving.models import load_speech_model
from voxwire.sim.model import SimSpeech


def test_flags_make_the_config() -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "sim", "--sim-cost", "120ms+0.1ms/row", "--opus-complexity", "3", "--workers", "2",
         "--encoder-threads", "0"]
    )  # fmt: skip
    config = config_from_args(args, environ={})
    model = load_speech_model(config)
    assert isinstance(model, SimSpeech) and model.config.cost == StepCost.parse("120ms+0.1ms/row")
    assert (config.opus_settings().complexity, config.workers, config.encoder_threads) == (3, 2, 0)


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--opus-complexity", "11", "opus_complexity"),
        ("--workers", "-1", "workers"),
        ("--sim-cost", "4 parsecs", "sim_cost"),
    ],
)
def test_a_bad_value_is_a_clear_cli_error(
    flag: str, value: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", flag, value]) == 2
    assert named in capsys.readouterr().err
