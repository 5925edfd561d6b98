"""TextTokenizer against ids recorded from the reference (scripts/reference/tokenizer_fixtures.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from voxwire.text.tokenizer import (
    AUDIO_END_ID,
    AUDIO_START_ID,
    REF_AUDIO_END_ID,
    REF_AUDIO_START_ID,
    TextTokenizer,
    TokenizerError,
    normalize_whitespace,
)
from voxwire.tiny.configs import TINY_VOCAB_SIZE
from voxwire.tiny.tokenizer_files import write_tiny_tokenizer

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "reference" / "tokenizer" / "tiny_tokenizer_ids.json").read_text(
        encoding="utf-8"
    )
)
CASES: list[dict[str, Any]] = FIXTURE["cases"]
MARKER_IDS = (AUDIO_START_ID, AUDIO_END_ID, REF_AUDIO_START_ID, REF_AUDIO_END_ID)


def _is_cjk_word(piece: str) -> bool:
    return len(piece) >= 2 and all("\u4e00" <= char <= "\u9fff" for char in piece)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny_tokenizer")
    write_tiny_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_dir)


def test_written_files_are_the_ones_the_fixture_was_recorded_from(tiny_dir: Path) -> None:
    written = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in tiny_dir.iterdir()}
    assert written == FIXTURE["file_sha256"], "tiny tokenizer changed: rerun scripts/reference/tokenizer_fixtures.py"


@pytest.mark.parametrize("case", CASES, ids=[repr(case["text"])[:40] for case in CASES])
def test_ids_match_reference(tiny: TextTokenizer, case: dict[str, Any]) -> None:
    assert tiny.encode(case["text"]) == case["ids"]


def test_fixture_exercises_the_cjk_splitting_rule() -> None:
    split_cases = [case for case in CASES if case["tokens"] != case["raw_tokens"]]
    merged = {token for case in split_cases for token in case["raw_tokens"] if _is_cjk_word(token.replace("▁", ""))}
    assert len(split_cases) >= 5
    # Both forms the rule handles: a bare CJK word and one carrying the word-boundary "▁".
    assert any(token.startswith("▁") for token in merged)
    assert any(not token.startswith("▁") for token in merged)


def test_fixture_exercises_byte_fallback_and_special_tokens() -> None:
    tokens = {token for case in CASES for token in case["raw_tokens"]}
    assert {"<0xF0>", "<0x09>", "<s>", "</s>", "<unk>"} <= tokens


def test_vocab_size_is_the_tiny_models_vocab_size(tiny: TextTokenizer) -> None:
    assert tiny.vocab_size == TINY_VOCAB_SIZE == FIXTURE["vocab_size"]


def test_marker_ids_exist_and_ordinary_text_never_produces_them(tiny_dir: Path) -> None:
    vocab = Tokenizer.from_file(str(tiny_dir / "tokenizer.json")).get_vocab()
    assert set(MARKER_IDS) <= set(vocab.values())
    assert not any(set(MARKER_IDS) & set(case["ids"]) for case in CASES)


def test_tokenizer_json_has_no_field_tokenizers_ignores(tiny_dir: Path) -> None:
    written = json.loads((tiny_dir / "tokenizer.json").read_text(encoding="utf-8"))
    reserialized = json.loads(Tokenizer.from_file(str(tiny_dir / "tokenizer.json")).to_str())
    # Newer tokenizers releases write merges as pairs; the file keeps the "a b" form every release reads.
    reserialized["model"]["merges"] = [" ".join(pair) for pair in reserialized["model"]["merges"]]
    assert reserialized == written


def test_tiny_tokenizer_is_llama_shaped(tiny_dir: Path) -> None:
    spec = json.loads((tiny_dir / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((tiny_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    assert [vocab["<unk>"], vocab["<s>"], vocab["</s>"]] == [0, 1, 2]
    assert all(f"<0x{byte:02X}>" in vocab for byte in range(256))
    assert spec["model"]["byte_fallback"] is True
    assert spec["pre_tokenizer"]["type"] == "Metaspace"
    assert config["add_bos_token"] is True


def test_unknown_pieces_from_the_split_map_to_unk(tmp_path: Path) -> None:
    # "甲乙" reaches the output whole as an added token, but its single characters are not in the vocab.
    vocab = {"<unk>": 0, "▁": 1, "a": 2, "甲乙": 3}
    spec = {
        "version": "1.0",
        "added_tokens": [
            {
                "id": 3,
                "content": "甲乙",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": False,
            }
        ],
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "vocab": vocab, "merges": []},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    tokenizer = TextTokenizer.from_dir(tmp_path)
    assert tokenizer.encode("a甲乙") == [1, 2, 0, 0]
    assert tokenizer.encode("a丙") == [1, 2, 0]


def test_vocabulary_without_an_unknown_token(tmp_path: Path) -> None:
    spec = {"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(TokenizerError, match="unknown token '<unk>' is not in the vocabulary"):
        TextTokenizer.from_dir(tmp_path)


def test_missing_directory_or_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"cannot read the tokenizer file .*tokenizer\.json"):
        TextTokenizer.from_dir(tmp_path / "absent")
    with pytest.raises(TokenizerError, match="cannot read"):
        TextTokenizer.from_dir(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"version": "1.0", "model": ', "not valid JSON"),
        (b"\xff\xfe not utf-8", "cannot read"),
        (b'{"version": "1.0", "model": {"type": "NoSuchModel"}}', "tokenizers library can load"),
        (b"[1, 2, 3]", "tokenizers library can load"),
    ],
)
def test_corrupt_tokenizer_json(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "tokenizer.json").write_bytes(content)
    with pytest.raises(TokenizerError, match=message):
        TextTokenizer.from_dir(tmp_path)


def test_tokenizer_error_is_a_value_error() -> None:
    assert issubclass(TokenizerError, ValueError)


@pytest.mark.parametrize("value", [None, b"bytes", 42, ["list"]])
def test_non_str_input(tiny: TextTokenizer, value: object) -> None:
    with pytest.raises(TokenizerError, match="text must be a str"):
        tiny.encode(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ""),
        ("plain", "plain"),
        ("line\nbreak", "line break"),
        (" \n leading and trailing \n ", " leading and trailing "),
        ("tabs\t\tand\r\nCRLF", "tabs and CRLF"),
        ("全角\u3000空格\u00a0nbsp", "全角 空格 nbsp"),
        ("\n", " "),
    ],
)
def test_normalize_whitespace(text: str, expected: str) -> None:
    assert normalize_whitespace(text) == expected
