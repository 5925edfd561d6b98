"""docs/clients.md's screenshot of the demo page is one the browser test made of the page as it is now: a PNG of the
test's viewport whose digest of the page's markup and style (written in by the test) is the current one, and the
page is titled as the docs name it."""

from __future__ import annotations

import re
import struct
from pathlib import Path

from .conftest import (
    CLIENT_JS,
    DOCS_SCREENSHOT,
    SCREENSHOT_KEY,
    SCREENSHOT_SOURCES,
    UPDATE_SCREENSHOT,
    VIEWPORT,
    page_digest,
    png_chunks,
)

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = f"{UPDATE_SCREENSHOT}=1 python -m pytest tests/browser/test_demo_page.py -k test_speaks_through_webcodecs"
MIN_BYTES, MAX_BYTES = 20_000, 1_000_000
"""A screenshot of the page at this size with its waveform: tens to hundreds of KB (a blank page is a few KB)."""


def test_the_docs_show_the_screenshot_of_the_page_as_it_is() -> None:
    clients = (ROOT / "docs" / "clients.md").read_text(encoding="utf-8")
    assert f"](../client_js/{DOCS_SCREENSHOT.name})" in clients
    png = DOCS_SCREENSHOT.read_bytes()
    assert MIN_BYTES < len(png) < MAX_BYTES, len(png)
    chunks = dict(png_chunks(png))
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    assert (width, height) == (VIEWPORT["width"], VIEWPORT["height"])
    key, _, digest = chunks.get(b"tEXt", b"").partition(b"\0")
    assert key == SCREENSHOT_KEY and digest.decode() == page_digest(), (
        f"{DOCS_SCREENSHOT.name} is not of the page as {', '.join(SCREENSHOT_SOURCES)} now make it: {REGENERATE}"
    )


def test_the_page_is_titled_as_the_docs_name_it() -> None:
    page = (CLIENT_JS / "index.html").read_text(encoding="utf-8")
    [title] = re.findall(r"<title>(.*?)</title>", page)
    [heading] = re.findall(r"<h1>(.*?)</h1>", page)
    assert title == heading == "voxwire"
    assert "serves a demo page at `/`" in (ROOT / "docs" / "clients.md").read_text(encoding="utf-8")
