"""The metrics an operator sees, on live ``voxwire serve`` processes (in one process and with ``--workers 2``): the
table in docs/operations.md lists exactly what ``/metrics`` exposes (names and types, both ways), every metric and
label that the shipped Grafana dashboard and KEDA query read exists, and the process metrics name every process."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tests.deploy.fleet import DEPLOY, ROOT
from tests.server_process import ServerProcess, poll

import voxwire
from voxwire.serving.runtime.metrics import DROP_REASONS
from voxwire.serving.ws.session_core import CLIENT_GONE

pytestmark = pytest.mark.slow

OPERATIONS = ROOT / "docs" / "operations.md"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
SCALED_OBJECT = DEPLOY / "k8s" / "keda" / "scaledobject.yaml"
SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Metrics count this sentence.", "response_format": "wav"}
LONG = " ".join(["This sentence keeps the simulated engine busy for a while."] * 8)
TARGET_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus adds to what it scrapes: a dashboard may select by them although ``/metrics`` has none."""


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` answer: each family's type, and the label names of each sample name."""

    types: dict[str, str]
    """Family name as the docs write it (a counter's with ``_total``) -> type, for families with samples."""
    labels: dict[str, set[str]]
    """Sample name (``..._bucket``, ``..._total``) -> the label names its samples carry."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]]
    """Sample name -> {sorted labels: value}."""


def parse(text: str) -> Scrape:
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        if not family.samples:
            continue
        types[family.name + ("_total" if family.type == "counter" else "")] = family.type
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return Scrape(types, labels, samples)


def post(url: str, body: dict[str, str]) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def leave_mid_stream(url: str) -> None:
    """Start a long streamed speech request, read its first bytes, and hang up."""
    body = {**SPEECH, "input": LONG, "response_format": "pcm"}
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    response = urllib.request.urlopen(request, timeout=60)
    assert response.status == 200 and response.read(4096)
    response.close()


def exercise(server: ServerProcess) -> Scrape:
    """Give every metric a sample: speech, an error, a path that does not exist, a client that leaves."""
    speech = server.url + "/v1/audio/speech"
    assert post(speech, SPEECH) == 200
    assert post(speech, {**SPEECH, "response_format": "vorbis"}) == 400
    assert server.status("/wp-login.php") == 404
    leave_mid_stream(speech)

    def dropped() -> bool:
        samples = parse(server.get("/metrics")).samples["voxwire_dropped_sessions_total"]
        return samples[(("reason", "client_disconnected"),)] > 0

    assert poll(dropped, timeout=30), server.log
    return parse(server.get("/metrics"))


@pytest.fixture(scope="module", params=["0", "2"], ids=["one-process", "workers-2"])
def scrape(request: pytest.FixtureRequest) -> Iterator[tuple[str, Scrape]]:
    """(``--workers`` value, the scrape after ``exercise``) of a sim-model server."""
    workers = request.param
    with ServerProcess("--model", "sim", "--sim-cost", "30ms", "--workers", workers) as server:
        server.wait_ready()
        yield workers, exercise(server)


def documented() -> dict[str, str]:
    """The table of docs/operations.md's Metrics section: metric name -> type (first word of its type cell)."""
    section = OPERATIONS.read_text(encoding="utf-8").split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    table: dict[str, str] = {}
    for row in section.splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if not row.startswith("| `") or len(cells) != 3:
            continue
        kind = cells[1].split(",")[0]
        for name in re.findall(r"`([a-z_:][a-z0-9_:]*)`", cells[0]):
            table[name] = kind
    return table


def test_the_docs_table_lists_exactly_what_metrics_exposes(scrape: tuple[str, Scrape]) -> None:
    _, scraped = scrape
    docs = documented()
    assert len(docs) >= 20  # the parser found the table
    assert sorted(set(scraped.types) - set(docs)) == [], "exposed by /metrics but missing from docs/operations.md"
    assert sorted(set(docs) - set(scraped.types)) == [], "in docs/operations.md but not exposed by /metrics"
    wrong = {name: (docs[name], kind) for name, kind in scraped.types.items() if docs[name] != kind}
    assert wrong == {}, "documented type != exposed type"


def test_not_found_paths_are_counted_apart_from_errors(scrape: tuple[str, Scrape]) -> None:
    _, scraped = scrape
    requests = scraped.samples["voxwire_http_requests_total"]
    assert requests[(("method", "GET"), ("route", "unmatched"), ("status", "404"))] == 1
    assert requests[(("method", "POST"), ("route", "/v1/audio/speech"), ("status", "400"))] == 1
    errors = {dict(labels)["code"]: value for labels, value in scraped.samples["voxwire_errors_total"].items()}
    assert errors["unsupported_format"] == 1
    assert "not_found" not in errors  # the 404 is not an error of the service ("not_ready": the start-up probes)


def test_build_info_and_a_process_label_for_every_process(scrape: tuple[str, Scrape]) -> None:
    workers, scraped = scrape
    (build,) = scraped.samples["voxwire_build_info"]
    assert dict(build) == {"version": voxwire.__version__, "model": "sim", "device": "auto"}
    processes = {dict(labels)["process"] for labels in scraped.samples["process_resident_memory_bytes"]}
    expected = {"server"} if workers == "0" else {"supervisor", "engine-0", "frontend-0", "frontend-1"}
    assert processes == expected
    cpu = scraped.samples["process_cpu_seconds_total"]
    assert all(value > 0 for value in cpu.values()) and len(cpu) == len(expected)


def dashboard_targets() -> Iterator[tuple[str, str]]:
    """(panel title, PromQL expression) of every query of the dashboard, rows' panels included."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = list(dashboard["panels"])
    assert panels
    while panels:
        panel = panels.pop()
        panels.extend(panel.get("panels", []))
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


def metrics_and_labels(expr: str) -> tuple[set[str], dict[str, set[str]], set[str]]:
    """The metric names an expression reads, the label names each of its selectors names, and the labels its
    ``by (...)`` clauses group by."""
    names = set(re.findall(r"\b((?:voxwire|process)_[a-z0-9_]+)\b", expr))
    selected = {
        name: set(re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", matchers))
        for name, matchers in re.findall(r"\b((?:voxwire|process)_[a-z0-9_]+)\{([^}]*)\}", expr)
    }
    grouped = {label.strip() for clause in re.findall(r"\bby \(([^)]*)\)", expr) for label in clause.split(",")}
    return names, selected, grouped


def test_every_dashboard_panel_reads_metrics_and_labels_that_exist(scrape: tuple[str, Scrape]) -> None:
    _, scraped = scrape
    for title, expr in dashboard_targets():
        names, selected, grouped = metrics_and_labels(expr)
        assert names, f"panel {title!r} reads no voxwire metric: {expr}"
        missing = names - set(scraped.labels)
        assert not missing, f"panel {title!r} reads {missing}, which /metrics does not expose"
        for name, labels in selected.items():
            unknown = labels - scraped.labels[name] - TARGET_LABELS
            assert not unknown, f"panel {title!r} selects {name} by {unknown}, labels it does not have"
        offered = set().union(*(scraped.labels[name] for name in names)) | TARGET_LABELS
        assert grouped <= offered, f"panel {title!r} groups by {grouped - offered}, labels its metrics lack"


def test_the_keda_query_reads_metrics_that_exist(scrape: tuple[str, Scrape]) -> None:
    _, scraped = scrape
    (scaled,) = [doc for doc in yaml.safe_load_all(SCALED_OBJECT.read_text()) if doc]
    (trigger,) = scaled["spec"]["triggers"]
    names, _, _ = metrics_and_labels(trigger["metadata"]["query"])
    assert names and names <= set(scraped.labels)


def test_the_dashboard_is_a_grafana_dashboard_over_a_chosen_prometheus() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
    documented_metrics = set(documented())
    read = set().union(*(metrics_and_labels(expr)[0] for _, expr in dashboard_targets()))
    # Every latency histogram the issue asks operators to watch has a panel.
    for histogram in ("voxwire_time_to_first_audio_seconds", "voxwire_engine_step_seconds",
                      "voxwire_engine_queue_wait_seconds", "voxwire_http_request_duration_seconds"):  # fmt: skip
        assert histogram + "_bucket" in read and histogram in documented_metrics


@pytest.mark.asyncio
async def test_a_fresh_server_exposes_the_dropped_sessions_counter_at_zero(serve, aiohttp_client) -> None:
    """The table lists it, so a fresh ``/metrics`` has it: one series per reason that is not an error code."""
    client = await aiohttp_client(await serve())
    scraped = parse(await (await client.get("/metrics")).text())
    samples = scraped.samples["voxwire_dropped_sessions_total"]
    dropped = {dict(labels)["reason"]: value for labels, value in samples.items()}
    assert dropped == dict.fromkeys(DROP_REASONS, 0.0)
    assert CLIENT_GONE in DROP_REASONS  # the WebSocket session's reason for a broken connection


def test_every_literal_drop_reason_of_the_server_starts_at_zero() -> None:
    """The reasons written into the server's ``count_dropped`` calls (the others are error codes) are initialised."""
    server = ROOT / "server" / "voxwire"
    literals = {
        reason
        for path in server.rglob("*.py")
        for reason in re.findall(r'count_dropped\(\s*"(\w+)"', path.read_text(encoding="utf-8"))
    }
    assert literals and literals <= set(DROP_REASONS)
