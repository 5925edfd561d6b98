"""Sentence segmenter: every boundary rule, streaming behaviour, and no lost or duplicated text."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voxwire.text.segmenter import SentenceSegmenter


def segment(text: str, *, pieces: list[str] | None = None, max_chars: int = 250) -> list[str]:
    """All sentences from pushing ``pieces`` (default: ``text`` at once) and flushing."""
    segmenter = SentenceSegmenter(max_chars=max_chars)
    out = []
    for piece in [text] if pieces is None else pieces:
        out += segmenter.push(piece)
    return out + segmenter.flush()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello there. How are you? Fine! Good.", ["Hello there.", "How are you?", "Fine!", "Good."]),
        # abbreviations and initials
        ("Mr. Smith met Dr. Jones. They talked.", ["Mr. Smith met Dr. Jones.", "They talked."]),
        ("Use fruit, e.g. Apples, i.e. Red ones. Done.", ["Use fruit, e.g. Apples, i.e. Red ones.", "Done."]),
        ("J. R. R. Tolkien wrote it. Yes.", ["J. R. R. Tolkien wrote it.", "Yes."]),
        ("See No. 5 and Fig. 2 on Jan. 5. Then stop.", ["See No. 5 and Fig. 2 on Jan. 5.", "Then stop."]),
        ("I like apples, pears, etc. The rest no.", ["I like apples, pears, etc.", "The rest no."]),
        ("Made in the U.S. by hand. It works.", ["Made in the U.S. by hand.", "It works."]),
        ("He moved to the U.S. Then he left.", ["He moved to the U.S.", "Then he left."]),
        ("We met at 3 p.m. today. Good.", ["We met at 3 p.m. today.", "Good."]),
        # numbers, versions, URLs, e-mail
        ("Pi is 3.14 exactly. Next.", ["Pi is 3.14 exactly.", "Next."]),
        ("It costs $.99 now. Buy it.", ["It costs $.99 now.", "Buy it."]),
        ("Install v1.2.3 today. It is 2.0. Ok.", ["Install v1.2.3 today.", "It is 2.0.", "Ok."]),
        ("Go to https://ex.com/a.b?c=1&d=2! Then rest.", ["Go to https://ex.com/a.b?c=1&d=2!", "Then rest."]),
        ("Visit www.example.org. It is free.", ["Visit www.example.org.", "It is free."]),
        ("Mail john.doe@mail.co.uk. He replies.", ["Mail john.doe@mail.co.uk.", "He replies."]),
        ("1. Buy milk\n2. Buy eggs", ["1. Buy milk", "2. Buy eggs"]),
        # ellipses
        ("Wait... what? I see... Fine.", ["Wait... what?", "I see...", "Fine."]),
        ("Well… maybe. Hmm… No.", ["Well… maybe.", "Hmm…", "No."]),
        ("It was... ...quiet.", ["It was... ...quiet."]),
        ("... Hello there.", ["... Hello there."]),
        # quotes and brackets after the terminator
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ('"Why?" he asked. "Because!" She smiled.', ['"Why?" he asked.', '"Because!"', "She smiled."]),
        ("(This is an aside.) Back to it.", ["(This is an aside.)", "Back to it."]),
        ("Really?! Yes!!! Ok?!", ["Really?!", "Yes!!!", "Ok?!"]),
        # CJK
        ("你好。今天天气很好！你呢？", ["你好。", "今天天气很好！", "你呢？"]),
        ("我觉得……不太好；不过没关系。", ["我觉得……不太好；", "不过没关系。"]),
        ("他说：「好的。」然后走了。", ["他说：「好的。」", "然后走了。"]),
        ("こんにちは。元気ですか？", ["こんにちは。", "元気ですか？"]),
        ("OK!你好. Fine.", ["OK!", "你好.", "Fine."]),
        ("它值3.14元。好", ["它值3.14元。", "好"]),
        # newlines
        ("Title\nFirst line, no stop\r\nSecond.", ["Title", "First line, no stop", "Second."]),
        ("  \n\n  Spaced   out.  \n", ["Spaced   out."]),
        ("", []),
        ("   ", []),
    ],
)
def test_rules(text: str, expected: list[str]) -> None:
    assert segment(text) == expected


def test_a_sentence_waits_for_the_character_that_proves_it_ended() -> None:
    segmenter = SentenceSegmenter()
    assert segmenter.push("It is 3.") == []  # could be 3.5
    assert segmenter.push("5 degrees. ") == []  # the next word could be lowercase
    assert segmenter.push("Nice") == ["It is 3.5 degrees."]
    assert segmenter.push(" day") == []
    assert segmenter.push("\n") == ["Nice day"]
    assert segmenter.push("Mr.") == []
    assert segmenter.push(" Smith.") == []
    assert segmenter.pending == "\nMr. Smith."
    assert segmenter.flush() == ["Mr. Smith."]
    assert segmenter.pending == ""


def test_cjk_stops_only_wait_for_the_next_character() -> None:
    segmenter = SentenceSegmenter()
    assert segmenter.push("你好。") == []  # a closing bracket could follow
    assert segmenter.push("我") == ["你好。"]


@pytest.mark.parametrize(
    ("text", "max_chars", "expected"),
    [
        ("one two three four five six", 12, ["one two", "three four", "five six"]),
        ("alpha beta, gamma delta epsilon", 20, ["alpha beta,", "gamma delta epsilon"]),
        ("a, bcdefg hijklmnop qrs", 20, ["a, bcdefg hijklmnop", "qrs"]),
        ("一二三四五六七八九十一二三四五", 10, ["一二三四五六七八九十", "一二三四五"]),
        ("一二三四五六，七八九十一二三", 10, ["一二三四五六，", "七八九十一二三"]),
        ("https://example.com/very/long/path", 10, ["https://ex", "ample.com/", "very/long/", "path"]),
        ("Short. Then a long sentence here.", 14, ["Short.", "Then a long", "sentence here."]),
    ],
)
def test_long_text_is_cut_so_speech_can_start(text: str, max_chars: int, expected: list[str]) -> None:
    assert segment(text, max_chars=max_chars) == expected


def test_forced_cut_happens_during_push() -> None:
    segmenter = SentenceSegmenter(max_chars=10)
    assert segmenter.push("one two three") == ["one two"]
    assert segmenter.flush() == ["three"]


def test_max_chars_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        SentenceSegmenter(max_chars=0)


def conserved(text: str, sentences: list[str]) -> bool:
    """``text == w0 + s1 + w1 + ... + sn + wn`` with every ``wi`` whitespace or empty."""
    position = 0
    for sentence in sentences:
        if not sentence or sentence != sentence.strip():
            return False
        while position < len(text) and text[position].isspace():
            position += 1
        if text[position : position + len(sentence)] != sentence:
            return False
        position += len(sentence)
    return text[position:].strip() == ""


ALPHABET = st.sampled_from(
    [
        "a", "b", "Z", "7", " ", "  ", "\n", "\r\n", "\t", ".", "...", "!", "?", "…", ",", ";", ":", '"', "'",
        ")", "(", "。", "！", "？", "；", "，", "你", "好", "」", "「", "Mr", "e.g", "U.S", "No", "1", "3.14",
        "http://x.io/a?b=1", "@", "é", "\u2028",
    ]
)  # fmt: skip
TEXTS = st.lists(ALPHABET, max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=TEXTS, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8), max_chars=st.integers(1, 40))
def test_no_character_is_lost_or_duplicated_and_splitting_the_input_changes_nothing(
    text: str, cuts: list[int], max_chars: int
) -> None:
    whole = segment(text, max_chars=max_chars)
    assert conserved(text, whole)
    assert all(len(sentence) <= max_chars for sentence in whole)
    bounds = sorted({0, len(text), *(cut % (len(text) + 1) for cut in cuts)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert segment(text, pieces=pieces, max_chars=max_chars) == whole


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_conservation_on_arbitrary_unicode(text: str) -> None:
    assert conserved(text, segment(text, max_chars=50))


def designed(pieces: list[str], max_chars: int = 250) -> tuple[str | None, list[str]]:
    """(the control taken, the sentences) with the voice design prefix looked for."""
    segmenter = SentenceSegmenter(max_chars=max_chars, design_prefix=True)
    out = []
    for piece in pieces:
        out += segmenter.push(piece)
    return segmenter.control, out + segmenter.flush()


@pytest.mark.parametrize(
    "pieces",
    [
        ["(A warm, gentle female voice)Hello there. How are you today?"],
        ["  (A warm", ", gentle  female voice)", "Hello there.", " How are you today?"],
        list("(A warm, gentle female voice) Hello there. How are you today?"),
    ],
)
def test_a_design_prefix_is_the_whole_streams_control_however_it_arrives(pieces: list[str]) -> None:
    assert designed(pieces) == ("A warm, gentle female voice", ["Hello there.", "How are you today?"])


def test_nothing_is_returned_while_the_prefix_may_still_close() -> None:
    segmenter = SentenceSegmenter(design_prefix=True)
    assert segmenter.push("(Calm. Slow. Deep") == []
    assert segmenter.push(")Go. Now it ends. ") == ["Go."]
    assert segmenter.control == "Calm. Slow. Deep"
    assert segmenter.flush() == ["Now it ends."]


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        (["Hi (aside) there. Next"], ["Hi (aside) there.", "Next"]),  # not at the start: ordinary text
        (["(never closed. Hello there."], ["(never closed.", "Hello there."]),  # closed by the end of input? no
        (["(" + "x" * 30, ") tail."], ["(" + "x" * 19, "x" * 11 + ") tail."]),  # not closed within max_chars
    ],
)
def test_an_unclosed_or_late_parenthesis_is_ordinary_text(pieces: list[str], expected: list[str]) -> None:
    control, sentences = designed(pieces, max_chars=20)
    assert control is None
    assert sentences == expected


def test_without_design_prefix_the_parenthesis_stays_on_the_first_sentence() -> None:
    assert segment("(A calm voice)Hello there. Bye.") == ["(A calm voice)Hello there.", "Bye."]


def test_only_the_streams_start_is_a_prefix_and_parentheses_inside_it_are_dropped() -> None:
    assert designed(["(Deep (very) voice) Hi. (Not a prefix) Bye."]) == (
        "Deep very voice",
        ["Hi.", "(Not a prefix) Bye."],
    )
    assert designed(["(", "(Deep)", " voice) Hi."]) == ("Deep voice", ["Hi."])


@settings(max_examples=300, deadline=None)
@given(text=TEXTS, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8), max_chars=st.integers(1, 40))
def test_with_a_design_prefix_splitting_the_input_changes_nothing(text: str, cuts: list[int], max_chars: int) -> None:
    control, whole = designed([text], max_chars=max_chars)
    if control is None and not text.lstrip().startswith("("):
        assert whole == segment(text, max_chars=max_chars)
    bounds = sorted({0, len(text), *(cut % (len(text) + 1) for cut in cuts)})
    assert designed([text[a:b] for a, b in itertools.pairwise(bounds)], max_chars=max_chars) == (control, whole)
