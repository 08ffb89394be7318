#!/usr/bin/env bash
# Time of `flags audit` on the qwen recipe (tests/fixtures/recipes), medians over RUNS:
#  - static mode from the 0.5.19 wheel, embedded interpreter and python3 subprocess;
#  - import mode on the SGLang 0.5.23 venv of scripts/fetch-sglang.sh, in-process and subprocess,
#    with the split the module reports (interpreter start, sglang import, parser build) and the
#    audit itself (total minus those);
#  - the reference beside it: `python3 -c "import sglang.srt.server_args"` in that venv, i.e. what
#    reading the real parser cannot avoid.
# Usage: benches/flags_audit.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-9}
./scripts/fetch-sglang.sh
[ -x target/release/sglang-supervisor ] || cargo build --release -p sglang-supervisor
B=target/release/sglang-supervisor
W=$(ls target/sglang-wheels/sglang-0.5.19-*.whl)
PY=target/sglang-venv/bin/python3
R=tests/fixtures/recipes/qwen3.5_fp8_h200.sh
work=$(mktemp -d)
t() { local s e; s=$(date +%s%N); "$@" >/dev/null 2>&1 || true; e=$(date +%s%N); echo $(((e - s) / 1000)); }
for i in $(seq "$runs"); do
  t $B flags audit --sglang "$W" "$R" >>"$work/static_embedded"
  t $B flags audit --subprocess --sglang "$W" "$R" >>"$work/static_subprocess"
  t $B flags audit --sglang "$PY" "$R" >>"$work/import_embedded"
  t $B flags audit --subprocess --sglang "$PY" "$R" >>"$work/import_subprocess"
  t "$PY" -c "import sglang.srt.server_args" >>"$work/reference_import"
  $B flags dump --raw --sglang "$PY" 2>/dev/null | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)['timings']))" >>"$work/split"
done
python3 - "$work" <<'PY'
import json, statistics, sys
w = sys.argv[1]
med = lambda name: statistics.median(int(x) for x in open(f"{w}/{name}")) / 1e6
for name in ["static_embedded", "static_subprocess", "import_embedded", "import_subprocess", "reference_import"]:
    print(f"{name:18} median {med(name):.3f} s")
print(f"import (embedded) / bare python import: {med('import_embedded') / med('reference_import'):.2f}")
split = [json.loads(l) for l in open(f"{w}/split")]
m = lambda k: statistics.median(s[k] for s in split)
print("import split (medians): interpreter start {:.3f} s, sglang import {:.3f} s, parser build {:.3f} s, rest (probe, JSON, audit) {:.3f} s, total {:.3f} s".format(
    m("interpreter_start_s"), m("import_s"), m("parser_s"),
    m("total_s") - m("interpreter_start_s") - m("import_s") - m("parser_s"), m("total_s")))
PY
