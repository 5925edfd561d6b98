"""``VoiceStore``: saved voices (prompt latents computed once) by id, optionally persisted in a folder.

A voice is stored as two files in ``voices_dir``: ``<id>.safetensors`` (the ``VoicePrompt`` patches)
and ``<id>.json`` (name, transcript, model, creation time), the JSON written last so that a voice is
either complete or absent after a crash. Ids are made here (``voice_`` + random hex) and every id
from a client is matched against ``VOICE_ID_PATTERN`` before it touches the file system, so no id
can name a path outside the folder. This module does not decode or encode audio (the handlers do,
through ``SpeechService``); it only keeps the results. It reads and writes the latents with numpy, not torch (a
``--workers`` frontend keeps voices without the model stack): the files are byte for byte what safetensors'
torch writer made of the same float32 patches, so voices saved by either load in both.

Loading is defensive: a voice whose metadata has a wrong field, whose latents have the wrong shape
or are not finite, is skipped with a warning, so one bad file never breaks the listing or reaches
the model; files a crash left behind (a ``.tmp`` being written, latents whose JSON never came) are
removed once they are older than ``ORPHAN_GRACE_S``, which leaves another process's write alone.

Aliases (``--voice-alias FOREIGN=OURS``) let another API's voice ids and names (ElevenLabs' ``21m00Tcm4TlvDq8ikWAM``,
OpenAI's ``alloy``) name one of ours: ``resolve`` reads every request's ``voice`` through them, so each transport
gets them alike; ``load`` refuses an alias to a voice the store does not have (the server does not start).

A voice made with an API key records a digest of that key (``owner``, never listed); only the same
key may delete it. A voice made without a key (authentication off) may be deleted by anyone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from voxwire.errors import VoxwireError
from voxwire.prompt import VoicePrompt
from voxwire.speech_model import public_model_name

logger = logging.getLogger(__name__)

VOICE_ID_PATTERN = re.compile(r"voice_[0-9a-f]{16}")
"""The only shape a stored voice id has: letters and digits, so never a path component like ``..``."""

OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer", "verse"}
)
"""OpenAI's built-in voice names; none has a prompt: each is the model's default voice, designed by the name's
description on a model with voice design (``serving/speech/voice_design.py``)."""

DEFAULT_VOICE_NAMES = OPENAI_VOICES | {"default"}


class UnknownVoiceError(VoxwireError):
    """No saved voice has this id."""


class VoiceLimitError(VoxwireError):
    """The store already holds ``max_voices`` voices."""


class VoiceAliasError(VoxwireError):
    """An alias (``--voice-alias``) names a voice this server does not have."""


class VoiceOwnerError(VoxwireError):
    """The voice was made with another API key, which alone may delete it."""


ORPHAN_GRACE_S = 600.0
"""A leftover file younger than this may belong to a write in progress (another process on the folder)."""


@dataclass(frozen=True)
class VoiceInfo:
    """A saved voice's metadata, as listed by ``GET /v1/voices`` and written next to its latents."""

    id: str
    name: str
    transcript: str | None
    """The clip's transcript (continuation prompt); None for a reference-only voice (voxcpm2)."""
    model: str
    """The model (its ``--model`` source) whose encoder made the latents; listed as ``public_model_name``."""
    duration_s: float
    created_at: int
    """Unix time, seconds."""
    owner: str | None = None
    """Digest of the API key that made it (``auth.key_owner``); None when made without a key. Not listed."""

    def to_json(self) -> dict[str, object]:
        listed = asdict(self)
        del listed["owner"]
        return {"object": "voice", **listed, "model": public_model_name(self.model)}

    @classmethod
    def from_json(cls, data: object) -> VoiceInfo:
        """Metadata read back from disk, every field checked. Raises ``ValueError``."""
        if not isinstance(data, dict):
            raise ValueError("the metadata is not a JSON object")
        unknown = set(data) - set(_INFO_FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {sorted(unknown)}")
        for name, (kinds, optional) in _INFO_FIELDS.items():
            value = data.get(name)
            if value is None and optional:
                continue
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise ValueError(f"field {name!r} is {value!r}")
        duration = float(data["duration_s"])
        if not math.isfinite(duration) or duration < 0:
            raise ValueError(f"field 'duration_s' is {duration!r}")
        return cls(**{**data, "duration_s": duration})


_INFO_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "id": (str, False), "name": (str, False), "transcript": (str, True), "model": (str, False),
    "duration_s": ((int, float), False), "created_at": (int, False), "owner": (str, True),
}  # fmt: skip
"""VoiceInfo's fields: (accepted JSON types, may be null or absent)."""


@dataclass(frozen=True)
class Voice:
    info: VoiceInfo
    prompt: VoicePrompt


class VoiceStore:
    """Voices by id, in memory and (when ``directory`` is set) on disk. Use it from one event loop."""

    def __init__(
        self,
        directory: Path | None,
        model: str,
        patch_shape: tuple[int, int],
        max_voices: int,
        aliases: Iterable[tuple[str, str]] = (),
    ) -> None:
        """``patch_shape`` is the model's (patch_size, feat_dim): saved latents of another shape are skipped;
        ``aliases``: (foreign name, ours) pairs (``--voice-alias``), checked by ``load``."""
        self.directory = directory
        self.model = model
        self.patch_shape = patch_shape
        self.max_voices = max_voices
        self.aliases = {foreign.casefold(): ours for foreign, ours in aliases}
        """Our voice of each foreign name, by its casefolded form."""
        self._voices: dict[str, Voice] = {}

    def __len__(self) -> int:
        return len(self._voices)

    def load(self) -> None:
        """Read every complete voice of this model from ``directory`` (blocking: call it off the loop), then check
        the aliases.

        Raises:
            VoiceAliasError: an alias names a voice the store does not have.
        """
        if self.directory is not None:
            self._load_directory(self.directory)
        for foreign, ours in self.aliases.items():
            try:
                self._own(ours)
            except UnknownVoiceError:
                raise _unknown_alias_target(foreign, ours) from None

    def _load_directory(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._remove_orphans()
        for meta_path in sorted(directory.glob("voice_*.json")):
            voice_id = meta_path.stem
            if VOICE_ID_PATTERN.fullmatch(voice_id) is None:
                continue
            try:
                voice = self._read(voice_id)
            except (OSError, ValueError, KeyError, TypeError, SafetensorError, VoxwireError) as exc:
                logger.warning("skipping voice %s: cannot read it: %s", voice_id, exc)
                continue
            self._voices[voice_id] = voice
        logger.info("loaded %d voice(s) from %s", len(self._voices), directory)

    def infos(self) -> list[VoiceInfo]:
        """Every voice's metadata, oldest first."""
        return sorted((voice.info for voice in self._voices.values()), key=lambda info: (info.created_at, info.id))

    def get(self, voice_id: str) -> Voice:
        voice = self._voices.get(voice_id) if VOICE_ID_PATTERN.fullmatch(voice_id) else None
        if voice is None:
            raise UnknownVoiceError(f"no voice with id {voice_id!r} (see GET /v1/voices)")
        return voice

    def canonical(self, voice: str | None) -> str | None:
        """Our name for a request's ``voice``: its alias's voice (``--voice-alias``), else ``voice`` itself."""
        return None if voice is None else self.aliases.get(voice.casefold(), voice)

    def resolve(self, voice: str | None) -> VoicePrompt | None:
        """The prompt a request's ``voice`` field names, read through the aliases (``canonical``): None (the
        model's default voice) for no voice, ``default`` or an OpenAI built-in name, else the saved voice with
        that id.

        Raises:
            UnknownVoiceError: ``voice`` is neither a default name nor a saved voice id.
        """
        return self._own(self.canonical(voice))

    def _own(self, voice: str | None) -> VoicePrompt | None:
        if voice is None or voice.lower() in DEFAULT_VOICE_NAMES:
            return None
        return self.get(voice).prompt

    async def add(
        self, prompt: VoicePrompt, *, name: str | None, duration_s: float, owner: str | None = None
    ) -> VoiceInfo:
        """Save a new voice under a fresh id (on disk first, when persistent) and return its metadata.

        Raises:
            VoiceLimitError: the store is full.
        """
        if len(self._voices) >= self.max_voices:
            raise VoiceLimitError(f"the server keeps at most {self.max_voices} voices; delete one first")
        voice_id = f"voice_{secrets.token_hex(8)}"
        transcript = prompt.text if prompt.audio_patches is not None else None
        info = VoiceInfo(
            voice_id, name or voice_id, transcript, self.model, round(duration_s, 3), int(time.time()), owner
        )
        voice = Voice(info, prompt)
        if self.directory is not None:
            await asyncio.to_thread(self._write, voice)
        self._voices[voice_id] = voice
        return info

    async def delete(self, voice_id: str, owner: str | None = None) -> None:
        """Forget a voice and remove its files; ``owner`` is the requester's key digest (None: no key).

        Raises:
            UnknownVoiceError: no voice has this id.
            VoiceOwnerError: the voice was made with another key.
        """
        voice = self.get(voice_id)
        if voice.info.owner is not None and voice.info.owner != owner:
            raise VoiceOwnerError(f"voice {voice_id!r} was made with another API key; only that key may delete it")
        if self.directory is not None:
            await asyncio.to_thread(self._remove, voice_id)
        self._voices.pop(voice_id, None)

    def adopt(self, voice: Voice) -> None:
        """Hold a voice another process saved (it wrote the files, if any)."""
        self._voices[voice.info.id] = voice

    def forget(self, voice_id: str) -> None:
        """Drop a voice another process deleted (it removed the files, if any)."""
        self._voices.pop(voice_id, None)

    # ---- files (blocking; run in a worker thread) ----------------------------------------

    def _paths(self, voice_id: str) -> tuple[Path, Path]:
        assert self.directory is not None and VOICE_ID_PATTERN.fullmatch(voice_id), voice_id
        return self.directory / f"{voice_id}.safetensors", self.directory / f"{voice_id}.json"

    def _write(self, voice: Voice) -> None:
        tensors_path, meta_path = self._paths(voice.info.id)
        tensors = {
            name: np.ascontiguousarray(patches)
            for name, patches in (("audio_patches", voice.prompt.audio_patches),
                                  ("reference_patches", voice.prompt.reference_patches))
            if patches is not None
        }  # fmt: skip
        # Each file is written beside and renamed, and the JSON last: it marks the voice complete.
        _replace(tensors_path, lambda tmp: save_file(tensors, str(tmp)))
        _replace(meta_path, lambda tmp: tmp.write_text(json.dumps(asdict(voice.info), indent=1)))

    def _read(self, voice_id: str) -> Voice:
        tensors_path, meta_path = self._paths(voice_id)
        info = VoiceInfo.from_json(json.loads(meta_path.read_text()))
        if info.id != voice_id:
            raise ValueError(f"its metadata names id {info.id!r}")
        tensors = load_file(str(tensors_path))
        if not tensors or any(tuple(t.shape[1:]) != self.patch_shape for t in tensors.values()):
            shapes = [tuple(t.shape) for t in tensors.values()]
            raise ValueError(f"latents {shapes} of model {info.model!r} do not fit patches {self.patch_shape}")
        text = info.transcript or ""
        return Voice(info, VoicePrompt(text, tensors.get("audio_patches"), tensors.get("reference_patches")))

    def _remove_orphans(self) -> None:
        """Delete what an interrupted write or delete left: ``.tmp`` files and latents without their JSON."""
        assert self.directory is not None
        leftovers = [*self.directory.glob(".voice_*.tmp")]
        tensors = self.directory.glob("voice_*.safetensors")
        leftovers += [path for path in tensors if not path.with_suffix(".json").exists()]
        now = time.time()
        for path in leftovers:
            try:
                if now - path.stat().st_mtime > ORPHAN_GRACE_S:
                    path.unlink()
                    logger.warning("removed %s, left over by an interrupted write", path.name)
            except OSError as exc:
                logger.warning("cannot remove the leftover %s: %s", path.name, exc)

    def _remove(self, voice_id: str) -> None:
        tensors_path, meta_path = self._paths(voice_id)
        meta_path.unlink(missing_ok=True)
        tensors_path.unlink(missing_ok=True)


def check_alias_targets(aliases: Iterable[tuple[str, str]], directory: Path | None) -> None:
    """Before the model loads, so that a mistyped alias stops the server at once: each alias names a built-in voice
    or a voice saved in ``directory`` (its metadata file is there; ``VoiceStore.load`` checks that it loads).

    Raises:
        VoiceAliasError: an alias names neither.
    """
    for foreign, ours in aliases:
        saved = directory is not None and VOICE_ID_PATTERN.fullmatch(ours) and (directory / f"{ours}.json").is_file()
        if ours.lower() not in DEFAULT_VOICE_NAMES and not saved:
            raise _unknown_alias_target(foreign, ours)


def _unknown_alias_target(foreign: str, ours: str) -> VoiceAliasError:
    return VoiceAliasError(
        f"--voice-alias {foreign}={ours}: no voice {ours!r} here (a built-in name: "
        f"{', '.join(sorted(DEFAULT_VOICE_NAMES))}; or the id of a voice saved in --voices-dir)"
    )


def _replace(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
