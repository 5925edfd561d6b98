"""``voxwire serve``: arguments and environment make the config; the process serves and stops on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.server_process import http_status, poll

import voxwire
from voxwire.cli.main import build_parser, main
from voxwire.cli.serve import config_from_args
from voxwire.tts import VoxCPM


def test_every_numeric_flag_is_in_the_operations_tables_with_its_default() -> None:
    """Limits in the Limits table, the other settings in the Flags tables (scripts/flag_docs.py writes both)."""
    from pathlib import Path

    from voxwire.serving.server_config import ServerConfig
    from voxwire.serving.settings import groups

    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()

    def section(title: str) -> str:
        start = page.index(f"\n## {title}\n")
        return page[start : page.index("\n## ", start + 1)]

    per_machine = {"workers": "one per spare core"}  # defaults computed from the machine, shown as their rule
    by_memory = {"kv_cache_gb": "by memory"}  # None: the free memory decides
    # None: derived from another setting
    by_rule = {
        "persona_slots_per_client": "half of --max-personas",
        "max_batch_sessions": "a quarter of --max-sessions",
        "max_ahead_limit_ms": "30000, at least --max-ahead-ms",
    }
    switched_off = {"wyoming_port": "none: no Wyoming listener"}  # None: what the setting adds is off
    for group in groups(ServerConfig):
        table = section("Limits" if group.name == "limits" else "Flags")
        for setting in group.settings:
            if setting.kind not in (int, float):
                continue
            default = getattr(getattr(ServerConfig(), group.name), setting.name)
            shown = "model's" if default is None else f"{default:g}" if isinstance(default, float) else str(default)
            shown = {**per_machine, **by_memory, **by_rule, **switched_off}.get(setting.name, shown)
            assert f"| `--{setting.name.replace('_', '-')}` | {shown} |" in table, setting.name


def test_serve_arguments_and_environment_make_the_config() -> None:
    args = build_parser().parse_args(
        ["serve", "--port", "9000", "--api-key", "a", "--allowed-origin", "https://x.example", "--max-sessions", "3",
         "--max-clip-seconds", "12.5", "--voices-dir", "/tmp/v", "--voice-cache-mb", "64"]
    )  # fmt: skip
    config = config_from_args(args, environ={"VOXWIRE_API_KEYS": "b, c,,a"})
    assert (config.transport.port, config.engine.max_sessions, config.voices.max_clip_seconds) == (9000, 3, 12.5)
    assert config.transport.api_keys == ("a", "b", "c")
    assert config.transport.allowed_origins == ("https://x.example",)
    assert str(config.voices.voices_dir) == "/tmp/v"
    assert config.engine.engine_config().max_running == 3
    assert config.engine.voice_cache_bytes == 64 * 2**20


def test_kv_cache_flags_size_the_pool_in_bytes() -> None:
    args = build_parser().parse_args(["serve", "--kv-cache-gb", "0.5", "--gpu-memory-utilization", "0.8"])
    config = config_from_args(args, environ={})
    assert (config.engine.kv_cache_bytes, config.engine.gpu_memory_utilization) == (2**29, 0.8)
    assert config_from_args(build_parser().parse_args(["serve"]), environ={}).engine.kv_cache_bytes is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--kv-cache-gb", "0"], "kv_cache_gb=0.0"), (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization=1.5")],
)
def test_bad_kv_cache_flags_are_clear_cli_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *flags]) == 2
    assert message in capsys.readouterr().err


def test_batch_invariant_flag_reaches_the_models_runner(tmp_path: Path) -> None:
    from voxwire.speech_model import VoxCPMSpeech
    from voxwire.tiny.checkpoint import make_tiny_checkpoint

    assert not config_from_args(build_parser().parse_args(["serve"]), environ={}).engine.batch_invariant
    config = config_from_args(build_parser().parse_args(["serve", "--batch-invariant", "--no-realtime"]), environ={})
    assert config.engine.batch_invariant
    model = VoxCPMSpeech(voxwire.load_model(make_tiny_checkpoint(tmp_path / "v2", "voxcpm2"), device="cpu"))
    assert model.new_runner(config.engine.runner_options()).batch_invariant  # type: ignore[attr-defined]


def test_devices_flag_runs_one_engine_per_device_and_at_least_one_frontend() -> None:
    config = config_from_args(build_parser().parse_args(["serve", "--devices", "cuda:0, cuda:1"]), environ={})
    assert config.engine_devices() == ("cuda:0", "cuda:1")
    assert config.topology.frontends == 1  # --workers 0 with --devices: the engines need a frontend process
    config = config_from_args(
        build_parser().parse_args(["serve", "--devices", "cpu,cpu", "--workers", "3"]), environ={}
    )
    assert config.topology.frontends == 3
    single = config_from_args(build_parser().parse_args(["serve", "--device", "cpu", "--workers", "0"]), environ={})
    assert (single.engine_devices(), single.topology.frontends) == (("cpu",), 0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--devices", "cpu,,cpu"], "devices=('cpu', '', 'cpu')"),
        (["--device", "cpu", "--devices", "cpu"], "devices="),
    ],
)
def test_bad_devices_flags_are_clear_cli_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *flags]) == 2
    assert message in capsys.readouterr().err


def test_an_invalid_limit_is_a_clear_cli_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--max-sessions", "0"]) == 2
    assert "max_sessions=0" in capsys.readouterr().err
    assert main(["serve", "--voice-cache-mb", "-1"]) == 2
    assert "voice_cache_mb=-1" in capsys.readouterr().err


def test_lora_flags_make_the_persona_config(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(
        ["serve", "--lora", "a=/loras/a", "--lora", "b.2=/loras/b=c", "--max-personas", "2", "--max-lora-rank", "32",
         "--lora-root", "/loras"]
    )  # fmt: skip
    config = config_from_args(args, environ={})
    assert [(name, str(path)) for name, path in config.personas.loras] == [("a", "/loras/a"), ("b.2", "/loras/b=c")]
    personas = config.personas
    assert (personas.max_personas, personas.max_lora_rank, str(personas.lora_root)) == (2, 32, "/loras")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--lora", "/loras/a"])
    assert "expected NAME=DIR" in capsys.readouterr().err
    assert main(["serve", "--lora", "a=/x", "--lora", "a=/y"]) == 2  # one name twice
    assert "distinct names" in capsys.readouterr().err


@pytest.mark.slow
def test_voxwire_serve_runs_and_stops_cleanly_on_sigterm(tiny_tts: VoxCPM) -> None:
    command = [sys.executable, "-m", "voxwire.cli.main", "serve", "--model", tiny_tts.name, "--port", "0"]
    command += ["--workers", "0"]  # the single-process server's own shutdown (tests/workers cover --workers N)
    env = {**os.environ, "VOXWIRE_API_KEYS": "k"}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = _listening_url(process)
        ready = poll(lambda: http_status(f"{url}/ready") == 200, timeout=60, interval=0.05)
        assert ready, "never became ready"
        assert http_status(f"{url}/metrics") == 401
        process.send_signal(signal.SIGTERM)
        _, log = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, log
    assert "draining" in log and "stopped" in log


def _listening_url(process: subprocess.Popen[str]) -> str:
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return found.group(1)
    raise AssertionError("the server exited before listening")
