"""A whole bench run: every level in turn (or the SLO search), summarized into one report dictionary."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from typing import Any

from voxwire.client.bench.report import summarize
from voxwire.client.bench.runner import BenchConfig, LevelResult, check_server, find_max, run_closed, run_open


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


async def run_plan(plan: BenchPlan) -> dict[str, Any]:
    """Run ``plan`` against its server and return the report (``levels``: one summary per level)."""
    config = plan.config
    await check_server(config)
    found: int | None = None
    if plan.find_max:
        assert plan.slo_p99_ttfa_ms is not None, "find_max needs slo_p99_ttfa_ms"
        found, results = await find_max(
            lambda level: run_closed(config, level), plan.slo_p99_ttfa_ms, plan.max_concurrency
        )
    elif plan.rates:
        results = [await run_open(config, rate) for rate in plan.rates]
    else:
        results = [await run_closed(config, level) for level in plan.concurrency]
    return _report(plan, results, found)


def _report(plan: BenchPlan, results: list[LevelResult], found: int | None) -> dict[str, Any]:
    settings = {key: value for key, value in asdict(plan.config).items() if key not in ("token", "texts", "progress")}
    settings["texts"] = len(plan.config.texts)
    settings["ramp_up_s"] = plan.config.effective_ramp_up_s
    report: dict[str, Any] = {
        "settings": settings,
        "client": {"python": platform.python_version(), "machine": platform.machine()},
        "levels": [summarize(result, plan.slo_p99_ttfa_ms) for result in results],
    }
    if plan.find_max:
        report["find_max"] = {"slo_p99_ttfa_ms": plan.slo_p99_ttfa_ms, "max_concurrency": found}
    return report
