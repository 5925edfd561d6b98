"""``--dit-fp8``: the server's choice of LocDiT GEMM precision reaches the loader (auto: the loader's own rule)."""

from __future__ import annotations

import pytest

import voxwire.loader
from voxwire.serving.server_config import ServerConfig
from voxwire.serving.speech.load import load_speech_model


@pytest.mark.parametrize(("setting", "asked"), [("auto", None), ("on", True), ("off", False)])
def test_the_setting_reaches_the_loader(setting: str, asked: bool | None, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def load_model(path: str, **options: object) -> object:
        seen.update(options)
        raise RuntimeError("stop here")  # the options are what this test is about

    monkeypatch.setattr(voxwire.loader, "load_model", load_model)
    with pytest.raises(RuntimeError, match="stop here"):
        load_speech_model(ServerConfig.of(model="/nowhere", dit_fp8=setting))
    assert seen["dit_fp8"] is asked


def test_an_unknown_value_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"dit_fp8='fast'.*auto, on, off"):
        ServerConfig.of(dit_fp8="fast")
