#!/usr/bin/env bash
# Every test: formatting, lints, unit tests, and the integration tests that run the real binary
# against the replayed SGLang server (real processes, signals and HTTP over loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
# A full disk fails deep inside pip or the linker with ENOSPC: say so first, in one line. The
# release build takes about 4 GB and the import-mode venv (torch) about 5 GB more, with pip's
# unpacking in the temp dir on top; a checkout whose venv is built needs only the build's share.
need_gb=12
[ -f "${SGLANG_IMPORT_VENV:-target/sglang-venv}/.complete" ] && need_gb=5
for where in "${CARGO_TARGET_DIR:-.}" "${TMPDIR:-/tmp}"; do
  mkdir -p "$where"
  free_gb=$(( $(df -Pk "$where" | awk 'NR==2 {print $4}') / 1048576 ))
  if [ "$free_gb" -lt "$need_gb" ]; then
    echo "scripts/test.sh: only $free_gb GB free on the disk of $where; the build and the SGLang venv need about $need_gb GB: free some (old clones' target/ folders) or point CARGO_TARGET_DIR and TMPDIR at a larger disk" >&2
    exit 1
  fi
done
# The tests and pip write their temporary files into one folder of this run's, removed at the
# end: files named by pid in /tmp would otherwise outlive a failed or killed test. Sticky and
# open to all, as /tmp is: tests/tests/thread_limit.rs runs the supervisor as nobody.
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/sglsup-test.XXXXXX")
chmod 1777 "$run_tmp"
export TMPDIR=$run_tmp
at_exit="rm -rf '$run_tmp';"
trap "$at_exit" EXIT
. scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
./scripts/fetch-sglang.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
# A binary built without the embedded interpreter still does every flags mode, in subprocesses.
cargo clippy -p sglang-supervisor --no-default-features --release -- -D warnings
# The integration tests run target/release/sglang-supervisor: build the binaries first.
cargo build --release --workspace --bins
# tests/tests/slurm.rs starts a local Slurm cluster (and munged) when none runs: stop them
# afterwards, unless they were running before (then they are someone's, and stay).
stop_after=""
pgrep -x slurmctld >/dev/null || stop_after="scripts/slurm-local-cluster.sh stop;"
pgrep -x munged >/dev/null || stop_after="$stop_after pkill -x munged;"
[ -n "$stop_after" ] && trap "{ $stop_after } >/dev/null 2>&1 || true; $at_exit" EXIT
cargo test --release --workspace
