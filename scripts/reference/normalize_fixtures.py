"""Record the reference's text normalization (voxcpm 2.0.3, ``utils/text_normalize.py``) for tests/text.

Runs in the reference environment (scripts/reference/setup_env.sh), never in tests:
    <reference venv>/bin/python scripts/reference/normalize_fixtures.py

Only that module and its own dependencies (wetext, inflect, regex) are needed, so it is loaded from its
file without importing the ``voxcpm`` package (which needs torch). Each input's output is recorded, or
the name of the exception the reference raised (double spaces crash its English normalizer).
"""

from __future__ import annotations

import importlib.util
import json
from importlib import metadata
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "reference" / "normalize" / "normalizer.json"

INPUTS = [
    # English, read well by the reference
    "Hello world.",
    "It costs $1,000,000.",
    "Tickets are €20 each.",
    "The meeting is on 03/15/2024.",
    "See you at 3:30 PM.",
    "It weighs 5 kg and is 12% heavier.",
    "She finished 1st and he was 22nd.",
    "Call 555-123-4567 now.",
    "Add 3/4 cup of sugar.",
    "It was -5 degrees outside.",
    "Dr. Smith met Mr. Jones.",
    "Solve x-2 = 5.",
    "# Title\nSome `code` and a [link](http://example.com) here.",
    "Great job 👍 today!",
    "“Quoted” words.",
    "I have 7 cats.",
    # English, read wrongly by the reference
    "There are 1,234 people.",
    "It costs $12.50.",
    "Hello  world.",
    "Music of the 1990s.",
    "Version 2.0.3 is out.",
    "See **this** now.",
    # Chinese, read well by the reference
    "你好，世界。",
    "今天是2024年3月15日。",
    "请拨打13812345678。",
    "比分是3:2。",
    "增长了15%。",
    "气温是-3°C。",
    "550 + 320 = 870 千卡。",
    "型号A-5很好。",
    "收入8034亿元，增长3.0%。",
    "面积是5m²。",
    "（注意）这是【重点】。",
    "中文 和 English 混合。",
    # Chinese, read wrongly by the reference
    "日期是2023-05-01。",
]


def load_reference_module() -> object:
    files = metadata.files("voxcpm") or []
    (path,) = [file for file in files if str(file).endswith("utils/text_normalize.py")]
    spec = importlib.util.spec_from_file_location("reference_text_normalize", path.locate())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    normalizer = load_reference_module().TextNormalizer()
    cases = []
    for text in INPUTS:
        try:
            cases.append({"input": text, "output": normalizer.normalize(text)})
        except Exception as exc:  # the reference's failures are part of what is recorded
            cases.append({"input": text, "error": type(exc).__name__})
    versions = {name: metadata.version(name) for name in ("voxcpm", "wetext", "inflect", "regex")}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    document = {"_comment": "reference TextNormalizer().normalize(input), see " + Path(__file__).name}
    OUT.write_text(json.dumps({**document, "versions": versions, "cases": cases}, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
