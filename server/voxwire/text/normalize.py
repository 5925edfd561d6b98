"""Text normalization: numbers, dates, currency and symbols written out as they are spoken.

Optional (``pip install 'voxwire[normalize]'``: wetext, inflect, regex; wetext ships its FSTs in
its wheel, so nothing is downloaded at run time). It follows the reference's ``normalize=True``:

1. Language: Chinese if the text has a CJK ideograph, otherwise English.
2. Cleaning: Markdown (code, images, links, list bullets, HTML tags, headings) and emoji are
   removed, line breaks and tabs become spaces, curly double quotes straight ones.
3. Chinese: ``=`` is read 等于; when the text has digits or math symbols a hyphen between a
   letter/digit and a digit is spaced (so ``x-2`` is not read "x minus two" as a negative); wetext's
   Chinese TN (erhua removed); spaces are dropped unless both neighbours are ASCII; ``² ³ √ ≈ <``
   are read out; full-width brackets become spaces.
4. English: wetext's English TN, then any digits left are spelled with inflect.

and fixes the reference's known misreadings (each has a test in tests/text/test_normalize.py):

- whitespace runs are collapsed after cleaning: any double space, including one that removing
  Markdown or an emoji leaves, made wetext's English TN raise ``AssertionError``;
- English comma-grouped numbers (``1,234``) are spelled here, since wetext drops their first group
  ("thousand two hundred...");
- amounts with cents (``$12.50``) or comma groups are read as money ("twelve dollars and fifty
  cents"), not as a decimal ("twelve point five dollars");
- Chinese ISO dates (``2023-05-01``) are read as 年月日, not as subtractions (VoxCPM#51);
- the backslashes wetext's English TN puts before double quotes are removed;
- decades (``1990s``) are read "nineteen nineties", not "...ninety seconds";
- Markdown bold and italic markers are removed (``**x**`` was read "asterisk asterisk x...").

``normalize`` is synchronous (about 5-10 ms a sentence after a one-off load of about 1 s); the
server calls ``normalize_in_worker``, which runs it on one worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from voxwire.errors import VoxwireError

logger = logging.getLogger(__name__)

EXTRA_HINT = "text normalization needs the optional extra: pip install 'voxwire[normalize]' (wetext, inflect, regex)"


class NormalizerUnavailableError(VoxwireError):
    """The ``normalize`` extra is not installed."""


_CJK = re.compile(r"[\u4e00-\u9fff]")

# Markdown, in the order it is removed: fenced code, inline code, images, links (text kept),
# list bullets, HTML tags, headings, blank lines, then bold/italic markers (text kept).
_MARKDOWN = (
    (re.compile(r"```.*?```", re.DOTALL), ""),
    (re.compile(r"`[^`]*`"), ""),
    (re.compile(r"!\[[^\]]*\]\([^)]+\)"), ""),
    (re.compile(r"\[([^\]]+)\]\([^)]+\)"), r"\1"),
    (re.compile(r"^(\s*)-\s+", re.MULTILINE), r"\1"),
    (re.compile(r"<[^>]+>"), ""),
    (re.compile(r"^#{1,6}\s*", re.MULTILINE), ""),
    (re.compile(r"\n\s*\n"), "\n"),
    # a marker must not touch a word on its outer side, so "2*3*4" keeps its operators
    (re.compile(r"(?<![\w*])(\*\*|__|\*)(?=\S)(.+?)(?<=\S)\1(?![\w*])"), r"\2"),
)
_WHITESPACE = re.compile(r"\s+")

_ZH_MATH_HINT = re.compile(r"[\d$%^*_+≥≤≠×÷?=]")
_ZH_HYPHEN_BEFORE_DIGIT = re.compile(r"(?<=[a-zA-Z0-9])-(?=\d)")
_ISO_DATE = re.compile(r"(?<!\d)(\d{4})-(\d{1,2})-(\d{1,2})(?!\d)")
_ZH_SYMBOLS = {"²": "平方", "³": "立方", "√": "根号", "≈": "约等于", "<": "小于"}
_ZH_BRACKETS = {"（": " ", "）": " ", "【": " ", "】": " ", "`": "", "——": " "}

_GROUPED = r"\d{1,3}(?:,\d{3})+"
_MONEY = re.compile(rf"([$€£])({_GROUPED}|\d+)(?:\.(\d{{2}}))?(?!\d|[,.]\d)")
_GROUPED_NUMBER = re.compile(rf"(?<![\d.,]){_GROUPED}(?!\d|[,.]\d)")
_DECADE = re.compile(r"(?<![\d.,])(1\d|20)([1-9]0)s\b")
_DIGITS = re.compile(r"\d+")
_CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents")}
_CURRENCIES["£"] = ("pound", "pounds", "penny", "pence")


class TextNormalizer:
    """wetext's Chinese and English TN and inflect, loaded once (about 1 s, 50 MB)."""

    def __init__(self) -> None:
        try:
            import inflect
            import regex
            from wetext import Normalizer
        except ImportError as exc:
            raise NormalizerUnavailableError(f"{EXTRA_HINT}; missing: {exc.name}") from None
        self._zh = Normalizer(lang="zh", operator="tn", remove_erhua=True)
        self._en = Normalizer(lang="en", operator="tn")
        self._inflect: Any = inflect.engine()
        self._emoji = regex.compile(r"\p{Emoji_Presentation}|\p{Emoji}\uFE0F")

    def normalize(self, text: str) -> str:
        """``text`` as it should be spoken."""
        chinese = _CJK.search(text) is not None
        text = self._clean(text)
        return self._chinese(text) if chinese else self._english(text)

    def _clean(self, text: str) -> str:
        for pattern, replacement in _MARKDOWN:
            text = pattern.sub(replacement, text)
        text = self._emoji.sub("", text.strip())
        text = text.replace("“", '"').replace("”", '"')
        return _WHITESPACE.sub(" ", text).strip()  # also turns line breaks and tabs into spaces

    def _chinese(self, text: str) -> str:
        text = text.replace("=", "等于")
        text = _ISO_DATE.sub(_iso_date_in_chinese, text)
        if _ZH_MATH_HINT.search(text):
            text = _ZH_HYPHEN_BEFORE_DIGIT.sub(" - ", text)
        text = _drop_blanks(self._zh.normalize(text))
        for table in (_ZH_SYMBOLS, _ZH_BRACKETS):
            for symbol, spoken in table.items():
                text = text.replace(symbol, spoken)
        return text

    def _english(self, text: str) -> str:
        text = _MONEY.sub(self._money, text)
        text = _GROUPED_NUMBER.sub(lambda match: self._words(match.group()), text)
        text = _DECADE.sub(self._decade, text)
        text = self._en.normalize(text).replace('\\"', '"')
        return _DIGITS.sub(lambda match: self._inflect.number_to_words(match.group()), text)

    def _money(self, match: re.Match[str]) -> str:
        symbol, amount, cents = match.groups()
        if cents is None and "," not in amount:
            return match.group()  # "$20", "€5": wetext reads these right
        one, many, one_cent, many_cents = _CURRENCIES[symbol]
        units, hundredths = int(amount.replace(",", "")), int(cents or 0)
        parts = [f"{self._words(str(units))} {one if units == 1 else many}"] if units or not hundredths else []
        if hundredths:
            parts.append(f"{self._words(str(hundredths))} {one_cent if hundredths == 1 else many_cents}")
        return " and ".join(parts)

    def _decade(self, match: re.Match[str]) -> str:
        century, decade = match.groups()  # "1990s": "nineteen nineties"
        return f"{self._words(century)} {self._inflect.plural(self._words(decade))}"

    def _words(self, number: str) -> str:
        """An integer in words, in wetext's style: no commas, no hyphens ("thirty four")."""
        return self._inflect.number_to_words(number.replace(",", ""), comma="").replace("-", " ")


def _iso_date_in_chinese(match: re.Match[str]) -> str:
    year, month, day = (int(part) for part in match.groups())
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return match.group()
    return f"{year}年{month}月{day}日"


def _drop_blanks(text: str) -> str:
    """Remove every space that is not between two ASCII characters that are not spaces."""

    def kept(index: int) -> bool:
        before = text[index - 1] if index > 0 else ""
        after = text[index + 1] if index + 1 < len(text) else ""
        return all(len(char) == 1 and char.isascii() and char != " " for char in (before, after))

    return "".join(char for index, char in enumerate(text) if char != " " or kept(index))


_lock = threading.Lock()
_normalizer: TextNormalizer | None = None
_worker: ThreadPoolExecutor | None = None


def load_normalizer() -> TextNormalizer:
    """The process's one ``TextNormalizer``, loaded on first use. Raises ``NormalizerUnavailableError``."""
    global _normalizer
    with _lock:
        if _normalizer is None:
            _normalizer = TextNormalizer()
        return _normalizer


def normalizer_available() -> bool:
    """Whether the ``normalize`` extra is installed (without loading it)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("wetext", "inflect", "regex"))


def normalize(text: str) -> str:
    return load_normalizer().normalize(text)


async def normalize_in_worker(text: str) -> str:
    """``normalize`` on the normalization thread: the event loop never waits for wetext (or its load).

    One thread for the process: sentences from every session are normalized one at a time, which
    keeps wetext's FST state off concurrent threads; a sentence takes milliseconds.
    """
    return await asyncio.get_running_loop().run_in_executor(_normalization_thread(), normalize, text)


async def preload_in_worker() -> None:
    """Load the normalizer on the normalization thread now (about 1 s, once per process), so that a
    session's first sentence does not wait for it. A failure is only logged: each sentence retries."""
    try:
        await asyncio.get_running_loop().run_in_executor(_normalization_thread(), load_normalizer)
    except Exception:
        logger.exception("could not load the text normalizer")


def _normalization_thread() -> ThreadPoolExecutor:
    global _worker
    with _lock:
        if _worker is None:
            _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voxwire-normalize")
        return _worker
