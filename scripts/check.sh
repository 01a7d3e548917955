#!/usr/bin/env bash
# Runs every check: ruff (lint and format), mypy --strict for each package on its own, all tests.
# Sets the environment up first (scripts/setup.sh --no-run; instant when already done).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/setup.sh" --no-run
bin="$root/.venv/bin"

echo "[check] ruff check"
"$bin/ruff" check .
echo "[check] ruff format --check"
"$bin/ruff" format --check .
for pkg in libs/quant libs/partition libs/layout libs/gridsampler apps/exporter; do
  echo "[check] mypy --strict $pkg"
  (cd "$pkg" && "$bin/mypy" --strict src)
done
echo "[check] pytest"
# Two workers (the CI machine has 2 cores), each test file on one worker, so that a file's
# module-scoped exports are made once; ETKIT_TEST_WORKERS=0 runs in this process.
workers="${ETKIT_TEST_WORKERS:-2}"
if [ "$workers" = 0 ]; then
  "$bin/pytest" "$@"
else
  "$bin/pytest" -n "$workers" --dist loadfile "$@"
fi
