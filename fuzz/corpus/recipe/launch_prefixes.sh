#!/usr/bin/env bash
# Launchers in front of the interpreter, one server per GPU group.
PY=/opt/venv/bin/python3
numactl --cpunodebind=0 --membind=0 python3 -m sglang.launch_server --model-path "$MODEL" --tp 4 --port 30000 &
srun --nodes=1 --ntasks=1 --exclusive python3 -m sglang.launch_server --model-path "$MODEL" -tp 4 --port 30001 &
timeout 7200 python3 -m sglang.launch_server --model-path "$MODEL" --tp 4 --port 30002 --disable-radix-cache yes &
env SGLANG_ENABLE_TORCH_INFERENCE_MODE=1 CUDA_VISIBLE_DEVICES=4,5,6,7 python3 -m sglang.launch_server --model-path "$MODEL" --tp 4 --port 30003 &
/opt/venv/bin/python3 -m sglang.launch_server --model-path "$MODEL" --tp 4 --port 30004 --mem-fraction-static 0.8x &
$PY -u -m sglang.launch_server --model-path "$MODEL" --tp 4 --port 30005 &
wait
