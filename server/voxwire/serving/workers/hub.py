"""``Hub``: what every frontend of ``voxwire serve --workers N`` must see alike, kept by engine 0.

Frontends announce their changes to engine 0 only: a voice saved or deleted (``VoiceSaved``, ``VoiceDeleted``),
or personas added or removed on every engine (``PersonasPublished``). The hub keeps the saved voices, so that
every frontend, including a restarted one, gets them all in its ``Welcome``, and relays each change to the
frontends concerned (``VoicesChanged``, ``PersonasChanged``); once each has answered ``Applied``, the announcer
hears ``Synced``, so a client's next request finds the change on any frontend.

The hub's state lives in this process only, so when engine 0 dies (``--devices``: it is restarted while
another engine serves), its successor starts empty and rebuilds it from the frontends, which all hold the
voices: each rejoining frontend's ``Hello`` brings the voices it holds and the ids it saw deleted (never reused),
the hub keeps their union less every deleted id, and tells the frontends already back what they lack
(``joined``). The persona names are the registry's, which the rejoining frontends restore on every engine.

Sans-I/O: every call returns the letters to send (frontend identity, message); the engine process posts them.
It runs on the engine process's loop thread, between steps.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from voxwire.serving.speech.persona_registry import PersonaRegistry
from voxwire.serving.speech.voice_store import Voice
from voxwire.serving.workers import ipc

Letter = tuple[bytes, object]
"""A message for one frontend: its identity and the message."""

HUB_MESSAGES = (ipc.VoiceSaved, ipc.VoiceDeleted, ipc.PersonasPublished, ipc.Applied)
"""The messages ``Hub.handle`` answers."""

_Sync = tuple[bytes, int]
"""An announcement under way: its origin's identity and call id."""

_UNAWAITED = -1
"""The call id of a relay nobody waits for (what a rejoining frontend brought): its ``Applied`` answers are dropped."""


class Hub:
    """The voices saved so far and the announcements not yet applied everywhere."""

    def __init__(self, personas: PersonaRegistry | None) -> None:
        """``personas``: the engine's persona registry, whose names ``PersonasPublished`` relays (None: a model
        without LoRA layers)."""
        self._personas = personas
        self._voices: dict[str, Voice] = {}
        self._deleted: set[str] = set()
        """Ids of the voices deleted since this process started: a rejoining frontend cannot bring them back."""
        self._pending: dict[_Sync, set[bytes]] = {}
        """Each announcement under way, and the frontends that have not applied it yet."""

    def voices(self) -> tuple[Voice, ...]:
        """Every voice saved so far (for a frontend's ``Welcome``)."""
        return tuple(self._voices.values())

    def handle(
        self, sender: bytes, message: ipc.VoiceSaved | ipc.VoiceDeleted | ipc.PersonasPublished | ipc.Applied,
        frontends: Set[bytes],
    ) -> list[Letter]:  # fmt: skip
        """The letters that answer ``message`` from ``sender``; ``frontends``: those connected now."""
        if isinstance(message, ipc.VoiceSaved):
            self._voices[message.voice.info.id] = message.voice
            return self._announce(sender, ipc.VoicesChanged((sender, message.call_id), (message.voice,)), frontends)
        if isinstance(message, ipc.VoiceDeleted):
            self._voices.pop(message.voice_id, None)
            self._deleted.add(message.voice_id)
            changes = ipc.VoicesChanged((sender, message.call_id), deleted=(message.voice_id,))
            return self._announce(sender, changes, frontends)
        if isinstance(message, ipc.PersonasPublished):
            names = tuple(self._personas.names()) if self._personas is not None else ()
            # The origin is told too: a frontend's list of names changes by this message alone.
            changed = ipc.PersonasChanged((sender, message.call_id), names)
            return self._announce(sender, changed, frontends, origin_too=True)
        return self._applied(sender, message.sync)

    def joined(
        self,
        frontend: bytes,
        voices: Sequence[Voice] = (),
        deleted: Sequence[str] = (),
        frontends: Set[bytes] = frozenset(),
    ) -> list[Letter]:
        """``frontend`` said hello: a restarted one gets every voice in its welcome, so no announcement waits for
        its previous process. One that rejoins this hub after engine 0's restart brings the ``voices`` it holds
        and the ids it saw ``deleted``: the hub keeps what is new to it, forgets the deleted, and tells the other
        ``frontends`` (those back already) both."""
        letters = [letter for sync in list(self._pending) for letter in self._applied(frontend, sync)]
        gone = tuple(voice_id for voice_id in deleted if voice_id not in self._deleted)
        self._deleted.update(gone)
        for voice_id in gone:
            self._voices.pop(voice_id, None)
        new = tuple(v for v in voices if v.info.id not in self._voices and v.info.id not in self._deleted)
        self._voices.update((voice.info.id, voice) for voice in new)
        if new or gone:
            changes = ipc.VoicesChanged((frontend, _UNAWAITED), new, gone)
            letters += [(other, changes) for other in frontends if other != frontend]
        return letters

    def _announce(
        self,
        origin: bytes,
        changes: ipc.VoicesChanged | ipc.PersonasChanged,
        frontends: Set[bytes],
        *,
        origin_too: bool = False,
    ) -> list[Letter]:
        """Tell ``frontends`` but the origin (all of them: ``origin_too``); the origin hears ``Synced`` once every
        one told has applied it."""
        told = set(frontends) if origin_too else set(frontends) - {origin}
        self._pending[changes.sync] = told
        letters: list[Letter] = [(frontend, changes) for frontend in told]
        if not told:
            letters += self._applied(origin, changes.sync)
        return letters

    def _applied(self, sender: bytes, sync: _Sync) -> list[Letter]:
        waiting = self._pending.get(sync)
        if waiting is None:
            return []
        waiting.discard(sender)
        if waiting:
            return []
        del self._pending[sync]
        origin, call_id = sync
        return [(origin, ipc.Synced(call_id))]
