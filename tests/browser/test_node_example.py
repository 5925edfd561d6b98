"""client_js/README.md's Node example, as written there, against a live server: the protocol codec over the
``ws`` package's WebSocket where Node has none (Node 18 and 20), and over Node's own (22, or 20 with
``--experimental-websocket``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from tests.server_process import ServerProcess

from .conftest import CLIENT_JS, client_js_tool, link_package

README_SERVER = "ws://127.0.0.1:8000"
NODE_TIMEOUT_S = 60
WITHOUT_GLOBAL_WEBSOCKET = ("--import", "data:text/javascript,delete globalThis.WebSocket")
"""Node 22 as Node 18 and 20 are, so the ``ws`` path runs on every Node."""
WITH_GLOBAL_WEBSOCKET = ("--experimental-websocket",)
"""Node 20 as Node 22 is (Node's own WebSocket), so that path runs on Node 20 too."""


def global_websocket() -> tuple[str, ...]:
    """The node options that give this Node a global WebSocket, if any do."""
    for options in ((), WITH_GLOBAL_WEBSOCKET):
        has = ["node", *options, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"]
        if subprocess.run(has, capture_output=True, timeout=NODE_TIMEOUT_S).returncode == 0:
            return options
    pytest.skip("this Node has no WebSocket of its own (Node 18)")


def node_example() -> str:
    readme = (CLIENT_JS / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## In Node\n", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"^```js\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    assert README_SERVER in code
    return code


@pytest.mark.slow
@pytest.mark.parametrize("websocket", ["ws", "node"])
def test_the_readme_node_example_speaks(tmp_path: Path, websocket: str) -> None:
    ws = client_js_tool("ws")
    options = WITHOUT_GLOBAL_WEBSOCKET if websocket == "ws" else global_websocket()
    (tmp_path / "package.json").write_text('{"type": "module"}')
    link_package(tmp_path, "voxwire-client", CLIENT_JS)
    link_package(tmp_path, "ws", ws)
    with ServerProcess("--model", "sim") as server:
        server.wait_ready()
        (tmp_path / "speak.js").write_text(node_example().replace(README_SERVER, server.url.replace("http", "ws")))
        done = subprocess.run(
            ["node", *options, "speak.js"], cwd=tmp_path, capture_output=True, text=True, timeout=NODE_TIMEOUT_S
        )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    *readies, spoken = done.stdout.splitlines()  # the server's greeting, then the settings of the `start`
    matches = [re.fullmatch(r"sim: (\d+) Hz", ready) for ready in readies]
    assert len(matches) == 2 and all(matches), readies
    [rate] = {int(match[1]) for match in matches if match}
    found = re.fullmatch(r"([\d.]+) s of speech, (\d+) bytes", spoken)
    assert found, spoken
    audio_s, pcm_bytes = float(found[1]), int(found[2])
    assert audio_s > 0 and pcm_bytes == round(audio_s * rate) * 2  # every sample of the speech, 16-bit
