#!/usr/bin/env bash
# Runs every check: ruff (lint and format), mypy --strict for each package on its own, each
# library's public API against its last release (scripts/api_check.py), all tests.
# Sets the environment up first (scripts/setup.sh --no-run; instant when already done).
#
#   scripts/check.sh [PYTEST_ARGS...]                        everything (what CI runs)
#   scripts/check.sh --package libs/quant [PYTEST_ARGS...]   one package: ruff and mypy on its
#                                                            folder, and its tests from its folder,
#                                                            with its own pytest settings
# --package may be given several times. Arguments after the options go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

all_packages=()
for pyproject in libs/*/pyproject.toml apps/*/pyproject.toml; do
  all_packages+=("$(dirname "$pyproject")")
done
packages=()
while [ $# -gt 0 ] && [ "$1" = "--package" ]; do
  folder="${2:-}"
  folder="${folder%/}"
  if [ -z "$folder" ] || [ ! -f "$root/$folder/pyproject.toml" ] || [[ "$folder" != */* ]]; then
    echo "check.sh: --package takes a package folder, one of: ${all_packages[*]} (got '${2:-}')" >&2
    exit 2
  fi
  packages+=("$folder")
  shift 2
done

"$root/scripts/setup.sh" --no-run
bin="$root/.venv/bin"
# One mypy cache for every package: each package's check analyzes torch, torchao and ExecuTorch
# (and the libraries below it) as its dependencies, and a cache of their own made each package's
# first check do that again: 137 -> 37 s for the six on a fresh clone. mypy keeps a module's
# cache entry only for the options it was checked with, so each package's settings still apply.
mypy_cache=(--cache-dir "$root/.mypy_cache")
# Two workers (the CI machine has 2 cores), each test file on one worker, so that a file's
# module-scoped exports are made once; ETKIT_TEST_WORKERS=0 runs in this process.
workers="${ETKIT_TEST_WORKERS:-2}"
pytest_cmd=("$bin/pytest")
if [ "$workers" != 0 ]; then
  # heaviest files first (conftest.py), not xdist's most-tests-first
  pytest_cmd+=(-n "$workers" --dist loadfile --no-loadscope-reorder)
  # one PyTorch thread per worker: two workers with two OpenMP threads each on two cores ran
  # three test files 4.7 % slower (173.6 against 165.5 s)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi

if ((${#packages[@]} == 0)); then
  echo "[check] ruff check"
  "$bin/ruff" check .
  echo "[check] ruff format --check"
  "$bin/ruff" format --check .
  for pkg in "${all_packages[@]}"; do
    echo "[check] mypy --strict $pkg"
    (cd "$pkg" && "$bin/mypy" --strict "${mypy_cache[@]}" src)
  done
  echo "[check] public APIs against their releases (scripts/api_check.py)"
  "$bin/python" scripts/api_check.py
  echo "[check] pytest"
  "${pytest_cmd[@]}" "$@"
  exit
fi

for pkg in "${packages[@]}"; do
  echo "[check] $pkg: ruff check, ruff format --check"
  "$bin/ruff" check "$pkg"
  "$bin/ruff" format --check "$pkg"
  echo "[check] $pkg: mypy --strict"
  (cd "$pkg" && "$bin/mypy" --strict "${mypy_cache[@]}" src)
  if [ -d "$pkg/api" ]; then
    echo "[check] $pkg: public API against its release"
    "$bin/python" scripts/api_check.py "$pkg"
  fi
  echo "[check] $pkg: pytest (from $pkg, with its own settings)"
  (cd "$pkg" && "${pytest_cmd[@]}" "$@")
done
