"""``RemotePersonas``: the LoRA personas of the engine processes of ``voxwire serve --workers N``, seen from one
frontend, over the calls to the engines on its links (``EngineCalls``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from voxwire.engine.errors import EngineDeadError
from voxwire.serving.speech.persona_names import OPERATOR, PersonaInfo, PersonaLoadError, UnknownPersonaError
from voxwire.serving.workers import ipc

logger = logging.getLogger(__name__)


class EngineCalls(Protocol):
    """What ``RemotePersonas`` needs of the engines (``links.EngineLinks``)."""

    def engines(self) -> range:
        """The engines' indices."""
        ...

    async def call(self, engine: int, message: Callable[[int], object]) -> object:
        """Engine ``engine``'s answer to ``message(call id)`` (its error raised)."""
        ...

    async def publish(self, message: Callable[[int], object]) -> None:
        """Announce ``message(call id)`` to engine 0; returns once every frontend has applied it."""
        ...


class RemotePersonas:
    """The engines' LoRA personas, seen from one frontend (``Personas``).

    Adding, removing and listing go to every engine process (each owns its model's bank, and its registry
    decides for the requests it runs); a request's persona is checked here against the names engine 0 last
    announced (``apply``), which every frontend has before a change answers its client. An engine still
    refuses a request naming a persona it no longer has (``unknown_persona``), as the single-process server
    does.

    With ``--devices``, a persona is on every engine or on none: if one engine cannot load it, the engines that
    did remove it again and the add fails with that engine's error (two frontends adding one name at once may
    thus both fail with ``persona_exists``; the client retries). A remove succeeds if any engine had the persona.
    """

    def __init__(self, engines: EngineCalls, names: Sequence[str]) -> None:
        self._engines = engines
        self._names = frozenset(names)

    def apply(self, names: Sequence[str]) -> None:
        """Engine 0's persona names now (``PersonasChanged``)."""
        self._names = frozenset(names)

    def names(self) -> list[str]:
        return sorted(self._names)

    def check(self, name: str | None) -> None:
        if name is not None and name not in self._names:
            known = ", ".join(self.names()) or "none are loaded"
            raise UnknownPersonaError(f"unknown persona {name!r} (personas: {known})")

    async def infos(self) -> list[PersonaInfo]:
        """Engine 0's personas, each with the requests holding it on every engine."""
        every = await self._on_each(ipc.ListPersonas, self._engines.engines())
        users: collections.Counter[str] = collections.Counter()
        for infos in every:
            if isinstance(infos, BaseException):
                raise infos
            assert isinstance(infos, tuple)
            users.update({info.name: info.in_use for info in infos})
        first = every[0]
        assert isinstance(first, tuple)
        return [replace(info, in_use=users[info.name]) for info in first]

    async def add(self, name: str, path: str, *, owner: str | None) -> PersonaInfo:
        add = functools.partial(ipc.AddPersona, name=name, path=path, owner=owner)
        results = await self._on_each(add, self._engines.engines())
        errors = [result for result in results if isinstance(result, BaseException)]
        if errors:
            engines = zip(self._engines.engines(), results, strict=True)
            loaded = [i for i, result in engines if not isinstance(result, BaseException)]
            if loaded:
                logger.warning("persona %r loaded on %d of %d engines: removing it", name, len(loaded), len(results))
                await self._on_each(functools.partial(ipc.RemovePersona, name=name, owner=owner), loaded)
                await self._publish()
            raise errors[0]
        await self._publish()
        first = results[0]
        assert isinstance(first, tuple) and isinstance(first[0], PersonaInfo)
        return first[0]

    async def remove(self, name: str, *, owner: str | None) -> None:
        remove = functools.partial(ipc.RemovePersona, name=name, owner=owner)
        results = await self._on_each(remove, self._engines.engines())
        errors = [result for result in results if isinstance(result, BaseException)]
        if len(errors) < len(results):
            await self._publish()
        unexpected = [error for error in errors if not isinstance(error, UnknownPersonaError)]
        if unexpected:
            raise unexpected[0]
        if len(errors) == len(results):  # no engine had it
            raise errors[0]

    async def restore(self, engine: int, source: int) -> None:
        """Give ``engine``, restarted, the personas that ``source`` (a serving engine) holds: a successor loads the
        operator's ``--lora`` personas only, so those added over the API are loaded again from their folders, for
        their owners, and any ``source`` lacks are removed again (by the server: ``OPERATOR``). A load that fails
        is logged: that engine then refuses a
        request naming the persona (``unknown_persona``), as an engine does for one removed meanwhile."""
        try:
            wanted = await self._engines.call(source, ipc.ListPersonas)
        except EngineDeadError:  # the source died meanwhile: the successor keeps its --lora personas only
            logger.warning("engine %d's personas were not restored: engine %d died meanwhile", engine, source)
            return
        held = await self._engines.call(engine, ipc.ListPersonas)
        assert isinstance(wanted, tuple) and isinstance(held, tuple)
        held_names = {info.name for info in held}
        for info in wanted:
            if info.name not in held_names:
                await self._restore_one(engine, info)
        for name in sorted(held_names - {info.name for info in wanted}):
            with contextlib.suppress(UnknownPersonaError):  # another frontend removed it first
                await self._engines.call(engine, functools.partial(ipc.RemovePersona, name=name, owner=OPERATOR))

    async def _restore_one(self, engine: int, info: PersonaInfo) -> None:
        try:
            add = functools.partial(ipc.AddPersona, name=info.name, path=info.path, owner=info.owner)
            await self._engines.call(engine, add)
        except PersonaLoadError as exc:
            if exc.code != "persona_exists":  # exists: another frontend restored it first
                logger.error("persona %r could not be restored on engine %d: %s", info.name, engine, exc)

    async def _on_each(self, message: Callable[[int], object], engines: Iterable[int]) -> list[object]:
        """Each of ``engines``' answer to ``message(call id)``, or the exception it raised."""
        calls = (self._engines.call(engine, message) for engine in engines)
        return list(await asyncio.gather(*calls, return_exceptions=True))

    async def _publish(self) -> None:
        await self._engines.publish(ipc.PersonasPublished)
