"""Browser test material: the real app in process on a free port, and a page in headless Chromium.

* ``demo_server(**config)``: ``make_app`` over a tiny random voxcpm2 model (its audio is noise, which
  is all a player test needs), started on 127.0.0.1 and ready (warmed up).
* ``page``: a Playwright page in Debian's ``chromium`` (``CHROMIUM`` overrides the path), with a
  fresh profile and autoplay allowed, so audio starts without a user gesture. Console errors and
  page exceptions are collected in ``page.errors``.
* ``open_demo(page, server)`` opens the demo page with the API key, recording every ``done`` in
  ``window.dones``; ``stats(page)`` reads the library's live counters (``window.voxwireStats``).
* ``with_page_digest(png)`` marks a screenshot with the digest of the page's markup and style (``page_digest``), by
  which the docs' copy (``DOCS_SCREENSHOT``) is known to be current.
* ``client_js_tool(path)`` finds a devDependency of client_js (esbuild, Vite, ws; ``npm ci`` installs them) and
  ``link_package`` installs the library into a scratch project, as an app would have it.

The tests skip when Playwright, Chromium or client_js's devDependencies are missing, except in CI (``CI`` set),
where they fail: .ci/run installs them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from voxwire.serving.app import make_app
from voxwire.serving.runtime.keys import STATE_KEY
from voxwire.serving.server_config import ServerConfig
from voxwire.speech_model import VoxCPMSpeech
from voxwire.tts import VoxCPM

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]
READY_TIMEOUT_S = 60.0
KEY = "browser-test-key"
OPUS_PACKET_SAMPLES = 960  # 20 ms at 48 kHz
WAIT_MS = 30_000
CLIENT_JS = Path(__file__).resolve().parents[2] / "client_js"
VIEWPORT = {"width": 1200, "height": 820}
DOCS_SCREENSHOT = CLIENT_JS / "demo_page.png"
"""The screenshot docs/clients.md shows; test_demo_page.py's playback test rewrites it with UPDATE_SCREENSHOT set."""
UPDATE_SCREENSHOT = "VOXWIRE_UPDATE_SCREENSHOT"
SCREENSHOT_SOURCES = ("index.html", "demo.css")
SCREENSHOT_KEY = b"voxwire-page-sha256"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

DemoServer = Callable[..., Awaitable[TestServer]]


def _missing(reason: str) -> None:
    """Skip on a developer machine without the browser; fail in CI, where .ci/run installs it."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must install it")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        _missing("no chromium on PATH (apt-get install chromium)")
    return path


@pytest_asyncio.fixture
async def demo_server(aiohttp_server: Callable[..., Awaitable[TestServer]], tiny_tts: VoxCPM) -> DemoServer:
    """``await demo_server(**overrides)``: a started server on ``tiny_tts``, or on ``model`` (a persona test's own:
    personas wrap a model's layers, and the shared tiny model must stay as every other test reads it)."""

    async def start(*, model: VoxCPM = tiny_tts, **overrides: Any) -> TestServer:
        # The pages are tested here, not the server's overload rule (tests/engine/test_shedding.py and
        # tests/serving/ws/test_overload.py hold it): a loaded test machine must not shed a page's second stream.
        settings: dict[str, Any] = {
            "port": 0, "max_sessions": 4, "drain_timeout_s": 5.0, "max_step_load": 1000.0, **overrides,
        }  # fmt: skip
        app = make_app(ServerConfig.of(**settings), model=VoxCPMSpeech(model))
        server = await aiohttp_server(app)

        async def accepting() -> None:
            while not app[STATE_KEY].accepting:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(accepting(), READY_TIMEOUT_S)  # asyncio.timeout needs Python 3.11
        return server

    return start


@pytest_asyncio.fixture
async def page(chromium: str, tmp_path: Path) -> AsyncIterator[Any]:
    try:
        import playwright.async_api as playwright_api
    except ImportError:
        _missing("Playwright drives the browser (pip install playwright)")
    async with playwright_api.async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            tmp_path / "profile",
            executable_path=chromium,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport=VIEWPORT,
        )
        try:
            page = await context.new_page()
            page.errors = []
            page.on("pageerror", lambda error: page.errors.append(str(error)))
            page.on("console", lambda message: page.errors.append(message.text) if message.type == "error" else None)
            yield page
        finally:
            await context.close()


def page_digest() -> str:
    """What the demo page looks like, in short: the SHA-256 of its markup and style (index.html, demo.css)."""
    digest = hashlib.sha256()
    for name in SCREENSHOT_SOURCES:
        digest.update((CLIENT_JS / name).read_bytes())
    return digest.hexdigest()


def png_chunks(png: bytes) -> Iterator[tuple[bytes, bytes]]:
    """A PNG's chunks, as (type, data)."""
    assert png.startswith(PNG_SIGNATURE), "not a PNG"
    at = len(PNG_SIGNATURE)
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        yield png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        at += 12 + length


def with_page_digest(png: bytes) -> bytes:
    """The screenshot with the page's digest in a text chunk after its header (the docs' copy is checked by it)."""
    data = SCREENSHOT_KEY + b"\0" + page_digest().encode()
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    header_end = len(PNG_SIGNATURE) + 12 + 13  # the IHDR chunk comes first and holds 13 bytes
    return png[:header_end] + chunk + png[header_end:]


def client_js_tool(path: str) -> Path:
    """A file under client_js/node_modules (the library's devDependencies: bundlers, ``ws``), which ``npm ci`` in
    client_js installs (.ci/run does)."""
    found = CLIENT_JS / "node_modules" / path
    if shutil.which("node") is None or not found.exists():
        _missing(f"no node, or no client_js/node_modules/{path} (cd client_js && npm ci)")
    return found


def link_package(project: Path, name: str, target: Path) -> None:
    """Install ``target`` into ``project`` as the package ``name`` (a link, as ``npm link`` makes)."""
    (project / "node_modules").mkdir(parents=True, exist_ok=True)
    (project / "node_modules" / name).symlink_to(target, target_is_directory=True)


async def stats(page: Any) -> dict[str, Any]:
    return await page.evaluate("() => ({...window.voxwireStats})")  # type: ignore[no-any-return]


# Collects every ``done`` message in ``window.dones``, from the moment the page creates its client.
RECORD_DONE = """
window.dones = [];
Object.defineProperty(window, 'voxwireClient', {
    configurable: true,
    get() { return this.recordedClient; },
    set(client) {
        this.recordedClient = client;
        client.addEventListener('done', (event) => window.dones.push(event.detail));
    },
});
"""


async def open_demo(page: Any, server: Any, *, lead_ms: int | None = None) -> None:
    await page.add_init_script(RECORD_DONE)
    await page.goto(str(server.make_url(f"/?token={KEY}")))
    if lead_ms is not None:
        await page.fill("#lead", str(lead_ms))
        await page.dispatch_event("#lead", "change")
