"""``SharedVoiceStore``: a frontend's saved voices, kept equal on every frontend of ``voxwire serve --workers N``.

A voice saved or deleted here is announced to engine 0, the voices' one keeper (``hub.Hub``), which tells the
other frontends; the save or delete answers its client once every frontend has it (or after
``proxy.SYNC_TIMEOUT_S``), so the client's next request finds the voice on any frontend. A frontend starts
with every voice saved so far (engine 0's ``Welcome``), so a restarted one resolves them all too.
"""

from __future__ import annotations

from pathlib import Path

from voxwire.prompt import VoicePrompt
from voxwire.serving.voices import VoiceInfo, VoiceStore
from voxwire.serving.workers import ipc
from voxwire.serving.workers.proxy import EngineProxy


class SharedVoiceStore(VoiceStore):
    """A frontend's ``VoiceStore`` that tells the other frontends (through engine 0) what it saves and deletes."""

    def __init__(self, proxy: EngineProxy, directory: Path | None, max_voices: int) -> None:
        super().__init__(directory, proxy.info.name, proxy.patch_shape, max_voices)
        self._proxy = proxy
        for voice in proxy.initial_voices:
            self.adopt(voice)
        proxy.on_voices = self._apply

    async def add(
        self, prompt: VoicePrompt, *, name: str | None, duration_s: float, owner: str | None = None
    ) -> VoiceInfo:
        info = await super().add(prompt, name=name, duration_s=duration_s, owner=owner)
        voice = self.get(info.id)
        await self._proxy.publish(lambda call_id: ipc.VoiceSaved(call_id, voice))
        return info

    async def delete(self, voice_id: str, owner: str | None = None) -> None:
        await super().delete(voice_id, owner)
        await self._proxy.publish(lambda call_id: ipc.VoiceDeleted(call_id, voice_id))

    def _apply(self, changes: ipc.VoicesChanged) -> None:
        """Another frontend's change, relayed by engine 0."""
        for voice in changes.saved:
            self.adopt(voice)
        for voice_id in changes.deleted:
            self.forget(voice_id)
