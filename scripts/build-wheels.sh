#!/usr/bin/env bash
# Builds every etkit package (libs/*, apps/*) on its own, a wheel and an sdist each, into dist/
# (or the folder given as the first argument).
#
#   scripts/build-wheels.sh            -> dist/etkit_quant-0.1.0-py3-none-any.whl, ...
#   scripts/build-wheels.sh OUT_DIR
#
# Builds without isolation, with the build backends of the environment that runs it (.venv, or
# $ETKIT_BUILD_PYTHON): poetry-core for the pure-Python packages; for etkit-gridsampler,
# scikit-build-core with CMake (>= 3.20) and a C++17 compiler, against the executorch wheel
# installed in that environment (its headers and libexecutorch.so), which is why it cannot build
# in an isolated environment. Each wheel is built from its sdist, so the sdist is proven whole.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${ETKIT_BUILD_PYTHON:-$root/.venv/bin/python}"
out="$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)"

"$python" -c 'import build, poetry.core, scikit_build_core, executorch' 2>/dev/null || {
  echo "build-wheels.sh: $python lacks build, poetry-core, scikit-build-core or executorch;" \
    "run scripts/setup.sh --no-run (or pip install build poetry-core scikit-build-core" \
    "executorch==1.5.1 into it)" >&2
  exit 1
}
command -v cmake >/dev/null || { echo "build-wheels.sh: cmake not found (apt-get install cmake)" >&2; exit 1; }

for pyproject in "$root"/libs/*/pyproject.toml "$root"/apps/*/pyproject.toml; do
  package="$(dirname "$pyproject")"
  echo "[build-wheels] ${package#"$root"/}"
  # Quiet unless it fails: the backends' logs are long.
  if ! log="$("$python" -m build --no-isolation --outdir "$out" "$package" 2>&1)"; then
    printf '%s\n' "$log" >&2
    echo "build-wheels.sh: building ${package#"$root"/} failed" >&2
    exit 1
  fi
done
echo "[build-wheels] wheels and sdists in $out:"
ls -1 "$out"
