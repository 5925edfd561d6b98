"""``UtilityCalls``: an engine process's answers to the frontends' calls that are not speech requests.

A frontend encodes a voice clip (``EncodeVoice``) on an engine, since the model and its device live there, and
adds, removes and lists LoRA personas (``AddPersona``, ``RemovePersona``, ``ListPersonas``) on every engine,
since each owns its model's registry. Encoding a clip and loading a persona are slow, so they run on worker
threads (as the single-process server does with ``asyncio.to_thread``) and an upload does not stall the
streams; their answers wait in a queue until the engine's loop posts them (``finished``).

Sans-I/O: every call returns the letters to send (frontend identity, message); the engine process posts them.
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from voxwire.engine import QueueFullError
from voxwire.errors import InvalidInputError
from voxwire.prompt import VoicePrompt
from voxwire.serving.speech.persona_names import PersonaInfo, PersonaLoadError, PersonaOwnerError, UnknownPersonaError
from voxwire.serving.speech.persona_registry import PersonaRegistry
from voxwire.serving.workers import ipc
from voxwire.serving.workers.hub import Letter
from voxwire.speech_model import SpeechModel

logger = logging.getLogger(__name__)

UTILITY_CALLS = (ipc.EncodeVoice, ipc.AddPersona, ipc.RemovePersona, ipc.ListPersonas)
"""The messages ``UtilityCalls.handle`` answers."""

_Reply = Callable[[Future[object]], object]
"""Makes the answer to a call from its finished job's future."""


class UtilityCalls:
    """Answers the utility calls to one engine; ``close()`` ends its worker threads."""

    def __init__(self, model: SpeechModel, personas: PersonaRegistry | None, max_voice_jobs: int) -> None:
        """``personas``: the model's LoRA personas (None: a model without LoRA layers); ``max_voice_jobs``: voice
        clips encoding or waiting at once, from every frontend together; more are refused as busy (each frontend
        bounds its own uploads too, but the engine's encoder is one, shared with the step loop's process)."""
        self._model = model
        self._max_voice_jobs = max_voice_jobs
        self._encoding = 0
        self._personas = personas
        self._encoder = ThreadPoolExecutor(1, thread_name_prefix="voxwire-voice-encoder")
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="voxwire-persona-loader")
        """One thread: persona loads run one at a time (``PersonaRegistry.add``'s rule)."""
        self._done: collections.deque[tuple[bytes, Future[object], _Reply]] = collections.deque()
        """Finished jobs (appended by the worker threads): their caller, their future, and their reply."""
        self._running = 0

    @property
    def busy(self) -> bool:
        """Whether a job runs on a worker thread (its answer is due soon: poll often)."""
        return self._running > 0

    def handle(
        self, sender: bytes, call: ipc.EncodeVoice | ipc.AddPersona | ipc.RemovePersona | ipc.ListPersonas
    ) -> list[Letter]:
        """The answer to ``call`` when it is quick; a slow one starts a job, answered by ``finished`` later."""
        registry = self._personas
        if isinstance(call, ipc.EncodeVoice):
            if self._encoding >= self._max_voice_jobs:
                busy = QueueFullError(f"{self._encoding} voice clips are being encoded on this engine; retry shortly")
                return [(sender, ipc.VoiceEncoded(call.call_id, error=busy))]
            self._encoding += 1
            self._submit(sender, self._encoder, lambda: self._model.make_prompt(call.clip), self._voice_reply(call))
            return []
        if registry is None:
            error = UnknownPersonaError("this server has no personas (its model has no LoRA layers)")
            return [(sender, ipc.PersonaReply(call.call_id, error=error))]
        if isinstance(call, ipc.AddPersona):
            add = functools.partial(registry.add, call.name, call.path, owner=call.owner)
            self._submit(sender, self._loader, add, _persona_reply(call))
            return []
        if isinstance(call, ipc.RemovePersona):
            try:
                registry.remove(call.name, owner=call.owner)
            except (UnknownPersonaError, PersonaOwnerError) as exc:
                return [(sender, ipc.PersonaReply(call.call_id, error=exc))]
            return [(sender, ipc.PersonaReply(call.call_id))]
        return [(sender, ipc.PersonaReply(call.call_id, tuple(registry.infos())))]

    def finished(self) -> list[Letter]:
        """The answers of the jobs that finished since the last call."""
        letters: list[Letter] = []
        while self._done:
            sender, future, reply = self._done.popleft()
            self._running -= 1
            letters.append((sender, reply(future)))
        return letters

    def close(self) -> None:
        """Stop the worker threads; jobs not started are dropped (their callers are stopping too)."""
        self._encoder.shutdown(wait=False, cancel_futures=True)
        self._loader.shutdown(wait=False, cancel_futures=True)

    def _submit(self, sender: bytes, executor: ThreadPoolExecutor, job: Callable[[], object], reply: _Reply) -> None:
        self._running += 1
        future = executor.submit(job)
        future.add_done_callback(lambda done: self._done.append((sender, done, reply)))

    def _voice_reply(self, call: ipc.EncodeVoice) -> _Reply:
        def reply(done: Future[object]) -> ipc.VoiceEncoded:
            self._encoding -= 1  # on the engine's loop (``finished``), like the check in ``handle``
            error = done.exception()
            if error is not None and not isinstance(error, (InvalidInputError, QueueFullError)):
                # A server bug (a device out of memory, say): its type may be one the engine socket does not
                # decode, and the upload would wait forever; the frontend answers 500, the traceback stays here.
                logger.error("encoding a voice clip failed", exc_info=error)
                error = RuntimeError(f"{type(error).__name__}: {error}")
            if error is not None:
                return ipc.VoiceEncoded(call.call_id, error=error)
            prompt = done.result()
            assert isinstance(prompt, VoicePrompt)
            return ipc.VoiceEncoded(call.call_id, prompt)

        return reply


def _persona_reply(call: ipc.AddPersona) -> Callable[[Future[object]], ipc.PersonaReply]:
    def reply(done: Future[object]) -> ipc.PersonaReply:
        error = done.exception()
        if isinstance(error, (PersonaLoadError, UnknownPersonaError)):
            return ipc.PersonaReply(call.call_id, error=error)
        if error is not None:  # a server bug: the frontend answers 500; the traceback stays in this log
            logger.error("loading persona %r failed", call.name, exc_info=error)
            return ipc.PersonaReply(call.call_id, error=RuntimeError(f"{type(error).__name__}: {error}"))
        info = done.result()
        assert isinstance(info, PersonaInfo)
        return ipc.PersonaReply(call.call_id, (info,))

    return reply
