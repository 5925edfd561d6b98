"""Engine 0's hub, without sockets: a change announced by one frontend reaches the others, and its announcer hears
``Synced`` only once every one of them has applied it (or left, restarted); persona names go to the announcer too;
a frontend that joins later finds every saved voice in its welcome; engine 0's successor rebuilds the voices from
the frontends that rejoin it, less every voice one of them saw deleted."""

from __future__ import annotations

import torch

from voxwire.prompt import VoicePrompt
from voxwire.serving.speech.voice_store import Voice, VoiceInfo
from voxwire.serving.workers import ipc
from voxwire.serving.workers.hub import Hub

F0, F1, F2 = (ipc.frontend_identity(i) for i in range(3))


def voice(voice_id: str) -> Voice:
    """A reference-only voice of one zero patch (the hub only keeps and relays it)."""
    return Voice(VoiceInfo(voice_id, "Ann", None, "sim", 1.0, 0), VoicePrompt(reference_patches=torch.zeros(1, 4, 8)))


class Names:
    """A persona registry's names, as the hub reads them."""

    def names(self) -> list[str]:
        return ["A", "B"]


def test_a_saved_voice_reaches_the_others_and_its_saver_hears_synced_once_all_applied_it() -> None:
    hub = Hub(None)
    letters = hub.handle(F0, ipc.VoiceSaved(7, voice("v1")), {F0, F1, F2})
    assert sorted(frontend for frontend, _ in letters) == [F1, F2]
    changed = letters[0][1]
    assert isinstance(changed, ipc.VoicesChanged) and changed.sync == (F0, 7)
    assert [v.info.id for v in changed.saved] == ["v1"]
    assert hub.handle(F1, ipc.Applied(changed.sync), {F0, F1, F2}) == []
    assert hub.handle(F2, ipc.Applied(changed.sync), {F0, F1, F2}) == [(F0, ipc.Synced(7))]
    assert hub.handle(F2, ipc.Applied(changed.sync), {F0, F1, F2}) == []  # answered once
    assert [v.info.id for v in hub.voices()] == ["v1"]  # a frontend that joins later gets it in its welcome


def test_a_lone_frontend_hears_synced_at_once_and_a_deleted_voice_is_forgotten() -> None:
    hub = Hub(None)
    hub.handle(F0, ipc.VoiceSaved(1, voice("v1")), {F0})
    letters = hub.handle(F0, ipc.VoiceDeleted(2, "v1"), {F0})
    assert letters == [(F0, ipc.Synced(2))] and hub.voices() == ()


def test_a_restarted_frontend_holds_up_no_announcement() -> None:
    hub = Hub(None)
    letters = hub.handle(F0, ipc.VoiceSaved(3, voice("v1")), {F0, F1})
    assert [frontend for frontend, _ in letters] == [F1]
    assert hub.joined(F1) == [(F0, ipc.Synced(3))]  # its new process gets every voice in its welcome


def test_persona_names_go_to_every_frontend_the_announcer_included() -> None:
    hub = Hub(Names())  # type: ignore[arg-type]
    letters = hub.handle(F0, ipc.PersonasPublished(4), {F0, F1})
    assert sorted(frontend for frontend, _ in letters) == [F0, F1]
    changed = letters[0][1]
    assert isinstance(changed, ipc.PersonasChanged) and changed.names == ("A", "B")
    assert hub.handle(F0, ipc.Applied(changed.sync), {F0, F1}) == []
    assert hub.handle(F1, ipc.Applied(changed.sync), {F0, F1}) == [(F0, ipc.Synced(4))]


def test_a_restarted_hub_rebuilds_the_voices_from_the_frontends_that_rejoin_it() -> None:
    hub = Hub(None)  # engine 0's successor: it starts empty
    # F0 rejoins first with what it holds; it saw v3 deleted while F1 (still away) did not.
    assert hub.joined(F0, (voice("v1"), voice("v2")), ("v3",), {F0}) == []
    assert sorted(v.info.id for v in hub.voices()) == ["v1", "v2"]
    # F1 holds v1 and v3 and saw v2 deleted: the hub forgets v2, keeps v3 out, and tells F0 (back already).
    letters = hub.joined(F1, (voice("v1"), voice("v3")), ("v2",), {F0, F1})
    assert [frontend for frontend, _ in letters] == [F0]
    changed = letters[0][1]
    assert isinstance(changed, ipc.VoicesChanged) and changed.saved == () and changed.deleted == ("v2",)
    assert [v.info.id for v in hub.voices()] == ["v1"]  # F1's welcome: it drops v3 itself
    assert hub.handle(F0, ipc.Applied(changed.sync), {F0, F1}) == []  # nobody waits for that relay
    # A voice only F2 holds reaches the others.
    letters = hub.joined(F2, (voice("v4"),), (), {F0, F1, F2})
    assert sorted(frontend for frontend, _ in letters) == [F0, F1]
    assert [v.info.id for v in letters[0][1].saved] == ["v4"]  # type: ignore[attr-defined]


def test_a_voice_deleted_through_the_hub_cannot_be_brought_back() -> None:
    hub = Hub(None)
    hub.handle(F0, ipc.VoiceSaved(1, voice("v1")), {F0})
    hub.handle(F0, ipc.VoiceDeleted(2, "v1"), {F0})
    assert hub.joined(F1, (voice("v1"),), (), {F0, F1}) == []  # F1 rejoins late, still holding it
    assert hub.voices() == ()
