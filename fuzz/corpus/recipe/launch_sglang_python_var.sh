#!/usr/bin/env bash
# The interpreter in a variable, quoted: "$SGLANG_PYTHON" -m sglang.launch_server.
SGLANG_PYTHON=${SGLANG_PYTHON:-/opt/venv/bin/python3}
"$SGLANG_PYTHON" -m sglang.launch_server --model-path "$MODEL" \
  --tp 8 --trust-remote-code=1 \
  --port 30000 > server.log 2>&1 &
