#!/usr/bin/env bash
# The launch built in a bash array, extended under a condition, run as "${cmd[@]}" in the background.
set -euo pipefail
MODEL=${MODEL:-deepseek-ai/DeepSeek-R1-0528}
cmd=(python3 -m sglang.launch_server
  --model-path "$MODEL"
  --tensor-parallel-size 8
  --trust-remote-code
  --mem-fraction-static 0.85)
if [[ "${LONG_CONTEXT:-0}" == 1 ]]; then
  cmd+=(--context-length 131072)
fi
cmd+=(--cuda-graph-max-bs 256 --kv-cache-dtype fp8_e4m3)
echo "launching: ${cmd[*]}"
"${cmd[@]}" > "$SERVER_LOG" 2>&1 &
SERVER_PID=$!
wait_for_server_ready --port 30000 --server-pid "$SERVER_PID"
