#!/usr/bin/env bash
# Rewrites requirements/constraints.txt from the packages installed in .venv (after changing
# requirements/dev.txt and running `.venv/bin/pip install -r requirements/dev.txt`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
{
  echo "# Exact versions of every Python package in etkit's .venv (a pip constraints file: the lock)."
  echo "# Regenerate after changing requirements/dev.txt: scripts/lock.sh"
  "$root/.venv/bin/pip" freeze --exclude-editable | grep -v '^etkit'
} >"$root/requirements/constraints.txt.tmp"
mv "$root/requirements/constraints.txt.tmp" "$root/requirements/constraints.txt"
# The upstream sentinels (tests named test_upstream_*: facts of the pinned ExecuTorch, torch and
# torchao that etkit's workarounds rest on) run on the new lock; when they pass, its sha256 is
# recorded and the suite leaves them to `pytest -m extended` until the lock changes again
# (conftest.py, "Upstream sentinels").
cd "$root"
.venv/bin/pytest -p no:xdist -q -m "" -k test_upstream_
sha256sum requirements/constraints.txt >tests/upstream_checked.sha256
