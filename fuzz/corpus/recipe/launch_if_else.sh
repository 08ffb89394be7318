#!/usr/bin/env bash
# Two launches: prefill/decode disaggregation or a single server.
if [[ "${DISAGG:-0}" == 1 ]]; then
  python3 -m sglang.launch_server --model-path "$MODEL" --tp 8 \
    --disaggregation-mode prefill --port 30000 > prefill.log 2>&1 &
else
  python3 -m sglang.launch_server --model-path "$MODEL" --tp 8 \
    --cuda-graph-max-bs 128 --port 30000 > server.log 2>&1 &
fi
