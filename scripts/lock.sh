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
