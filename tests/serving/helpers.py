"""What the serving tests share beyond fixtures: a voice clip and its upload over HTTP, a request spoken with a
voice, ``/metrics`` read as numbers, and the texts the engine is asked to speak."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import soundfile
from aiohttp import FormData
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from voxwire.serving.runtime.keys import ENGINES_KEY, SPEAKER_KEY
from voxwire.serving.speech.service import SpeechJob

STEP_S = 0.1
"""An engine step's duration under ``record_steps``: long enough to see which step an event lands in."""


def clip(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A WAV clip: a decaying chirp, enough to run the encoder (the tiny model cannot tell voices apart)."""
    t = np.arange(int(seconds * rate)) / rate
    samples = 0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t) * np.exp(-t)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples.astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def form(audio: bytes | None, **fields: str) -> FormData:
    data = FormData()
    if audio is not None:
        data.add_field("file", audio, filename="me.wav", content_type="audio/wav")
    for name, value in fields.items():
        data.add_field(name, value)
    return data


async def upload(client: TestClient, audio: bytes | None, **fields: str) -> tuple[int, dict]:
    async with client.post("/v1/voices", data=form(audio, **fields)) as response:
        return response.status, await response.json()


async def speak_with(client: TestClient, voice: str) -> int:
    body = {"model": "m", "input": "In my voice.", "voice": voice, "response_format": "pcm", "seed": 1}
    async with client.post("/v1/audio/speech", json=body) as response:
        await response.read()
        return response.status


async def scrape(client: TestClient) -> dict[str, float]:
    """``/metrics`` as {sample name with labels: value}."""
    async with client.get("/metrics") as response:
        assert response.status == 200
        assert response.content_type == "text/plain"
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def record_engine_jobs(app: object, monkeypatch: pytest.MonkeyPatch) -> list[SpeechJob]:
    """Every job the app's service is asked to speak from now on, in order."""
    service = app[SPEAKER_KEY]  # type: ignore[index]
    jobs: list[SpeechJob] = []
    speak = service.speak

    def recording(job: SpeechJob) -> object:
        jobs.append(job)
        return speak(job)

    monkeypatch.setattr(service, "speak", recording)
    return jobs


def engine_busy(app: object) -> bool:
    """Whether the app's engine runs or queues any request."""
    stats = app[ENGINES_KEY].engine.stats()  # type: ignore[index]
    return bool(stats.running or stats.waiting)


def record_steps(app: object, step_s: float) -> list[tuple[float, tuple[str, ...]]]:
    """Slow every engine step to ``step_s`` and log (start time, requests decoded) of each."""
    runner = app[ENGINES_KEY].runner  # type: ignore[index]
    execute = runner.execute
    steps: list[tuple[float, tuple[str, ...]]] = []

    def logged(plan: object) -> object:
        steps.append((time.perf_counter(), tuple(plan.request_ids)))  # type: ignore[attr-defined]
        time.sleep(step_s)
        return execute(plan)

    runner.execute = logged
    return steps
