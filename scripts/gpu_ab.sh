#!/usr/bin/env bash
# Helpers for one device call that times this tree against a base tree (docs/notes/gpu-sessions.md). Source it from a
# call script run in the repository root on the GPU machine:
#
#   source scripts/gpu_ab.sh
#   ab_setup .gpucall/base.tgz "bench_decode_step bench_attention_decode" futransformer_gpu_tests
#   ab_run step 2 bench_decode_step --configs llama-3.1-8b --heads int4 --batches 1,8,32 --iters 30
#   ab_tests '*AttentionDecode*'
#   ab_pack
#
# ab_setup BASE_TGZ "TARGETS" [NEW_ONLY_TARGETS]: unpacks the base (a `git archive` tarball carried in an ignored
#   folder: the machine has no history) and builds TARGETS in both trees at once (plus NEW_ONLY_TARGETS in this one);
#   .deps/*.deb are unpacked into a private prefix first (gpu_deps.sh).
# ab_run NAME ROUNDS PROGRAM ARGS...: ROUNDS alternating runs, this tree first, each writing --json into the work folder
#   as NAME-{new,base}-ROUND.json with its log beside it. FT_GIT_COMMIT names the tree in every JSON.
# ab_tests FILTER: futransformer_gpu_tests of this tree with a gtest filter.
# ab_pack: everything in the work folder as one tarball in $OUT ($OUT keeps only a few loose files per call).
set -uo pipefail
AB_ROOT="$(pwd)"
AB_WORK="${AB_WORK:-/tmp/ab-work}"
AB_OUT="${OUT:-$AB_ROOT/gpu-results}"
AB_NEW="$AB_ROOT/build-gpu"
AB_BASE_SRC=/tmp/ab-base
AB_BASE="$AB_BASE_SRC/build"
mkdir -p "$AB_WORK" "$AB_OUT"
# shellcheck source=scripts/gpu_deps.sh
source "$AB_ROOT/scripts/gpu_deps.sh"

ab_log() { echo "[ab $(date +%T)] $*" | tee -a "$AB_WORK/ab.log"; }

ab_setup() {
  local base_tgz="$1" targets="$2" new_only="${3:-}"
  use_local_debs "$AB_ROOT"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv > "$AB_WORK/gpu.csv" 2>&1
  ab_log "GPU: $(tail -n 1 "$AB_WORK/gpu.csv")"
  mkdir -p "$AB_BASE_SRC"
  if ! tar -xzf "$base_tgz" -C "$AB_BASE_SRC"; then
    ab_log "cannot unpack $base_tgz"
    return 1
  fi
  local jobs=$(( $(nproc) / 2 ))
  # shellcheck disable=SC2086
  (cmake -S "$AB_ROOT" -B "$AB_NEW" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_CUDA=ON > "$AB_WORK/configure-new.log" 2>&1 &&
     cmake --build "$AB_NEW" -j "$jobs" --target $targets $new_only > "$AB_WORK/build-new.log" 2>&1
   ab_log "build new rc=$?") &
  # shellcheck disable=SC2086
  (cmake -S "$AB_BASE_SRC" -B "$AB_BASE" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_CUDA=ON > "$AB_WORK/configure-base.log" 2>&1 &&
     cmake --build "$AB_BASE" -j "$jobs" --target $targets > "$AB_WORK/build-base.log" 2>&1
   ab_log "build base rc=$?") &
  wait
  grep -h -m 10 "error" "$AB_WORK/build-new.log" "$AB_WORK/build-base.log"
  return 0
}

ab_run() {
  local name="$1" rounds="$2" program="$3"
  shift 3
  for ((r = 1; r <= rounds; ++r)); do
    for tree in new base; do
      local dir="$AB_NEW"
      [ "$tree" = base ] && dir="$AB_BASE"
      FT_GIT_COMMIT="${S:-unknown}-$tree" "$dir/$program" "$@" --json "$AB_WORK/$name-$tree-$r.json" \
        > "$AB_WORK/$name-$tree-$r.log" 2>&1
      ab_log "$name $tree round $r rc=$?"
    done
  done
}

ab_tests() {
  "$AB_NEW/futransformer_gpu_tests" --gtest_filter="$1" > "$AB_WORK/gpu-tests.log" 2>&1
  ab_log "gpu tests ($1) rc=$?"
  grep -E "FAILED|PASSED" "$AB_WORK/gpu-tests.log" | head -n 20
}

ab_pack() { (cd "$AB_WORK" && tar -czf "$AB_OUT/ab.tgz" .) && ab_log "packed into $AB_OUT/ab.tgz"; }
