"""A tiny Llama-style tokenizer (the MiniCPM4 layout) for the tiny models, built deterministically.

The layout copies what a SentencePiece-converted Llama/MiniCPM tokenizer ships: ``<unk>``, ``<s>``,
``</s>`` at ids 0-2, the 256 byte-fallback tokens ``<0x00>``..``<0xFF>`` at ids 3-258 (so ids
101-104, which the models use as special positions, exist and are byte tokens that ordinary text never
produces, as in the real vocabulary), then ``▁`` and single characters, then BPE merges.

The merges are learned here by a plain greedy BPE over an embedded English/Chinese corpus with fixed
tie-breaking, and the JSON is written by hand rather than by ``tokenizers``' serializer, so the bytes
are identical on every run and across ``tokenizers`` versions. Chinese runs are learned as words, so
the vocabulary holds multi-character CJK entries and the reference's CJK-splitting rule is exercised.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

METASPACE = "▁"
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
# A pair must occur this often in the corpus to become a merge; single occurrences would only memorise
# whole sentences.
MIN_PAIR_FREQUENCY = 2

# Every character of this corpus is in the base alphabet; anything else reaches the byte fallback.
_CORPUS = """\
The quick brown fox jumps over the lazy dog.
Hello world, this is a small streaming speech server.
We turn text into speech one chunk at a time, so the first sound arrives quickly.
The model reads the text, then it speaks the words with the voice of the prompt.
Streaming means the listener hears the start of the sentence while the rest is still being made.
Please say hello to the new voice, and thank you for listening.
There is a time for speaking and a time for listening; the server does both at once.
Numbers such as 12, 345 and 2026 are read one digit at a time.
What is the weather like today? It is sunny, warm and quiet in the park.
She said that the sound of the sea was the best sound in the world.
你好，世界！
今天天气很好，我们一起去公园散步吧。
语音合成模型把文字变成声音，流式语音合成让声音更快到达。
我们的服务器一边生成一边播放，听的人不用等待。
你好，今天我们来试一试新的声音。
这个模型可以用提示音频里的声音说话。
今天的天气很好，公园里有很多人在散步。
谢谢你的耐心，我们马上开始语音合成。
世界上有很多种语言，中文和英文都可以合成。
声音、文字、模型：一个都不能少。
“你好”是我们说的第一句话；“谢谢”是第二句。
"""

# Training words mirror SentencePiece's script splitting: merges stay inside one Latin word or one CJK
# run, and digits and punctuation are never merged (Llama splits digits).
_TRAINING_WORD = re.compile(f"{METASPACE}?[A-Za-z]+|{METASPACE}?[\u4e00-\u9fff]+|.")
_CJK_PUNCTUATION = "，。！？、：；“”（）"


def _alphabet() -> list[str]:
    ascii_printable = [chr(code) for code in range(0x21, 0x7F)]
    cjk = sorted({char for char in _CORPUS if "\u4e00" <= char <= "\u9fff"})
    return [METASPACE, *ascii_printable, *_CJK_PUNCTUATION, *cjk]


def _training_words() -> Counter[tuple[str, ...]]:
    alphabet = set(_alphabet())
    words: Counter[tuple[str, ...]] = Counter()
    for line in _CORPUS.splitlines():
        # What the Metaspace pre-tokenizer (prepend_scheme "first") hands the model for this line.
        pretokenized = METASPACE + line.replace(" ", METASPACE)
        for word in _TRAINING_WORD.findall(pretokenized):
            assert set(word) <= alphabet, f"corpus character outside the alphabet in {word!r}"
            words[tuple(word)] += 1
    return words


def _merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    merged: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            merged.append(word[i] + word[i + 1])
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return tuple(merged)


def _learn_merges(words: Counter[tuple[str, ...]]) -> list[tuple[str, str]]:
    merges: list[tuple[str, str]] = []
    while True:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, freq in words.items():
            for pair in pairwise(word):
                pairs[pair] += freq
        # Most frequent first; ties by the pair itself, so the order never depends on hashing.
        best = min(pairs, key=lambda pair: (-pairs[pair], pair), default=None)
        if best is None or pairs[best] < MIN_PAIR_FREQUENCY:
            return merges
        merges.append(best)
        words = Counter({_merge_word(word, best): freq for word, freq in words.items()})


def _added_token(token_id: int, content: str) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _tokenizer_json() -> dict[str, Any]:
    pieces = [*SPECIAL_TOKENS, *(f"<0x{byte:02X}>" for byte in range(256)), *_alphabet()]
    merges = _learn_merges(_training_words())
    pieces += [left + right for left, right in merges]
    assert len(set(pieces)) == len(pieces), "a merge produced an existing piece"
    bos = SPECIAL_TOKENS[1]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(i, token) for i, token in enumerate(SPECIAL_TOKENS)],
        # Exactly the pipeline transformers' LlamaTokenizer rebuilds from vocab and merges (v5 ignores
        # the file's normalizer/pre-tokenizer), so the file used as-is and transformers agree.
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": METASPACE, "prepend_scheme": "first", "split": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [1], "tokens": [bos]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": METASPACE}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": SPECIAL_TOKENS[0],
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {piece: i for i, piece in enumerate(pieces)},
            # "a b" strings rather than pairs: every tokenizers release reads them.
            "merges": [f"{left} {right}" for left, right in merges],
        },
    }


def _special_token_entry(content: str) -> dict[str, Any]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def _tokenizer_config() -> dict[str, Any]:
    unk, bos, eos = SPECIAL_TOKENS
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {**_special_token_entry(token), "special": True} for i, token in enumerate(SPECIAL_TOKENS)
        },
        "bos_token": bos,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos,
        "legacy": False,
        "pad_token": None,
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": unk,
        "use_default_system_prompt": False,
    }


def _special_tokens_map() -> dict[str, Any]:
    unk, bos, eos = SPECIAL_TOKENS
    return {
        "bos_token": _special_token_entry(bos),
        "eos_token": _special_token_entry(eos),
        "unk_token": _special_token_entry(unk),
    }


def _dump(path: Path, content: dict[str, Any]) -> None:
    path.write_text(json.dumps(content, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def write_tiny_tokenizer(directory: Path) -> None:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _dump(directory / "tokenizer.json", _tokenizer_json())
    _dump(directory / "tokenizer_config.json", _tokenizer_config())
    _dump(directory / "special_tokens_map.json", _special_tokens_map())
