"""The built-in text set (short replies, paragraphs, Chinese) and ``--texts FILE``."""

from __future__ import annotations

import re
from pathlib import Path

from voxwire.errors import InvalidInputError

BUILTIN_TEXTS: tuple[str, ...] = (
    "Sure, I can help with that.",
    "Yes.",
    "Okay, one moment please.",
    "The meeting moved to three thirty this afternoon.",
    "I found two flights to Lisbon on Friday. The earlier one leaves at seven and costs a bit more.",
    "Thanks for waiting. Your order shipped this morning, and it should arrive on Tuesday. "
    "I'll send you the tracking link as soon as the carrier scans the package.",
    "Streaming speech synthesis starts talking before the whole answer exists. Each sentence is spoken as soon "
    "as it is complete, so the listener hears the first words while the language model is still writing the "
    "rest. What matters is the time to the first sound and that playback never stalls.",
    "Here is a quick summary of the report. Revenue grew eleven percent over the last quarter, mostly from the "
    "new subscription plans. Costs stayed flat. The team recommends hiring two more support engineers before "
    "the holiday season.",
    "你好，很高兴认识你。",
    "今天天气很好，我们下午去公园散步吧。",
    "语音合成服务需要在用户说完之后尽快开始播放，第一段音频的延迟决定了对话是否自然。",
)

# A "word" for pacing: one CJK character (written without spaces), or a run of other non-space characters,
# each with the whitespace before it.
_WORD = re.compile(r"\s*(?:[\u3400-\u9fff\uf900-\ufaff]|[^\s\u3400-\u9fff\uf900-\ufaff]+)")


def load_texts(path: Path | None) -> tuple[str, ...]:
    """The texts of ``path`` (one per non-blank line), or the built-in set."""
    if path is None:
        return BUILTIN_TEXTS
    try:
        texts = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    except OSError as exc:
        raise InvalidInputError(f"cannot read --texts {path}: {exc.strerror}") from None
    if not texts:
        raise InvalidInputError(f"--texts {path} has no text (one utterance per line)")
    return texts


def words(text: str) -> list[str]:
    """``text`` cut into words that concatenate back to it (trailing whitespace aside)."""
    return _WORD.findall(text)
