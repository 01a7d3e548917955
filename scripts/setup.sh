#!/usr/bin/env bash
# Sets up everything etkit needs on a Debian 12 machine, then runs the exporter's main job.
#
#   scripts/setup.sh            set up, then run the main job
#   scripts/setup.sh --no-run   set up only (what scripts/check.sh uses)
#
# Safe to run again: each step is skipped when what it would install is already there.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
run_main_job=1
for arg in "$@"; do
  case "$arg" in
    --no-run) run_main_job=0 ;;
    *) echo "setup.sh: unknown argument '$arg' (expected --no-run or nothing)" >&2; exit 2 ;;
  esac
done

say() { printf '[setup] %s\n' "$*"; }

# 1. System packages: the Vulkan loader, Mesa's lavapipe driver, vulkaninfo, glslang, a C++ toolchain,
#    and the AArch64 cross compiler and qemu-user that build and run the NEON kernel's tests.
apt_packages=(libvulkan1 mesa-vulkan-drivers vulkan-tools glslang-tools g++ cmake make
  g++-aarch64-linux-gnu qemu-user)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to apt-get install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  say "apt-get install ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "system packages present"
fi

# 2. The virtual environment, Python 3.11.
python_bin="${ETKIT_PYTHON:-$(command -v python3.11 || command -v python3)}"
if [ ! -x "$venv/bin/python" ]; then
  "$python_bin" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || { echo "setup.sh: $python_bin is not Python 3.11; set ETKIT_PYTHON to a Python 3.11" >&2; exit 1; }
  say "creating .venv with $python_bin"
  "$python_bin" -m venv "$venv"
fi

# 3. Python packages, exactly as locked, then the six etkit packages editable.
#    The stamp holds a hash of everything that decides the environment, so a second run is instant.
stamp="$venv/.etkit-setup-stamp"
digest="$(cat "$root/requirements/"*.txt "$root"/libs/*/pyproject.toml "$root"/apps/*/pyproject.toml \
  "$root/libs/gridsampler/CMakeLists.txt" $(find "$root/libs/gridsampler/csrc" -type f | sort) \
  | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
  say "installing Python packages (locked in requirements/constraints.txt)"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  # (pip's config here lists optional local indexes; its warnings about the absent ones are noise)
  quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }; }
  # uv (locked like the rest) installs the same versions as pip, from the same places: 43 s
  # with bytecode compiled against pip's 164-176 s for requirements/dev.txt into a new venv on
  # this project's 2-core machine (2026-11-30), most of a fresh set-up and of every CI run. It does not read pip's
  # configuration, so pip's find-links and indexes (where a machine keeps torch's CPU build) are
  # handed to it, with pip's rule of taking the best match from any of them. Where uv cannot be
  # installed or fails, pip installs everything, as before.
  pip_setting() {
    "$venv/bin/pip" config list 2>/dev/null | sed -n "s/^[^=]*\.$1='\(.*\)'\$/\1/p" | tr ' ' '\n' | sed '/^$/d' | sort -u
  }
  install=("$venv/bin/pip" install -q)
  if quiet "$venv/bin/pip" install -q -c "$root/requirements/constraints.txt" uv \
    && [ -x "$venv/bin/uv" ]; then
    # --compile-bytecode: pip compiles every module at install; uv does not by default, and where
    # PYTHONDONTWRITEBYTECODE is set (these machines) every process would then compile torch and
    # ExecuTorch at import (the full suite took 1998 s against 1676 s without it)
    install=("$venv/bin/uv" pip install -q --compile-bytecode --python "$venv/bin/python"
      --index-strategy unsafe-best-match)
    while read -r value; do install+=(--find-links "$value"); done < <(pip_setting find-links)
    while read -r value; do install+=(--index-url "$value"); done < <(pip_setting index-url)
    while read -r value; do install+=(--extra-index-url "$value"); done < <(pip_setting extra-index-url)
  fi
  packages() {
    quiet "${install[@]}" -c "$root/requirements/constraints.txt" -r "$root/requirements/dev.txt" \
      && quiet "${install[@]}" --no-deps -r "$root/requirements/no-deps.txt"
  }
  if ! packages && [ "${install[0]}" != "$venv/bin/pip" ]; then
    say "uv failed; installing with pip"
    install=("$venv/bin/pip" install -q)
    packages
  fi
  say "installing the etkit packages editable"
  quiet "${install[@]}" --no-deps --no-build-isolation \
    -e "$root/libs/quant" -e "$root/libs/partition" -e "$root/libs/layout" \
    -e "$root/libs/gridsampler" -e "$root/libs/pterunner" -e "$root/apps/exporter"
  # Nothing must have pulled a CUDA build of torch.
  if "$venv/bin/pip" list 2>/dev/null | grep -qi '^nvidia-'; then
    echo "setup.sh: nvidia-* wheels were installed; torch must be the CPU build" >&2; exit 1
  fi
  echo "$digest" >"$stamp"
else
  say "Python packages up to date"
fi

# 4. The main job: check the toolchain, export the flow-warp demo for VGF and verify the written
#    program on Vulkan (etkit's runner, VGF on scenario_runner), and export it for XNNPACK and
#    verify that program in executorch.runtime, both against the PyTorch models.
if ((run_main_job)); then
  say "running: etkit doctor"
  "$venv/bin/etkit" doctor
  say "running: etkit-export demo flow-warp --target vgf --verify"
  "$venv/bin/etkit-export" demo flow-warp --target vgf --verify \
    --out "$root/artifacts/flow-warp-vgf" --force
  say "running: etkit-export demo flow-warp --target xnnpack --verify"
  "$venv/bin/etkit-export" demo flow-warp --target xnnpack --verify \
    --out "$root/artifacts/flow-warp-xnnpack" --force
fi
