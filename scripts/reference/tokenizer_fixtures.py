"""Record the reference's token ids for the tiny tokenizer, for tests/text/test_tokenizer.py.

Runs in the reference environment (scripts/reference/setup_env.sh), never in tests:
    <reference venv>/bin/python scripts/reference/tokenizer_fixtures.py

The tiny tokenizer files come from voxwire (they are the input, not the thing under test); the ids
come from transformers' LlamaTokenizerFast wrapped by the reference's mask_multichar_chinese_tokens,
exactly as VoxCPM's models load and call it.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "server"))

from tokenizers import Tokenizer  # noqa: E402
from transformers import LlamaTokenizerFast  # noqa: E402
from voxcpm.model.utils import mask_multichar_chinese_tokens  # noqa: E402

from voxwire.tiny.tokenizer_files import write_tiny_tokenizer  # noqa: E402

OUTPUT = REPO / "tests" / "fixtures" / "reference" / "tokenizer" / "tiny_tokenizer_ids.json"

TEXTS = [
    "",
    " ",
    "   ",
    "Hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech, one chunk at a time: the listener hears the start first!",
    "你好，世界！",
    "今天天气很好，我们一起去公园散步吧。",
    "语音合成",
    "好",
    " 你好",
    "世界上有很多种语言，中文和英文都可以合成。",
    "VoxCPM 是一个语音合成模型。",
    "mixed中文and English混合text",
    "“你好”（括号）、顿号；冒号：问号？",
    "Numbers: 3.14159, 2026-01-31, 1,000,000 and 42%.",
    "Punctuation!? (round) [square] {curly} \"double\" 'single' -- dashes... #@$^&*_+=|\\/<>~`",
    "Emoji 😀🎉 and rare characters: café, naïve, Ω, 龘, 𠀀, こんにちは, 한국어.",
    " leading space",
    "trailing space ",
    "multiple   spaces    inside",
    "tab\tand\nnewline\r\nstay as bytes",
    "\u3000全角空格\u3000",
    "▁literal metaspace ▁▁ characters",
    "<s> special </s> tokens <unk> inside text",
    "(A warm, calm voice) Hello, 欢迎收听今天的语音合成节目。",
]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_tiny_tokenizer(directory)
        checksums = {path.name: _sha256(path) for path in sorted(directory.iterdir())}
        tokenizer = LlamaTokenizerFast.from_pretrained(directory)
        wrapped = mask_multichar_chinese_tokens(tokenizer)
        # transformers rebuilds a Llama pipeline instead of using the file's; the tiny tokenizer is only
        # a fair parity target if the file, used as it is, tokenizes the same way.
        as_is = Tokenizer.from_file(str(directory / "tokenizer.json"))
        cases = []
        for text in TEXTS:
            raw_tokens = tokenizer.tokenize(text)
            if as_is.encode(text, add_special_tokens=False).tokens != raw_tokens:
                raise SystemExit(f"transformers and tokenizer.json disagree on {text!r}")
            cases.append(
                {"text": text, "raw_tokens": raw_tokens, "tokens": wrapped.tokenize(text), "ids": wrapped(text)}
            )
        fixture = {
            "generated_by": "scripts/reference/tokenizer_fixtures.py",
            "versions": {name: metadata.version(name) for name in ("voxcpm", "transformers", "tokenizers")},
            "vocab_size": len(tokenizer.vocab),
            "file_sha256": checksums,
            "cases": cases,
        }
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {OUTPUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
