"""Text to token ids, exactly as the VoxCPM reference feeds them to the model.

The reference runs ``LlamaTokenizerFast.tokenize`` (no BOS/EOS) and then replaces every token whose
text without ``▁`` is a multi-character CJK vocabulary entry by its single characters, so Chinese
reaches the model one character per position. This module does the same on ``tokenizer.json`` with
the ``tokenizers`` library alone, which keeps ``transformers`` out of the server.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tokenizers import Tokenizer

# Token ids the models reserve as sequence markers (spec §4.3).
AUDIO_START_ID = 101
AUDIO_END_ID = 102
REF_AUDIO_START_ID = 103
REF_AUDIO_END_ID = 104

_METASPACE = "▁"
_WHITESPACE_RUN = re.compile(r"\s+")


class TokenizerError(ValueError):
    """The tokenizer files cannot be used, or the input is not text."""


def normalize_whitespace(text: str) -> str:
    """Collapse every run of whitespace (newlines included) to one space, keeping leading/trailing space.

    The reference does this to the target text before tokenizing; it never strips, so a text that
    starts with a newline starts with a space token.
    """
    return _WHITESPACE_RUN.sub(" ", text)


def _is_cjk_word(piece: str) -> bool:
    return len(piece) >= 2 and all("\u4e00" <= char <= "\u9fff" for char in piece)


class TextTokenizer:
    """Encodes text to the reference's ids; load one with :meth:`from_dir`."""

    def __init__(self, tokenizer: Tokenizer, unk_token: str) -> None:
        self._tokenizer = tokenizer
        # The reference converts token strings back to ids, so it sees added tokens too.
        self._vocab = tokenizer.get_vocab(with_added_tokens=True)
        if unk_token not in self._vocab:
            raise TokenizerError(f"the unknown token {unk_token!r} is not in the vocabulary")
        self._unk_id = self._vocab[unk_token]
        self._cjk_words = frozenset(piece for piece in self._vocab if _is_cjk_word(piece))
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        """Load ``path/tokenizer.json`` (the file a VoxCPM checkpoint ships) and use its pipeline as is.

        transformers >= 5 does not: its ``LlamaTokenizer`` keeps only the vocabulary and merges and
        rebuilds a Metaspace pipeline. The two agree whenever the file already holds that pipeline, as
        the tiny tokenizer does; a file with a legacy ``Prepend`` normalizer differs on leading spaces.
        """
        file = Path(path) / "tokenizer.json"
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise TokenizerError(f"cannot read the tokenizer file {file}: {error}") from error
        try:
            spec = json.loads(text)
        except ValueError as error:
            raise TokenizerError(f"{file} is not valid JSON: {error}") from error
        try:
            tokenizer = Tokenizer.from_str(text)
        except Exception as error:  # tokenizers reports every malformed file as a bare Exception
            raise TokenizerError(f"{file} is not a tokenizer the tokenizers library can load: {error}") from error
        unk_token = spec["model"].get("unk_token") or "<unk>"
        # The reference calls the backend with truncation and padding off, whatever the file says.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return cls(tokenizer, unk_token)

    def encode(self, text: str) -> list[int]:
        """Token ids for ``text``, with no BOS/EOS; whitespace normalisation is the caller's job."""
        if not isinstance(text, str):
            raise TokenizerError(f"text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        for token in self._tokenizer.encode(text, add_special_tokens=False).tokens:
            # The reference drops every "▁" before the lookup, and with it the word boundary.
            bare = token.replace(_METASPACE, "")
            pieces = list(bare) if bare in self._cjk_words else [token]
            ids.extend(self._vocab.get(piece, self._unk_id) for piece in pieces)
        return ids
