"""Text normalization: the reference's readings (golden outputs recorded from voxcpm 2.0.3's own normalizer by
scripts/reference/normalize_fixtures.py) and the fixes for the readings it gets wrong."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

import pytest

from voxwire.text import normalize as normalize_module
from voxwire.text.normalize import NormalizerUnavailableError, TextNormalizer, normalize, normalize_in_worker

GOLDEN = Path(__file__).parents[1] / "fixtures" / "reference" / "normalize" / "normalizer.json"
CASES = {case["input"]: case for case in json.loads(GOLDEN.read_text())["cases"]}

FIXED = {
    # double spaces, typed or left by removing Markdown or an emoji, crashed wetext's English TN
    "Hello  world.": "Hello world.",
    "# Title\nSome `code` and a [link](http://example.com) here.": "Title Some and a link here.",
    "Great job 👍 today!": "Great job today!",
    # "1,234" lost its "one"
    "There are 1,234 people.": "There are one thousand two hundred and thirty four people.",
    # "$12.50" was "twelve point five dollars"
    "It costs $12.50.": "It costs twelve dollars and fifty cents.",
    # ISO dates in Chinese were read as subtractions (VoxCPM#51)
    "日期是2023-05-01。": "日期是二零二三年五月一日。",
    # wetext escapes double quotes with a backslash
    "“Quoted” words.": '"Quoted" words.',
    "Music of the 1990s.": "Music of the nineteen nineties.",
    "See **this** now.": "See this now.",
}


@pytest.mark.slow
@pytest.mark.parametrize("text", [text for text in CASES if text not in FIXED])
def test_reads_as_the_reference_does(text: str) -> None:
    assert normalize(text) == CASES[text]["output"]


@pytest.mark.parametrize("text", list(FIXED))
def test_fixes_what_the_reference_misreads(text: str) -> None:
    reference = CASES[text]
    assert reference.get("output") != FIXED[text], "the golden shows the reference's misreading"
    assert normalize(text) == FIXED[text]


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        (
            "It costs $1,234.50 in total.",
            "It costs one thousand two hundred and thirty four dollars and fifty cents in total.",
        ),
        ("Only $0.99 today.", "Only ninety nine cents today."),
        ("It is $1.01.", "It is one dollar and one cent."),
        ("It costs £3.10.", "It costs three pounds and ten pence."),
        ("It costs $12.", "It costs twelve dollars."),
        ("Compute 2*3*4 now.", "Compute two times three times four now."),
        ("从2023-05-01到2023-06-30。", "从二零二三年五月一日到二零二三年六月三十日。"),
    ],
)
def test_money_grouped_numbers_and_dates(text: str, spoken: str) -> None:
    assert normalize(text) == spoken


def test_a_clear_error_when_the_extra_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wetext", None)  # what an uninstalled package looks like to import
    with pytest.raises(NormalizerUnavailableError, match=r"pip install 'voxwire\[normalize\]'"):
        TextNormalizer()


@pytest.mark.asyncio
async def test_the_worker_keeps_wetext_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    original = normalize_module.normalize

    def spy(text: str) -> str:
        threads.append(threading.current_thread().name)
        return original(text)

    monkeypatch.setattr(normalize_module, "normalize", spy)
    spoken = await asyncio.gather(*(normalize_in_worker(f"I have {n} cats.") for n in (2, 3)))
    assert spoken == ["I have two cats.", "I have three cats."]
    assert len(threads) == 2 and all(name.startswith("voxwire-normalize") for name in threads)
