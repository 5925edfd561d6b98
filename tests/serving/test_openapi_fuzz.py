"""Schemathesis against ``voxwire serve --model demo``, one process and ``--workers 2``, over every operation of
``/openapi.json``: no 5xx, no status, media type, header or body the document does not state, no request the
schema refuses answered with a success, and no hang (each request has a timeout, the run a deadline).

Bounded for CI: a fixed seed, a few examples per operation, and short texts (``--max-text-chars-per-utterance``,
which the document states, so generated inputs stay within it or are refused at once).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from tests.server_process import ServerProcess

from voxwire.serving.edge.auth import OPENAPI_PATH
from voxwire.serving.openapi import OPERATIONS

pytestmark = pytest.mark.slow

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "unsupported_method",
    "allow_header_conformance",
)
TOPOLOGIES = {
    # The coverage phase (every schema's boundary and negative cases) on one server; the handlers and the schema
    # are the same behind --workers, so there random examples test the frontends' path to the engines.
    "one process": (("--workers", "0"), "examples,coverage,fuzzing"),
    "two workers": (("--workers", "2"), "examples,fuzzing"),
}
MAX_EXAMPLES = 10
"""Random examples per operation; the coverage phase adds each schema's boundary and negative cases on top."""
REQUEST_TIMEOUT_S = 60
"""One response (a whole utterance of at most 64 characters included); longer is a hang. Not less: the first
``normalize: true`` request loads wetext's grammars (8 s on an idle core, over 20 s on a busy CI machine)."""
RUN_TIMEOUT_S = 420
READY_TIMEOUT_S = 240.0


def schemathesis(url: str, phases: str, report_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
        "--checks", ",".join(CHECKS),
        "--phases", phases,
        "--max-examples", str(MAX_EXAMPLES),
        "--request-timeout", str(REQUEST_TIMEOUT_S),
        "--seed", "1",
        "--workers", "2",
        "--no-color",
        "--report", "junit", "--report-dir", str(report_dir),
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=report_dir)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_schemathesis_finds_no_failure_on_any_operation(topology: str, tmp_path: Path) -> None:
    workers, phases = TOPOLOGIES[topology]
    with ServerProcess("--model", "demo", "--max-text-chars-per-utterance", "64", *workers) as server:
        server.wait_ready(timeout=READY_TIMEOUT_S)
        result = schemathesis(server.url, phases, tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-12_000:]
        # Every operation was run (schemathesis leaves out the document's own URL, which it read to start).
        (report,) = tmp_path.glob("junit-*.xml")
        tested = {case.get("name") for case in ElementTree.parse(report).iter("testcase")}
        documented = {f"{operation.method} {operation.path}" for operation in OPERATIONS}
        assert tested == documented - {f"GET {OPENAPI_PATH}"}, output[-4_000:]
        assert server.process.poll() is None, "the server died under the fuzzing"
        assert server.status("/ready") == 200
    assert "unexpected error" not in server.log, server.log[-8_000:]  # a handler bug that became a 500
