#!/usr/bin/env bash
# The command kept in a string, extended, then run unquoted.
CMD="python3 -m sglang.launch_server --model-path $MODEL --tp 8"
CMD="$CMD --host 0.0.0.0 --port 30000"
CMD+=" --attention-backend fa3 --enable-expert-distribution-metrics"
echo "$CMD"
$CMD > server.log 2>&1 &
