"""The flags of the simulator, the Opus settings, the process split and the runner's size make a valid config or a
clear error."""

from __future__ import annotations

import pytest

from voxwire.cli.main import build_parser, main
from voxwire.cli.serve import config_from_args
from voxwire.engine import RunnerOptions
from voxwire.engine.cost_model import StepCost
from voxwire.serving.speech.load import load_speech_model
from voxwire.sim.model import SimSpeech


def test_flags_make_the_config() -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "sim", "--sim-cost", "120ms+0.1ms/row", "--opus-complexity", "3", "--workers", "2",
         "--encoder-threads", "0"]
    )  # fmt: skip
    config = config_from_args(args, environ={})
    model = load_speech_model(config)
    assert isinstance(model, SimSpeech) and model.config.cost == StepCost.parse("120ms+0.1ms/row")
    assert (config.audio.opus_settings().complexity, config.topology.workers, config.audio.encoder_threads) == (3, 2, 0)


def test_flags_size_the_runner() -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "sim", "--max-sessions", "3", "--max-length", "200", "--max-inference-timesteps", "20",
         "--kv-cache-gb", "0.5", "--gpu-memory-utilization", "0.8", "--voice-cache-mb", "0", "--no-realtime",
         "--batch-invariant"]
    )  # fmt: skip
    config = config_from_args(args, environ={})
    options = config.engine.runner_options()
    assert options == RunnerOptions(
        num_slots=3,
        max_length=200,
        kv_cache_bytes=2**29,
        gpu_memory_utilization=0.8,
        max_timesteps=20,
        voice_cache_bytes=0,
        measure_cost=False,  # only the real-time policy budgets by the measured cost
        batch_invariant=True,
    )
    runner = load_speech_model(config).new_runner(options)
    assert (runner.num_slots, runner.num_kv_blocks) == (3, 1 + 3 * 13)  # 200 positions: 13 blocks of 16 a slot


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
