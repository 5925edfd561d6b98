"""Three replicas behind real HAProxy and real nginx, both running the shipped configurations: a replica killed
outright loses only its own streams, and one shut down gracefully finishes its streams while every new session
goes elsewhere, with no failed upgrade and no 1013 on any client."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import numpy as np
import pytest
from tests.deploy.fleet import Fleet, Outcome, Replica, fleet, has_binary, http_text, speak

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (has_binary("haproxy") and has_binary("nginx")), reason="needs haproxy and nginx (apt-get install them)"
    ),
]

STREAMS = 12
"""Sessions live at once in each phase, half through each balancer."""
INPUTS = 6
"""Distinct texts and seeds; stream ``i`` speaks input ``i % INPUTS`` (each input's solo run costs CPU time)."""
SENTENCES = 6
PACE_S = 0.5
"""Seconds between a stream's sentences: six of them keep it live for about three seconds."""
DRAIN_TIMEOUT_S = 30.0
REPLICA_FLAGS = ("--model", "sim", "--drain-timeout-s", str(DRAIN_TIMEOUT_S), "--log-level", "WARNING")
"""The simulated engine: real speech, steps paced by the default cost model, and audio that depends on nothing
but each request's text and seed, so a stream must match its solo run byte for byte."""
PHASE_TIMEOUT_S = 120.0


def test_replicas_behind_haproxy_and_nginx_survive_a_kill_and_drain_cleanly(tmp_path: Path) -> None:
    with fleet(tmp_path) as running:
        asyncio.run(_scenario(running))


async def _scenario(running: Fleet) -> None:
    replicas = [running.replica(name, *REPLICA_FLAGS) for name in ("a", "b", "c")]
    for replica in replicas:
        await asyncio.to_thread(running.wait_ready, replica.url)
    balancers = [running.haproxy(replicas), running.nginx(replicas)]
    for url in balancers:
        await asyncio.to_thread(running.wait_ready, url)
    killed, drained, survivor = replicas

    # Each stream's audio alone, straight from one replica, unpaced: what every stream must hear byte for byte.
    solo = [await speak(survivor.url, index, SENTENCES, 0.0, Outcome()) for index in range(INPUTS)]
    assert all(outcome.error is None and outcome.audio for outcome in solo), [o.error for o in solo]

    # 1. Twelve live streams; SIGKILL one replica: only its own streams are lost.
    first = await _start(balancers)
    await _all_started(first)
    killed.popen.send_signal(signal.SIGKILL)
    outcomes = await _finish(first)
    on_killed = [index for index, outcome in enumerate(outcomes) if outcome.replica == killed.name]
    assert on_killed and len(on_killed) < STREAMS, _where(outcomes)
    for index, outcome in enumerate(outcomes):
        if index in on_killed:
            assert outcome.error is not None and "connection_lost" in outcome.error, (index, outcome.error)
        else:
            assert outcome.error is None, (index, outcome.replica, outcome.error)
            assert_same_audio(outcome, solo[index % INPUTS], index)

    # 2. Twelve new sessions, all served by the replicas left; SIGTERM one of them while they speak.
    second = await _start(balancers)
    await _all_started(second)
    drained.popen.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.2)  # the signal is handled: the replica is draining
    # 3. Twelve more new sessions meanwhile: the draining replica refuses them before the upgrade, the balancers
    # send them to the survivor, and no client sees a refusal.
    third = await _start(balancers)
    await _all_started(third)
    refusals = _shutting_down_refusals(drained)
    outcomes_2, outcomes_3 = await _finish(second), await _finish(third)
    for index, outcome in [*enumerate(outcomes_2), *enumerate(outcomes_3)]:
        assert outcome.error is None, (index, outcome.replica, outcome.error)
        assert outcome.replica in (drained.name, survivor.name)
        assert_same_audio(outcome, solo[index % INPUTS], index)
    assert any(outcome.replica == drained.name for outcome in outcomes_2), _where(outcomes_2)
    assert all(outcome.replica == survivor.name for outcome in outcomes_3), _where(outcomes_3)
    assert refusals >= 1, "no new session reached the draining replica: the test proved nothing about draining"
    returncode = await asyncio.to_thread(drained.popen.wait, DRAIN_TIMEOUT_S + 15)
    assert returncode == 0, drained.tail()


Live = list[tuple[Outcome, "asyncio.Task[Outcome]"]]


async def _start(balancers: list[str]) -> Live:
    """``STREAMS`` paced sessions, alternately through each balancer."""
    live: Live = []
    for index in range(STREAMS):
        outcome = Outcome()
        session = speak(balancers[index % 2], index % INPUTS, SENTENCES, PACE_S, outcome)
        live.append((outcome, asyncio.ensure_future(session)))
    return live


async def _all_started(live: Live) -> None:
    """Wait until every session heard its first audio or ended (a failure is reported by the checks after)."""

    async def started(outcome: Outcome, task: asyncio.Task[Outcome]) -> None:
        waiter = asyncio.ensure_future(outcome.started.wait())
        await asyncio.wait([waiter, task], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()

    await asyncio.wait_for(asyncio.gather(*(started(outcome, task) for outcome, task in live)), PHASE_TIMEOUT_S)


async def _finish(live: Live) -> list[Outcome]:
    return list(await asyncio.wait_for(asyncio.gather(*(task for _, task in live)), PHASE_TIMEOUT_S))


def _shutting_down_refusals(replica: Replica) -> int:
    """Upgrades the draining replica refused with 503 ``shutting_down`` (its own count, from ``/metrics``)."""
    found = re.search(r'voxwire_errors_total\{code="shutting_down"\} (\S+)', http_text(f"{replica.url}/metrics"))
    return 0 if found is None else int(float(found.group(1)))


def assert_same_audio(heard: Outcome, solo: Outcome, index: int) -> None:
    """The stream's audio is its solo run's, byte for byte: a lost, repeated or reordered chunk fails."""
    got, expected = np.frombuffer(heard.audio, np.int16), np.frombuffer(solo.audio, np.int16)
    assert got.size == expected.size, f"stream {index} on {heard.replica}: {got.size} samples, solo {expected.size}"
    assert heard.audio == solo.audio, f"stream {index} on {heard.replica} differs from its solo run"


def _where(outcomes: list[Outcome]) -> list[tuple[str | None, str | None]]:
    return [(outcome.replica, outcome.error) for outcome in outcomes]
