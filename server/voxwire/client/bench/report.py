"""The bench report: per level summaries (p50/p90/p99), as a table, as JSON and as a PNG plot."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxwire.client.bench.measure import RequestKind, percentiles
from voxwire.client.bench.runner import LevelOutcome, LevelResult, failure_rate, level_outcome, meets_slo
from voxwire.errors import InvalidInputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOT_INSTALL = "pip install 'voxwire[bench]' (or pip install matplotlib)"

_LATENCIES = ("ttfa_ms", "ttfd_ms", "server_ttfa_ms", "engine_ttfc_ms", "connect_ms", "rtf", "rtf_wall", "stall_ms")
_HTTP_LATENCIES = ("ttfb_ms", "ttfa_ms", "connect_ms", "rtf", "rtf_wall")
FAILED_MARKER = "failed level"
"""The legend label of the markers drawn at the failed levels on each latency panel of the plot."""
MIXED = "mixed"
"""The ``kind`` of a mixed level's summary (its sides have the kinds of ``RequestKind``)."""


def summarize(result: LevelResult, max_failure_rate: float, slo_p99_ttfa_ms: float | None = None) -> dict[str, Any]:
    """One level's numbers and ``outcome``: a level of one kind of request flat (``_summarize_side``); a mixed level
    its totals and outcome, with its two sides' summaries under ``live`` and ``files``."""
    if not result.files:
        return _summarize_side(result, max_failure_rate, slo_p99_ttfa_ms)
    live, files = result.sides()
    failed = sum(1 for record in result.records if record.error)
    summary: dict[str, Any] = {
        "kind": MIXED,
        "mode": result.mode,
        "concurrency": int(result.level) if result.mode == "closed" else None,
        "rate_per_s": result.level if result.mode == "open" else None,
        "file_concurrency": result.files,
        "utterances": len(result.records),
        "failed": failed,
        "failure_rate": failure_rate(result),
        "outcome": level_outcome(result, max_failure_rate).value,
        "wall_s": result.wall_s,
        "live": _summarize_side(live, max_failure_rate, slo_p99_ttfa_ms),
        "files": _summarize_side(files, max_failure_rate),
    }
    if slo_p99_ttfa_ms is not None:
        summary["meets_slo"] = meets_slo(result, slo_p99_ttfa_ms)
    return summary


def _summarize_side(
    result: LevelResult, max_failure_rate: float, slo_p99_ttfa_ms: float | None = None
) -> dict[str, Any]:
    """The numbers of a level's requests of one kind; latencies and RTFs over those that succeeded. Played audio
    (live sessions, HTTP streams) has chunk gaps and underruns; whole files have ``slower_than_realtime``."""
    ok = [record for record in result.records if not record.error]
    audio_s = sum(record.audio_s for record in result.records)
    kind = result.kind
    summary: dict[str, Any] = {
        "kind": kind.value,
        "mode": result.mode,
        "concurrency": int(result.level) if result.mode == "closed" else None,
        "rate_per_s": result.level if result.mode == "open" else None,
        "utterances": len(result.records),
        "completed": len(ok),
        "failed": len(result.records) - len(ok),
        "failure_rate": failure_rate(result),
        "outcome": level_outcome(result, max_failure_rate).value,
        "errors": dict(Counter(record.error for record in result.records if record.error)),
        "peak_in_flight": result.peak_in_flight.get(kind, 0),
        "wall_s": result.wall_s,
        "audio_s": audio_s,
        "audio_per_wall_s": audio_s / result.wall_s if result.wall_s else None,
        "requests_per_s": len(ok) / result.wall_s if result.wall_s else None,
    }
    latencies = _LATENCIES if kind is RequestKind.WEBSOCKET else _HTTP_LATENCIES
    for name in latencies:
        summary[name] = percentiles([getattr(record, name) for record in ok])
    if kind is RequestKind.HTTP_FILE:
        summary["slower_than_realtime"] = sum(1 for record in ok if (record.rtf_wall or 0.0) > 1)
    else:
        if kind is RequestKind.HTTP_STREAM:
            summary["stall_ms"] = percentiles([record.stall_ms for record in ok])
        summary["chunk_gap_ms"] = percentiles([gap for record in ok for gap in record.chunk_gaps_ms])
        summary["max_chunk_gap_ms"] = percentiles([max(record.chunk_gaps_ms, default=0.0) for record in ok])
        summary["underruns"] = {
            "total": sum(record.underruns for record in ok),
            "utterances_with_underruns": sum(1 for record in ok if record.underruns),
            **percentiles([record.underruns for record in ok]),
        }
    if slo_p99_ttfa_ms is not None and kind is RequestKind.WEBSOCKET:
        summary["meets_slo"] = meets_slo(result, slo_p99_ttfa_ms)
    summary["records"] = [asdict(record) for record in result.records]
    return summary


def sides(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A level summary's live side and file side (HTTP requests, streamed or not), those it has."""
    if summary["kind"] == MIXED:
        return {"live": summary["live"], "files": summary["files"]}
    return {"live" if summary["kind"] == RequestKind.WEBSOCKET.value else "files": summary}


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


Columns = tuple[tuple[str, int], ...]
_LIVE_COLUMNS: Columns = (
    ("level", 10),
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
_FILE_COLUMNS: Columns = (
    ("level", 10),
    ("req", 5),
    ("fail", 5),
    ("req/s", 7),
    ("TTFB p50", 9),
    ("p90", 7),
    ("p99", 7),
    ("RTF p50", 8),
    ("p90", 6),
    ("p99", 6),
    ("max", 6),
    ("gap p99", 8),
    ("underruns", 10),
    ("x realtime", 10),
    ("", 12),
)
_LIVE_TITLE = "live WebSocket sessions (RTF: (wall - TTFA) / audio):"
_FILE_TITLE = "HTTP requests, POST /v1/audio/speech (RTF: wall / audio; level c=N+Mf: M file users beside N live):"


def table(summaries: list[dict[str, Any]]) -> str:
    """Fixed-width tables, one row per level: live sessions' and HTTP requests' (a mixed level has a row in each,
    both titled; a run of live sessions only has its table alone). Times in ms, RTFs as ratios; a level (or a
    mixed level's side) that did not pass is marked FAILED or UNREACHABLE in the last column, and under each
    table every row with failures lists them by error code."""
    live = [(summary, side["live"]) for summary in summaries if "live" in (side := sides(summary))]
    files = [(summary, side["files"]) for summary in summaries if "files" in (side := sides(summary))]
    tables = []
    if live:
        rows = [_live_row(summary_label(summary), side) for summary, side in live]
        tables.append(([_LIVE_TITLE] if files else []) + _lines(_LIVE_COLUMNS, rows) + _failures(live))
    if files:
        rows = [_file_row(summary_label(summary), side) for summary, side in files]
        tables.append([_FILE_TITLE, *_lines(_FILE_COLUMNS, rows), *_failures(files)])
    return "\n\n".join("\n".join(lines) for lines in tables)


def _failures(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """``failed at c=4: timeout 3, busy 1`` for each row (level, side) with failures."""
    return [
        f"failed at {summary_label(summary)}: " + ", ".join(f"{code} {count}" for code, count in side["errors"].items())
        for summary, side in rows
        if side["errors"]
    ]


def _live_row(label: str, summary: dict[str, Any]) -> list[str]:
    return [
        label,
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
        _mark(summary),
    ]


def _file_row(label: str, summary: dict[str, Any]) -> list[str]:
    played = "underruns" in summary  # HTTP streams are played as they arrive; files are not
    return [
        label,
        str(summary["utterances"]),
        str(summary["failed"]),
        _num(summary["requests_per_s"], 2),
        _num(summary["ttfb_ms"]["p50"], 0),
        _num(summary["ttfb_ms"]["p90"], 0),
        _num(summary["ttfb_ms"]["p99"], 0),
        _num(summary["rtf_wall"]["p50"], 3),
        _num(summary["rtf_wall"]["p90"], 3),
        _num(summary["rtf_wall"]["p99"], 3),
        _num(summary["rtf_wall"]["max"], 3),
        _num(summary["chunk_gap_ms"]["p99"], 0) if played else "-",
        str(summary["underruns"]["total"]) if played else "-",
        _num(summary["audio_per_wall_s"], 2),
        _mark(summary),
    ]


def _lines(columns: Columns, rows: list[list[str]]) -> list[str]:
    underlines = ["-" * (width - 1) if name else "" for name, width in columns]
    return [_row(columns, cells) for cells in [[name for name, _ in columns], underlines, *rows]]


def _mark(summary: dict[str, Any]) -> str:
    outcome = LevelOutcome(summary["outcome"])
    return "" if outcome is LevelOutcome.PASSED else outcome.name


def summary_label(summary: dict[str, Any]) -> str:
    """``level_label`` of a level's summary."""
    level = summary["concurrency"] or summary["rate_per_s"]
    return level_label(summary["mode"], level, summary.get("file_concurrency", 0))


def level_label(mode: str, level: float, files: int = 0) -> str:
    """``c=4`` for a closed-loop level of 4 users, ``0.5/s`` for an open-loop rate; ``+2f`` with 2 file users beside."""
    label = f"c={level:g}" if mode == "closed" else f"{level:g}/s"
    return f"{label}+{files}f" if files else label


def _row(columns: Columns, cells: list[str]) -> str:
    return " ".join(cell.rjust(width) for cell, (_, width) in zip(cells, columns, strict=True)).rstrip()


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def require_matplotlib() -> None:
    """Fail now, before a run of minutes, when ``--plot`` could not be drawn at its end."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidInputError(f"--plot needs matplotlib, which is not installed: {PLOT_INSTALL}") from None


def plot(path: Path, summaries: list[dict[str, Any]], title: str) -> None:
    """``figure`` as a PNG at ``path`` (``require_matplotlib`` first)."""
    figure(summaries, title).savefig(path, dpi=110)


def figure(summaries: list[dict[str, Any]], title: str) -> Figure:
    """Against the level (concurrency or rate): for live sessions TTFA p50/p90/p99 and underruns, for HTTP requests
    RTF (wall / audio) p50/p90/p99 and audio seconds per wall second (a mixed run: all four), and failed utterances
    (the last panel). The levels that did not pass are drawn red and their bars labelled FAILED or UNREACHABLE, with
    a red X (``FAILED_MARKER``) on each latency panel, so a level whose requests all failed does not read as "no
    underruns"."""
    from matplotlib.figure import Figure  # not pyplot: no display, no global figure to close

    closed = summaries[0]["mode"] == "closed"
    levels = [summary["concurrency"] if closed else summary["rate_per_s"] for summary in summaries]
    names = [f"{level:g}" for level in levels]
    passed = [summary["outcome"] == LevelOutcome.PASSED.value for summary in summaries]
    colors = ["tab:blue" if ok else "tab:red" for ok in passed]
    # Written over a failed level's bars: an empty bar there means "not measured", not "none".
    marks = ["" if ok else LevelOutcome(summary["outcome"]).name for ok, summary in zip(passed, summaries, strict=True)]
    per_level = [sides(summary) for summary in summaries]
    lines: list[tuple[str, str, str]] = []  # (side, field, axis label): percentiles drawn as lines
    bars: list[tuple[list[float], str, bool]] = []  # (values, axis label, whether they are counts)
    if all("live" in side for side in per_level):
        lines.append(("live", "ttfa_ms", "time to first audio (ms)"))
        bars.append(([side["live"]["underruns"]["total"] for side in per_level], "player underruns (total)", True))
    if all("files" in side for side in per_level):
        lines.append(("files", "rtf_wall", "HTTP RTF: wall / audio"))
        throughput = [side["files"]["audio_per_wall_s"] or 0.0 for side in per_level]
        bars.append((throughput, "HTTP audio seconds per wall second", False))
    bars.append(([summary["failed"] for summary in summaries], "failed utterances (red: failed level)", True))
    drawn = Figure(figsize=(5 * (len(lines) + len(bars)), 4.2))
    panels = drawn.subplots(1, len(lines) + len(bars), squeeze=False)[0]
    failed_levels = [level for level, ok in zip(levels, passed, strict=True) if not ok]
    for axes, (side_name, name, label) in zip(panels, lines, strict=False):
        for percentile, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
            values = [side[side_name][name][percentile] for side in per_level]
            axes.plot(levels, values, style, label=f"{name.split('_')[0].upper()} {percentile}")
        if failed_levels:
            axes.plot(
                failed_levels, [0] * len(failed_levels), "X", color="tab:red", markersize=12, clip_on=False,
                label=FAILED_MARKER,
            )  # fmt: skip
        axes.set_ylabel(label)
        axes.set_ylim(bottom=0)
        axes.legend()
        if closed and len(levels) > 1 and max(levels) / max(min(levels), 1) >= 8:
            axes.set_xscale("log", base=2)
        axes.set_xticks(levels, names)
    for axes, (values, label, counts) in zip(panels[len(lines) :], bars, strict=True):
        axes.bar_label(axes.bar(names, values, color=colors), marks, color="tab:red", fontsize=8)
        axes.set_ylim(0, max(1, max(values)) * 1.15)
        axes.yaxis.get_major_locator().set_params(integer=counts)
        axes.set_ylabel(label)
    files = summaries[0].get("file_concurrency")
    unit = "concurrent sessions" if closed else "arrivals per second"
    for axes in panels:
        axes.set_xlabel(f"{unit} (+{files} file users)" if files else unit)
        axes.grid(alpha=0.3)
    drawn.suptitle(title)
    drawn.tight_layout()
    return drawn
