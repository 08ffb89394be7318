#!/usr/bin/env bash
# Builds sglang-supervisor with its embedded interpreter linked against PYTHON's own static
# libpython, so that `flags` reads the image's SGLang in-process (the embedded interpreter must be
# the very Python the image runs: same version, same standard library). The Dockerfile runs it;
# tests/tests/docker_build.rs runs it too, with the Python of the real SGLang wheels
# (target/sglang-venv), where no container engine exists.
#   examples/docker/build.sh [PYTHON]      (default: python3)
#   env: PREFIX (default /usr/local: the binary goes to PREFIX/bin), CARGO_TARGET_DIR
# Needs: cargo, a C toolchain, PYTHON's static libpython (Debian/Ubuntu: python3.X-dev), and
# zlib and expat headers (zlib1g-dev libexpat1-dev), which that static libpython links.
set -euo pipefail
PYTHON=${1:-python3}
PREFIX=${PREFIX:-/usr/local}
src=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$src/target}
mkdir -p "$target" "$PREFIX/bin"

# PyO3's build configuration for this Python: its version, its static library, and the system
# libraries its built-in modules need (MODLIBS: -lz -lexpat on Debian and Ubuntu).
cfg=$target/pyo3-embedded.cfg
"$PYTHON" - > "$cfg" <<'PY'
import os, sys, sysconfig
v = sysconfig.get_config_var
lib = v("LIBRARY") or f"libpython{v('VERSION')}.a"
dirs = [d for d in (v("LIBDIR"), v("LIBPL")) if d and os.path.exists(os.path.join(d, lib))]
if not dirs:
    sys.exit(f"{sys.executable}: no static {lib} in {v('LIBDIR')} or {v('LIBPL')}: "
             f"install python{v('VERSION')}-dev (Debian/Ubuntu)")
libs = []
for flag in " ".join(v(k) or "" for k in ("MODLIBS", "LIBS", "SYSLIBS")).split():
    name = flag[2:] if flag.startswith("-l") else None
    if name and name not in libs and name not in ("m", "dl", "pthread", "util", "rt"):
        libs.append(name)
print("implementation=CPython")
print(f"version={v('VERSION')}")
print("shared=false\nabi3=false")
print(f"lib_name=python{v('VERSION')}")
print(f"lib_dir={dirs[0]}")
print(f"executable={os.path.realpath(getattr(sys, '_base_executable', sys.executable))}")
print(f"pointer_width={8 * __import__('struct').calcsize('P')}")
print("build_flags=\nsuppress_build_script_link_lines=false")
for name in libs:
    print(f"extra_build_script_line=cargo:rustc-link-lib={name}")
PY
# The committed configuration, when it says the same, keeps cargo from rebuilding PyO3.
if cmp -s "$cfg" "$src/python/pyo3-static.cfg"; then cfg=$src/python/pyo3-static.cfg; fi
echo "embedding $(grep '^executable=' "$cfg" | cut -d= -f2) ($(grep '^version=' "$cfg" | cut -d= -f2)), config $cfg"

# --bin without -p: the whole workspace's feature set, as `cargo build --workspace` has it.
(cd "$src" && PYO3_CONFIG_FILE=$cfg cargo build --release --locked --bin sglang-supervisor)
install -m 0755 "$target/release/sglang-supervisor" "$PREFIX/bin/sglang-supervisor"
bin=$PREFIX/bin/sglang-supervisor

# What it needs at run time: no libpython, only glibc (its newest symbol version), libz, libexpat.
if ldd "$bin" | grep -q libpython; then echo "$bin links libpython dynamically" >&2; exit 1; fi
glibc=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)
echo "installed $bin: needs $glibc or newer, $(ldd "$bin" | awk '/libz|libexpat/ {print $1}' | tr '\n' ' ')"

# Where PYTHON imports SGLang, `flags` must read it in-process, with this very interpreter.
if "$PYTHON" -c 'import sglang' 2>/dev/null; then
  want=$("$PYTHON" -c 'import platform; print(platform.python_version())')
  said=$("$bin" flags dump --sglang "$PYTHON" 2>&1 >/dev/null | grep -o 'embedded Python [0-9.]*' || true)
  if [ "$said" != "embedded Python $want" ]; then
    echo "flags did not run in the embedded interpreter of $PYTHON ($want): '${said:-subprocess}'" >&2
    exit 1
  fi
  echo "flags reads SGLang $("$PYTHON" -c 'import sglang; print(sglang.__version__)') in-process ($said)"
fi
