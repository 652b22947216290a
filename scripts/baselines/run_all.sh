#!/usr/bin/env bash
# Runs the three PyTorch baselines on a CUDA machine and leaves JSON + logs in OUT_DIR.
#
#   bash scripts/baselines/run_all.sh OUT_DIR [--quick]
#
# Full (~6 min on an H200, each script under a time limit so the whole stays under ~7 min even when compiles are
# slow): SDPA prefill attention (flash, cudnn, default) at 2k/8k; one Llama block, decode (8B and 70B, batch 1/8/32,
# context 1024, BF16 and INT4, max-autotune-no-cudagraphs + CUDA graphs); the block's prefill (2k/8k tokens, BF16 and
# FP8, default compile); HF LlamaForCausalLM 8B decode step (static cache 1024, reduce-overhead, batch 1/8/32).
# --quick (~3 min): fewer iterations, 8B block only with the default compile mode, HF batch 1 and 32.
#
# A script stopped by its time limit gets SIGINT first; every script rewrites its JSON after each finished row, so
# what it measured survives. Inductor's caches go to $TORCHINDUCTOR_CACHE_DIR (default /tmp/ft-inductor-cache): a
# second run on the same machine reuses compiled kernels and autotuning results.
# Environment: PYTHON (default python3), FT_GIT_COMMIT (recorded in the JSON).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:?usage: run_all.sh OUT_DIR [--quick]}"
quick=0
case "${2:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "run_all: unknown argument $2" >&2; exit 2 ;;
esac
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/ft-inductor-cache}"
if [ -z "${FT_GIT_COMMIT:-}" ]; then
  FT_GIT_COMMIT="$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  # Tracked files that differ from HEAD: mark it, the commit alone would not name what ran.
  [ -n "$(git -C "$here" status --porcelain --untracked-files=no 2>/dev/null)" ] && FT_GIT_COMMIT="$FT_GIT_COMMIT+dirty"
fi
export FT_GIT_COMMIT

log() { echo "[run_all $(date +%T)] $*" | tee -a "$out/run_all.log"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv \
  > "$out/gpu.csv" 2>&1
"$py" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu",
torch.cuda.get_device_name() if torch.cuda.is_available() else None)
try:
  import transformers; print("transformers", transformers.__version__)
except Exception as e: print("transformers missing:", e)' > "$out/versions.txt" 2>&1
log "$(tr '\n' ' ' < "$out/versions.txt")"

status=0
# run NAME LIMIT_SECONDS SCRIPT ARGS...
run() {
  local name="$1" limit="$2" script="$3"; shift 3
  log "$name: $script $* (limit ${limit}s)"
  local t0=$SECONDS rc
  timeout --signal=INT --kill-after=20 "$limit" "$py" "$here/$script" "$@" --json "$out/$name.json" \
    > "$out/$name.log" 2>&1
  rc=$?
  tail -n 25 "$out/$name.log"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then log "$name: TIME LIMIT after $((SECONDS - t0))s (partial JSON kept)"
  elif [ "$rc" -ne 0 ]; then log "$name: exit $rc after $((SECONDS - t0))s"
  else log "$name: ok in $((SECONDS - t0))s"; fi
  [ "$rc" -eq 0 ] || status=1
}

if [ "$quick" = 1 ]; then
  run attention        30 prefill_attention.py --quick --backends flash,default
  run blocks_decode    60 torch_blocks.py --decode --quick --models 8b --compile-mode default
  run blocks_prefill   35 torch_blocks.py --prefill --quick --models 8b
  run hf_decode        90 hf_llama_decode.py --quick --batches 1,32
else
  run attention        45 prefill_attention.py
  run blocks_decode   140 torch_blocks.py --decode --models 8b,70b
  run blocks_prefill   70 torch_blocks.py --prefill --models 8b,70b
  run hf_decode       140 hf_llama_decode.py --batches 1,8,32
fi

# One file with everything, for the side-by-side tables.
"$py" - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
merged = {}
for name in ("attention", "blocks_decode", "blocks_prefill", "hf_decode"):
  path = os.path.join(out, name + ".json")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      merged[name] = json.load(f)
with open(os.path.join(out, "baselines.json"), "w", encoding="utf-8") as f:
  json.dump(merged, f, indent=2)
print("merged", ", ".join(merged) or "nothing", "into", os.path.join(out, "baselines.json"))
EOF
log "done (status $status); results in $out"
exit "$status"
