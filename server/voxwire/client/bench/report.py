"""The bench report: per level summaries (p50/p90/p99), as a table, as JSON and as a PNG plot."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from voxwire.client.bench.measure import percentiles
from voxwire.client.bench.runner import LevelResult, meets_slo

_LATENCIES = ("ttfa_ms", "ttfd_ms", "server_ttfa_ms", "engine_ttfc_ms", "connect_ms", "rtf", "rtf_wall", "stall_ms")


def summarize(result: LevelResult, slo_p99_ttfa_ms: float | None = None) -> dict[str, Any]:
    """One level's numbers; latencies and RTFs over the utterances that succeeded."""
    ok = [record for record in result.records if not record.error]
    audio_s = sum(record.audio_s for record in result.records)
    summary: dict[str, Any] = {
        "mode": result.mode,
        "concurrency": int(result.level) if result.mode == "closed" else None,
        "rate_per_s": result.level if result.mode == "open" else None,
        "utterances": len(result.records),
        "failed": len(result.records) - len(ok),
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
)


def table(summaries: list[dict[str, Any]]) -> str:
    """A fixed-width table, one row per level; times in ms, RTFs as ratios."""
    lines = [_row([name for name, _ in _COLUMNS]), _row(["-" * (width - 1) for _, width in _COLUMNS])]
    for summary in summaries:
        level = f"c={summary['concurrency']}" if summary["mode"] == "closed" else f"{summary['rate_per_s']:g}/s"
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
                ]
            )
        )
    return "\n".join(lines)


def _row(cells: list[str]) -> str:
    return " ".join(cell.rjust(width) for cell, (_, width) in zip(cells, _COLUMNS, strict=True))


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def plot(path: Path, summaries: list[dict[str, Any]], title: str) -> None:
    """TTFA p50/p90/p99 and underruns against the level (concurrency or rate), as a PNG."""
    try:
        import matplotlib
    except ImportError:
        from voxwire.client.errors import ClientError

        raise ClientError("--plot needs matplotlib: pip install 'voxwire[bench]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")  # files only: no display needed
    from matplotlib import pyplot

    closed = summaries[0]["mode"] == "closed"
    levels = [summary["concurrency"] if closed else summary["rate_per_s"] for summary in summaries]
    figure, (latency, underruns) = pyplot.subplots(1, 2, figsize=(11, 4.2))
    for name, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
        latency.plot(levels, [summary["ttfa_ms"][name] for summary in summaries], style, label=f"TTFA {name}")
    latency.set_ylabel("time to first audio (ms)")
    latency.set_ylim(bottom=0)
    latency.legend()
    counts = [summary["underruns"]["total"] for summary in summaries]
    underruns.bar([f"{level:g}" for level in levels], counts)
    underruns.set_ylim(0, max(1, max(counts)) * 1.15)
    underruns.yaxis.get_major_locator().set_params(integer=True)
    underruns.set_ylabel("player underruns (total)")
    for axes in (latency, underruns):
        axes.set_xlabel("concurrent sessions" if closed else "arrivals per second")
        axes.grid(alpha=0.3)
    if closed and len(levels) > 1 and max(levels) / max(min(levels), 1) >= 8:
        latency.set_xscale("log", base=2)
    latency.set_xticks(levels, [f"{level:g}" for level in levels])
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
