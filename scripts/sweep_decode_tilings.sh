#!/usr/bin/env bash
# In-step A/B of decode settings on a Hopper GPU: each candidate (a set of environment assignments, typically
# FT_W4A16_TUNED_EXTRA entries) runs against the defaults in alternating pairs inside the whole decode step
# (bench_decode_step), and a table of the step's graph µs per batch comes out. Tilings that win alone can lose in the
# step, where each GEMM fills its ring while the kernel before it runs (docs/results.md, eighteenth session), so the
# W4A16 table is tuned this way.
#
#   bash scripts/sweep_decode_tilings.sh BUILD_DIR OUT_DIR [--config llama-3.1-8b] [--batches 1,8] [--pairs 2]
#        [--iters 30] LABEL=ASSIGNMENTS ...
#
# ASSIGNMENTS: space-separated VAR=value pairs, e.g.
#   'qkv-w24s8=FT_W4A16_TUNED_EXTRA=6144:4096:1:2:24:8:0:0:0'
#   'np=FT_NORM_PARTIALS=1 FT_ATTN_DECODE_SPLITS=4'
#   'gu70-cl24=FT_W4A16_CLUSTER_ROWS_EXTRA=57344:8192:24'   (one shape's split-K in clusters up to M = 24)
# (FT_W4A16_TUNED_EXTRA's format: src/cuda/gemm_w4a16_heuristics.h, parse_tuned_extra.) Every run's JSON goes to
# OUT_DIR; the table (median of each side, change of the medians) goes to stdout and OUT_DIR/sweep.md. Set
# FT_GIT_COMMIT to the commit that was built, as for every bench. FT_SWEEP_BENCH overrides the bench binary (tests).
set -euo pipefail

usage() {
  sed -n '8,9p' "$0" >&2
  exit 2
}
[ $# -ge 2 ] || usage
build="$1" out="$2"
shift 2
config=llama-3.1-8b batches=1,8 pairs=2 iters=30
candidates=()
while (($#)); do
  case "$1" in
    --config) config="$2"; shift ;;
    --batches) batches="$2"; shift ;;
    --pairs) pairs="$2"; shift ;;
    --iters) iters="$2"; shift ;;
    -*) echo "sweep_decode_tilings: unknown option $1" >&2; usage ;;
    *=*) candidates+=("$1") ;;
    *) echo "sweep_decode_tilings: '$1' is not LABEL=ASSIGNMENTS" >&2; usage ;;
  esac
  shift
done
[ ${#candidates[@]} -gt 0 ] || { echo "sweep_decode_tilings: no candidate given" >&2; usage; }
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || { echo "sweep_decode_tilings: --pairs must be a positive count" >&2; exit 2; }
bench="${FT_SWEEP_BENCH:-$build/bench_decode_step}"
[ -x "$bench" ] || { echo "sweep_decode_tilings: $bench is not an executable (build bench_decode_step first)" >&2; exit 1; }
mkdir -p "$out"

run=0
# run LABEL ASSIGNMENTS...: one bench run; its JSON is $out/<run>-<label>.json.
bench_run() {
  local label="$1"
  shift
  run=$((run + 1))
  local json="$out/$(printf %03d "$run")-$label.json"
  if ! env "$@" "$bench" --configs "$config" --batches "$batches" --heads int4 --epilogues fused --iters "$iters" \
    --json "$json" > "${json%.json}.log" 2>&1; then
    echo "sweep_decode_tilings: run $run ($label) failed; see ${json%.json}.log" >&2
    exit 1
  fi
}

for cand in "${candidates[@]}"; do
  label="${cand%%=*}" assignments="${cand#*=}"
  [[ "$label" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "sweep_decode_tilings: label '$label' must be [A-Za-z0-9._-]" >&2; exit 2; }
  read -r -a vars <<< "$assignments"
  for ((p = 0; p < pairs; ++p)); do
    bench_run "base-for-$label"
    bench_run "$label" "${vars[@]}"
  done
done

python3 - "$out" "$config" "${candidates[@]}" <<'PY' | tee "$out/sweep.md"
import glob, json, os, statistics, sys

out, config, cands = sys.argv[1], sys.argv[2], sys.argv[3:]
step = config + " step"
def steps(label):
    # {batch: [graph µs of each run]} over the runs of this label, in run order
    r = {}
    for f in sorted(glob.glob(os.path.join(out, "[0-9][0-9][0-9]-" + label + ".json"))):
        for row in json.load(open(f))["rows"]:
            if row["shape"] == step:
                r.setdefault(row["batch"], []).append(row["graph_us"])
    return r
print("| candidate | batch | defaults µs | candidate µs | change of the medians |")
print("|---|---|---|---|---|")
for c in cands:
    label, assignments = c.split("=", 1)
    base, cand = steps("base-for-" + label), steps(label)
    for b in sorted(cand):
        mb, mc = statistics.median(base.get(b, [float("nan")])), statistics.median(cand[b])
        print("| %s (`%s`) | %d | %s | %s | %+.1f %% |" % (label, assignments, b,
              ", ".join("%.1f" % v for v in base.get(b, [])), ", ".join("%.1f" % v for v in cand[b]),
              100.0 * (mc / mb - 1.0)))
PY
