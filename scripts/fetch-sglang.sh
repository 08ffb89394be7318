#!/usr/bin/env bash
# Real SGLang for the flag tests (issue #3), cached under target/ (re-runs cost nothing):
#  - the released wheels 0.5.14, 0.5.19, 0.5.20 and 0.5.23 from PyPI, without dependencies: the
#    static reader is tested on all four against the real parser dumps;
#  - a venv with SGLang 0.5.23 and what its import needs (torch, numpy, pyzmq, pillow, IPython,
#    msgspec; reference/sglang.md §4): import mode is tested on it, in-process and subprocess.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${SGLANG_WHEELS_DIR:-target/sglang-wheels}
VENV=${SGLANG_IMPORT_VENV:-target/sglang-venv}
mkdir -p "$WHEELS"
for v in 0.5.14 0.5.19 0.5.20 0.5.23; do
  ls "$WHEELS"/sglang-$v-*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 "sglang==$v" -d "$WHEELS"
done
if ! [ -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  # Debian's python3.11: the same build as the embedded interpreter, so import mode runs
  # in-process there (another patch release runs in a subprocess; tested as well).
  /usr/bin/python3.11 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.14.1 numpy pyzmq pillow ipython msgspec \
    orjson pybase64 requests packaging starlette pydantic tqdm aiohttp
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "$WHEELS"/sglang-0.5.23-*.whl
  "$VENV/bin/python" -c "import sglang.srt.server_args" && touch "$VENV/.complete"
fi
# The real parsers of 0.5.19 and 0.5.20 for the argparse oracle (tests/oracle/argparse_oracle.py):
# each unpacked wheel on the venv's torch, with the pure-Python packages their import of
# server_args needs, pinned as those releases pin them (torchvision, a compiled extension, is the
# one module the oracle stands in for: no parser code touches it).
PARSERS=${SGLANG_PARSERS_DIR:-target/sglang-parsers}
if ! [ -f "$PARSERS/.complete" ]; then
  rm -rf "$PARSERS"
  for v in 0.5.19 0.5.20; do
    python3 -m zipfile -e "$WHEELS"/sglang-$v-*.whl "$PARSERS/$v"
  done
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --target "$PARSERS/deps" \
    openai==2.6.1 transformers==5.12.1 tokenizers==0.22.2 huggingface-hub==1.33.0 safetensors==0.8.0 \
    xgrammar==0.2.1 apache-tvm-ffi==0.1.11 partial-json-parser==0.2.1.1.post7 pyyaml==6.0.4 \
    regex==2026.11.19 jiter==0.19.0 httpx==0.29.0 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0 \
    distro==1.9.0 sniffio==1.3.1 typing-extensions==4.16.0
  touch "$PARSERS/.complete"
fi
