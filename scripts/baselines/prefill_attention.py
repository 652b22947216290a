#!/usr/bin/env python3
"""Causal prefill attention through PyTorch SDPA: the attention baseline (Llama-3.1-8B heads: 32 query heads, 8 KV
heads, head_dim 128, BF16, batch 1) at 2k and 8k tokens.

Backends (--backends): flash (forced with sdpa_kernel(SDPBackend.FLASH_ATTENTION): the required baseline), cudnn,
efficient, math, and default (whatever SDPA picks unforced). GQA goes through enable_gqa=True; a backend that refuses
it is run on K/V expanded to all query heads beforehand (row says gqa=expanded; the expansion is not timed).

FLOPs count the causal half of QK^T and PV: 2 * T^2 * heads * head_dim (the FlashAttention papers' convention).
Each row also checks one GQA group (4 query heads sharing KV head 0) against an fp32 reference; rel L2 must stay under
ATTN_CHECK_TOL.

Usage (GPU):
  python3 scripts/baselines/prefill_attention.py --json out/attention.json
  python3 scripts/baselines/prefill_attention.py --tokens 2048,4096,8192,16384 --backends flash
CPU dry run:
  python3 scripts/baselines/prefill_attention.py --device cpu --quick
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import bench_common as bc

BACKENDS = {
  "flash": SDPBackend.FLASH_ATTENTION,
  "cudnn": SDPBackend.CUDNN_ATTENTION,
  "efficient": SDPBackend.EFFICIENT_ATTENTION,
  "math": SDPBackend.MATH,
  "default": None,
}
# BF16 output rounding is 2^-9 relative; fp32 accumulation in every backend keeps the rest well below that, so 1e-2
# passes any correct kernel while a wrong mask, head mapping or scale is off by order 1.
ATTN_CHECK_TOL = 1e-2


def reference_group(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int) -> torch.Tensor:
  """fp32 causal attention of query heads 0..group-1 against KV head 0 (the heads enable_gqa pairs with it)."""
  qf = q[0, :group].float()
  kf = k[0, 0].float()
  vf = v[0, 0].float()
  t = qf.shape[1]
  scores = (qf @ kf.t()) / math.sqrt(qf.shape[-1])
  mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
  scores = scores.masked_fill(~mask, float("-inf"))
  return torch.softmax(scores, dim=-1) @ vf


def run_sdpa(backend, q, k, v, gqa: bool) -> torch.Tensor:
  if backend is None:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
  with sdpa_kernel(backend):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def measure(name: str, tokens: int, args, device: str) -> dict:
  backend = BACKENDS[name]
  h, kvh, d = args.heads, args.kv_heads, args.head_dim
  group = h // kvh
  set_bytes = tokens * (h + 2 * kvh) * d * 2
  n_sets = bc.rotation_sets(set_bytes, device, cap=16)
  gen = torch.Generator(device=device).manual_seed(args.seed + tokens)
  sets = []
  for _ in range(n_sets):
    q = torch.randn(1, h, tokens, d, device=device, generator=gen).to(torch.bfloat16)
    k = torch.randn(1, kvh, tokens, d, device=device, generator=gen).to(torch.bfloat16)
    v = torch.randn(1, kvh, tokens, d, device=device, generator=gen).to(torch.bfloat16)
    sets.append((q, k, v))
  gqa_mode = "enable_gqa"
  try:
    out0 = run_sdpa(backend, *sets[0], gqa=True)
    bc.synchronize(device)
  except RuntimeError as e:
    print(f"[{name} T={tokens}] enable_gqa refused ({str(e).splitlines()[0][:120]}); expanding K/V", flush=True)
    gqa_mode = "expanded"
    sets = [(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)) for q, k, v in sets]
    out0 = run_sdpa(backend, *sets[0], gqa=False)
    bc.synchronize(device)
  use_gqa = gqa_mode == "enable_gqa"
  check = bc.rel_l2(out0[0, :group].float(), reference_group(*sets[0], group))
  del out0

  def call(i: int) -> None:
    run_sdpa(backend, *sets[i % len(sets)], gqa=use_gqa)

  for i in range(args.warmup):
    call(i)
  stats = bc.summarize(bc.time_calls(call, args.iters, device))
  flops = 2 * tokens * tokens * h * d
  return {
    "tokens": tokens, "batch": 1, "heads": h, "kv_heads": kvh, "head_dim": d, "backend": name, "gqa": gqa_mode,
    **stats, "flops": flops, "tflops": flops / (stats["us_median"] * 1e-6) / 1e12, "input_sets": len(sets),
    "check_rel_l2": check, "check_ok": check <= ATTN_CHECK_TOL,
  }


COLUMNS = [
  ("tokens", "tokens", "d"), ("backend", "backend", ""), ("gqa", "gqa", ""), ("us_median", "us_med", ".1f"),
  ("us_p10", "us_p10", ".1f"), ("us_p90", "us_p90", ".1f"), ("tflops", "TFLOP/s", ".1f"),
  ("check_rel_l2", "check", ".1e"), ("error", "error", ""),
]


def parse_args(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tokens", default=None, help="comma list (default 2048,8192; 256 on cpu)")
  p.add_argument("--backends", default=None, help="comma list of " + ",".join(BACKENDS) +
                 " (default flash,cudnn,default; math,default on cpu)")
  p.add_argument("--heads", type=int, default=32)
  p.add_argument("--kv-heads", type=int, default=8)
  p.add_argument("--head-dim", type=int, default=128)
  p.add_argument("--quick", action="store_true", help="20 timed calls instead of 100")
  p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
  p.add_argument("--seed", type=int, default=20240601)
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  cpu = a.device == "cpu"
  a.tokens = bc.parse_int_list(a.tokens or ("256" if cpu else "2048,8192"))
  a.backends = bc.parse_str_list(a.backends or ("math,default" if cpu else "flash,cudnn,default"))
  for b in a.backends:
    if b not in BACKENDS:
      p.error(f"unknown backend '{b}' (known: {', '.join(BACKENDS)})")
  if a.heads % a.kv_heads:
    p.error("--heads must be a multiple of --kv-heads")
  a.warmup, a.iters = (3, 20) if a.quick else (10, 100)
  if cpu:
    a.warmup, a.iters = 1, 3
  return a


def main(argv: list[str]) -> int:
  args = parse_args(argv)
  device = bc.pick_device(args.device)
  rows: list[dict] = []
  failures = 0
  for tokens in args.tokens:
    for name in args.backends:
      try:
        row = measure(name, tokens, args, device)
        if not row["check_ok"]:
          failures += 1
      except Exception as e:  # e.g. a backend missing from this build: record it, keep the other rows
        failures += 1
        row = {"tokens": tokens, "backend": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"[:300]}
      rows.append(row)
      bc.print_table([row], COLUMNS)
      sys.stdout.flush()
      bc.write_json(args.json, "prefill_attention.py", vars(args), device, rows,
                    {"attn_check_tol": ATTN_CHECK_TOL, "failures": failures}, quiet=True)
      if device == "cuda":
        torch.cuda.empty_cache()
  print("\n== summary (causal SDPA, batch 1, BF16) ==")
  bc.print_table(rows, COLUMNS)
  if args.json:
    print(f"wrote {args.json}")
  # A backend this build lacks (cudnn, say) is not a failure of the baseline; a failing flash row or check is.
  flash_bad = any(r.get("backend") == "flash" and (r.get("error") or not r.get("check_ok")) for r in rows)
  bad_check = any(r.get("check_ok") is False for r in rows)
  return 1 if (flash_bad or bad_check) else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
