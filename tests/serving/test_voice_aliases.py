"""``--voice-alias FOREIGN=OURS``: another API's voice ids and names resolve to ours, checked when the store loads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from voxwire.cli.main import build_parser, main
from voxwire.cli.serve import config_from_args
from voxwire.prompt import VoicePrompt
from voxwire.serving.speech.voice_store import VoiceAliasError, VoiceStore, check_alias_targets

ELEVENLABS_RACHEL = "21m00Tcm4TlvDq8ikWAM"


def saved_voice(tmp_path: Path) -> str:
    """A voice saved in ``tmp_path`` (a store of patches (2, 4)); its id."""
    store = VoiceStore(tmp_path, "m", (2, 4), max_voices=10)
    prompt = VoicePrompt(reference_patches=np.zeros((3, 2, 4), dtype=np.float32))
    return asyncio.run(store.add(prompt, name="mine", duration_s=1.0)).id


def test_an_alias_names_a_saved_voice_ignoring_case(tmp_path: Path) -> None:
    voice_id = saved_voice(tmp_path)
    store = VoiceStore(tmp_path, "m", (2, 4), max_voices=10, aliases=[(ELEVENLABS_RACHEL, voice_id)])
    store.load()
    prompt = store.resolve(ELEVENLABS_RACHEL.lower())
    assert prompt is not None and prompt.reference_patches is not None
    assert store.canonical(ELEVENLABS_RACHEL) == voice_id


def test_an_openai_name_may_be_aliased_to_a_saved_voice_and_a_foreign_name_to_a_builtin(tmp_path: Path) -> None:
    voice_id = saved_voice(tmp_path)
    store = VoiceStore(tmp_path, "m", (2, 4), max_voices=10, aliases=[("alloy", voice_id), ("Rachel", "nova")])
    store.load()
    assert store.resolve("alloy") is not None  # no longer the default voice
    assert store.resolve("rachel") is None and store.canonical("rachel") == "nova"  # nova's design applies


def test_an_alias_to_a_voice_the_server_lacks_stops_the_start(tmp_path: Path) -> None:
    store = VoiceStore(None, "m", (2, 4), max_voices=10, aliases=[(ELEVENLABS_RACHEL, "voice_0123456789abcdef")])
    with pytest.raises(VoiceAliasError, match="voice_0123456789abcdef"):
        store.load()


def test_an_alias_to_a_voice_never_saved_stops_the_server_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    voice_id = saved_voice(tmp_path)
    check_alias_targets([("Rachel", "NOVA"), (ELEVENLABS_RACHEL, voice_id)], tmp_path)
    assert main(["serve", "--voice-alias", "Rachel=voice_0123456789abcdef", "--voices-dir", str(tmp_path)]) == 2
    assert "no voice 'voice_0123456789abcdef'" in capsys.readouterr().err


def test_the_flag_takes_foreign_equals_ours_and_one_voice_per_name(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["serve", "--voice-alias", "Rachel=nova", "--voice-alias", "x = default"])
    assert config_from_args(args, environ={}).voices.voice_aliases == (("Rachel", "nova"), ("x", "default"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--voice-alias", "nova"])
    assert "expected FOREIGN=OURS" in capsys.readouterr().err
    assert main(["serve", "--voice-alias", "Rachel=nova", "--voice-alias", "rachel=alloy"]) == 2
    assert "one voice per name" in capsys.readouterr().err
