#!/usr/bin/env bash
# Creates the environment that runs the reference implementation (PyPI voxcpm 2.0.3) to make golden
# fixtures and to benchmark against. It is never a runtime or test dependency of voxwire: tests read the
# committed fixtures.
#   usage: bash scripts/reference/setup_env.sh [VENV_DIR]   (default: .venv-reference)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-${VOXWIRE_REFERENCE_VENV:-.venv-reference}}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0 transformers einops pydantic safetensors tqdm soundfile soxr librosa numpy tokenizers huggingface_hub wetext inflect regex
# voxcpm's declared dependencies pull gradio, funasr, modelscope and torchaudio: install it alone.
"$venv/bin/pip" install -q --no-deps voxcpm==2.0.3
# voxwire itself, without its dependencies (they are installed above), for scripts/bench_model.py.
"$venv/bin/pip" install -q --no-deps -e "$here/../.."
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$here/shim" > "$site/voxwire_reference_shim.pth"
"$venv/bin/python" -c "import voxcpm.model.voxcpm2, torchaudio; print('reference environment ready:', '$venv')"
