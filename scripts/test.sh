#!/usr/bin/env bash
# Every test: formatting, lints, unit tests, and the integration tests that run the real binary
# against the replayed SGLang server (real processes, signals and HTTP over loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
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
[ -n "$stop_after" ] && trap "{ $stop_after } >/dev/null 2>&1 || true" EXIT
cargo test --release --workspace
