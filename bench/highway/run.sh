#!/usr/bin/env bash
# Rebuilds the Highway evaluation (bench/highway) and prints the bit-identity check and the
# interleaved timing table. Needs libhwy-dev (Debian 12: 1.0.3) and g++.
#
#   bench/highway/run.sh [--rounds N] [--check-only | --bench-only]
#   ARM=1 bench/highway/run.sh   # also cross-builds for aarch64 (NEON, and SVE), header-only,
#                                # and runs the bit-identity check under qemu-aarch64
#   SNAPSHOT=1 ...               # builds the scalar and hand-written kernels from git HEAD
#                                # (when the working tree's csrc is mid-edit)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${OUT_DIR:-/tmp/etkit-hwy-bench}"
mkdir -p "$out"
csrc="$root/libs/gridsampler/csrc"
if [[ "${SNAPSHOT:-0}" == 1 ]]; then
  csrc="$out/csrc"
  rm -rf "$csrc" && mkdir -p "$csrc"
  for f in $(git -C "$root" ls-tree --name-only HEAD libs/gridsampler/csrc/); do
    git -C "$root" show "HEAD:$f" >"$csrc/$(basename "$f")"
  done
fi
# the scalar kernel and every hand-written one it dispatches to (quantized*.cpp)
sources=(main.cc hwy_sampler.cc "$csrc"/quantized*.cpp)
flags=(-std=c++17 -O3 -Wall -Wextra -I"$here" -I"$csrc")

cd "$here"
# x86: every Highway target (SSE4, AVX2, AVX3, AVX3_DL) in one binary, dynamic dispatch (libhwy).
g++ "${flags[@]}" -DHWY_WANT_AVX3_DL -o "$out/hwy_bench" "${sources[@]}" -lhwy -lpthread
"$out/hwy_bench" "$@"

if [[ "${ARM:-0}" == 1 ]]; then
  # Debian's libhwy-dev is amd64 only, but the headers are the same for every architecture:
  # a copy on the include path (not /usr/include, which holds x86 system headers) and one static
  # target (HWY_COMPILE_ONLY_STATIC) need no libhwy at all.
  mkdir -p "$out/include" && cp -r /usr/include/hwy "$out/include/"
  arm_flags=("${flags[@]}" -static -I"$out/include" -DHWY_COMPILE_ONLY_STATIC=1)
  aarch64-linux-gnu-g++ "${arm_flags[@]}" -o "$out/hwy_bench_neon" "${sources[@]}" -lpthread
  aarch64-linux-gnu-g++ "${arm_flags[@]}" -march=armv8.2-a+sve -o "$out/hwy_bench_sve" \
    "${sources[@]}" -lpthread
  echo "== aarch64 NEON under qemu (timings under emulation mean nothing)"
  qemu-aarch64 "$out/hwy_bench_neon" --check-only
  for bytes in 16 32 64; do
    echo "== aarch64 SVE, $((bytes * 8))-bit vectors, under qemu"
    qemu-aarch64 -cpu "max,sve-default-vector-length=$bytes" "$out/hwy_bench_sve" --check-only
  done
fi
