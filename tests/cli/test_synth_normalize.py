"""``voxwire synth --normalize``: the text is normalized before synthesis; without the extra, a clear error."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from voxwire.cli.main import main
from voxwire.params import SynthesisParams
from voxwire.text import normalize as normalize_module
from voxwire.tts import VoxCPM


@pytest.mark.slow
def test_synth_speaks_the_normalized_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spoken: list[str] = []
    generate = VoxCPM.generate

    def recording(self: VoxCPM, text: str, params: SynthesisParams, **kwargs: Any) -> object:
        spoken.append(text)
        return generate(self, text, replace(params, max_len=4), **kwargs)

    monkeypatch.setattr(VoxCPM, "generate", recording)
    out = tmp_path / "speech.wav"
    argv = ["synth", "--model", "demo", "--normalize", "--text", "It costs $12.50.", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    assert spoken == ["It costs twelve dollars and fifty cents."]
    assert out.stat().st_size > 44


def test_synth_without_the_extra_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "wetext", None)
    monkeypatch.setattr(normalize_module, "_normalizer", None)  # not loaded yet in this process
    argv = ["synth", "--model", "demo", "--normalize", "--text", "1 2 3", "--out", str(tmp_path / "x.wav")]
    assert main(argv) == 2
    assert "pip install 'voxwire[normalize]'" in capsys.readouterr().err
