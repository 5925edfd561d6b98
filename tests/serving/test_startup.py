"""Start-up (issue 33 item 3): the port answers from the first second, ``/ready`` names the phase while the model
loads, every phase logs as it goes (no silent stretch), and a model that cannot load still stops the command with
its error."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from tests.server_process import SERVER_THREADS

from voxwire.serving.runtime.keys import STATE_KEY, Phase
from voxwire.startup import Progress, Readiness, enter, reporting
from voxwire.tts import VoxCPM

ORDER = list(Readiness)
LOG_GAP_S = 5.0
"""The longest a starting server's log may stay silent (issue 33's done-when)."""


class Serving:
    """``voxwire serve`` on the tiny checkpoint, one process; each stderr line kept with when it arrived."""

    def __init__(self, *args: str, workers: int = 0) -> None:
        command = [sys.executable, "-m", "voxwire.cli.main", "serve", "--workers", str(workers), *args, "--port", "0"]
        environment = {**os.environ, "OMP_NUM_THREADS": str(SERVER_THREADS)}
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=environment)
        self.lines: list[tuple[float, str]] = []
        self.listening = threading.Event()
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append((time.monotonic(), line))
            if not self.listening.is_set() and "listening on " in line:
                self.url = line.split("listening on ")[1].split()[0]
                self.listening.set()

    @property
    def log(self) -> str:
        return "".join(line for _, line in self.lines)

    def wait_for_line(self, text: str, timeout: float) -> float:
        """When the first line holding ``text`` arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for arrived, line in list(self.lines):
                if text in line:
                    return arrived
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} in {timeout} s:\n{self.log}")

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)


def get(url: str) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of a GET; a refused connection raises."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1], ids=["one-process", "workers"])
def test_ready_names_the_phase_from_the_first_answer_and_never_refuses(tiny_tts: VoxCPM, workers: int) -> None:
    # With --workers the supervisor answers until the frontend, warmed up, joins the port.
    server = Serving("--model", tiny_tts.name, workers=workers)
    try:
        assert server.listening.wait(60), server.log
        answers = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            answers.append(get(server.url + "/ready"))  # raises on a refused connection
            if answers[-1][0] == 200:
                break
            time.sleep(0.05)
        health = get(server.url + "/health")
        speech = urllib.request.Request(server.url + "/v1/audio/speech", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as invalid:  # the full app's routes answer: {} is not a request
            urllib.request.urlopen(speech, timeout=10)
    finally:
        server.close()
    assert health == (200, {"status": "ok"}) and invalid.value.code == 400, invalid.value.read()
    assert answers[-1] == (200, {"status": "ready"}), answers[-1]
    starting = [body for status, body in answers if status == 503]
    # The model's code is imported after the port listens: the first answers are the loading phase's.
    assert starting and starting[0]["phase"] == Readiness.LOADING_WEIGHTS.value
    assert all(body["status"] == "starting" for body in starting)
    assert all(body["error"]["code"] == "not_ready" for body in starting)
    phases = [ORDER.index(Readiness(body["phase"])) for body in starting]
    assert phases == sorted(phases), [body["phase"] for body in starting]


@pytest.mark.slow
def test_other_routes_are_not_ready_with_retry_after_while_loading(tiny_tts: VoxCPM) -> None:
    server = Serving("--model", tiny_tts.name)
    try:
        assert server.listening.wait(60), server.log
        request = urllib.request.Request(server.url + "/v1/audio/speech", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
    finally:
        server.close()
    assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
    assert json.loads(refused.value.read())["error"]["code"] == "not_ready"


@pytest.mark.slow
@pytest.mark.alone
def test_a_starting_server_never_leaves_its_log_silent_for_five_seconds(tiny_tts: VoxCPM) -> None:
    server = Serving("--model", tiny_tts.name)
    try:
        ready = server.wait_for_line("; ready (", timeout=180)
    finally:
        server.close()
    stamps = [server.started] + [arrived for arrived, _ in server.lines if arrived <= ready]
    gaps = [
        (later - earlier, line) for earlier, later, (_, line) in zip(stamps, stamps[1:], server.lines, strict=False)
    ]
    longest, before = max(gaps)
    assert longest < LOG_GAP_S, f"{longest:.1f} s of silence before: {before}\n{server.log}"
    for phase in ("loading_weights", "sizing_kv_pool", "fitting_step_cost", "warming_up"):
        assert f"start-up: {phase}: " in server.log, phase


@pytest.mark.slow
def test_a_checkpoint_that_cannot_load_stops_the_command_with_its_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    command = [sys.executable, "-m", "voxwire.cli.main", "serve", "--workers", "0", "--model", str(tmp_path)]
    result = subprocess.run([*command, "--port", "0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("voxwire serve: error: ")]
    assert str(tmp_path) in error


@pytest.mark.slow
def test_sigterm_while_loading_exits_at_once(tiny_tts: VoxCPM) -> None:
    server = Serving("--model", tiny_tts.name)
    try:
        assert server.listening.wait(60), server.log
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0, server.log
    finally:
        server.close()
    assert "stopped while starting" in server.log


@pytest.mark.asyncio
async def test_ready_of_a_warming_server_names_the_warm_up(client: TestClient) -> None:
    state = client.server.app[STATE_KEY]
    state.phase = Phase.STARTING
    try:
        async with client.get("/ready") as response:
            body = await response.json()
            assert (response.status, response.headers["Retry-After"]) == (503, "1")
    finally:
        state.phase = Phase.READY
    assert (body["status"], body["phase"], body["error"]["code"]) == ("starting", "warming_up", "not_ready")


def test_progress_logs_at_most_every_interval_and_at_the_end(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    progress = Progress("steps", 5, interval_s=2.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="voxwire.startup"):
        for elapsed in (0.5, 1.0, 2.5, 3.0, 3.5):
            now[0] = elapsed
            progress.advance()
    assert [record.getMessage() for record in caplog.records] == [
        "start-up: steps 3/5 (2.5 s)",
        "start-up: steps 5/5 (3.5 s)",
    ]


def test_reporting_tells_each_phase_and_fills_a_silence(caplog: pytest.LogCaptureFixture) -> None:
    told: list[Readiness] = []
    with caplog.at_level(logging.INFO, logger="voxwire.startup"), reporting(told.append, interval_s=0.05):
        enter(Readiness.SIZING_KV_POOL, "a pool")
        time.sleep(0.5)  # one long step: nothing else logs
    assert told == [Readiness.SIZING_KV_POOL]
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0] == "start-up: sizing_kv_pool: a pool"
    assert any(message.startswith("start-up: still sizing_kv_pool (") for message in messages[1:]), messages


def test_graph_capture_counts_its_graphs_in_the_log(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from voxwire.engine.cuda_graphs import StepGraphs

    ran: list[tuple[int, int]] = []
    graphs = StepGraphs(lambda bucket, timesteps: ran.append((bucket, timesteps)), (1, 2), (10, 50))
    # No CUDA here: the recording itself is stood in for; what is tested is the count the log gives.
    monkeypatch.setattr(graphs, "_capture", lambda bucket, timesteps: (lambda: None, torch.zeros(1)))
    with caplog.at_level(logging.INFO, logger="voxwire.startup"):
        graphs.capture_all()
    assert len(ran) == graphs.count == 4
    assert caplog.records[-1].getMessage().startswith("start-up: captured CUDA graphs 4/4 (")
