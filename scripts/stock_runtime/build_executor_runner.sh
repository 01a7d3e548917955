#!/usr/bin/env bash
# Builds ExecuTorch's stock `executor_runner` (examples/portable/executor_runner, unmodified)
# with only the Arm VGF backend, to run etkit's one-VGF .pte files without any part of etkit.
# An on-demand check, not part of the test suite (about 12 minutes on 2 cores). See README.md.
#
#   scripts/stock_runtime/build_executor_runner.sh [--ref REF | --src DIR] [--build DIR]
#       [--jobs N] [--python PY] [--url URL] [--configure-only] [-- EXTRA CMAKE ARGS]
#
#   --ref REF      ExecuTorch git tag, branch or full commit to fetch (default: v<version> of the
#                  executorch installed in PY, e.g. v1.5.1 for 1.5.1+cpu; upstream tags releases
#                  vX.Y.Z)
#   --src DIR      an ExecuTorch source tree already prepared (submodules included); nothing is
#                  fetched. Its folder must be named `executorch` (upstream's CMakeLists.txt
#                  requires it).
#   --build DIR    where everything this script makes goes (default: build/stock-runtime in the
#                  repository root): DIR/src/executorch (the clone, without --src) and
#                  DIR/cmake-out (the CMake build). Nothing outside DIR is written; nothing is
#                  ever deleted.
#   --jobs N       ninja -j (default: the number of CPUs); the build runs under `nice -n 10`.
#   --python PY    the Python whose ai-ml-sdk-vgf-library wheel provides libvgf (default:
#                  .venv/bin/python in the repository root, else python3)
#   --url URL      where to clone ExecuTorch from (default https://github.com/pytorch/executorch)
#
# Prints the path of the built executor_runner on its last line.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
REF=""
SRC=""
BUILD="$ROOT/build/stock-runtime"
JOBS=$(nproc 2>/dev/null || echo 2)
PY=""
URL="https://github.com/pytorch/executorch"
CONFIGURE_ONLY=0
EXTRA=()

# The submodules the build needs (paths as upstream's .gitmodules names them), and a file each
# must hold once it is checked out. third-party/json and FXdiv are needed only because the
# top-level CMake files add them unconditionally; Vulkan-Headers and volk are what the VGF
# backend compiles against (volk.c is built into vgf_backend when EXECUTORCH_BUILD_VULKAN=OFF).
SUBMODULES=(
  third-party/flatbuffers:CMakeLists.txt
  third-party/flatcc:CMakeLists.txt
  third-party/gflags:CMakeLists.txt
  third-party/json:CMakeLists.txt
  backends/xnnpack/third-party/FXdiv:CMakeLists.txt
  backends/vulkan/third-party/Vulkan-Headers:include/vulkan/vulkan_core.h
  backends/vulkan/third-party/volk:volk.c
)
MARKER=.etkit-stock-runtime  # marks a --build folder as made by this script

die() { echo "build_executor_runner.sh: error: $*" >&2; exit 2; }
say() { echo "build_executor_runner.sh: $*" >&2; }
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see the header of this script)"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --ref) need_value "$@"; REF=$2; shift 2 ;;
    --src) need_value "$@"; SRC=$2; shift 2 ;;
    --build) need_value "$@"; BUILD=$2; shift 2 ;;
    --jobs|-j) need_value "$@"; JOBS=$2; shift 2 ;;
    --python) need_value "$@"; PY=$2; shift 2 ;;
    --url) need_value "$@"; URL=$2; shift 2 ;;
    --configure-only) CONFIGURE_ONLY=1; shift ;;
    -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

[ -n "$REF" ] && [ -n "$SRC" ] && die "give --ref or --src, not both"
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive integer, got '$JOBS'"

# --- tools -------------------------------------------------------------------------------------
for tool in cmake ninja; do
  command -v "$tool" >/dev/null || die "'$tool' not found on PATH: install it (Debian: apt-get install $tool$([ "$tool" = ninja ] && echo -build)) and rerun"
done
[ -n "$SRC" ] || command -v git >/dev/null \
  || die "'git' not found on PATH: install git, or pass --src DIR with a prepared ExecuTorch tree"
command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null \
  || die "no C++ compiler (c++, g++ or clang++) on PATH: install one (Debian: apt-get install g++)"

if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
command -v "$PY" >/dev/null || die "Python '$PY' not found: pass --python PATH (the environment with etkit's wheels)"

# --- libvgf from the ai-ml-sdk-vgf-library wheel -----------------------------------------------
VGF_ROOT=$("$PY" - <<'EOF' 2>/dev/null || true
from pathlib import Path
import vgf_lib
print(Path(vgf_lib.__path__[0]) / "binaries")
EOF
)
[ -n "$VGF_ROOT" ] || die "the ai-ml-sdk-vgf-library wheel is not installed in $PY: pip install ai-ml-sdk-vgf-library==0.11.0 (scripts/setup.sh does), or pass --python"
[ -f "$VGF_ROOT/lib/libvgf.a" ] && [ -f "$VGF_ROOT/include/vgf/decoder.hpp" ] \
  || die "$VGF_ROOT lacks lib/libvgf.a or include/vgf/decoder.hpp: reinstall ai-ml-sdk-vgf-library==0.11.0"

if [ -n "$SRC" ]; then
  [ -f "$SRC/CMakeLists.txt" ] && [ -f "$SRC/schema/program.fbs" ] \
    || die "--src $SRC is not an ExecuTorch source tree (no CMakeLists.txt or schema/program.fbs)"
  SRC=$(cd "$SRC" && pwd)
  [ "$(basename "$SRC")" = executorch ] \
    || die "--src $SRC: the folder must be named 'executorch' (upstream's CMakeLists.txt refuses any other name)"
fi

# --- the build folder: ours, or new ------------------------------------------------------------
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
if [ ! -e "$BUILD/$MARKER" ]; then
  [ -z "$(ls -A "$BUILD")" ] \
    || die "$BUILD is not empty and was not made by this script: pass another --build (nothing is deleted)"
  echo "made by scripts/stock_runtime/build_executor_runner.sh; safe to delete" > "$BUILD/$MARKER"
fi

# --- sources -----------------------------------------------------------------------------------
if [ -z "$SRC" ]; then
  if [ -z "$REF" ]; then
    VERSION=$("$PY" -c 'import executorch.version as v; print(v.__version__.split("+")[0])' 2>/dev/null || true)
    [ -n "$VERSION" ] || die "executorch is not installed in $PY, so the ref to build is unknown: pass --ref (e.g. --ref v1.5.1) or --python"
    REF="v$VERSION"
  fi
  SRC="$BUILD/src/executorch"
  HAVE=$(cat "$BUILD/src/ref" 2>/dev/null || true)
  if [ -n "$HAVE" ]; then
    [ "$HAVE" = "$REF" ] \
      || die "$SRC holds ref '$HAVE', not '$REF': pass another --build, or delete $SRC yourself"
    say "reusing $SRC ($REF)"
  else
    # New, or a fetch of ours that stopped half-way (it has our .git and no ref file yet).
    [ ! -e "$SRC" ] || [ -e "$SRC/.git" ] \
      || die "$SRC exists but is not a git checkout: delete it yourself or pass another --build"
    say "fetching ExecuTorch $REF from $URL into $SRC"
    mkdir -p "$SRC"
    [ -e "$SRC/.git" ] || git -C "$SRC" init -q
    git -C "$SRC" remote get-url origin >/dev/null 2>&1 || git -C "$SRC" remote add origin "$URL"
    git -C "$SRC" remote set-url origin "$URL"
    git -C "$SRC" fetch -q --depth 1 origin "$REF" \
      || die "git could not fetch '$REF' from $URL (a tag, a branch or a full commit hash; check the network)"
    git -C "$SRC" -c advice.detachedHead=false checkout -q FETCH_HEAD
    echo "$REF" > "$BUILD/src/ref"
  fi
  PATHS=()
  DECLARED=$(git -C "$SRC" config -f .gitmodules --get-regexp '\.path$' | awk '{print $2}')
  for entry in "${SUBMODULES[@]}"; do
    path=${entry%%:*}
    grep -qx -- "$path" <<<"$DECLARED" \
      || die "ExecuTorch $REF has no submodule at $path: this script knows the layout of v1.5.x; use --src with a prepared tree"
    PATHS+=("$path")
  done
  say "initializing submodules: ${PATHS[*]}"
  git -C "$SRC" submodule update --init --depth 1 --jobs 4 -- "${PATHS[@]}" \
    || { say "a shallow submodule fetch failed; retrying with full history";
         git -C "$SRC" submodule update --init --jobs 4 -- "${PATHS[@]}"; } \
    || die "git could not fetch the submodules ${PATHS[*]} (check the network)"
  git -C "$SRC" rev-parse HEAD > "$BUILD/src/commit"
  say "ExecuTorch $REF = $(cat "$BUILD/src/commit")"
fi
for entry in "${SUBMODULES[@]}"; do
  path=${entry%%:*}; file=${entry#*:}
  [ -f "$SRC/$path/$file" ] || die "$SRC/$path/$file is missing: check out submodule $path (git submodule update --init $path)"
done

# --- configure and build -----------------------------------------------------------------------
OUT="$BUILD/cmake-out"
say "configuring $OUT (libvgf from $VGF_ROOT)"
nice -n 10 cmake -S "$SRC" -B "$OUT" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DEXECUTORCH_BUILD_EXTENSION_DATA_LOADER=ON -DEXECUTORCH_BUILD_EXTENSION_FLAT_TENSOR=ON \
  -DEXECUTORCH_BUILD_XNNPACK=OFF -DEXECUTORCH_BUILD_VULKAN=OFF -DEXECUTORCH_BUILD_VGF=ON \
  -DEXECUTORCH_BUILD_PTHREADPOOL=OFF -DEXECUTORCH_BUILD_CPUINFO=OFF \
  -DFXDIV_BUILD_TESTS=OFF -DFXDIV_BUILD_BENCHMARKS=OFF \
  -DEXECUTORCH_VGF_ROOT="$VGF_ROOT" \
  -DEXECUTORCH_ENABLE_LOGGING=ON -DEXECUTORCH_BUILD_EXECUTOR_RUNNER=ON \
  -DPYTHON_EXECUTABLE="$PY" "${EXTRA[@]}" > "$BUILD/configure.log" 2>&1 \
  || { tail -n 20 "$BUILD/configure.log" >&2; die "cmake configure failed; the whole log is $BUILD/configure.log"; }

if [ "$CONFIGURE_ONLY" = 1 ]; then
  say "configured (--configure-only); build with: nice -n 10 ninja -C $OUT -j $JOBS executor_runner"
  exit 0
fi
say "building executor_runner with ninja -j $JOBS (niced; about 12 minutes on 2 cores)"
nice -n 10 ninja -C "$OUT" -j "$JOBS" executor_runner \
  || die "the build failed (see the ninja output above)"
[ -x "$OUT/executor_runner" ] || die "ninja finished but $OUT/executor_runner is missing"
echo "$OUT/executor_runner"
