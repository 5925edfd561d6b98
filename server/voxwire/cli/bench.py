"""``voxwire bench``: latency and load measurement of a voxwire server (closed or open loop), no torch needed."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

LEVEL_FAILED_EXIT = 1
"""The exit status when a level failed more utterances than ``--max-failure-rate`` allows."""
HTTP_MODES = {"file": "HTTP_FILE", "stream": "HTTP_STREAM"}
"""``--http`` choices -> ``RequestKind`` member names."""

_EPILOG = """examples:
  voxwire bench --server ws://gpu-box:8000 --concurrency 1,4,16 --duration 30 --json bench.json --plot bench.png
  voxwire bench --local --concurrency 1,4,16 --duration 20           # a local demo server in a subprocess
  voxwire bench --server URL --rate 0.5,1,2 --duration 60            # open loop: Poisson arrivals per second
  voxwire bench --server URL --find-max --slo-p99-ttfa-ms 500        # highest concurrency within the SLO
  voxwire bench --server URL --words-per-second 8                    # text streamed like a language model
  voxwire bench --server URL --http file --concurrency 1,8,32        # whole files over POST /v1/audio/speech
  voxwire bench --server URL --http stream --rate 2,4                # HTTP streams, Poisson arrivals
  voxwire bench --server URL --concurrency 64 --files 8              # 64 live sessions + 8 file users at once

metrics per utterance: TTFA (first text sent -> first audio frame), TTFD (-> first decodable frame),
RTF = (wall - TTFA) / audio seconds (as Nano-vLLM), wall / audio, gaps between frames, and underruns of a
player that starts after --player-buffer-ms of audio and plays in real time. Over HTTP (--http, --files): TTFB
(request sent -> first response byte), RTF = wall / audio seconds (wall: to the body's last byte), requests per
second and audio seconds per wall second; streams also gaps and underruns.

exit status: 0 every level passed; 1 a level failed more utterances than --max-failure-rate (table: FAILED);
2 bad arguments or a missing optional dependency (checked before the run); 3 the server is unreachable
(before the run, or for a whole level: the run stops there, table: UNREACHABLE); 4 the API key was refused.
Once levels have run, the table, --json and --plot are written whatever the exit status."""


def register(parser: argparse.ArgumentParser) -> None:
    from voxwire.client.bench.http_speech import Priority
    from voxwire.client.bench.measure import BENCH_FORMATS, HTTP_FORMATS
    from voxwire.client.bench.runner import DEFAULT_MAX_FAILURE_RATE
    from voxwire.client.connection import DEFAULT_SERVER, TOKEN_ENV
    from voxwire.client.retry import RetryPolicy

    parser.description = (
        "Drive concurrent WebSocket sessions (or HTTP speech requests, or both at once) against a voxwire server "
        "and report time to first audio, real-time factor, chunk gaps, player underruns (p50/p90/p99) and "
        "throughput per load level."
    )
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--server", default=DEFAULT_SERVER, help=f"ws://host:port or endpoint URL ({DEFAULT_SERVER})")
    target.add_argument("--local", action="store_true", help="start `voxwire serve` in a subprocess for the run")
    parser.add_argument("--local-model", default="demo", help="--model of the --local server (default: demo)")
    parser.add_argument("--local-args", default="", help="more `voxwire serve` flags for --local, one string")
    parser.add_argument(
        "--local-port", type=_port, default=0, help="port of the --local server (default 0: any free port)"
    )
    parser.add_argument("--token", help=f"API key (default: ${TOKEN_ENV})")
    parser.add_argument("--concurrency", type=_ints, default=(1,), help="closed-loop users per level, e.g. 1,4,16")
    parser.add_argument("--rate", type=_floats, help="open loop instead: Poisson arrivals per second, e.g. 0.5,1,2")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per level (default 30)")
    parser.add_argument("--texts", type=Path, help="file with one text per line (default: built-in mixed set)")
    parser.add_argument("--words-per-second", type=float, help="stream each text word by word at this pace")
    parser.add_argument("--format", choices=BENCH_FORMATS, default="opus", help="audio format (default opus)")
    parser.add_argument("--voice", help="voice id")
    parser.add_argument(
        "--persona",
        action="append",
        default=[],
        help="LoRA persona loaded on the server (repeatable: users take them in turn, mixing personas in a batch)",
    )
    parser.add_argument("--seed", type=int, help="synthesis seed")
    http = parser.add_mutually_exclusive_group()
    http.add_argument(
        "--http",
        choices=tuple(HTTP_MODES),
        help="POST /v1/audio/speech requests instead of WebSocket sessions: file (the whole body, as a batch job "
        "wants it) or stream (played as it arrives)",
    )
    http.add_argument(
        "--files",
        type=_count,
        default=0,
        help="a mixed run: this many users requesting whole files over HTTP, back to back, beside each level's live "
        "WebSocket sessions",
    )
    parser.add_argument(
        "--response-format", choices=HTTP_FORMATS, help="HTTP requests' response_format (default pcm: 24 kHz s16le)"
    )
    parser.add_argument(
        "--priority",
        choices=tuple(priority.value for priority in Priority),
        help="HTTP requests' scheduling class (default realtime, not sent; batch: the body's \"priority\" field)",
    )
    parser.add_argument(
        "--ramp-up-s",
        type=float,
        help="closed loop: start the users evenly over this many seconds of each level (default 1, at most half "
        "of --duration; 0: all at once, a cold burst)",
    )
    parser.add_argument("--player-buffer-ms", type=float, default=200.0, help="simulated player's lead (default 200)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before one utterance counts as failed")
    parser.add_argument(
        "--retries",
        type=int,
        default=RetryPolicy().retries,
        help="times a refused connection (HTTP 503, close 1013) is tried again, with backoff",
    )
    parser.add_argument("--find-max", action="store_true", help="search the highest concurrency meeting the SLO")
    parser.add_argument("--slo-p99-ttfa-ms", type=float, help="SLO for --find-max (also marks levels in the report)")
    parser.add_argument("--max-concurrency", type=int, default=256, help="upper bound for --find-max (default 256)")
    parser.add_argument(
        "--max-failure-rate",
        type=_rate,
        default=DEFAULT_MAX_FAILURE_RATE,
        help=f"a level with a larger share of failed utterances fails the run: exit status 1 (default "
        f"{DEFAULT_MAX_FAILURE_RATE:g}, i.e. {DEFAULT_MAX_FAILURE_RATE * 100:g} %%; 1: never)",
    )
    parser.add_argument("--json", type=Path, help="write the full report (with every utterance) here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here (needs matplotlib, checked before the run)")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        action="store_true",
        help="progress on stderr also when it is not a terminal: a line per second (a terminal gets a bar anyway)",
    )
    shown.add_argument("--quiet", action="store_true", help="no progress on stderr, not even on a terminal")
    parser.set_defaults(func=run)


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(part) for part in text.split(",") if part.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of integers >= 1")
    return values


def _count(text: str) -> int:
    count = int(text)
    if count < 1:
        raise argparse.ArgumentTypeError("an integer >= 1")
    return count


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError("a port number from 0 (any free port) to 65535")
    return port


def _rate(text: str) -> float:
    rate = float(text)
    if not 0 <= rate <= 1:
        raise argparse.ArgumentTypeError("a share of utterances from 0 to 1 (0.01: 1 %)")
    return rate


def _floats(text: str) -> tuple[float, ...]:
    values = tuple(float(part) for part in text.split(",") if part.strip())
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("a comma-separated list of numbers > 0")
    return values


def run(args: argparse.Namespace) -> int:
    from voxwire.client.bench.http_speech import Priority
    from voxwire.client.bench.local import LocalServer
    from voxwire.client.bench.measure import RequestKind
    from voxwire.client.bench.plan import BenchPlan, run_plan
    from voxwire.client.bench.report import plot, require_matplotlib, summary_label, table, write_json
    from voxwire.client.bench.runner import BenchConfig, LevelOutcome
    from voxwire.client.bench.texts import load_texts
    from voxwire.client.connection import token_from_env
    from voxwire.client.errors import ClientError, ServerUnreachableError
    from voxwire.client.retry import RetryPolicy
    from voxwire.errors import InvalidInputError

    # Optional dependencies first: a run takes minutes, and what it lacks must not surface only at its end.
    if args.plot is not None:
        require_matplotlib()
    if args.local:
        from voxwire.cli.main import SERVER_INSTALL, missing_server_modules

        if missing := missing_server_modules():
            raise InvalidInputError(
                f"--local runs `voxwire serve`, which needs the server extra ({', '.join(missing)} not installed): "
                f"{SERVER_INSTALL}"
            )
    if args.find_max and args.slo_p99_ttfa_ms is None:
        raise InvalidInputError("--find-max needs --slo-p99-ttfa-ms")
    kind = RequestKind.WEBSOCKET if args.http is None else RequestKind[HTTP_MODES[args.http]]
    if kind is not RequestKind.WEBSOCKET:
        for flag, given in (("--find-max", args.find_max), ("--words-per-second", args.words_per_second)):
            if given:
                raise InvalidInputError(f"{flag} is for live WebSocket sessions; --http sends each text whole")
    elif not args.files:
        for flag, given in (("--response-format", args.response_format), ("--priority", args.priority)):
            if given:
                raise InvalidInputError(f"{flag} is for HTTP requests: add --http or --files")
    texts = load_texts(args.texts)
    try:
        retry = RetryPolicy(retries=args.retries)
    except ValueError as exc:
        raise InvalidInputError(f"--retries: {exc}") from None
    if args.ramp_up_s is not None and not 0 <= args.ramp_up_s < args.duration:
        raise InvalidInputError(f"--ramp-up-s {args.ramp_up_s:g}: must be >= 0 and shorter than --duration")

    async def bench() -> dict[str, Any]:
        async def against(server: str) -> dict[str, Any]:
            config = BenchConfig(
                server=server,
                texts=texts,
                duration_s=args.duration,
                token=token_from_env(args.token),
                format=args.format,
                voice=args.voice,
                seed=args.seed,
                personas=tuple(args.persona),
                words_per_second=args.words_per_second,
                player_buffer_ms=args.player_buffer_ms,
                utterance_timeout_s=args.timeout,
                progress=not args.quiet and (args.progress or sys.stderr.isatty()),
                retry=retry,
                ramp_up_s=args.ramp_up_s,
                kind=kind,
                files=args.files,
                response_format=args.response_format or "pcm",
                priority=Priority(args.priority or Priority.REALTIME.value),
            )
            plan = BenchPlan(
                config,
                args.concurrency,
                args.rate or (),
                args.find_max,
                args.slo_p99_ttfa_ms,
                args.max_concurrency,
                args.max_failure_rate,
            )
            return await run_plan(plan)

        if not args.local:
            return await against(args.server)
        async with LocalServer(args.local_model, tuple(shlex.split(args.local_args)), args.local_port) as url:
            return await against(url)

    try:
        report = asyncio.run(bench())
        report["command"] = shlex.join(["voxwire", *sys.argv[1:]])
        print(table(report["levels"]))
        if "find_max" in report:
            found = report["find_max"]["max_concurrency"]
            print(f"highest concurrency meeting p99 TTFA <= {args.slo_p99_ttfa_ms:g} ms with no underruns: {found}")
        if args.json is not None:
            write_json(args.json, report)
        if args.plot is not None:
            plot(args.plot, report["levels"], f"voxwire bench: {report['settings']['server']}")
    except ClientError as exc:
        print(f"voxwire bench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if report["stopped"] is not None:
        print(f"voxwire bench: error: {report['stopped']}", file=sys.stderr)
        return ServerUnreachableError.exit_code
    failed = [level for level in report["levels"] if level["outcome"] != LevelOutcome.PASSED.value]
    if failed:
        described = ", ".join(
            f"{summary_label(level)} ({level['failed']} of {level['utterances']}: {level['failure_rate']:.1%})"
            for level in failed
        )
        print(
            f"voxwire bench: error: {len(failed)} level(s) failed more than --max-failure-rate "
            f"{args.max_failure_rate:.1%} of their utterances: {described}",
            file=sys.stderr,
        )
        return LEVEL_FAILED_EXIT
    return 0
