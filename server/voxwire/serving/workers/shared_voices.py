"""``SharedVoiceStore``: a frontend's saved voices, kept equal on every frontend of ``voxwire serve --workers N``.

A voice saved or deleted here is announced to engine 0, the voices' one keeper (``hub.Hub``), which tells the
other frontends; the save or delete answers its client once every frontend has it (or after
``links.SYNC_TIMEOUT_S``), so the client's next request finds the voice on any frontend. A frontend starts
with every voice saved so far (engine 0's ``Welcome``), so a restarted one resolves them all too.

If engine 0 dies, saves and deletes answer 503 ``unavailable`` until it is back (``EngineLinks.check_hub``); its
successor rebuilds the set from the frontends as they rejoin it: each brings the voices it holds and the ids it
saw deleted (ids are never reused), and the hub keeps the union less the deleted (``Hub.joined``).
"""

from __future__ import annotations

from collections.abc import Sequence

from voxwire.prompt import VoicePrompt
from voxwire.serving.server_config import VoiceSettings
from voxwire.serving.speech.voice_store import Voice, VoiceInfo, VoiceStore
from voxwire.serving.workers import ipc
from voxwire.serving.workers.links import EngineLinks


class SharedVoiceStore(VoiceStore):
    """A frontend's ``VoiceStore`` that tells the other frontends (through engine 0) what it saves and deletes."""

    def __init__(self, links: EngineLinks, settings: VoiceSettings) -> None:
        welcome = links.welcome
        super().__init__(
            settings.voices_dir, welcome.info.name, welcome.patch_shape, settings.max_voices, settings.voice_aliases
        )
        self._links = links
        self._deleted: set[str] = set()
        """Ids of the voices deleted so far (never reused): what a restarted hub must not take back."""
        for voice in welcome.voices:
            self.adopt(voice)
        links.on_voices = self._apply
        links.voices_held = self._held

    async def add(
        self, prompt: VoicePrompt, *, name: str | None, duration_s: float, owner: str | None = None
    ) -> VoiceInfo:
        self._links.check_hub()  # no change the other frontends cannot hear of: 503 while the hub restarts
        info = await super().add(prompt, name=name, duration_s=duration_s, owner=owner)
        voice = self.get(info.id)
        await self._links.publish(lambda call_id: ipc.VoiceSaved(call_id, voice))
        return info

    async def delete(self, voice_id: str, owner: str | None = None) -> None:
        self._links.check_hub()
        await super().delete(voice_id, owner)
        self._deleted.add(voice_id)
        await self._links.publish(lambda call_id: ipc.VoiceDeleted(call_id, voice_id))

    def _apply(self, saved: Sequence[Voice], deleted: Sequence[str]) -> None:
        """Another frontend's change, relayed by engine 0 (or what a restarted engine 0 holds)."""
        self._deleted.update(deleted)
        for voice in saved:
            if voice.info.id not in self._deleted:
                self.adopt(voice)
        for voice_id in deleted:
            self.forget(voice_id)

    def _held(self) -> tuple[tuple[Voice, ...], tuple[str, ...]]:
        return tuple(self.get(info.id) for info in self.infos()), tuple(sorted(self._deleted))
