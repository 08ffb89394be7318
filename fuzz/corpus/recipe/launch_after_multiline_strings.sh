#!/usr/bin/env bash
# Multi-line quoted strings and a multi-line $(python3 -c '...') before the launch.
USAGE='usage: run.sh MODEL
  runs the benchmark; it'"'"'s long'
NUM_GPUS=$(python3 -c '
import os
print(len(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")))
')
cat > /tmp/notes.txt <<EOF
don't stop at this apostrophe
EOF
MSG="first line
second line with 'quotes'"
python3 -m sglang.launch_server --model-path "$MODEL" --tp 8 \
  --hel --port 30000 &
