"""What an HTTP speech request tells the scheduler (``engine.policy``): it runs with no lead bound (its reader wants
the audio as fast as it comes), and either route takes a ``priority`` from its body or the ``Voxwire-Priority``
header, with typed refusals. A WebSocket stream's own bound: ``ws/test_ws_max_ahead.py``."""

from __future__ import annotations

import json
import math

import pytest
from aiohttp.test_utils import TestClient
from tests.serving.helpers import record_engine_jobs

from voxwire.engine import Priority

pytestmark = pytest.mark.asyncio

SPEECH = {"model": "tts-1", "input": "Hi.", "voice": "alloy", "response_format": "pcm", "seed": 1}


async def speak(client: TestClient, headers: dict[str, str] | None = None, **fields: object) -> tuple[int, bytes]:
    async with client.post("/v1/audio/speech", json={**SPEECH, **fields}, headers=headers) as response:
        return response.status, await response.read()


async def test_an_http_response_has_no_lead_bound_and_is_realtime_by_default(client, monkeypatch) -> None:
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    assert (await speak(client))[0] == 200
    assert (jobs[0].options.max_ahead_s, jobs[0].options.priority) == (math.inf, Priority.REALTIME)
    assert jobs[0].request().max_ahead_s == math.inf


async def test_the_body_or_the_header_makes_a_request_batch(client, monkeypatch) -> None:
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    assert (await speak(client, priority="batch"))[0] == 200
    assert (await speak(client, headers={"Voxwire-Priority": "batch"}))[0] == 200
    # The body's field wins over the header.
    assert (await speak(client, headers={"Voxwire-Priority": "batch"}, priority="realtime"))[0] == 200
    assert [job.request().priority for job in jobs] == [Priority.BATCH, Priority.BATCH, Priority.REALTIME]


@pytest.mark.parametrize("where", ["body", "header"])
async def test_an_unknown_priority_is_a_typed_400_naming_it(client, monkeypatch, where: str) -> None:
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    given = {"priority": "urgent"} if where == "body" else {"headers": {"Voxwire-Priority": "urgent"}}
    status, body = await speak(client, **given)
    assert status == 400
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_parameter"
    assert ("priority" if where == "body" else "Voxwire-Priority") in error["message"]
    assert jobs == []


async def test_nano_vllm_generate_has_no_lead_bound_and_takes_a_priority(client, monkeypatch) -> None:
    jobs = record_engine_jobs(client.server.app, monkeypatch)
    payload = {"target_text": "Hi.", "response_format": "pcm", "max_generate_length": 3}
    async with client.post("/generate", json={**payload, "priority": "batch"}) as response:
        assert response.status == 200
        await response.read()
    assert (jobs[0].options.max_ahead_s, jobs[0].options.priority) == (math.inf, Priority.BATCH)
