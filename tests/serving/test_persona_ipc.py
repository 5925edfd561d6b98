"""Personas across processes, without spawning any: the engine process's side of the persona messages
(``EngineCore`` on its ZeroMQ socket, driven by a test DEALER), and the frontend's ``RemotePersonas`` over
several engines (a load that fails on one engine is rolled back on the others)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from tests.engine_socket import FrontendSocket, running

from voxwire.engine import Engine, Request
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.persona_names import (
    OPERATOR,
    PersonaInfo,
    PersonaLoadError,
    PersonaOwnerError,
    UnknownPersonaError,
)
from voxwire.serving.speech.persona_registry import open_registry
from voxwire.serving.workers import ipc
from voxwire.serving.workers.engine_process import EngineCore
from voxwire.serving.workers.remote_personas import RemotePersonas
from voxwire.speech_model import VoxCPMSpeech
from voxwire.tts import VoxCPM

from .conftest import LORA


@pytest.fixture
def engine(persona_tts: VoxCPM, tmp_path: Path) -> Iterator[FrontendSocket]:
    """An engine process's core on the persona model, in a thread, with no persona loaded."""
    bank = persona_tts.personas
    for name in list(bank.adapters) if bank is not None else []:
        bank.remove(name)
    # Started as ``run_engine`` starts it with ``--lora A=...`` (which reserves the layers A adapts), then A is
    # removed: the test adds it over the socket.
    config = ServerConfig.of(
        max_sessions=2, max_lora_rank=16, realtime=False, workers=0, loras=(("A", LORA),), lora_root=LORA.parent
    )
    model = VoxCPMSpeech(persona_tts)
    registry = open_registry(model, config)
    assert registry is not None
    registry.remove("A", owner=OPERATOR)
    endpoint = f"ipc://{tmp_path}/engine-0"
    engine = Engine(model.new_runner(config.engine.runner_options()), config.engine.engine_config())
    core = EngineCore(model, engine, endpoint, registry, max_voice_jobs=config.voices.max_voice_jobs)
    frontend = FrontendSocket(endpoint)
    with running(core):
        try:
            frontend.send(ipc.Hello(1))
            welcome = frontend.receive(ipc.Welcome)
            assert isinstance(welcome, ipc.Welcome) and welcome.personas == ()
            yield frontend
        finally:
            frontend.close()


def test_the_engine_loads_lists_announces_and_removes_personas(engine: FrontendSocket) -> None:
    engine.send(ipc.AddPersona(1, "A", str(LORA), None))
    reply = engine.receive(ipc.PersonaReply)
    assert isinstance(reply, ipc.PersonaReply) and reply.error is None
    [info] = reply.infos
    assert (info.name, info.rank, info.in_use) == ("A", 8, 0) and info.modules["target_modules_lm"]

    engine.send(ipc.AddPersona(2, "A", str(LORA), None))
    refused = engine.receive(ipc.PersonaReply)
    assert isinstance(refused, ipc.PersonaReply) and isinstance(refused.error, PersonaLoadError)
    assert refused.error.code == "persona_exists"  # pickled across the socket with its code

    engine.send(ipc.PersonasPublished(3))  # the origin is told too, and answers before it hears Synced
    changed = engine.receive(ipc.PersonasChanged)
    assert isinstance(changed, ipc.PersonasChanged) and changed.names == ("A",)
    engine.send(ipc.Applied(changed.sync))
    synced = engine.receive(ipc.Synced)
    assert isinstance(synced, ipc.Synced) and synced.call_id == 3

    engine.send(ipc.ListPersonas(4))
    listed = engine.receive(ipc.PersonaReply)
    assert isinstance(listed, ipc.PersonaReply) and [i.name for i in listed.infos] == ["A"]
    engine.send(ipc.RemovePersona(5, "A", None))
    removed = engine.receive(ipc.PersonaReply)
    assert isinstance(removed, ipc.PersonaReply) and removed.error is None
    engine.send(ipc.RemovePersona(6, "A", None))
    again = engine.receive(ipc.PersonaReply)
    assert isinstance(again, ipc.PersonaReply) and isinstance(again.error, UnknownPersonaError)


def test_the_requesters_key_travels_with_the_calls_and_the_engine_decides(engine: FrontendSocket) -> None:
    """Issue 20.5: under --workers the frontends forward the requester's key digest (``OWNER_KEY``); the engine's
    registry refuses anyone else's removal, typed across the socket, and the owner's own succeeds."""
    engine.send(ipc.AddPersona(1, "B", "voxcpm2", "digest-of-key-a"))  # relative to the root
    added = engine.receive(ipc.PersonaReply)
    assert isinstance(added, ipc.PersonaReply) and added.error is None
    assert [(i.name, i.path) for i in added.infos] == [("B", "voxcpm2")]
    for call_id, other in ((2, "digest-of-key-b"), (3, None)):
        engine.send(ipc.RemovePersona(call_id, "B", other))
        refused = engine.receive(ipc.PersonaReply)
        assert isinstance(refused, ipc.PersonaReply) and isinstance(refused.error, PersonaOwnerError), other
        assert "another API key" in str(refused.error)
    engine.send(ipc.RemovePersona(4, "B", "digest-of-key-a"))
    removed = engine.receive(ipc.PersonaReply)
    assert isinstance(removed, ipc.PersonaReply) and removed.error is None


def test_the_engine_refuses_a_request_naming_a_persona_it_lacks(engine: FrontendSocket) -> None:
    # A frontend whose list of names is stale (a removal not yet announced) still gets the typed refusal.
    engine.send(ipc.Add(Request("r-1", "Hello there.", persona="gone")))
    rejected = engine.receive(ipc.Rejected)
    assert isinstance(rejected, ipc.Rejected) and rejected.request_id == "r-1"
    assert isinstance(rejected.error, UnknownPersonaError) and "gone" in str(rejected.error)


# ---- RemotePersonas over several engines ------------------------------------------------------------------------


def info(name: str, in_use: int = 0) -> PersonaInfo:
    return PersonaInfo(name, f"/loras/{name}", 8, 16.0, True, True, True, in_use)


@dataclass
class FakeEngines:
    """``EngineLinks``' calls as ``RemotePersonas`` uses them: each engine answers by message type."""

    answers: list[dict[type, object]]
    sent: list[tuple[int, object]] = field(default_factory=list)
    published: int = 0

    def engines(self) -> range:
        return range(len(self.answers))

    async def call(self, engine: int, message: Callable[[int], object]) -> object:
        sent = message(len(self.sent))
        self.sent.append((engine, sent))
        answer = self.answers[engine][type(sent)]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def publish(self, message: Callable[[int], object]) -> None:
        self.published += 1


@pytest.mark.asyncio
async def test_a_persona_one_engine_cannot_load_is_removed_from_the_others() -> None:
    bad = PersonaLoadError("invalid_lora", "engine 1 could not read it")
    engines = FakeEngines([{ipc.AddPersona: (info("B"),), ipc.RemovePersona: ()}, {ipc.AddPersona: bad}])
    personas = RemotePersonas(engines, ["A"])
    with pytest.raises(PersonaLoadError) as caught:
        await personas.add("B", "/loras/B", owner=None)
    assert caught.value is bad
    removes = [(engine, message.name) for engine, message in engines.sent if isinstance(message, ipc.RemovePersona)]
    assert removes == [(0, "B")] and engines.published == 1  # the frontends hear the rolled-back list


@pytest.mark.asyncio
async def test_a_persona_every_engine_loads_is_announced_once() -> None:
    engines = FakeEngines([{ipc.AddPersona: (info("B"),)}, {ipc.AddPersona: (info("B"),)}])
    personas = RemotePersonas(engines, ["A"])
    assert await personas.add("B", "/loras/B", owner=None) == info("B")
    assert engines.published == 1 and not any(isinstance(m, ipc.RemovePersona) for _, m in engines.sent)


@pytest.mark.asyncio
async def test_listing_counts_users_on_every_engine_and_remove_needs_one_engine_to_know_it() -> None:
    unknown = UnknownPersonaError("unknown persona 'B'")
    engines = FakeEngines(
        [
            {ipc.ListPersonas: (info("A", 1), info("B", 0)), ipc.RemovePersona: ()},
            {ipc.ListPersonas: (info("A", 2), info("B", 3)), ipc.RemovePersona: unknown},
        ]
    )
    personas = RemotePersonas(engines, ["A", "B"])
    assert [(i.name, i.in_use) for i in await personas.infos()] == [("A", 3), ("B", 3)]
    await personas.remove("B", owner=None)  # engine 1 had lost it already: removed all the same
    assert engines.published == 1
    engines.answers[0][ipc.RemovePersona] = unknown
    with pytest.raises(UnknownPersonaError):
        await personas.remove("B", owner=None)
    assert engines.published == 1  # nothing changed, nothing to announce


@pytest.mark.asyncio
async def test_every_call_of_an_add_or_remove_carries_the_requesters_key() -> None:
    bad = PersonaLoadError("invalid_lora", "engine 1 could not read it")
    answers: list[dict[type, object]] = [{ipc.AddPersona: (info("B"),)}, {ipc.AddPersona: bad}]
    for answer in answers:
        answer[ipc.RemovePersona] = ()
    engines = FakeEngines(answers)
    personas = RemotePersonas(engines, ["A"])
    with pytest.raises(PersonaLoadError):
        await personas.add("B", "b", owner="digest")
    await personas.remove("B", owner="digest")
    sent = [(engine, type(message).__name__, message.owner) for engine, message in engines.sent]
    assert sent == [
        (0, "AddPersona", "digest"), (1, "AddPersona", "digest"),
        (0, "RemovePersona", "digest"),  # the roll-back, on the engine that loaded it
        (0, "RemovePersona", "digest"), (1, "RemovePersona", "digest"),
    ]  # fmt: skip


def test_names_are_checked_against_the_last_announced_list() -> None:
    personas = RemotePersonas(FakeEngines([{}]), ["A"])
    personas.check("A")
    personas.check(None)
    with pytest.raises(UnknownPersonaError, match="'B'"):
        personas.check("B")
    personas.apply(("A", "B"))
    personas.check("B")
    assert personas.names() == ["A", "B"]


@pytest.mark.asyncio
async def test_a_restarted_engine_gets_the_personas_a_serving_engine_holds() -> None:
    # Engine 1's successor loaded the --lora personas only: A, and C (which the API removed since).
    exists = PersonaLoadError("persona_exists", "another frontend restored it first")
    engines = FakeEngines(
        [
            {ipc.ListPersonas: (info("A"), replace(info("B"), owner="key-digest"), info("D"))},
            # Another frontend restores them too: an add that finds the persona there is no failure.
            {ipc.ListPersonas: (info("A"), info("C")), ipc.AddPersona: exists, ipc.RemovePersona: ()},
        ]
    )
    personas = RemotePersonas(engines, ["A", "B", "D"])
    await personas.restore(1, source=0)
    changes = [(engine, type(m).__name__, m.name) for engine, m in engines.sent if not isinstance(m, ipc.ListPersonas)]
    assert changes == [(1, "AddPersona", "B"), (1, "AddPersona", "D"), (1, "RemovePersona", "C")]
    added = [m for _, m in engines.sent if isinstance(m, ipc.AddPersona)]
    assert [m.path for m in added] == ["/loras/B", "/loras/D"]  # from the folders the serving engine loaded
    assert [m.owner for m in added] == ["key-digest", None]  # for the same owners
    assert [m.owner for _, m in engines.sent if isinstance(m, ipc.RemovePersona)] == [OPERATOR]  # by the server
    assert engines.published == 0  # the names every frontend checks against did not change
