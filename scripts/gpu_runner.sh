#!/usr/bin/env bash
# On a machine with a Hopper GPU (H100/H200): configure and build with CUDA (ninja, all cores), run the GPU test
# label, run the benchmarks, and write JSON + logs into OUT_DIR (default ./gpu-results).
#
#   bash scripts/gpu_runner.sh [OUT_DIR] [--tests-only|--bench-only] [--sanitize] [--filter REGEX]
#
# Packages the build needs but a GPU image may lack (PCRE2 headers, say) can be put as Debian .deb files in .deps/;
# they are unpacked into a private prefix, never into /.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/gpu-results}"; shift || true
mode=all; sanitize=0; filter=""
while (($#)); do
  case "$1" in
    --tests-only) mode=tests ;;
    --bench-only) mode=bench ;;
    --sanitize) sanitize=1 ;;
    --filter) filter="$2"; shift ;;
    *) echo "gpu_runner: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
log() { echo "[gpu_runner $(date +%T)] $*" | tee -a "$out/runner.log"; }

# shellcheck source=scripts/gpu_deps.sh
source "$root/scripts/gpu_deps.sh"
use_local_debs "$root"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv \
  > "$out/gpu.csv" 2>&1
log "GPU: $(tail -n 1 "$out/gpu.csv")"
commit="${FT_GIT_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
# Without FT_GIT_COMMIT, a tree whose tracked files differ from HEAD (e.g. a working tree copied over an older
# checkout) is marked: the commit alone would not name what ran.
if [ -z "${FT_GIT_COMMIT:-}" ] && [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit+dirty"
fi
export FT_GIT_COMMIT="$commit"

build="$root/build-gpu"
log "configure + build (commit $commit)"
if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_CUDA=ON > "$out/configure.log" 2>&1; then
  tail -n 30 "$out/configure.log"; log "configure FAILED"; exit 1
fi
if ! cmake --build "$build" -j "$(nproc)" > "$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -n 40; log "build FAILED"; exit 1
fi
status=0
if [ "$mode" != bench ]; then
  log "ctest -L gpu"
  (cd "$build" && ctest -L gpu --output-on-failure ${filter:+-R "$filter"} --timeout 900) > "$out/gpu-tests.log" 2>&1 \
    || status=1
  tail -n 15 "$out/gpu-tests.log"
  if [ "$sanitize" = 1 ] && [ -x "$build/futransformer_gpu_tests" ]; then
    for tool in memcheck racecheck; do
      log "compute-sanitizer --tool $tool"
      compute-sanitizer --tool "$tool" --error-exitcode 3 "$build/futransformer_gpu_tests" \
        --gtest_filter="${FT_SANITIZE_FILTER:-*}" > "$out/sanitizer-$tool.log" 2>&1 || status=1
      tail -n 4 "$out/sanitizer-$tool.log"
    done
  fi
fi
if [ "$mode" != tests ]; then
  shopt -s nullglob
  for bench in "$build"/bench_*; do
    [ -x "$bench" ] || continue
    name="$(basename "$bench")"
    [ -n "$filter" ] && ! [[ "$name" =~ $filter ]] && continue
    log "bench $name"
    "$bench" --json "$out/$name.json" > "$out/$name.log" 2>&1 || { status=1; log "$name FAILED"; }
    tail -n 40 "$out/$name.log"
  done
fi
log "done (status $status)"
exit $status
