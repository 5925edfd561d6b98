"""libopus loading: the system's copy when it loads, else PyAV's bundled copy, a clear error only without both.

The fallback is proven end to end: ``voxwire serve`` with the system library made unavailable to its process
serves Ogg Opus that ``opusinfo`` accepts and ffmpeg decodes to the length of the same utterance as WAV. The
library is hidden by a mount namespace (``unshare --mount``, root): /dev/null bound over the library's files and
over the dynamic linker's cache, as on a machine without ``libopus0``. Where no mount namespace can be made
(an unprivileged container), a ``sitecustomize`` on the server's PYTHONPATH makes ctypes find no system
libopus; that variant always runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
from tests.server_process import ServerProcess

from voxwire.audio import libopus
from voxwire.audio.formats import make_encoder
from voxwire.audio.quality import spectral_snr_db

TEXT = "Opus comes from the copy inside PyAV's wheel."
SEED = 5
SYSTEM_LIBRARY_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/usr/local/lib")


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``libopus()`` loads again under the test's patches, and again after it."""
    libopus.libopus.cache_clear()
    yield
    monkeypatch.undo()
    libopus.libopus.cache_clear()


def ffmpeg_samples(path: Path) -> np.ndarray:
    """48 kHz float32 by ffmpeg's native Opus decoder (no libopus code), pre-skip and end trimming applied."""
    command = ["ffmpeg", "-v", "error", "-c:a", "opus", "-i", str(path), "-f", "f32le", "-ar", "48000", "-"]
    return np.frombuffer(subprocess.run(command, check=True, capture_output=True).stdout, dtype=np.float32)


def test_pyav_bundled_copy_is_found_and_encodes(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (bundled,) = libopus.bundled_libraries()  # PyAV is a server dependency: its wheel carries exactly one
    monkeypatch.setattr(libopus, "system_library", lambda: None)
    assert Path(libopus.libopus()._name) == bundled
    samples = (0.3 * np.sin(np.arange(48000) * 2 * np.pi * 440 / 48000)).astype(np.float32)
    encoder = make_encoder("ogg_opus", 48000)
    path = tmp_path / "tone.opus"
    path.write_bytes(b"".join(encoder.encode(samples) + encoder.finish()))
    decoded = ffmpeg_samples(path)
    assert decoded.size == samples.size
    assert spectral_snr_db(samples, decoded) > 12


def test_a_broken_system_library_falls_back_to_pyav(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "libopus.so.0"
    broken.write_bytes(b"not a library")
    monkeypatch.setattr(libopus, "system_library", lambda: str(broken))
    assert Path(libopus.libopus()._name) == libopus.bundled_libraries()[0]


def test_neither_copy_is_a_typed_error_naming_both_fixes(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(libopus, "system_library", lambda: None)
    monkeypatch.setattr(libopus, "bundled_libraries", list)
    with pytest.raises(libopus.OpusUnavailableError) as caught:
        make_encoder("ogg_opus", 48000)
    message = str(caught.value)
    assert "no system libopus" in message and "PyAV" in message
    assert "apt-get install libopus0" in message and "pip install 'voxwire[server]'" in message

    broken = tmp_path / "libopus.so.0"
    broken.write_bytes(b"")
    monkeypatch.setattr(libopus, "system_library", lambda: str(broken))
    with pytest.raises(libopus.OpusUnavailableError, match=str(broken)):
        make_encoder("ogg_opus", 48000)


def test_importing_the_server_loads_no_libopus() -> None:
    """Only an encoder loads the library: every other subcommand runs where it cannot load."""
    code = (
        "import voxwire.cli.main, voxwire.serving.app\n"
        "from voxwire.audio.libopus import libopus\n"
        "assert libopus.cache_info().currsize == 0, 'libopus was loaded at import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def system_library_files() -> list[str]:
    """The real files behind the system libopus (symbolic links resolved)."""
    found = {
        str(path.resolve())
        for folder in SYSTEM_LIBRARY_DIRS
        if Path(folder).is_dir()
        for path in Path(folder).rglob("libopus.so*")
    }
    return sorted(found)


def mount_namespace_hiding(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """``unshare --mount``: /dev/null bound over libopus and the linker cache for the server process only."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a mount namespace needs root and unshare(1); the sitecustomize variant runs instead")
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("this container cannot make a mount namespace; the sitecustomize variant runs instead")
    files = system_library_files()
    assert files, "the system libopus is not installed here: nothing to hide (CI installs libopus0)"
    hide = " && ".join(f"mount --bind /dev/null {target}" for target in [*files, "/etc/ld.so.cache"])
    return ["unshare", "--mount", "--", "sh", "-c", f'{hide} && exec "$0" "$@"'], {}


def sitecustomize_hiding(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """ctypes finds no system libopus in the server process (its sitecustomize patches ``find_library``)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import ctypes.util\n"
        "_find_library = ctypes.util.find_library\n"
        "ctypes.util.find_library = lambda name: None if name == 'opus' else _find_library(name)\n"
    )
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return [], {"PYTHONPATH": path}


def say(server: ServerProcess, out: Path, *options: str) -> None:
    command = [sys.executable, "-m", "voxwire.cli.main", "say", "--server", server.ws_url, "--seed", str(SEED)]
    subprocess.run([*command, "--out", str(out), *options, TEXT], check=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("hiding", [mount_namespace_hiding, sitecustomize_hiding])
def test_serve_without_the_system_library_speaks_ogg_opus(
    hiding: Callable[[Path], tuple[list[str], dict[str, str]]], tmp_path: Path
) -> None:
    launcher, env = hiding(tmp_path)
    with ServerProcess("--model", "sim", "--sim-cost", "5ms+0.1ms/row", launcher=launcher, env=env) as server:
        server.wait_ready()
        say(server, tmp_path / "speech.opus", "--format", "ogg_opus")
        say(server, tmp_path / "speech.wav")
        loaded = Path(f"/proc/{server.process.pid}/maps").read_text()
        assert server.stop() == 0, server.log
    # The server encoded with PyAV's copy, and no system libopus was mapped into it.
    (bundled,) = libopus.bundled_libraries()
    assert str(bundled) in loaded
    assert not any(str(file) in loaded for file in system_library_files())

    info = subprocess.run(["opusinfo", tmp_path / "speech.opus"], capture_output=True, text=True)
    assert info.returncode == 0 and "WARNING" not in info.stdout + info.stderr, info.stdout + info.stderr
    reference, rate = soundfile.read(tmp_path / "speech.wav", dtype="float32")
    assert rate == 48000 and reference.size > rate  # the sim model speaks seconds of the clip
    decoded = ffmpeg_samples(tmp_path / "speech.opus")
    assert decoded.size == reference.size, "Ogg Opus must decode to the utterance's exact length"
    assert spectral_snr_db(reference, decoded) > 12  # the same speech, not silence or another stretch
