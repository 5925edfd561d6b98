"""``/docs`` in real headless Chromium: the page renders every operation of ``/openapi.json`` with the assets the
package ships, and asks nothing of any other host."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import DemoServer

pytestmark = pytest.mark.asyncio

WAIT_MS = 30_000


@pytest.mark.slow
async def test_the_docs_page_renders_every_operation_from_this_server_only(demo_server: DemoServer, page: Any) -> None:
    server = await demo_server(max_text_chars_per_utterance=321)
    base = str(server.make_url("")).rstrip("/")
    hosts: set[str] = set()
    page.on("request", lambda request: hosts.add(request.url.split("/")[2]))
    await page.goto(base + "/docs")
    await page.wait_for_selector("main[data-operations]", timeout=WAIT_MS)
    document = await page.evaluate("() => fetch('/openapi.json').then((response) => response.json())")
    operations = sum(len(methods) for methods in document["paths"].values())
    assert await page.get_attribute("main", "data-operations") == str(operations)
    assert await page.locator("details.operation").count() == operations
    assert await page.locator("h2").all_inner_texts() == list(dict.fromkeys(
        spec["tags"][0] for methods in document["paths"].values() for spec in methods.values()
    ))  # fmt: skip
    # A request body's fields, with this server's limit, are on the page once its operation is opened.
    speech = page.locator("details#post_v1_audio_speech")
    await speech.locator("summary").click()
    text = await speech.inner_text()
    assert "input" in text and "at most 321 characters" in text and "unknown_field" in text
    assert hosts == {base.split("/")[2]}, hosts
    assert page.errors == []
