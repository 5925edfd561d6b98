"""Load generators: closed loop (N users, each speaking its next text when the last is done) and open loop
(Poisson arrivals, a new connection each), plus the search for the highest concurrency within an SLO.

A user speaks over a WebSocket session or, with ``BenchConfig.kind`` an HTTP kind, sends
``POST /v1/audio/speech`` requests (a new connection each; ``http_speech``). A mixed level runs ``files``
closed-loop HTTP file users beside its live WebSocket load, on the same clock; its records say which side made
them (``UtteranceRecord.kind``).

Each utterance is measured from its first ``text`` sent; with ``words_per_second`` its text is sent a word
at a time, as a language model would write it. A failed utterance is recorded with its error code (the
level goes on); a refused API key or an unreachable server before the run stops it, and a level in which no
session could connect (``LevelOutcome.UNREACHABLE``) stops the run after it. A refused connection
(HTTP 503 or close 1013: a busy, starting or draining server) is tried again with backoff and jitter before it
counts as failed (``busy`` after the last retry); a connection lost mid-utterance (1001, 1006) fails that
utterance (``going_away``, ``connection_lost``) and a closed-loop user goes on with its next text on a new
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from voxwire.client.aio import together
from voxwire.client.bench.http_speech import Priority, post_speech, speech_body, speech_url
from voxwire.client.bench.measure import (
    HTTP_FORMATS,
    AudioMeter,
    BodyMeter,
    RequestKind,
    UtteranceRecord,
    percentiles,
)
from voxwire.client.bench.texts import words
from voxwire.client.connection import Connection
from voxwire.client.errors import ClientError, ServerBusyError, ServerError, ServerUnreachableError
from voxwire.client.retry import RetryPolicy, open_with_retry, retry_while_busy
from voxwire.protocol.wire import AudioFrame, Done, End, Error, Start, Text

RECONNECT_PAUSE_S = 0.2
"""After a failed connection (or a failed HTTP request), so a refusing server is not hammered in a tight loop."""
DEFAULT_RAMP_UP_S = 1.0
"""Closed loop: a level's users start evenly over its first second unless told otherwise (at most over half the
level), as load tools ramp their users up: a service's users do not all arrive in the same instant. Starting
all N at once (``ramp_up_s=0``) measures something else, how a cold burst is absorbed: the engine's first step
starts with the first few arrivals and the rest wait for it to end."""
DEFAULT_MAX_FAILURE_RATE = 0.01
"""A level with more than 1 % of its utterances failed is a failed level: a healthy server fails none, and a
bench that exits 0 must mean the numbers it printed describe a working server."""
UNREACHABLE = "unreachable"
"""The error code of an utterance whose connection could not be opened at all (no server at the address)."""
PROGRESS_INTERVAL_S = 1.0
"""Progress is redrawn (a terminal's bar) or printed (a line in a log file, CI) at least this often: a level of
minutes must show it is alive."""


@dataclass(frozen=True)
class BenchConfig:
    server: str
    texts: tuple[str, ...]
    duration_s: float
    token: str | None = None
    format: str = "opus"
    voice: str | None = None
    seed: int | None = None
    personas: tuple[str, ...] = ()
    """LoRA personas the users speak with, in turn (user or visitor k takes ``personas[k % n]``); empty: none."""
    words_per_second: float | None = None
    player_buffer_ms: float = 200.0
    utterance_timeout_s: float = 120.0
    progress: bool = True
    """Progress on stderr while a level runs: a bar redrawn in place when stderr is a terminal, else a line every
    ``PROGRESS_INTERVAL_S`` (``voxwire bench`` turns it on for a terminal or with ``--progress``)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    ramp_up_s: float | None = None
    """Closed loop: user k of N starts its first utterance ``k * ramp_up_s / N`` into the level (0: all N at the
    same instant; None: ``DEFAULT_RAMP_UP_S``); its utterances count like any other."""
    kind: RequestKind = RequestKind.WEBSOCKET
    """How the level's users (or visitors) speak: live WebSocket sessions, or HTTP streams or files."""
    files: int = 0
    """A mixed run: this many closed-loop users requesting whole files over HTTP beside the live WebSocket load
    (``kind`` must be ``WEBSOCKET``), ramped up like it."""
    response_format: str = "pcm"
    """HTTP requests' ``response_format`` (``measure.HTTP_FORMATS``)."""
    priority: Priority = Priority.REALTIME
    """HTTP requests' scheduling class (``http_speech.speech_body``: the default is not sent)."""

    def __post_init__(self) -> None:
        if self.ramp_up_s is not None and not (0 <= self.ramp_up_s < self.duration_s):
            raise ValueError(
                f"ramp_up_s={self.ramp_up_s!r} is invalid: must be >= 0 and shorter than a level ({self.duration_s} s)"
            )
        if self.files < 0 or (self.files and self.kind is not RequestKind.WEBSOCKET):
            raise ValueError(f"files={self.files!r} is invalid: must be >= 0, and file users join live WebSocket load")
        if self.response_format not in HTTP_FORMATS:
            raise ValueError(f"response_format={self.response_format!r} is invalid: must be one of {HTTP_FORMATS}")

    @property
    def effective_ramp_up_s(self) -> float:
        if self.ramp_up_s is None:
            return min(DEFAULT_RAMP_UP_S, self.duration_s / 2)
        return self.ramp_up_s

    def start(self, user: int = 0) -> Start:
        return Start(voice=self.voice, format=self.format, seed=self.seed, persona=self._persona(user))

    def speech_body(self, text: str, kind: RequestKind, user: int = 0) -> dict[str, object]:
        """The ``POST /v1/audio/speech`` body of ``user``'s request to speak ``text``."""
        return speech_body(
            text, kind, self.response_format, voice=self.voice, seed=self.seed, persona=self._persona(user),
            priority=self.priority,
        )  # fmt: skip

    def _persona(self, user: int) -> str | None:
        return self.personas[user % len(self.personas)] if self.personas else None


@dataclass
class LevelResult:
    """Every utterance of one concurrency level (closed loop) or arrival rate (open loop)."""

    mode: str
    level: float
    wall_s: float = 0.0
    peak_in_flight: dict[RequestKind, int] = field(default_factory=dict)
    """Per kind of request: the most in flight at once."""
    records: list[UtteranceRecord] = field(default_factory=list)
    kind: RequestKind = RequestKind.WEBSOCKET
    """The kind of the level's own load (``level`` users or arrivals per second)."""
    files: int = 0
    """A mixed level: its HTTP file users beside the live load."""

    def sides(self) -> list[LevelResult]:
        """The level itself, or a mixed level's two sides: its live load and its file users (closed loop, level
        ``files``), each with its own records, on the level's clock."""
        if not self.files:
            return [self]
        files = RequestKind.HTTP_FILE
        return [
            replace(self, files=0, records=[record for record in self.records if record.kind is not files]),
            replace(
                self, mode="closed", level=self.files, kind=files, files=0,
                records=[record for record in self.records if record.kind is files],
            ),
        ]  # fmt: skip


async def check_server(config: BenchConfig) -> None:
    """Connect once before the run, so a wrong address, key or setting fails fast with its typed error."""
    async with await open_with_retry(config.server, config.token, config.retry) as connection:
        for user in range(max(1, len(config.personas))):  # every persona: an unknown one fails here
            await connection.configure(config.start(user))


async def run_closed(config: BenchConfig, concurrency: int) -> LevelResult:
    result = LevelResult("closed", concurrency, kind=config.kind, files=config.files)
    with _Progress(config, f"{concurrency} users" + _beside(config), result) as progress:
        ramp_s = config.effective_ramp_up_s
        user = _user if config.kind is RequestKind.WEBSOCKET else _http_user
        users = [user(config, index, index * ramp_s / concurrency, result, progress) for index in range(concurrency)]
        await _run(result, [*users, *_file_users(config, result, progress)])
    return result


async def run_open(config: BenchConfig, rate: float, *, rng_seed: int = 0) -> LevelResult:
    result = LevelResult("open", rate, kind=config.kind, files=config.files)
    with _Progress(config, f"{rate:g}/s" + _beside(config), result) as progress:
        arrivals = _arrivals(config, rate, random.Random(rng_seed), result, progress)
        await _run(result, [arrivals, *_file_users(config, result, progress)])
    return result


def _beside(config: BenchConfig) -> str:
    return f" + {config.files} files" if config.files else ""


def _file_users(config: BenchConfig, result: LevelResult, progress: _Progress) -> list[Awaitable[None]]:
    """A mixed level's file users, ramped up over the same seconds as its live load."""
    ramp_s, files = config.effective_ramp_up_s, config.files
    return [
        _http_user(config, index, index * ramp_s / files, result, progress, RequestKind.HTTP_FILE)
        for index in range(files)
    ]


async def find_max(
    run_level: Callable[[int], Awaitable[LevelResult]], slo_p99_ttfa_ms: float, max_concurrency: int
) -> tuple[int, list[LevelResult]]:
    """Highest concurrency meeting the SLO: doubling from 1 until it fails, then bisection. 0 if even 1 fails."""
    tried: dict[int, LevelResult] = {}

    async def meets(concurrency: int) -> bool:
        tried[concurrency] = await run_level(concurrency)
        return meets_slo(tried[concurrency], slo_p99_ttfa_ms)

    good, bad = 0, None
    concurrency = 1
    while concurrency <= max_concurrency:
        if not await meets(concurrency):
            bad = concurrency
            break
        good, concurrency = concurrency, concurrency * 2
    if bad is None and good < max_concurrency:
        bad = max_concurrency + 1
        if await meets(max_concurrency):
            good = max_concurrency
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if await meets(middle) else (good, middle)
    return good, [tried[level] for level in sorted(tried)]


class LevelOutcome(enum.Enum):
    """What a level says about the server, beyond its latencies."""

    PASSED = "passed"
    """At most ``max_failure_rate`` of its utterances failed."""
    FAILED = "failed"
    """More of its utterances failed than ``max_failure_rate`` allows: its latencies describe the survivors only."""
    UNREACHABLE = "unreachable"
    """No session of the level could even connect: the server is gone, and the run stops after this level."""


def level_outcome(result: LevelResult, max_failure_rate: float) -> LevelOutcome:
    """A mixed level fails when either side failed more than ``max_failure_rate`` of its utterances."""
    records = result.records
    if records and all(record.error == UNREACHABLE for record in records):
        return LevelOutcome.UNREACHABLE
    if any(failure_rate(side) > max_failure_rate for side in result.sides()):
        return LevelOutcome.FAILED
    return LevelOutcome.PASSED


def failure_rate(result: LevelResult) -> float:
    """The share of the level's utterances that failed (0 for a level without utterances)."""
    records = result.records
    return sum(1 for record in records if record.error) / len(records) if records else 0.0


def meets_slo(result: LevelResult, slo_p99_ttfa_ms: float) -> bool:
    """Every utterance succeeded, none underran, and the p99 time to first audio is within the target (a mixed
    level: of its live side, while every file also succeeded)."""
    records = result.records
    if any(record.error for record in records):
        return False
    records = result.sides()[0].records
    if not records or any(record.underruns for record in records):
        return False
    p99 = percentiles([record.ttfa_ms for record in records if record.ttfa_ms is not None])["p99"]
    return p99 is not None and p99 <= slo_p99_ttfa_ms


# ---- load generators ---------------------------------------------------------------------------------------------


async def _run(result: LevelResult, work: Sequence[Awaitable[None]]) -> None:
    started = time.perf_counter()
    await asyncio.gather(*work)
    result.wall_s = time.perf_counter() - started


async def _user(config: BenchConfig, index: int, start_s: float, result: LevelResult, progress: _Progress) -> None:
    """One closed-loop user: from ``start_s`` into the level, one connection, utterances back to back until the
    duration is over."""
    texts = list(config.texts)
    random.Random(index).shuffle(texts)  # users do not all speak the same text at the same time
    connection: Connection | None = None
    await asyncio.sleep(max(0.0, start_s - progress.elapsed()))
    try:
        for number in itertools.count():
            if progress.elapsed() >= config.duration_s:
                break
            text = texts[number % len(texts)]
            record = UtteranceRecord(result.level, len(text), progress.elapsed(), user=index)
            try:
                if connection is None:
                    connection = await _connect(config, record, index)
                with progress.in_flight(record.kind):
                    await _measure(connection, text, config, record)
            except (ClientError, asyncio.TimeoutError) as exc:
                record.error = _error_code(exc)
                if connection is None:
                    await asyncio.sleep(RECONNECT_PAUSE_S)
                else:
                    await connection.close()
                    connection = None
            progress.add(record)
    finally:
        if connection is not None:
            await connection.close()


async def _http_user(
    config: BenchConfig,
    index: int,
    start_s: float,
    result: LevelResult,
    progress: _Progress,
    kind: RequestKind | None = None,
) -> None:
    """One closed-loop HTTP user (of ``kind``, by default the level's): from ``start_s`` into the level, requests
    back to back until the duration is over."""
    kind = kind or config.kind
    texts = list(config.texts)
    random.Random(index).shuffle(texts)
    await asyncio.sleep(max(0.0, start_s - progress.elapsed()))
    for number in itertools.count():
        if progress.elapsed() >= config.duration_s:
            break
        record = await _http_request(config, kind, index, texts[number % len(texts)], result, progress)
        if record.error:
            await asyncio.sleep(RECONNECT_PAUSE_S)


async def _arrivals(
    config: BenchConfig, rate: float, rng: random.Random, result: LevelResult, progress: _Progress
) -> None:
    """Open loop: visitors arrive as a Poisson process at ``rate`` per second; each speaks one text."""
    visitors: list[asyncio.Task[object]] = []
    at = rng.expovariate(rate)
    while at < config.duration_s:
        await asyncio.sleep(max(0.0, at - progress.elapsed()))
        text = config.texts[rng.randrange(len(config.texts))]
        visitor: Awaitable[object]
        if config.kind is RequestKind.WEBSOCKET:
            visitor = _visitor(config, len(visitors), text, result, progress)
        else:
            visitor = _http_request(config, config.kind, len(visitors), text, result, progress)
        visitors.append(asyncio.ensure_future(visitor))
        at += rng.expovariate(rate)
    await asyncio.gather(*visitors)


async def _visitor(config: BenchConfig, index: int, text: str, result: LevelResult, progress: _Progress) -> None:
    record = UtteranceRecord(result.level, len(text), progress.elapsed(), user=index)
    with progress.in_flight(record.kind):
        try:
            async with await _connect(config, record, index) as connection:
                await _measure(connection, text, config, record)
        except (ClientError, asyncio.TimeoutError) as exc:
            record.error = _error_code(exc)
    progress.add(record)


async def _http_request(
    config: BenchConfig, kind: RequestKind, user: int, text: str, result: LevelResult, progress: _Progress
) -> UtteranceRecord:
    """One HTTP request of ``user``, measured and added to the level (failed or not)."""
    level = result.files if kind is not result.kind else result.level
    record = UtteranceRecord(level, len(text), progress.elapsed(), user=user, kind=kind)
    with progress.in_flight(kind):
        try:
            await asyncio.wait_for(_measure_http(config, text, record), config.utterance_timeout_s)
        except (ClientError, asyncio.TimeoutError) as exc:
            record.error = _error_code(exc)
    progress.add(record)
    return record


async def _connect(config: BenchConfig, record: UtteranceRecord, user: int) -> Connection:
    started = time.perf_counter()
    connection = await open_with_retry(config.server, config.token, config.retry)
    try:
        await connection.configure(config.start(user))
    except BaseException:
        await connection.close()
        raise
    record.connect_ms = (time.perf_counter() - started) * 1000
    return connection


# ---- one utterance -----------------------------------------------------------------------------------------------


async def _measure(connection: Connection, text: str, config: BenchConfig, record: UtteranceRecord) -> None:
    """Speak ``text`` on ``connection`` and fill ``record``; raises ``ClientError`` or ``TimeoutError``."""
    ready = connection.ready
    meter = AudioMeter(ready.format, ready.sample_rate)
    arrivals: list[tuple[float, float]] = []
    decodable_at: float | None = None
    started = time.perf_counter()

    async def send() -> None:
        rate = config.words_per_second
        pieces = words(text) if rate else [text]
        gap_s = 1 / rate if rate else 0.0
        for number, piece in enumerate(pieces):
            if number:
                await asyncio.sleep(gap_s)
            await connection.send(Text(piece))
        await connection.send(End())

    async def receive() -> Done:
        nonlocal decodable_at
        while True:
            message = await connection.receive()
            if isinstance(message, AudioFrame):
                now = time.perf_counter() - started
                seconds, decodable = meter.feed(message)
                arrivals.append((now, seconds))
                if decodable and decodable_at is None:
                    decodable_at = now
            elif isinstance(message, Error):
                if message.utterance is None:  # a refused message: no done will come for it
                    raise ServerError(message.code, message.message)
                record.error = message.code
            elif isinstance(message, Done):
                return message

    _, done = await asyncio.wait_for(together(send(), receive()), config.utterance_timeout_s)
    record.wall_s = time.perf_counter() - started
    record.finish_reason = done.finish_reason
    record.server_ttfa_ms = _ms(done.ttfa_s)
    record.engine_ttfc_ms = _ms(done.engine_ttfc_s)
    record.complete(arrivals, decodable_at, config.player_buffer_ms / 1000)
    if not arrivals and record.error is None:
        record.error = "no_audio"


async def _measure_http(config: BenchConfig, text: str, record: UtteranceRecord) -> None:
    """Request ``text`` over HTTP and fill ``record`` (its ``connect_ms`` covers any retries of a refusal); raises
    ``ClientError``."""
    url, body = speech_url(config.server), config.speech_body(text, record.kind, record.user or 0)
    started = time.perf_counter()
    async with await retry_while_busy(lambda: post_speech(url, body, config.token), config.retry) as response:
        record.connect_ms = (response.connected_at - started) * 1000
        record.ttfb_ms = (response.first_byte_at - started) * 1000
        meter = BodyMeter(config.response_format)
        arrivals: list[tuple[float, float]] = []
        async for chunk in response.chunks():
            try:
                seconds = meter.feed(chunk)
            except ValueError as exc:
                raise ServerError("invalid_audio_body", str(exc)) from None
            arrivals.append((time.perf_counter() - started, seconds))
    record.wall_s = time.perf_counter() - started
    decodable_at = next((at for at, seconds in arrivals if seconds > 0), None)
    streamed = record.kind is RequestKind.HTTP_STREAM
    record.complete(arrivals, decodable_at, config.player_buffer_ms / 1000 if streamed else None)
    if not record.audio_s:
        record.error = "no_audio"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _error_code(exc: BaseException) -> str:
    if isinstance(exc, ServerBusyError):
        return "busy"
    if isinstance(exc, ServerUnreachableError):
        return UNREACHABLE
    if isinstance(exc, ServerError):
        return exc.code
    return "timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__


# ---- progress ----------------------------------------------------------------------------------------------------


class _Progress:
    """The level's clock, its in-flight counts, and its progress on stderr (per kind of request: utterances,
    failures, underruns of played audio and requests in flight), every ``PROGRESS_INTERVAL_S``: a tqdm bar updated
    in place on a terminal; elsewhere (a log file, CI), where a bar redrawn with carriage returns shows nothing
    useful, a line each time and one at the end of the level."""

    def __init__(self, config: BenchConfig, label: str, result: LevelResult) -> None:
        from tqdm import tqdm

        self.result = result
        self.label = label
        self.duration_s = config.duration_s
        self.origin = time.perf_counter()
        self.live: Counter[RequestKind] = Counter()
        self.lines = config.progress and not sys.stderr.isatty()
        self.bar = tqdm(
            total=round(config.duration_s, 1),
            desc=label,
            unit="s",
            file=sys.stderr,
            leave=False,
            disable=not config.progress or self.lines,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s{postfix}",
        )
        self._ticker: asyncio.Task[None] | None = None

    def __enter__(self) -> _Progress:
        self._ticker = asyncio.ensure_future(self._print_lines() if self.lines else self._tick())
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        self.bar.close()
        if self.lines:
            self._print_line()

    def elapsed(self) -> float:
        return time.perf_counter() - self.origin

    @contextlib.contextmanager
    def in_flight(self, kind: RequestKind) -> Iterator[None]:
        self.live[kind] += 1
        peaks = self.result.peak_in_flight
        peaks[kind] = max(peaks.get(kind, 0), self.live[kind])
        try:
            yield
        finally:
            self.live[kind] -= 1

    def add(self, record: UtteranceRecord) -> None:
        self.result.records.append(record)

    def counts(self) -> str:
        """``N utterances, F failed, U underruns, L live`` for live sessions; HTTP ``N streams|files, F failed,
        [U underruns,] L in flight``; a mixed level both, ``;`` between."""
        parts = []
        for side in self.result.sides():
            records = side.records
            failed = sum(1 for record in records if record.error)
            underruns = sum(record.underruns for record in records)
            live = self.live[side.kind]
            if side.kind is RequestKind.WEBSOCKET:
                parts.append(f"{len(records)} utterances, {failed} failed, {underruns} underruns, {live} live")
            elif side.kind is RequestKind.HTTP_STREAM:
                parts.append(f"{len(records)} streams, {failed} failed, {underruns} underruns, {live} in flight")
            else:
                parts.append(f"{len(records)} files, {failed} failed, {live} in flight")
        return "; ".join(parts)

    def _print_line(self) -> None:
        elapsed = min(self.elapsed(), self.duration_s)
        print(f"{self.label}: {elapsed:.0f}/{self.duration_s:g} s, {self.counts()}", file=sys.stderr, flush=True)

    async def _print_lines(self) -> None:
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            self._print_line()

    async def _tick(self) -> None:
        while True:
            self.bar.n = min(self.elapsed(), self.duration_s)
            self.bar.set_postfix_str(self.counts())
            await asyncio.sleep(PROGRESS_INTERVAL_S / 2)
