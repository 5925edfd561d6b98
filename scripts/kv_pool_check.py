"""Check (not a test): a server whose dense KV pool would not fit runs on a small paged pool.

    python scripts/kv_pool_check.py [--sessions 24] [--kv-cache-gb 0.5]

Builds a tiny VoxCPM2-like checkpoint with a KV-heavy LM (12 + 8 layers, 4 KV heads, 8192
positions), for which ``--max-sessions 128 --max-length 8192`` would need a dense pool of > 8 GiB,
and starts ``voxwire serve --batch-invariant`` on it on the CPU twice: once with a near-empty KV pool (the
baseline resident memory) and once with ``--kv-cache-gb``. For the second it reports the resident memory over
the baseline once ``/ready`` answers, then speaks ``--sessions`` different utterances alone (one after
another) and all at once, and compares each session's 16-bit PCM. Exits 1 if a server does not get
ready, the memory is off, or any session's audio is not bit for bit what it is alone.
"""

from __future__ import annotations

import argparse
import copy
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import voxwire
from voxwire.engine.kv_pool import bytes_per_position
from voxwire.tiny.checkpoint import make_tiny_checkpoint
from voxwire.tiny.configs import ALL_CONFIGS

MAX_SESSIONS, MAX_LENGTH = 128, 8192
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"]


def kv_heavy_checkpoint(directory: Path) -> Path:
    raw = copy.deepcopy(ALL_CONFIGS["voxcpm2"])
    lm = raw["lm_config"]
    lm.update(num_hidden_layers=12, num_key_value_heads=4, max_position_embeddings=MAX_LENGTH)
    raw.update(residual_lm_num_layers=8, max_length=MAX_LENGTH)
    ALL_CONFIGS["kv-heavy"] = raw  # this process only: make_tiny_checkpoint takes a registered name
    return make_tiny_checkpoint(directory, "kv-heavy")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class Server:
    def __init__(self, model: Path, kv_cache_gb: float) -> None:
        self.port = free_port()
        command = [
            sys.executable, "-m", "voxwire.cli.main", "serve", "--model", str(model), "--device", "cpu",
            "--port", str(self.port), "--max-sessions", str(MAX_SESSIONS), "--max-length", str(MAX_LENGTH),
            "--kv-cache-gb", str(kv_cache_gb), "--max-waiting", "256", "--log-level", "WARNING", "--workers", "0",
            "--batch-invariant",
        ]  # fmt: skip
        self.process = subprocess.Popen(command)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 600.0) -> float:
        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            if self.process.poll() is not None:
                raise SystemExit(f"FAIL: the server exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/ready", timeout=5) as response:
                    if response.status == 200:
                        return time.perf_counter() - start
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit("FAIL: the server did not get ready")

    def speak(self, text: str, seed: int) -> np.ndarray:
        body = json.dumps({"model": "tts-1", "input": text, "response_format": "pcm", "seed": seed}).encode()
        request = urllib.request.Request(
            f"{self.url}/v1/audio/speech", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            return np.frombuffer(response.read(), dtype="<i2").astype(np.int32)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description="paged KV: a small pool serves a model whose dense pool would not fit")
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--kv-cache-gb", type=float, default=0.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = kv_heavy_checkpoint(Path(tmp) / "kv-heavy")
        tts = voxwire.load_model(model, device="cpu")
        weights = sum(p.numel() * p.element_size() for p in tts.model.parameters())
        dense = MAX_SESSIONS * MAX_LENGTH * bytes_per_position(tts)
        print(
            f"weights {weights / 2**20:.1f} MiB; dense pool of {MAX_SESSIONS} x {MAX_LENGTH}: {dense / 2**30:.1f} GiB"
        )
        if dense <= 8 * 2**30:
            raise SystemExit("FAIL: the model's dense pool would fit in 8 GiB")
        baseline = Server(model, kv_cache_gb=0.001)
        baseline.wait_ready()
        base_rss = resident_bytes(baseline.process.pid)
        baseline.stop()
        server = Server(model, kv_cache_gb=args.kv_cache_gb)
        try:
            ready_s = server.wait_ready()
            extra = resident_bytes(server.process.pid) - base_rss
            print(
                f"ready in {ready_s:.0f} s; resident {extra / 2**30:.2f} GiB over the same server with a "
                f"0.001 GiB pool (asked for {args.kv_cache_gb} GiB)"
            )
            utterances = [(f"{WORDS[i % 12]} {WORDS[(5 * i + 3) % 12]} {i}.", 1000 + i) for i in range(args.sessions)]
            alone = [server.speak(text, seed) for text, seed in utterances]
            with ThreadPoolExecutor(args.sessions) as pool:
                together = list(pool.map(lambda u: server.speak(*u), utterances))
        finally:
            server.stop()
    differences = [
        int(np.abs(a - b).max()) if a.shape == b.shape else 1 << 16 for a, b in zip(alone, together, strict=True)
    ]
    identical = sum(d == 0 for d in differences)
    print(f"{args.sessions} concurrent sessions: {identical} bit-identical to alone; PCM differences: {differences}")
    memory_ok = abs(extra - args.kv_cache_gb * 2**30) <= 0.15 * 2**30
    ok = memory_ok and identical == args.sessions
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
