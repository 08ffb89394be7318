"""A known GPU load for the power-window check: idle, then bf16 matmuls, then idle again.
usage: python3 matmul_load.py TOTAL_S [LOAD_FROM_S] [LOAD_TO_S]; prints the load's wall-clock edges."""
import sys, time
import torch

total = float(sys.argv[1]) if len(sys.argv) > 1 else 60
lo = float(sys.argv[2]) if len(sys.argv) > 2 else total * 0.25
hi = float(sys.argv[3]) if len(sys.argv) > 3 else total * 0.75
t0 = time.time()
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
while time.time() - t0 < lo:
    time.sleep(0.05)
print(f"load begin {time.time():.3f}", flush=True)
n = 0
while time.time() - t0 < hi:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    n += 20
print(f"load end {time.time():.3f} matmuls={n}", flush=True)
while time.time() - t0 < total:
    time.sleep(0.05)
