#!/usr/bin/env bash
# The TTFT the tap adds at one stream, its p99 above all, with the host's drift taken out: two
# replay servers, requests one at a time to each in turn (ABBA), the tap attached to one of them
# (`run --tap`: its kernel filter passes that port only), the watched server swapped every leg so
# that a difference between the two servers cancels. Each leg prints watched − unwatched; the end
# pools every leg's TTFTs per side (benches/tap_ttft.py: p99 and median, watched − unwatched, with
# a bootstrap 95 % interval) and checks the tap's records (one per watched request, every token).
# usage: benches/tap_ttft.sh [LEGS=6] [REQUESTS=1000] [TOKENS=16] [TOKEN_GAP_US=1000]
# (REQUESTS per side per leg; about LEGS × REQUESTS × 2 × TOKENS × TOKEN_GAP_US of wall time)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/proxy-bench ] || cargo build --release --workspace --bins
LEGS=${1:-6} REQUESTS=${2:-1000} TOKENS=${3:-16} GAP_US=${4:-1000}
work=$(mktemp -d)
. benches/free_port.sh
. benches/tap_attach.sh
replays=()
ports=()
for _ in 1 2; do
  p=$(free_port)
  target/release/sglang-replay --port "$p" --speed 100 --token-gap-us "$GAP_US" --merge-every 5 >/dev/null 2>&1 &
  replays+=($!)
  ports+=("$p")
done
trap 'kill ${tap:-} "${replays[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
for p in "${ports[@]}"; do
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break; sleep 0.05; done
done
echo "one stream, $REQUESTS requests of $TOKENS tokens a side a leg, the two servers in turn, ABBA"
for leg in $(seq "$LEGS"); do
  watched=${ports[$((leg % 2))]} unwatched=${ports[$(((leg + 1) % 2))]}
  rm -f "$work/tap.jsonl"
  tap_attach "$watched" "$work"
  # proxy-bench's "direct" side is the unwatched server, its "proxy" side the watched one
  PROXY_BENCH_ABBA=1 PROXY_BENCH_TTFTS="$work/ttfts" target/release/proxy-bench \
    "127.0.0.1:$unwatched" "127.0.0.1:$watched" 1 "$TOKENS" "$REQUESTS" "$tap" 2>&1 |
    sed -n 's/^added by the proxy: .*median TTFT \([^,]*\), p99 TTFT \([^,]*\),.*/median TTFT \1, p99 TTFT \2/p' |
    sed "s/^/leg $leg (watched :$watched) watched − unwatched: /"
  kill -TERM "$tap"; wait "$tap" 2>/dev/null || true
  printf '  ' && python3 benches/tap_records.py "$work/tap.jsonl" "$REQUESTS" "$TOKENS"; echo
done
python3 benches/tap_ttft.py "$work/ttfts"
