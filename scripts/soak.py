"""Soak (not a benchmark): a default ``voxwire serve`` on a machine whose CPUs are oversubscribed, and rounds of
WebSocket clients that finish, cancel, vanish and leave. A busy server must degrade (refuse new utterances
``busy``), never take its own busy engine for a hung one, and stay up and speaking (issue 29).

    python scripts/soak.py [--rounds 4] [--clients 48] [--busy N] [--busy-s S] [--model demo]
                           [--serve-args "--max-sessions 32"] [--log serve.log]

1. Starts ``voxwire serve --model MODEL --port 0`` with its default topology (no ``--workers``: on two cores,
   one frontend and one engine process under the supervisor) and waits for ``/ready`` on fresh connections.
2. Starts ``--busy`` processes (default four per core) that each burn a CPU for ``--busy-s`` seconds (default:
   as long as the rounds may last) and then exit by themselves; they are killed when the soak ends.
3. Runs ``--rounds`` rounds of ``--clients`` concurrent clients on ``/v1/tts/stream``, each with one behaviour
   in turn: *finish* (one sentence, waits for its ``done``), *cancel* (``cancel`` at the first audio of a long
   utterance), *vanish* (drops the TCP connection at the first audio, no close) and *leave* (closes normally at
   the first audio). A client refused ``busy`` (the WebSocket ``error``, or HTTP 503 on the upgrade) tries
   again after a short wait, a bounded number of times: that is the server degrading, not failing, and is
   counted.
4. Checks, with the busy processes still running: no log line "ending it" (no process ended as hung), no
   engine or frontend started twice, every finisher's ``done`` says stop or length, no client failed otherwise,
   the engine holds no stream soon after the rounds (those of clients that vanished or left included), the
   server process is alive, ``/ready`` answers 200 and one more session speaks; then SIGTERM stops the server
   with status 0.

Prints the clients by behaviour and outcome, the measures (busy refusals, the longest gap between two audio
frames a finisher received, load average, the engine's step time and sheds from ``/metrics``, the server's
RSS) and each check; exits 1 if a check failed, else 0.
Loopback only; every wait is bounded, so the soak stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import enum
import itertools
import math
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench_workers import listening_url, process_tree, wait_ready
from voxwire.client.connection import Connection
from voxwire.client.errors import ClientError, ServerBusyError, ServerError
from voxwire.protocol.wire import AudioFrame, Cancel, Done, End, Error, ErrorCode, Start, Text

SENTENCE = "The soak speaks one sentence while the machine is busy."
"""A finisher's utterance: one sentence, so ``busy`` can only refuse it at its start."""
LONG = " ".join(["This sentence keeps the engine busy for a while."] * 6)
"""The utterance a canceller, a vanisher or a leaver interrupts at its first audio."""
BUSY_TRIES = 400
"""Utterances (or upgrades) a client tries before it gives up on a server that keeps refusing it ``busy``: under
four busy processes a core a two-core server may take one stream at a time, and a client may wait for a whole
round's."""
BUSY_WAIT_S = (0.5, 2.0)
"""The wait before trying again after a ``busy`` refusal: uniform in this range, so that the refused clients of
a round do not all come back at once."""
OPEN_TIMEOUT_S = 30.0
"""The WebSocket handshake's bound (the client's default 10 s is short for a machine at load 10)."""
RECEIVE_TIMEOUT_S = 120.0
"""The longest silence of a stream before its client counts it as failed."""
CLIENT_LIMIT_S = 900.0
"""The longest a client may take, busy retries included."""
DRAIN_TIMEOUT_S = 60.0
"""How soon after the rounds the engine must hold no stream: each client's is over (done, or its client gone)."""
STOP_TIMEOUT_S = 120.0
"""The longest SIGTERM may take to stop the server (its drain) before the soak counts it as failed."""
BURN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"
"""A busy process: burns one CPU until its deadline (seconds from its own start), then exits."""


class Behaviour(enum.Enum):
    FINISH = "finish"
    """Speaks one sentence and waits for its ``done``."""
    CANCEL = "cancel"
    """Sends ``cancel`` at the first audio of a long utterance and waits for its ``done``."""
    VANISH = "vanish"
    """Drops the TCP connection at the first audio, without a close handshake."""
    LEAVE = "leave"
    """Closes the connection normally at the first audio."""


class Outcome(enum.Enum):
    DONE = "done"
    """``done`` with finish reason stop or length."""
    CANCELLED = "cancelled"
    """``done`` with finish reason cancelled."""
    VANISHED = "vanished"
    LEFT = "left"
    REFUSED = "refused busy"
    """Refused ``busy`` on every one of ``BUSY_TRIES`` tries."""
    FAILED = "failed"
    """Anything else: another error, a broken connection, a stream silent for ``RECEIVE_TIMEOUT_S``."""


AS_ASKED = {
    Behaviour.FINISH: {Outcome.DONE},
    Behaviour.CANCEL: {Outcome.CANCELLED, Outcome.DONE},  # done: the utterance ended before the cancel reached it
    Behaviour.VANISH: {Outcome.VANISHED},
    Behaviour.LEAVE: {Outcome.LEFT},
}
"""The outcomes in which a client did what its behaviour asks."""


@dataclass(frozen=True)
class Settings:
    rounds: int = 4
    clients: int = 48
    busy: int = 4 * (os.cpu_count() or 1)
    busy_s: float | None = None
    """How long each busy process burns (default: as long as the rounds may last, then it exits by itself)."""
    model: str = "demo"
    serve_args: tuple[str, ...] = ()
    log: Path | None = None
    """Where the server's log goes (default: a temporary file, removed at the end)."""


@dataclass(frozen=True)
class ClientResult:
    behaviour: Behaviour
    outcome: Outcome
    busy_refusals: int
    max_gap_s: float | None
    """The longest wait between two audio frames of the utterance that ended the client (a finisher's)."""
    detail: str = ""


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class Report:
    settings: Settings
    topology: str = ""
    clients: list[ClientResult] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    """The one-minute load average at the end of each round."""
    cost_ratios: list[float] = field(default_factory=list)
    """``voxwire_step_cost_ratio`` at the end of each round (the highest of the engines'): how much slower than at
    start-up the engine's steps ran."""
    mean_step_ms: float = 0.0
    """The engine steps' mean wall time over the rounds."""
    sessions_shed: float = 0.0
    """``voxwire_sessions_shed_total`` at the end: new streams the engine refused over its step budget."""
    rss_start_mb: float = 0.0
    rss_end_mb: float = 0.0
    burners_alive_at_end: int = 0
    error_lines: int = 0
    wall_s: float = 0.0
    checks: list[Check] = field(default_factory=list)

    def failed_checks(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]


class _Refused(Exception):
    """The server refused this try ``busy``."""


async def utterance(connection: Connection, behaviour: Behaviour, seed: int) -> tuple[Outcome, float | None, str]:
    """One utterance of ``behaviour``: its outcome, the longest gap between its audio frames, and a detail."""
    await connection.configure(Start(seed=seed))
    await connection.send(Text(SENTENCE if behaviour is Behaviour.FINISH else LONG))
    await connection.send(End())
    arrivals: list[float] = []
    error: str | None = None
    while True:
        message = await asyncio.wait_for(connection.receive(), RECEIVE_TIMEOUT_S)
        if isinstance(message, AudioFrame):
            arrivals.append(time.monotonic())
            if len(arrivals) > 1 or behaviour is Behaviour.FINISH:
                continue
            if behaviour is Behaviour.CANCEL:
                await connection.send(Cancel())
            elif behaviour is Behaviour.VANISH:
                connection.ws.transport.abort()
                return Outcome.VANISHED, None, ""
            else:
                await connection.close()
                return Outcome.LEFT, None, ""
        elif isinstance(message, Error):
            if message.code == ErrorCode.BUSY.value and not arrivals:
                error = message.code
            else:
                error = f"{message.code} after {len(arrivals)} audio frame(s): {message.message}"
        elif isinstance(message, Done):
            gap = max((b - a for a, b in itertools.pairwise(arrivals)), default=None)
            if error == ErrorCode.BUSY.value:
                raise _Refused
            if error is not None:
                return Outcome.FAILED, gap, error
            if message.finish_reason in ("stop", "length"):
                return Outcome.DONE, gap, ""
            if message.finish_reason == "cancelled":
                return Outcome.CANCELLED, gap, ""
            return Outcome.FAILED, gap, f"done with finish reason {message.finish_reason}"


async def client(url: str, behaviour: Behaviour, seed: int) -> ClientResult:
    """One client: connects, tries its utterance until the server takes it (at most ``BUSY_TRIES`` times)."""
    refusals = 0
    connection: Connection | None = None
    try:
        for _ in range(BUSY_TRIES):
            try:
                if connection is None:
                    connection = await Connection.open(url, timeout=OPEN_TIMEOUT_S)
                outcome, gap, detail = await utterance(connection, behaviour, seed)
                return ClientResult(behaviour, outcome, refusals, gap, detail)
            except (ServerBusyError, _Refused):
                refusals += 1
            except ServerError as exc:  # a refusal that closed the connection (1013)
                if exc.code != ErrorCode.BUSY.value or connection is None:
                    raise
                refusals += 1
                await connection.close()
                connection = None
            await asyncio.sleep(random.uniform(*BUSY_WAIT_S))
        return ClientResult(behaviour, Outcome.REFUSED, refusals, None)
    except ClientError as exc:
        return ClientResult(behaviour, Outcome.FAILED, refusals, None, str(exc))
    except asyncio.TimeoutError:
        return ClientResult(behaviour, Outcome.FAILED, refusals, None, f"no message for {RECEIVE_TIMEOUT_S:g} s")
    finally:
        if connection is not None:
            await connection.close()


async def bounded_client(url: str, behaviour: Behaviour, seed: int) -> ClientResult:
    try:
        return await asyncio.wait_for(client(url, behaviour, seed), CLIENT_LIMIT_S)
    except asyncio.TimeoutError:
        return ClientResult(behaviour, Outcome.FAILED, 0, None, f"not finished within {CLIENT_LIMIT_S:g} s")


async def round_of_clients(url: str, clients: int, first_seed: int) -> list[ClientResult]:
    """``clients`` clients at once, their behaviours in turn (finish, cancel, vanish, leave, finish, ...)."""
    behaviours = list(Behaviour)
    return await asyncio.gather(
        *(bounded_client(url, behaviours[i % len(behaviours)], first_seed + i) for i in range(clients))
    )


def start_burners(count: int, seconds: float) -> list[subprocess.Popen[str]]:
    return [subprocess.Popen([sys.executable, "-c", BURN, str(seconds)], text=True) for _ in range(count)]


def rss_mb(pid: int) -> float:
    """The resident memory of ``pid`` and its descendants, in MB."""
    total_kb = 0
    for each in process_tree(pid):
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except FileNotFoundError:  # it ended since the tree was read
            continue
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        total_kb += int(found.group(1)) if found else 0
    return total_kb / 1024


def metrics(url: str) -> str:
    """The server's ``/metrics`` (empty when it does not answer)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def samples(text: str, name: str) -> list[float]:
    """The values of ``name`` in a ``/metrics`` text, one per label set (e.g. per engine)."""
    return [float(value) for value in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)]


def drain_s(url: str) -> float | None:
    """Seconds until the engines hold no stream, running or waiting (None: not within ``DRAIN_TIMEOUT_S``)."""
    started = time.monotonic()
    while time.monotonic() - started < DRAIN_TIMEOUT_S:
        text = metrics(url)
        held = samples(text, "voxwire_engine_requests_running") + samples(text, "voxwire_engine_requests_waiting")
        if text and not any(held):
            return time.monotonic() - started
        time.sleep(0.5)
    return None


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def restarted_children(log: str) -> list[str]:
    """Engines and frontends the supervisor started more than once (one died or was ended)."""
    starts = collections.Counter(re.findall(r"\b((?:engine|frontend) \d+) started", log))
    return [f"{child} started {count} times" for child, count in sorted(starts.items()) if count > 1]


def run(settings: Settings) -> Report:
    """The whole soak: server, busy processes, rounds, checks; everything it started is gone when it returns."""
    report = Report(settings)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="voxwire-soak-") as folder:
        log_path = settings.log or Path(folder) / "serve.log"
        command = [sys.executable, "-m", "voxwire.cli.main", "serve", "--model", settings.model]
        command += ["--host", "127.0.0.1", "--port", "0", *settings.serve_args]
        burners: list[subprocess.Popen[str]] = []
        with log_path.open("w") as log_file:
            server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log_file, text=True)
            try:
                url = listening_url(log_path, server)
                wait_ready(url)
                report.rss_start_mb = rss_mb(server.pid)
                burn_s = settings.busy_s if settings.busy_s is not None else settings.rounds * CLIENT_LIMIT_S
                burners = start_burners(settings.busy, burn_s)
                after = rounds_under_load(report, server, url)
                report.burners_alive_at_end = sum(burner.poll() is None for burner in burners)
            finally:
                for process in (server, *burners):
                    process.kill()
                    process.wait()
        log = log_path.read_text()
    report.wall_s = time.monotonic() - started
    report.error_lines = sum(" ERROR " in line for line in log.splitlines())
    found = re.search(r"supervising (\d+) engine\(s\) and (\d+) frontend\(s\)", log)
    report.topology = f"{found.group(1)} engine + {found.group(2)} frontend process(es)" if found else "one process"
    report.checks = checks(report, log, after)
    return report


@dataclass(frozen=True)
class After:
    """What the server was like after the rounds."""

    drained_s: float | None
    """How soon the engines held no stream (None: not within ``DRAIN_TIMEOUT_S``)."""
    alive: bool
    ready: int | None
    """``/ready``'s status (None: nothing answered)."""
    last: ClientResult
    """One more finisher's."""
    stopped: int | None
    """The exit status after SIGTERM (None: still running ``STOP_TIMEOUT_S`` later)."""


def rounds_under_load(report: Report, server: subprocess.Popen[str], url: str) -> After:
    """The rounds of clients, then the server's state, with the busy processes still running."""
    settings = report.settings
    ws_url = url.replace("http://", "ws://") + "/v1/tts/stream"
    before = metrics(url)
    for number in range(settings.rounds):
        report.clients += asyncio.run(round_of_clients(ws_url, settings.clients, number * settings.clients))
        report.loads.append(os.getloadavg()[0])
        report.cost_ratios.append(max(samples(metrics(url), "voxwire_step_cost_ratio"), default=math.nan))
    drained = drain_s(url)
    end = metrics(url)
    steps = sum(samples(end, "voxwire_engine_step_seconds_count")) - sum(
        samples(before, "voxwire_engine_step_seconds_count")
    )
    spent = sum(samples(end, "voxwire_engine_step_seconds_sum")) - sum(
        samples(before, "voxwire_engine_step_seconds_sum")
    )
    report.mean_step_ms = 1e3 * spent / steps if steps > 0 else math.nan  # none: no step, or no server
    report.sessions_shed = sum(samples(end, "voxwire_sessions_shed_total"))
    alive = server.poll() is None
    ready = http_status(url + "/ready")
    last = asyncio.run(bounded_client(ws_url, Behaviour.FINISH, seed=settings.rounds * settings.clients))
    report.rss_end_mb = rss_mb(server.pid)
    server.send_signal(signal.SIGTERM)
    try:
        stopped: int | None = server.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stopped = None
    return After(drained, alive, ready, last, stopped)


def checks(report: Report, log: str, after: After) -> list[Check]:
    hung = [line for line in log.splitlines() if "ending it" in line]
    finishers = [result for result in report.clients if result.behaviour is Behaviour.FINISH]
    unfinished = [result for result in finishers if result.outcome is not Outcome.DONE]
    failed = [result for result in report.clients if result.outcome is Outcome.FAILED]
    restarted = restarted_children(log)
    return [
        Check('no process ended as hung (no "ending it" in the log)', not hung, "\n".join(hung)),
        Check("no engine or frontend started twice", not restarted, "; ".join(restarted)),
        Check(
            f"every finisher got done with stop or length ({len(finishers) - len(unfinished)} of {len(finishers)})",
            not unfinished,
            "; ".join(f"{result.outcome.value}: {result.detail}" for result in unfinished[:5]),
        ),
        Check(
            f"no client failed ({len(failed)} did)",
            not failed,
            "; ".join(f"{result.behaviour.value}: {result.detail}" for result in failed[:5]),
        ),
        Check(
            f"the engine held no stream within {DRAIN_TIMEOUT_S:g} s of the rounds (every client's over)",
            after.drained_s is not None,
        ),
        Check("the server process is still running (same pid)", after.alive),
        Check("/ready answers 200 after the rounds", after.ready == 200, f"it answered {after.ready}"),
        Check(
            "one more session speaks after the rounds",
            after.last.outcome is Outcome.DONE,
            f"{after.last.outcome.value}: {after.last.detail}",
        ),
        Check("SIGTERM stops the server with status 0", after.stopped == 0, f"status {after.stopped}"),
    ]


def format_report(report: Report) -> str:
    settings = report.settings
    burning = "" if settings.busy_s is None else f" for at most {settings.busy_s:g} s"
    lines = [
        f"soak: {shlex.join(['serve', '--model', settings.model, *settings.serve_args])} ({report.topology}), "
        f"{settings.busy} busy processes{burning} on {os.cpu_count()} cores, "
        f"{settings.rounds} rounds x {settings.clients} clients, {report.wall_s:.0f} s",
        "",
        "| behaviour | clients | " + " | ".join(outcome.value for outcome in Outcome) + " | busy refusals |",
        "|---|---|" + "---|" * len(Outcome) + "---|",
    ]
    for behaviour in (*Behaviour, None):
        results = [r for r in report.clients if behaviour is None or r.behaviour is behaviour]
        outcomes = collections.Counter(result.outcome for result in results)
        name = "all" if behaviour is None else behaviour.value
        counts = " | ".join(str(outcomes[outcome]) for outcome in Outcome)
        lines.append(f"| {name} | {len(results)} | {counts} | {sum(r.busy_refusals for r in results)} |")
    gaps = [r.max_gap_s for r in report.clients if r.behaviour is Behaviour.FINISH and r.max_gap_s is not None]
    gap = (
        f"{max(gaps) * 1e3:.0f} ms (median of the finishers' longest: {statistics.median(gaps) * 1e3:.0f} ms)"
        if gaps
        else "no finisher got two frames"
    )
    loads = ", ".join(f"{load:.1f}" for load in report.loads)
    ratios = ", ".join(f"{ratio:.1f}" for ratio in report.cost_ratios)
    lines += [
        "",
        "| measure | value |",
        "|---|---|",
        f"| busy refusals (WebSocket busy or HTTP 503): all / the most of one client (it gives up after "
        f"{BUSY_TRIES}) | {sum(r.busy_refusals for r in report.clients)} / "
        f"{max((r.busy_refusals for r in report.clients), default=0)} |",
        f"| longest gap between two audio frames of a finisher | {gap} |",
        f"| load average (1 min) at the end of each round | {loads} |",
        f"| engine step time over its start-up cost (`voxwire_step_cost_ratio`), end of each round | {ratios} |",
        f"| engine step, mean over the rounds | {report.mean_step_ms:.0f} ms |",
        f"| new streams shed over the step budget (`voxwire_sessions_shed_total`) | {report.sessions_shed:.0f} |",
        f"| server RSS, every process: after start / at the end | {report.rss_start_mb:.0f} / "
        f"{report.rss_end_mb:.0f} MB |",
        f"| busy processes still running at the end | {report.burners_alive_at_end} of {settings.busy} |",
        f"| ERROR lines in the server log | {report.error_lines} |",
        "",
        "| check | result |",
        "|---|---|",
    ]
    lines += [f"| {check.name} | {'pass' if check.passed else 'FAIL'} |" for check in report.checks]
    for check in report.failed_checks():
        if check.detail:
            lines += ["", f"{check.name}:", check.detail]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--clients", type=int, default=defaults.clients, help="concurrent clients per round")
    parser.add_argument("--busy", type=int, default=defaults.busy, help="CPU-burning processes (default: 4 per core)")
    parser.add_argument("--busy-s", type=float, default=defaults.busy_s, help="how long each busy process burns")
    parser.add_argument("--model", default=defaults.model, help="the server's --model")
    parser.add_argument("--serve-args", default="", help="more `voxwire serve` flags, e.g. '--max-sessions 32'")
    parser.add_argument("--log", type=Path, help="keep the server's log in this file")
    args = parser.parse_args()
    settings = Settings(
        args.rounds, args.clients, args.busy, args.busy_s, args.model, tuple(shlex.split(args.serve_args)), args.log
    )
    report = run(settings)
    print(format_report(report))
    sys.exit(1 if report.failed_checks() else 0)


if __name__ == "__main__":
    main()
