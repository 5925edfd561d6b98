"""A whole bench run: every level in turn (or the SLO search), summarized into one report dictionary; the same for
live sessions, HTTP requests and mixed levels (``BenchConfig.kind``, ``BenchConfig.files``)."""

from __future__ import annotations

import platform
from collections.abc import Awaitable
from dataclasses import asdict, dataclass
from typing import Any

from voxwire.client.bench.report import level_label, summarize
from voxwire.client.bench.runner import (
    DEFAULT_MAX_FAILURE_RATE,
    BenchConfig,
    LevelOutcome,
    LevelResult,
    check_server,
    find_max,
    level_outcome,
    run_closed,
    run_open,
)


@dataclass(frozen=True)
class BenchPlan:
    config: BenchConfig
    concurrency: tuple[int, ...] = (1,)
    """Closed-loop levels (ignored when ``rates`` is set or with ``find_max``)."""
    rates: tuple[float, ...] = ()
    """Open-loop arrival rates per second; when set, the run is open loop."""
    find_max: bool = False
    slo_p99_ttfa_ms: float | None = None
    max_concurrency: int = 256
    max_failure_rate: float = DEFAULT_MAX_FAILURE_RATE
    """A level with a larger share of failed utterances is ``LevelOutcome.FAILED``."""

    def __post_init__(self) -> None:
        if not 0 <= self.max_failure_rate <= 1:
            raise ValueError(f"max_failure_rate={self.max_failure_rate!r} is invalid: must be within [0, 1]")


class _ServerGone(Exception):
    """A level in which no session could connect: the levels after it would only repeat its failures."""

    def __init__(self, result: LevelResult) -> None:
        super().__init__()
        self.result = result


async def run_plan(plan: BenchPlan) -> dict[str, Any]:
    """Run ``plan`` against its server and return the report (``levels``: one summary per level; ``stopped``:
    why the run ended before its last level, or None)."""
    config = plan.config
    await check_server(config)
    done: list[LevelResult] = []

    async def level(run: Awaitable[LevelResult]) -> LevelResult:
        result = await run
        done.append(result)
        if level_outcome(result, plan.max_failure_rate) is LevelOutcome.UNREACHABLE:
            raise _ServerGone(result)
        return result

    found: int | None = None
    stopped: str | None = None
    try:
        if plan.find_max:
            assert plan.slo_p99_ttfa_ms is not None, "find_max needs slo_p99_ttfa_ms"
            found, results = await find_max(
                lambda concurrency: level(run_closed(config, concurrency)), plan.slo_p99_ttfa_ms, plan.max_concurrency
            )
        elif plan.rates:
            results = [await level(run_open(config, rate)) for rate in plan.rates]
        else:
            results = [await level(run_closed(config, concurrency)) for concurrency in plan.concurrency]
    except _ServerGone as gone:
        results = done
        stopped = (
            f"the server at {config.server} is unreachable: no session of level "
            f"{level_label(gone.result.mode, gone.result.level, gone.result.files)} could connect, so the run stopped "
            "there"
        )
    return _report(plan, results, found, stopped)


def _report(plan: BenchPlan, results: list[LevelResult], found: int | None, stopped: str | None) -> dict[str, Any]:
    settings = {key: value for key, value in asdict(plan.config).items() if key not in ("token", "texts", "progress")}
    settings["texts"] = len(plan.config.texts)
    settings["ramp_up_s"] = plan.config.effective_ramp_up_s
    settings["max_failure_rate"] = plan.max_failure_rate
    report: dict[str, Any] = {
        "settings": settings,
        "client": {"python": platform.python_version(), "machine": platform.machine()},
        "levels": [summarize(result, plan.max_failure_rate, plan.slo_p99_ttfa_ms) for result in results],
        "stopped": stopped,
    }
    if plan.find_max:
        report["find_max"] = {"slo_p99_ttfa_ms": plan.slo_p99_ttfa_ms, "max_concurrency": found}
    return report
