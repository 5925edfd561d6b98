"""The bench report: per level summaries (p50/p90/p99), as a table, as JSON and as a PNG plot."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from voxwire.client.bench.measure import percentiles
from voxwire.client.bench.runner import LevelOutcome, LevelResult, failure_rate, level_outcome, meets_slo
from voxwire.errors import InvalidInputError

PLOT_INSTALL = "pip install 'voxwire[bench]' (or pip install matplotlib)"

_LATENCIES = ("ttfa_ms", "ttfd_ms", "server_ttfa_ms", "engine_ttfc_ms", "connect_ms", "rtf", "rtf_wall", "stall_ms")


def summarize(result: LevelResult, max_failure_rate: float, slo_p99_ttfa_ms: float | None = None) -> dict[str, Any]:
    """One level's numbers and ``outcome``; latencies and RTFs over the utterances that succeeded."""
    ok = [record for record in result.records if not record.error]
    audio_s = sum(record.audio_s for record in result.records)
    summary: dict[str, Any] = {
        "mode": result.mode,
        "concurrency": int(result.level) if result.mode == "closed" else None,
        "rate_per_s": result.level if result.mode == "open" else None,
        "utterances": len(result.records),
        "failed": len(result.records) - len(ok),
        "failure_rate": failure_rate(result),
        "outcome": level_outcome(result, max_failure_rate).value,
        "errors": dict(Counter(record.error for record in result.records if record.error)),
        "peak_in_flight": result.peak_in_flight,
        "wall_s": result.wall_s,
        "audio_s": audio_s,
        "audio_per_wall_s": audio_s / result.wall_s if result.wall_s else None,
    }
    for name in _LATENCIES:
        summary[name] = percentiles([getattr(record, name) for record in ok])
    summary["chunk_gap_ms"] = percentiles([gap for record in ok for gap in record.chunk_gaps_ms])
    summary["max_chunk_gap_ms"] = percentiles([max(record.chunk_gaps_ms, default=0.0) for record in ok])
    summary["underruns"] = {
        "total": sum(record.underruns for record in ok),
        "utterances_with_underruns": sum(1 for record in ok if record.underruns),
        **percentiles([record.underruns for record in ok]),
    }
    if slo_p99_ttfa_ms is not None:
        summary["meets_slo"] = meets_slo(result, slo_p99_ttfa_ms)
    summary["records"] = [asdict(record) for record in result.records]
    return summary


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


_COLUMNS = (
    ("level", 8),
    ("utt", 5),
    ("fail", 5),
    ("TTFA p50", 9),
    ("p90", 7),
    ("p99", 7),
    ("TTFD p99", 9),
    ("RTF p50", 8),
    ("p90", 6),
    ("wall/aud", 9),
    ("gap p99", 8),
    ("underruns", 10),
    ("x realtime", 10),
    ("", 12),
)


def table(summaries: list[dict[str, Any]]) -> str:
    """A fixed-width table, one row per level; times in ms, RTFs as ratios; a level that did not pass is marked
    FAILED or UNREACHABLE in the last column."""
    underlines = ["-" * (width - 1) if name else "" for name, width in _COLUMNS]
    lines = [_row([name for name, _ in _COLUMNS]), _row(underlines)]
    for summary in summaries:
        outcome = LevelOutcome(summary["outcome"])
        level = level_label(summary["mode"], summary["concurrency"] or summary["rate_per_s"])
        lines.append(
            _row(
                [
                    level,
                    str(summary["utterances"]),
                    str(summary["failed"]),
                    _num(summary["ttfa_ms"]["p50"], 0),
                    _num(summary["ttfa_ms"]["p90"], 0),
                    _num(summary["ttfa_ms"]["p99"], 0),
                    _num(summary["ttfd_ms"]["p99"], 0),
                    _num(summary["rtf"]["p50"], 3),
                    _num(summary["rtf"]["p90"], 3),
                    _num(summary["rtf_wall"]["p50"], 3),
                    _num(summary["chunk_gap_ms"]["p99"], 0),
                    str(summary["underruns"]["total"]),
                    _num(summary["audio_per_wall_s"], 2),
                    "" if outcome is LevelOutcome.PASSED else outcome.name,
                ]
            )
        )
    return "\n".join(lines)


def level_label(mode: str, level: float) -> str:
    """``c=4`` for a closed-loop level of 4 users, ``0.5/s`` for an open-loop rate."""
    return f"c={level:g}" if mode == "closed" else f"{level:g}/s"


def _row(cells: list[str]) -> str:
    return " ".join(cell.rjust(width) for cell, (_, width) in zip(cells, _COLUMNS, strict=True)).rstrip()


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def require_matplotlib() -> None:
    """Fail now, before a run of minutes, when ``--plot`` could not be drawn at its end."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidInputError(f"--plot needs matplotlib, which is not installed: {PLOT_INSTALL}") from None


def plot(path: Path, summaries: list[dict[str, Any]], title: str) -> None:
    """TTFA p50/p90/p99, underruns and failed utterances against the level (concurrency or rate), as a PNG; the
    levels that did not pass are drawn red, so a level whose sessions all failed does not read as "no underruns"
    (``require_matplotlib`` first)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    from matplotlib import pyplot

    closed = summaries[0]["mode"] == "closed"
    levels = [summary["concurrency"] if closed else summary["rate_per_s"] for summary in summaries]
    names = [f"{level:g}" for level in levels]
    passed = [summary["outcome"] == LevelOutcome.PASSED.value for summary in summaries]
    colors = ["tab:blue" if ok else "tab:red" for ok in passed]
    # Written over a failed level's bars: an empty bar there means "not measured", not "none".
    marks = ["" if ok else LevelOutcome(summary["outcome"]).name for ok, summary in zip(passed, summaries, strict=True)]
    figure, (latency, underruns, failures) = pyplot.subplots(1, 3, figsize=(15, 4.2))
    for name, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
        latency.plot(levels, [summary["ttfa_ms"][name] for summary in summaries], style, label=f"TTFA {name}")
    failed_levels = [level for level, ok in zip(levels, passed, strict=True) if not ok]
    if failed_levels:
        latency.plot(
            failed_levels, [0] * len(failed_levels), "X", color="tab:red", markersize=12, clip_on=False, label="failed"
        )
    latency.set_ylabel("time to first audio (ms)")
    latency.set_ylim(bottom=0)
    latency.legend()
    for axes, counts, label in (
        (underruns, [summary["underruns"]["total"] for summary in summaries], "player underruns (total)"),
        (failures, [summary["failed"] for summary in summaries], "failed utterances (red: failed level)"),
    ):
        axes.bar_label(axes.bar(names, counts, color=colors), marks, color="tab:red", fontsize=8)
        axes.set_ylim(0, max(1, max(counts)) * 1.15)
        axes.yaxis.get_major_locator().set_params(integer=True)
        axes.set_ylabel(label)
    for axes in (latency, underruns, failures):
        axes.set_xlabel("concurrent sessions" if closed else "arrivals per second")
        axes.grid(alpha=0.3)
    if closed and len(levels) > 1 and max(levels) / max(min(levels), 1) >= 8:
        latency.set_xscale("log", base=2)
    latency.set_xticks(levels, names)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
