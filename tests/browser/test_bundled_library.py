"""The browser library bundled into an app, as an npm user builds one (esbuild, Vite), plays speech in headless
Chromium with no file copied beside the bundle: the AudioWorklet loads from its source built into the library. With
Vite, also from the package's own worklet.js, by the `workletUrl` recipe of client_js/README.md."""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from .conftest import CLIENT_JS, WAIT_MS, DemoServer, client_js_tool, link_package

pytestmark = pytest.mark.asyncio

BUILD_TIMEOUT_S = 120
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PAGE = (
    '<!doctype html><meta charset="utf-8"><title>bundled</title><link rel="icon" href="data:,">'
    '<script type="module" src="./app.js"></script>\n'
)
APP = """import { VoxwireClient } from 'voxwire-client';
%(imports)s
// The server to speak through comes in the page's query (it runs on another port than the app).
window.speak = async (text) => {
  const tts = new VoxwireClient({ url: new URLSearchParams(location.search).get('server')%(options)s });
  window.voxwireStats = tts.stats;
  await tts.connect();
  tts.text(text);
  tts.end();
};
"""
BUILT_IN = {"imports": "", "options": ""}
VITE_URL_RECIPE = {"imports": "import workletUrl from 'voxwire-client/worklet.js?url';", "options": ", workletUrl"}


def build(project: Path, tool: str, *args: str) -> Path:
    """Run a bundler from client_js's devDependencies in ``project``; its output folder."""
    done = subprocess.run([client_js_tool(f".bin/{tool}"), *args], cwd=project, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return project / "dist"


def esbuild(project: Path) -> Path:
    dist = build(project, "esbuild", "app.js", "--bundle", "--format=esm", "--outdir=dist")
    (dist / "index.html").write_text(PAGE)
    return dist


def vite(project: Path) -> Path:
    return build(project, "vite", "build", "--outDir", "dist", "--base", "./")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bundle", "app"),
    [(esbuild, BUILT_IN), (vite, BUILT_IN), (vite, VITE_URL_RECIPE)],
    ids=["esbuild", "vite", "vite-workletUrl"],
)
async def test_a_bundled_app_plays_speech(
    page: Any,
    demo_server: DemoServer,
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    tmp_path: Path,
    bundle: Callable[[Path], Path],
    app: dict[str, str],
) -> None:
    (tmp_path / "index.html").write_text(PAGE)
    (tmp_path / "app.js").write_text(APP % app)
    link_package(tmp_path, "voxwire-client", CLIENT_JS)
    dist = bundle(tmp_path)
    shipped = sorted(path.name for path in dist.rglob("*") if path.is_file())
    assert ("worklet" in " ".join(shipped)) == (app is VITE_URL_RECIPE), shipped  # copied only when asked for

    requested: list[str] = []  # the app server's log (Chromium's worklet loads are not page requests)

    @web.middleware
    async def log(request: web.Request, handler: Handler) -> web.StreamResponse:
        requested.append(request.path)
        return await handler(request)

    files = web.Application(middlewares=[log])

    async def index(_: web.Request) -> web.FileResponse:
        return web.FileResponse(dist / "index.html")

    files.router.add_get("/", index)
    files.router.add_static("/", dist)
    static = await aiohttp_server(files)
    server = await demo_server()
    await page.goto(str(static.make_url("/").with_query(server=str(server.make_url("/")))))
    await page.evaluate("() => window.speak('A bundled app speaks.')")
    played = "s => s.utterancesDone >= 1 && s.samplesPlayed > 0 && s.bufferedSamples === 0"
    await page.wait_for_function(f"() => ({played})(window.voxwireStats)", timeout=WAIT_MS)
    result = await page.evaluate("() => ({...window.voxwireStats})")
    assert result["framesReceived"] > 0 and result["packetsDecoded"] > 0  # WebCodecs decoded, the worklet played
    worklet_files = [url for url in requested if "worklet" in url]
    assert len(worklet_files) == (1 if app is VITE_URL_RECIPE else 0), requested
    assert page.errors == []
