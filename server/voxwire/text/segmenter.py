"""Incremental sentence segmenter for streamed text input.

Text arrives in arbitrary pieces (LLM tokens, WebSocket messages). ``push`` returns the
sentences whose end is already certain, so speech can start on them; ``flush`` returns the
rest. A boundary is only reported once the characters that decide it have arrived, so the
output never depends on how the input was split into pushes.

Output rule (tested): the whole input equals ``w0 + s1 + w1 + s2 + ... + sn + wn`` where the
``si`` are the returned sentences in order (non-empty, no leading or trailing whitespace,
inner whitespace verbatim) and every ``wi`` is whitespace or empty. Nothing else is lost,
added or reordered.

Boundaries:

- A newline (``\\n``, ``\\r``, U+2028, U+2029) always ends a sentence.
- A run of terminators (``. ! ? …`` and CJK ``。！？；｡．``) plus any closing quotes and
  brackets after it ends a sentence when what follows decides so:
  - a CJK full stop (``。！？；｡．``): always, once the character after the run is known;
  - directly followed by a non-space character: only if that character is CJK and the run is
    not an ellipsis (``3.14``, ``example.com``, ``v1.2.3``, ``a@b.c``, URLs and ``wait...what``
    stay whole);
  - followed by spaces: decided by the next character that is not a space, an opening quote
    or bracket, or an ellipsis. A lowercase letter means the sentence goes on (``e.g. the``,
    ``Wait... what``, ``"Why?" he asked``, ``It was... ...quiet``). A single
    ``.`` after a title or Latin abbreviation (``Mr.``, ``Dr.``, ``e.g.``, ``i.e.``, ``vs.``),
    an initial (``J. R. R. Tolkien``), a reference word or month before a number (``No. 5``, ``Jan. 5``)
    or a list number at the start of a sentence (``1. Buy milk``) does not end the sentence.
    Ambiguous abbreviations (``etc.``, ``U.S.``, ``Inc.``, ``p.m.``) end it before an
    uppercase word.
- A candidate whose text has no letter or digit (``...`` alone) is not a sentence; it stays
  with the text that follows.
- "Hello." at the end of the buffer is not emitted by ``push``: the next character could be
  ``5``, a quote or a lowercase word. ``flush`` treats the end of input as a boundary.
- Text longer than ``max_chars`` without a boundary is cut so speech can start: after the
  last clause mark (``, ; :`` or CJK ``，、：``) in the second half of the window, else at the
  last space, else (unspaced CJK, long URLs) at exactly ``max_chars``. No sentence is longer
  than ``max_chars``.

Voice design prefix (``design_prefix=True``, for VoxCPM2): a stream that starts (after spaces) with
``(`` is held until its matching ``)`` arrives; that parenthesised description is VoxCPM2's voice design for the
whole stream, so it is taken off (``control``, cleaned by ``text.design.clean_control``) rather than left
on the first sentence alone, and the output rule above holds for the text after it. A ``(`` not closed
within ``max_chars`` characters, or by the end of input, is ordinary text.
"""

from __future__ import annotations

import enum

from voxwire.text.design import clean_control

DEFAULT_MAX_CHARS = 250

NEWLINES = frozenset("\n\r\u2028\u2029")
CJK_STOPS = frozenset("。！？；｡．")
TERMINATORS = frozenset(".!?…") | CJK_STOPS
ELLIPSIS_CHARS = frozenset(".…")
CLOSERS = frozenset("\"')]}»›”’」』）］｝】》〉〕〗〙〛＂＇")
OPENERS = frozenset("\"'([{«‹“‘「『（［｛【《〈〔〖〘〚＂＇")
CLAUSE_MARKS = frozenset(",;:，、；：")
CJK_CLAUSE_MARKS = frozenset("，、：")

NON_FINAL_ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "mx", "dr", "prof", "st", "mt", "ft", "rev", "hon", "gen", "col", "capt",
        "cpt", "lt", "sgt", "maj", "cmdr", "adm", "sen", "rep", "gov", "pres", "fr", "sr", "jr",
        "messrs", "mme", "mlle", "e.g", "i.e", "cf", "vs", "viz", "approx", "ca", "incl",
    }
)  # fmt: skip
"""Words a '.' after which does not end a sentence, whatever follows (compared lowercase)."""

NUMBER_ABBREVIATIONS = frozenset(
    {
        "no", "nos", "nr", "vol", "vols", "p", "pp", "fig", "figs", "ch", "sec", "art", "eq", "op", "ref",
        "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    }
)  # fmt: skip
"""Words a '.' after which does not end a sentence when a number follows (``No. 5``, ``Jan. 5``)."""

_MAX_LIST_NUMBER_DIGITS = 3


class _Verdict(enum.Enum):
    BOUNDARY = enum.auto()
    CONTINUES = enum.auto()
    UNDECIDED = enum.auto()


class _Prefix(enum.Enum):
    """Where the stream is in looking for a voice design prefix at its start."""

    LOOKING = enum.auto()
    """The start may still be a ``(description)``: nothing is returned yet."""
    DONE = enum.auto()
    """Taken, or the stream does not start with one (or none is looked for)."""


class SentenceSegmenter:
    """Stateful: one instance per text stream."""

    def __init__(self, *, max_chars: int = DEFAULT_MAX_CHARS, design_prefix: bool = False) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be positive, got {max_chars}")
        self.max_chars = max_chars
        self._buffer = ""
        self._prefix = _Prefix.LOOKING if design_prefix else _Prefix.DONE
        self.control: str | None = None
        """The voice design the stream started with (``design_prefix``); None: none."""

    @property
    def pending(self) -> str:
        """Text received but not yet returned (may be whitespace only)."""
        return self._buffer

    def push(self, text: str) -> list[str]:
        """Append ``text``; return the sentences it completed."""
        self._buffer += text
        if not self._take_prefix(final=False):
            return []
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """Return everything still buffered, treating the end of input as a sentence end."""
        self._take_prefix(final=True)
        sentences = self._drain(final=True)
        self._buffer = ""
        return sentences

    def _take_prefix(self, *, final: bool) -> bool:
        """Take a leading ``(description)`` off the buffer once it is whole; False while it may still come."""
        if self._prefix is _Prefix.DONE:
            return True
        buf = self._buffer
        start = len(buf) - len(buf.lstrip())
        if start == len(buf):
            return final  # only spaces so far
        close = _matching_close(buf, start, start + self.max_chars + 1) if buf[start] == "(" else -1
        if buf[start] == "(" and close == -1 and not final and len(buf) - start <= self.max_chars:
            return False
        self._prefix = _Prefix.DONE
        if close != -1:
            self.control = clean_control(buf[start + 1 : close])
            self._buffer = buf[close + 1 :]
        return True

    def _drain(self, *, final: bool) -> list[str]:
        sentences = []
        while (cut := self._next_cut(final)) is not None:
            sentences.append(self._buffer[:cut].strip())
            self._buffer = self._buffer[cut:]
        return sentences

    def _next_cut(self, final: bool) -> int | None:
        """Index just after the next sentence, or None when none is certain yet."""
        buf = self._buffer
        start = len(buf) - len(buf.lstrip())
        if start == len(buf):
            return None
        limit = start + self.max_chars
        j = start
        while j < min(len(buf), limit):
            char = buf[j]
            if char in NEWLINES:
                return j
            if char not in TERMINATORS:
                j += 1
                continue
            verdict, end = self._judge(start, j, final)
            if end > limit:
                break
            if verdict is _Verdict.UNDECIDED:
                return None
            if verdict is _Verdict.BOUNDARY and _has_word(buf, start, end):
                return end
            j = end
        if len(buf) > limit:
            return _forced_cut(buf, start, limit)
        return len(buf) if final else None

    def _judge(self, start: int, j: int, final: bool) -> tuple[_Verdict, int]:
        """Decide whether the terminator run at ``j`` ends the sentence begun at ``start``.

        Returns the verdict and the index after the run and its closing quotes/brackets.
        """
        buf = self._buffer
        end = _skip(buf, j, TERMINATORS)
        run = buf[j:end]
        end = _skip(buf, end, CLOSERS)
        undecided = _Verdict.BOUNDARY if final else _Verdict.UNDECIDED
        if end == len(buf):
            return undecided, end
        if CJK_STOPS.intersection(run):
            return _Verdict.BOUNDARY, end
        after = buf[end]
        if not after.isspace():
            ends = _is_cjk(after) and not _is_ellipsis(run)
            return (_Verdict.BOUNDARY if ends else _Verdict.CONTINUES), end
        following = _skip_spaces(buf, end)
        if following == len(buf):
            return undecided, end
        if buf[following] in NEWLINES:
            return _Verdict.BOUNDARY, end
        # the case that decides is the first letter's: '"hello', '...and' go on
        following = _skip(buf, following, OPENERS | ELLIPSIS_CHARS)
        if following == len(buf):
            return undecided, end
        nxt = buf[following]
        if nxt.islower() or (run == "." and _dot_is_not_final(buf, start, j, nxt)):
            return _Verdict.CONTINUES, end
        return _Verdict.BOUNDARY, end


def _dot_is_not_final(buf: str, start: int, dot: int, nxt: str) -> bool:
    """True when the single '.' at ``dot`` belongs to an abbreviation, initial or list number."""
    word_start = dot
    while word_start > start and not buf[word_start - 1].isspace() and buf[word_start - 1] not in OPENERS:
        word_start -= 1
    word = buf[word_start:dot]
    lowered = word.lower()
    if lowered in NON_FINAL_ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isalpha() and word.isupper():
        return True
    if lowered in NUMBER_ABBREVIATIONS and nxt.isdigit():
        return True
    return word_start == start and word.isdigit() and len(word) <= _MAX_LIST_NUMBER_DIGITS


def _matching_close(buf: str, start: int, limit: int) -> int:
    """Index of the ``)`` that closes the ``(`` at ``start`` (nested pairs inside it skipped) before ``limit``, or
    -1."""
    depth = 0
    for k in range(start, min(len(buf), limit)):
        depth += {"(": 1, ")": -1}.get(buf[k], 0)
        if depth == 0:
            return k
    return -1


def _forced_cut(buf: str, start: int, limit: int) -> int:
    """Cut point for an over-long sentence, at most ``limit``; ``buf[limit]`` exists."""
    for k in range(limit, start + (limit - start) // 2, -1):
        if buf[k - 1] in CJK_CLAUSE_MARKS or (buf[k - 1] in CLAUSE_MARKS and buf[k].isspace()):
            return k
    for k in range(limit, start, -1):
        if buf[k].isspace():
            return k
    return limit


def _skip(buf: str, i: int, chars: frozenset[str]) -> int:
    while i < len(buf) and buf[i] in chars:
        i += 1
    return i


def _skip_spaces(buf: str, i: int) -> int:
    """Skip spaces and tabs but stop at a newline, which is a boundary of its own."""
    while i < len(buf) and buf[i].isspace() and buf[i] not in NEWLINES:
        i += 1
    return i


def _has_word(buf: str, start: int, end: int) -> bool:
    return any(char.isalnum() for char in buf[start:end])


def _is_ellipsis(run: str) -> bool:
    return set(run) <= ELLIPSIS_CHARS and (len(run) > 1 or run == "…")


def _is_cjk(char: str) -> bool:
    code = ord(char)
    return (
        0x3000 <= code <= 0x30FF  # CJK symbols and punctuation, hiragana, katakana
        or 0x3400 <= code <= 0x4DBF  # CJK extension A
        or 0x4E00 <= code <= 0x9FFF  # CJK unified ideographs
        or 0xAC00 <= code <= 0xD7AF  # Hangul syllables
        or 0xF900 <= code <= 0xFAFF  # CJK compatibility ideographs
        or 0xFF00 <= code <= 0xFFEF  # full-width and half-width forms
        or 0x20000 <= code <= 0x2FFFF  # CJK extensions B and later
    )
