"""Benchmark (not a test): real-time Opus streams through ``voxwire serve --model sim``, and the server's CPU.

    python scripts/bench_workers.py [--workers 0,2] [--concurrency 200] [--duration 30]
                                    [--sim-cost "120ms+0.1ms/row"] [--ramp-up-s S] [--json out.json]

For each ``--workers`` value it starts ``voxwire serve --model sim`` (every process of it: supervisor,
engine, frontends), waits for ``/ready`` on fresh connections, runs ``voxwire bench`` closed loop at
``--concurrency`` (Opus, 200 ms player lead; the users start evenly over ``--ramp-up-s``, by default the
bench's own ramp of one second; 0 starts them all at once) and reads the CPU time the server's processes used
during the run from ``/proc`` (Linux), reported per second of audio streamed. The bench client runs on the
same machine and competes for its cores, as it would in ``voxwire bench --local``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

SERVE = [sys.executable, "-m", "voxwire.cli.main", "serve", "--model", "sim", "--port", "0", "--log-level", "INFO"]


def process_tree(pid: int) -> list[int]:
    pids, frontier = [pid], [pid]
    while frontier:
        children = Path(f"/proc/{frontier.pop()}/task")
        for task in children.iterdir() if children.exists() else ():
            found = (task / "children").read_text().split()
            pids += [int(child) for child in found]
            frontier += [int(child) for child in found]
    return pids


def cpu_seconds(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def listening_url(log: Path, server: subprocess.Popen[str], timeout: float = 180.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        found = re.search(r"listening on (http://\S+)", log.read_text())
        if found:
            return found.group(1)
        time.sleep(0.2)
    raise SystemExit(f"the server did not start listening:\n{log.read_text()}")


def children_cpu_seconds() -> float:
    """CPU time of this script's finished children (the bench client, once it has exited)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_ready(url: str, timeout: float = 180.0, probes: int = 8) -> None:
    deadline, streak = time.monotonic() + timeout, 0
    while streak < probes:
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} never became ready")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=5) as response:
                streak = streak + 1 if response.status == 200 else 0
        except (urllib.error.URLError, OSError):
            streak = 0
            time.sleep(0.5)


def run_level(workers: int, args: argparse.Namespace) -> dict[str, object]:
    command = [*SERVE, "--sim-cost", args.sim_cost, "--workers", str(workers), "--max-sessions",
               str(args.concurrency + 16), "--max-waiting", str(args.concurrency + 16), "--max-connections",
               str(args.concurrency + 16), *args.serve_args.split()]  # fmt: skip
    log = tempfile.NamedTemporaryFile("w+", prefix="voxwire-serve-", suffix=".log")  # noqa: SIM115
    server = subprocess.Popen(command, stderr=log, text=True)
    try:
        url = listening_url(Path(log.name), server)
        wait_ready(url)
        with tempfile.TemporaryDirectory() as folder:
            report = Path(folder) / "bench.json"
            pids = process_tree(server.pid)
            cpu_before, started, client_before = cpu_seconds(pids), time.monotonic(), children_cpu_seconds()
            ramp = [] if args.ramp_up_s is None else ["--ramp-up-s", str(args.ramp_up_s)]
            subprocess.run(
                [sys.executable, "-m", "voxwire.cli.main", "bench", "--server", url.replace("http", "ws", 1),
                 "--concurrency", str(args.concurrency), "--duration", str(args.duration), "--json", str(report),
                 *ramp, "--quiet"],
                check=True,
            )  # fmt: skip
            cpu = cpu_seconds(pids) - cpu_before
            wall = time.monotonic() - started
            client_cpu = children_cpu_seconds() - client_before
            bench = json.loads(report.read_text())
            level = bench["levels"][0]
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    finally:
        server.kill()
        log.close()
    audio = float(level["audio_s"])
    return {
        "workers": workers,
        "concurrency": args.concurrency,
        "ramp_up_s": bench["settings"]["ramp_up_s"],
        "utterances": len(level["records"]),
        "failed": level["failed"],
        "ttfa_p50_ms": level["ttfa_ms"]["p50"],
        "ttfa_p99_ms": level["ttfa_ms"]["p99"],
        "rtf_p50": level["rtf"]["p50"],
        "underruns": level["underruns"]["total"],
        "x_realtime": level["audio_per_wall_s"],
        "server_cpu_cores": cpu / wall,
        "client_cpu_cores": client_cpu / wall,
        "server_cpu_ms_per_stream_s": 1e3 * cpu / audio,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=lambda text: [int(x) for x in text.split(",")], default=[0, 2])
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--sim-cost", default="120ms+0.1ms/row")
    parser.add_argument(
        "--ramp-up-s", type=float, help="start the bench's users over this many seconds (default: the bench's, 1 s)"
    )
    parser.add_argument(
        "--serve-args",
        default="--max-prefill-tokens-per-step 8192",
        help="more `voxwire serve` flags (default: a prefill budget that admits a burst of arrivals in one "
        "step, which costs nothing when --sim-cost has no /token term)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [run_level(workers, args) for workers in args.workers]
    print(
        "| workers | streams | ramp-up (s) | utterances | failed | TTFA p50 (ms) | TTFA p99 (ms) | RTF p50 | underruns "
        "| x realtime | server CPU (cores) | server CPU (ms per stream-second) | bench client CPU (cores) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['workers']} | {row['concurrency']} | {row['ramp_up_s']:g} | {row['utterances']} | {row['failed']} "
            f"| {row['ttfa_p50_ms']:.0f} | {row['ttfa_p99_ms']:.0f} | {row['rtf_p50']:.2f} | {row['underruns']} "
            f"| {row['x_realtime']:.1f} | {row['server_cpu_cores']:.2f} | {row['server_cpu_ms_per_stream_s']:.2f} "
            f"| {row['client_cpu_cores']:.2f} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
