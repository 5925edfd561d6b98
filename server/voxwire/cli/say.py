"""``voxwire say``: speak text through a running server, to the speakers, a file or stdout (no torch needed)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from voxwire.client.say import SayResult

_EPILOG = """examples:
  voxwire say "Hello there"                          # speakers (pip install 'voxwire[speakers]')
  voxwire say --out hello.wav "Hello there"          # a file (.wav, .ogg/.opus: Ogg Opus)
  voxwire say --out - --format pcm_s16le "Hi" | aplay -f S16_LE -r 48000 -c 1
  llm-tool | voxwire say -                           # speak each line as it arrives

A busy, starting or draining server (HTTP 503, close 1013) is tried again with backoff (--retries). A connection
lost mid-utterance (1001, 1006) is reported; the text not yet sent is spoken on a new connection, the rest of the
lost utterance is skipped (no audio is played twice), and the exit code is 6.

exit codes: 0 spoken, 1 other client error, 2 bad arguments or no audio output, 3 server unreachable,
4 authentication failed, 5 the server reported an error (its code is printed), 6 a connection was lost
mid-utterance (part of the text was not spoken), 7 the server stayed busy (retries exhausted), 130 interrupted"""


def register(parser: argparse.ArgumentParser) -> None:
    from voxwire.client.connection import DEFAULT_SERVER, TOKEN_ENV
    from voxwire.client.output import OUTPUT_FORMATS
    from voxwire.client.retry import RetryPolicy

    parser.description = (
        "Stream text to a voxwire server and play the audio as it arrives. Text '-' (or none, "
        "with stdin not a terminal) reads standard input line by line and speaks each line as it comes."
    )
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("text", nargs="*", help="words to speak, or '-' for standard input")
    parser.add_argument(
        "--server", default=DEFAULT_SERVER, help=f"ws://host:port or the full endpoint URL (default {DEFAULT_SERVER})"
    )
    parser.add_argument("--token", help=f"API key (default: ${TOKEN_ENV})")
    parser.add_argument("--voice", help="voice id (see GET /v1/voices); default: the model's voice")
    parser.add_argument("--persona", help="LoRA persona loaded on the server (see GET /v1/loras); default: none")
    parser.add_argument("--seed", type=int, help="random seed: the same seed speaks the same audio")
    parser.add_argument(
        "--format",
        choices=OUTPUT_FORMATS,
        help="audio format for --out (default: from the file extension, else wav); speakers always get float PCM",
    )
    parser.add_argument(
        "--out",
        help="write audio to this file, or '-' for stdout (default: speakers, or stdout when it is not a terminal)",
    )
    parser.add_argument(
        "--max-buffer-delay-ms",
        type=int,
        help="how long the server waits for the rest of an "
        "unfinished sentence before speaking it (default: the server's)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=RetryPolicy().retries,
        help="times a refused connection (server busy, starting or draining) is tried again, with backoff",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="report time to first audio and segments on stderr"
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no summary line on stderr after speaking (errors still are)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from voxwire.client.aio import lines_of
    from voxwire.client.connection import token_from_env
    from voxwire.client.errors import ClientError
    from voxwire.client.output import AudioSink, SpeakerSink, choose_sink, format_for
    from voxwire.client.retry import RetryPolicy
    from voxwire.client.say import one_text, say
    from voxwire.errors import InvalidInputError

    from_stdin = args.text in ([], ["-"])
    if from_stdin and sys.stdin.isatty() and not args.text:
        raise InvalidInputError("give the text to speak, or '-' to read it from standard input")

    def log(line: str) -> None:
        if args.verbose:
            warn(line)

    def warn(line: str) -> None:
        print(f"voxwire say: {line}", file=sys.stderr, flush=True)

    try:
        policy = RetryPolicy(retries=args.retries)
    except ValueError as exc:
        raise InvalidInputError(f"--retries: {exc}") from None

    sinks: list[AudioSink] = []

    async def speak() -> SayResult:
        sink = choose_sink(args.out, format_for(args.out, args.format))
        sinks.append(sink)
        texts = lines_of(sys.stdin) if from_stdin else one_text(" ".join(args.text))
        return await say(
            args.server,
            texts,
            sink,
            token=token_from_env(args.token),
            voice=args.voice,
            seed=args.seed,
            max_buffer_delay_ms=args.max_buffer_delay_ms,
            persona=args.persona,
            retry=policy,
            log=log,
            warn=warn,
        )

    try:
        result = asyncio.run(speak())
    except ClientError as exc:
        print(f"voxwire say: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if result.interruptions:
        lost = result.interruptions[-1]
        print(f"voxwire say: error: {len(result.interruptions)} connection(s) lost mid-utterance", file=sys.stderr)
        return lost.exit_code
    if not args.quiet:
        warn(summary(result, args.out, isinstance(sinks[0], SpeakerSink)))
    return 0


def summary(result: SayResult, out: str | None, speakers: bool) -> str:
    """The line ``voxwire say`` ends a spoken utterance with: what it wrote where, and how soon audio came."""
    where = "the speakers" if speakers else "standard output" if out in (None, "-") else out
    audio_s = 0.0 if result.done is None else result.done.audio_s
    first = "" if result.ttfa_s is None else f", first audio after {result.ttfa_s * 1e3:.0f} ms"
    return f"spoke {audio_s:.2f} s of audio to {where}{first}"
