"""``voxwire bench`` never hides a failure: a missing optional dependency stops it before the run, a level with
more failed utterances than ``--max-failure-rate`` makes it exit non-zero (marked in its table, JSON and plot),
a server that dies mid-run stops it with the reason, a running level shows its progress (on a terminal, or with
``--progress``), and ``--local-port`` places the ``--local`` server."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import struct
import sys
import termios
from pathlib import Path

import pytest

from voxwire.client.bench.measure import UtteranceRecord
from voxwire.client.bench.report import FAILED_MARKER, figure
from voxwire.client.bench.runner import LevelOutcome, LevelResult, level_outcome
from voxwire.client.errors import ServerUnreachableError

from ..server_process import ServerProcess
from .helpers import TIMEOUT_S, Completed, free_port, launch, voxwire

pytestmark = pytest.mark.asyncio

SIM_FLAGS = ("--model", "sim", "--sim-cost", "5ms+0.1ms/row", "--opus-complexity", "3")


def url(server) -> str:
    return str(server.make_url("/")).replace("http://", "ws://")


async def voxwire_without(module: str, *args: str) -> Completed:
    """``voxwire ARGS`` in an interpreter where importing ``module`` fails, as when it is not installed."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"import sys; sys.modules[{module!r}] = None; from voxwire.cli.main import main; sys.exit(main(sys.argv[1:]))",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    assert process.returncode is not None
    return Completed(process.returncode, stdout, stderr.decode())


def level(failed: int, succeeded: int, error: str = "timeout") -> LevelResult:
    records = [UtteranceRecord(1, 5, 0.0, error=error) for _ in range(failed)]
    records += [UtteranceRecord(1, 5, 0.0) for _ in range(succeeded)]
    return LevelResult("closed", 1, records=records)


async def test_a_level_fails_past_the_max_failure_rate() -> None:
    assert level_outcome(level(1, 99), 0.01) is LevelOutcome.PASSED  # 1 %: at the limit
    assert level_outcome(level(2, 98), 0.01) is LevelOutcome.FAILED
    assert level_outcome(level(2, 98), 0.05) is LevelOutcome.PASSED
    assert level_outcome(level(3, 0, error="unreachable"), 1.0) is LevelOutcome.UNREACHABLE


async def test_plot_without_matplotlib_fails_before_any_connection() -> None:
    connections = 0

    def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    listener = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with listener:
        result = await voxwire_without(
            "matplotlib", "bench", "--server", f"ws://127.0.0.1:{port}", "--plot", "bench.png", "--quiet"
        )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert "--plot needs matplotlib" in line and "pip install 'voxwire[bench]'" in line
    assert connections == 0  # stopped before it even checked the server: no run of minutes comes first


async def test_local_without_the_server_extra_fails_before_the_run(tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    result = await voxwire_without(
        "torch", "bench", "--local", "--local-model", "sim", "--duration", "1", "--quiet", "--json", str(report)
    )
    assert result.returncode == 2, result.stderr
    assert "needs the server extra (torch not installed)" in result.stderr and not report.exists()


@pytest.mark.slow
async def test_failures_past_max_failure_rate_exit_non_zero_and_are_marked(serve, tmp_path: Path) -> None:
    server = await serve()
    report_path = tmp_path / "bench.json"
    # A 1 ms utterance timeout: every utterance fails ("timeout"), the server stays up.
    common = ("bench", "--server", url(server), "--duration", "1", "--timeout", "0.001", "--json", str(report_path))
    failing = await voxwire(*common)
    assert failing.returncode == 1, failing.stderr
    # stderr is not a terminal and --progress is not given: the reason is the one line there.
    [reason] = failing.stderr.splitlines()
    assert "failed more than --max-failure-rate 1.0% of their utterances: c=1" in reason
    [summary] = json.loads(report_path.read_text())["levels"]
    assert summary["outcome"] == "failed" and summary["failure_rate"] == 1.0
    assert summary["failed"] == summary["utterances"] > 0 and set(summary["errors"]) == {"timeout"}
    row = next(line for line in failing.stdout.decode().splitlines() if line.strip().startswith("c=1"))
    assert row.split()[-1] == "FAILED"

    tolerated = await voxwire(*common, "--max-failure-rate", "1", "--quiet")
    assert tolerated.returncode == 0, tolerated.stderr
    [summary] = json.loads(report_path.read_text())["levels"]
    assert summary["outcome"] == "passed" and "FAILED" not in tolerated.stdout.decode()


@pytest.mark.slow
async def test_progress_shows_while_a_level_runs(serve) -> None:
    server = await serve()
    result = await voxwire("bench", "--server", url(server), "--duration", "3", "--progress")
    assert result.returncode == 0, result.stderr
    # stderr is not a terminal: whole lines with the live counts, one a second and one at the level's end, so a
    # level is never silent while it runs.
    lines = re.findall(r"^1 users: (\d)/3 s, \d+ utterances, 0 failed, \d+ underruns, [01] live$", result.stderr, re.M)
    assert len(lines) >= 2 and lines[-1] == "3", result.stderr


@pytest.mark.slow
async def test_a_terminal_gets_a_progress_bar(serve) -> None:
    server = await serve()
    terminal, stderr = pty.openpty()
    # A terminal has a size (a fresh pseudo-terminal's is 0 x 0, in which tqdm draws nothing).
    fcntl.ioctl(stderr, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    try:
        bench = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "voxwire.cli.main", "bench", "--server", url(server), "--duration", "2",
            stdout=asyncio.subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
        os.close(stderr)
        _, shown = await asyncio.gather(
            asyncio.wait_for(bench.communicate(), TIMEOUT_S), asyncio.to_thread(read_all, terminal)
        )
    finally:
        os.close(terminal)
    assert bench.returncode == 0, shown
    # Redrawn in place (carriage returns), with the level's live counts.
    assert "\r1 users:" in shown and re.search(r"\d+ utterances, 0 failed, \d+ underruns, [01] live", shown), shown


def read_all(terminal: int) -> str:
    """Everything written to the pseudo-terminal until its last writer closes it."""
    chunks = []
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # EIO: no writer is left
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
async def test_a_server_killed_mid_run_stops_the_run_and_fails_it(tmp_path: Path) -> None:
    report_path, plot_path = tmp_path / "bench.json", tmp_path / "bench.png"
    with ServerProcess(*SIM_FLAGS) as server:
        await asyncio.to_thread(server.wait_ready)
        bench = await launch(
            "bench", "--server", server.ws_url, "--concurrency", "1,2,3", "--duration", "3", "--quiet",
            "--json", str(report_path), "--plot", str(plot_path),
        )  # fmt: skip

        def spoke() -> bool:
            return re.search(r"^voxwire_utterances_total\{.*\} [1-9]", server.get("/metrics"), re.M) is not None

        for _ in range(int(TIMEOUT_S / 0.1)):  # the first level's first utterance is done: kill the server
            if await asyncio.to_thread(spoke):
                break
            await asyncio.sleep(0.1)
        server.process.kill()
        stdout, stderr = await asyncio.wait_for(bench.communicate(), TIMEOUT_S)

    assert bench.returncode == ServerUnreachableError.exit_code, stderr.decode()
    assert "no session of level c=2 could connect, so the run stopped there" in stderr.decode()
    report = json.loads(report_path.read_text())
    assert "c=2" in report["stopped"]
    first, second = report["levels"]  # the third level never ran
    assert first["outcome"] == "failed" and 0 < first["failed"] < first["utterances"]
    assert second["outcome"] == "unreachable" and second["failed"] == second["utterances"] > 0
    assert set(second["errors"]) == {"unreachable"}
    rows = [line.split() for line in stdout.decode().splitlines() if line.strip().startswith("c=")]
    assert [(row[0], row[-1]) for row in rows] == [("c=1", "FAILED"), ("c=2", "UNREACHABLE")]
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # drawn all the same
    # What the plot shows: the failed levels as red X markers on the latency panel, and in the failed-utterances
    # panel red bars of their failures labelled with their outcome (an empty latency there is not "fast").
    latency, _underruns, failures = figure(report["levels"], "bench").axes
    [markers] = [line for line in latency.get_lines() if line.get_label() == FAILED_MARKER]
    assert list(markers.get_xdata()) == [1, 2]
    assert [bar.get_height() for bar in failures.patches] == [first["failed"], second["failed"]]
    assert [text.get_text() for text in failures.texts] == ["FAILED", "UNREACHABLE"]


@pytest.mark.slow
async def test_local_port_places_the_local_server(tmp_path: Path) -> None:
    port, report_path = free_port(), tmp_path / "bench.json"
    result = await voxwire(
        "bench", "--local", "--local-model", "sim", "--local-args", "--sim-cost 5ms+0.1ms/row --workers 0",
        "--local-port", str(port), "--duration", "1", "--quiet", "--json", str(report_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["settings"]["server"] == f"ws://127.0.0.1:{port}" and report["levels"][0]["failed"] == 0
