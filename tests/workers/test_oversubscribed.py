"""Issue 29, item 6: a default ``voxwire serve`` on CPUs oversubscribed four times over, with clients that finish,
cancel, vanish and leave, degrades and never ends a process of its own as hung (its old heartbeat, stamped
between engine steps, ended the engine and the server under such load). ``scripts/soak.py`` at a small scale;
its full run is in docs/performance.md."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tests.script_modules import load_script

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # it makes the machine busy itself

SCRIPTS = Path(__file__).parents[2] / "scripts"


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))  # the script imports its neighbour bench_workers, as when run as a script
    try:
        return load_script(SCRIPTS / "soak.py", "soak")
    finally:
        sys.path.remove(str(SCRIPTS))


def test_an_oversubscribed_server_refuses_busy_but_ends_no_process_and_every_finisher_is_done(
    soak: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A default server: torch's own thread count and OpenMP waits, not the one thread tests/conftest.py gives the
    # suite's processes.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    settings = soak.Settings(rounds=2, clients=12, busy=4 * (os.cpu_count() or 1), busy_s=60.0)
    report = soak.run(settings)
    assert {result.behaviour for result in report.clients} == set(soak.Behaviour)
    assert report.failed_checks() == [], soak.format_report(report)
