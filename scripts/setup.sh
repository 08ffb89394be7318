#!/usr/bin/env bash
# Installs what building and testing need on a fresh Debian machine (idempotent, quiet when done).
set -euo pipefail
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
need_apt=()
# wrk drives the load test (tests/tests/load.rs, benches/load.sh); perf only the profile of the
# tap's cost in a writer (benches/tap_writer_profile.sh; no test needs it).
# chromium opens the HTML report headless and offline (tests/tests/profiler.rs); unshare and ip
# give a proxy test a network namespace with a short connect timeout (exporters proxy::upstream);
# nft a router namespace's DNAT rule (tests/tests/tap.rs, a port translated to another host).
for bin_pkg in "cc:build-essential" "curl:curl" "python3:python3" "pkg-config:pkg-config" "procps:procps" "wrk:wrk" "chromium:chromium" "unshare:util-linux" "ip:iproute2" "nft:nftables" "perf:linux-perf"; do
  bin=${bin_pkg%%:*}; pkg=${bin_pkg#*:}
  if [ "$bin" = procps ]; then command -v ps >/dev/null || need_apt+=("$pkg"); continue; fi
  command -v "$bin" >/dev/null || need_apt+=("$pkg")
done
# A real 2-node Slurm on this machine (scripts/slurm-local-cluster.sh) runs the Slurm example in
# tests/tests/slurm.rs: slurm-wlm (the controller, the node daemon and the client: a machine with
# only the client has sbatch but no slurmctld) and munge.
for bin in slurmctld slurmd sbatch; do
  command -v "$bin" >/dev/null || { need_apt+=(slurm-wlm); break; }
done
command -v munged >/dev/null || need_apt+=(munge)
# Debian's real ROCm SMI library: tests prove it means "no AMD GPU" (never a crash) here.
[ -e /usr/lib/librocm_smi64.so.1 ] || need_apt+=(librocm-smi64-1)
# A real Prometheus server and promtool: the exporter's output is checked by both.
[ -x /usr/bin/promtool ] && [ -x /usr/bin/prometheus ] || need_apt+=(prometheus)
# The embedded interpreter links Debian's static libpython3.11 (python/pyo3-static.cfg), which needs
# zlib and expat; venv and pip fetch the real SGLang wheels and build the import-mode venv.
# python3-yaml reads the Kubernetes examples in tests/tests/kubernetes_manifests.rs. liburing-dev
# builds benches/uring_relay.c (FLOOR=uring benches/proxy.sh; a benchmark, no test needs it).
for pkg in libpython3.11-dev python3.11-venv python3-pip zlib1g-dev libexpat1-dev python3-yaml liburing-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" ca-certificates >/dev/null
fi
# Python's prometheus_client: its strict OpenMetrics parser checks the exporter's output.
python3 -c "import prometheus_client" 2>/dev/null || python3 -m pip install -q prometheus_client 2>/dev/null || python3 -m pip install -q --break-system-packages prometheus_client
if ! command -v cargo >/dev/null; then
  [ -x "$HOME/.cargo/bin/cargo" ] || curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy >/dev/null
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
