"""libopus through ctypes: the system's copy when it loads, else the copy inside PyAV's wheel.

A machine without the system package (Debian's ``libopus0``) still has libopus: PyAV, a server dependency,
bundles it (``av.libs/libopus-<hash>.so.0`` on Linux, ``av/.dylibs/`` on macOS). The library is loaded on
the first encoder, so importing the audio modules never needs it. Only the calls voxwire makes are declared.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import weakref
from pathlib import Path

import numpy as np

from voxwire.errors import VoxwireError

APPLICATIONS = {"voip": 2048, "audio": 2049, "restricted_lowdelay": 2051}
"""OPUS_APPLICATION_* of opus_defines.h."""
SET_BITRATE = 4002
GET_BITRATE = 4003
SET_COMPLEXITY = 4010
GET_COMPLEXITY = 4011
GET_LOOKAHEAD = 4027
"""OPUS_SET_*/OPUS_GET_* request codes of opus_defines.h."""
_OK = 0

BUNDLED_FOLDERS = ("av.libs", "av/.dylibs")
"""Where PyAV's wheels keep their shared libraries, relative to the folder holding the ``av`` package."""
INSTALL_HINT = (
    "install the system library (Debian/Ubuntu: apt-get install libopus0) or PyAV, which bundles it "
    "(pip install 'voxwire[server]')"
)


class OpusUnavailableError(VoxwireError):
    """Neither the system libopus nor PyAV's bundled copy could be loaded; the message says what was tried."""


class LibopusError(RuntimeError):
    """A libopus call returned an error code; the message is libopus' own description of it."""


def system_library() -> str | None:
    """The system libopus as the dynamic linker finds it, or None."""
    return ctypes.util.find_library("opus")


def bundled_libraries() -> list[Path]:
    """libopus files shipped inside PyAV's wheel (found without importing PyAV, which loads all of FFmpeg)."""
    spec = importlib.util.find_spec("av")
    if spec is None or spec.origin is None:
        return []
    site = Path(spec.origin).parent.parent
    return sorted(path for folder in BUNDLED_FOLDERS for path in (site / folder).glob("*opus*"))


@functools.cache
def libopus() -> ctypes.CDLL:
    """The loaded library, its calls declared: the system's if it loads, else PyAV's (cached once loaded)."""
    system = system_library()
    bundled = [str(path) for path in bundled_libraries()]
    failures = [] if system else ["the dynamic linker finds no system libopus"]
    if not bundled:
        failures.append("PyAV is not installed")
    for candidate in ([system] if system else []) + bundled:
        try:
            return _declared(ctypes.CDLL(candidate))
        except (OSError, AttributeError) as exc:  # AttributeError: a library without the Opus encoder
            failures.append(f"{candidate}: {exc}")
    raise OpusUnavailableError(f"Opus needs libopus, which could not be loaded ({'; '.join(failures)}): {INSTALL_HINT}")


def _declared(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.opus_encoder_create.argtypes = (ctypes.c_int32, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
    lib.opus_encoder_create.restype = ctypes.c_void_p
    lib.opus_encoder_destroy.argtypes = (ctypes.c_void_p,)
    lib.opus_encoder_destroy.restype = None
    lib.opus_encode_float.argtypes = (
        ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_void_p, ctypes.c_int32,
    )  # fmt: skip
    lib.opus_encode_float.restype = ctypes.c_int32
    lib.opus_encoder_ctl.restype = ctypes.c_int  # variadic: arguments are passed as explicit ctypes values
    lib.opus_strerror.argtypes = (ctypes.c_int,)
    lib.opus_strerror.restype = ctypes.c_char_p
    return lib


class MonoEncoder:
    """One libopus encoder state for mono audio, destroyed with this object."""

    def __init__(self, sample_rate: int, application: str, max_packet_bytes: int) -> None:
        self._lib = libopus()
        error = ctypes.c_int()
        state = self._lib.opus_encoder_create(sample_rate, 1, APPLICATIONS[application], ctypes.byref(error))
        self._check(error.value, "opus_encoder_create")
        self._state = ctypes.c_void_p(state)
        weakref.finalize(self, self._lib.opus_encoder_destroy, self._state)
        self._packet = ctypes.create_string_buffer(max_packet_bytes)

    def set(self, request: int, value: int) -> None:
        self._check(self._lib.opus_encoder_ctl(self._state, ctypes.c_int(request), ctypes.c_int32(value)), "ctl")

    def get(self, request: int) -> int:
        value = ctypes.c_int32()
        self._check(self._lib.opus_encoder_ctl(self._state, ctypes.c_int(request), ctypes.byref(value)), "ctl")
        return value.value

    def encode_float(self, frame: np.ndarray) -> bytes:
        """One packet from one frame: float32 ``(frame_size,)``, a frame size Opus allows at this rate."""
        samples = np.ascontiguousarray(frame, dtype=np.float32)
        pointer = samples.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        size = self._lib.opus_encode_float(self._state, pointer, samples.size, self._packet, len(self._packet))
        self._check(size, "opus_encode_float")
        return ctypes.string_at(self._packet, size)

    def _check(self, code: int, call: str) -> None:
        if code < _OK:
            raise LibopusError(f"libopus {call}: {self._lib.opus_strerror(code).decode()}")
