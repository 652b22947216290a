#!/usr/bin/env python3
"""HF transformers LlamaForCausalLM decode step with a static KV cache and torch.compile(mode="reduce-overhead").

The model is built from a Llama-3.1-8B config (Meta's values, llama3 RoPE scaling) with random BF16 weights created
directly on the GPU: no checkpoint, no download. For each batch size a fresh StaticCache of --context slots is
pre-filled eagerly (prefill is never compiled, as the transformers docs advise), then the decode step -- the whole
forward pass including the LM head -- is compiled with fullgraph=True and timed one step at a time with CUDA events.
Every step advances the cache by one position; the prefill length leaves exactly enough free slots for all compiled,
warm-up and timed steps, and the static cache makes every step attend over all --context slots (masked), so the
cost does not drift with the position.

Reported per batch size: median step time (ms) from CUDA events, mean wall-clock step time, compile time (first three
calls: trace + compile, cudagraph warm-up, cudagraph recording), peak GPU memory, dynamo recompiles and cudagraph skips.

Usage (GPU):
  python3 scripts/baselines/hf_llama_decode.py --json out/hf_decode.json              # batch 1, 8, 32
  python3 scripts/baselines/hf_llama_decode.py --batches 1 --quick
CPU dry run (2-layer tiny config, eager, exercises model build, cache, prefill and the timing loop):
  python3 scripts/baselines/hf_llama_decode.py --device cpu --quick --compile-mode none
"""
from __future__ import annotations

import argparse
import gc
import inspect
import sys
import time

import torch

import bench_common as bc

# Calls to the compiled step before timing starts: 1 traces and compiles (cudagraph trees run it un-graphed),
# 2 warms the cudagraph path, 3 records the graph; replays start after.
COMPILE_CALLS = 3
CACHE_SLACK = 4

LLAMA31_8B = dict(
  vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
  num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-5,
  bos_token_id=128000, eos_token_id=[128001, 128008, 128009], tie_word_embeddings=False, attention_bias=False,
  mlp_bias=False, use_cache=True,
)
LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# CPU dry runs only: same structure (GQA 2:1, llama3 RoPE), sizes small enough for a laptop core.
TINY = dict(LLAMA31_8B, vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, bos_token_id=1, eos_token_id=2)


def build_config(values: dict):
  import transformers  # noqa: PLC0415 - imported late so --help works without it
  major = int(transformers.__version__.split(".")[0])
  if major >= 5:
    # 5.x keeps rope_theta inside rope_parameters; an old-style rope_scaling kwarg would be converted, but the
    # documented form is used first.
    cfg = transformers.LlamaConfig(**values, rope_parameters=dict(LLAMA31_ROPE))
  else:
    scaling = {k: v for k, v in LLAMA31_ROPE.items() if k != "rope_theta"}
    cfg = transformers.LlamaConfig(**values, rope_theta=LLAMA31_ROPE["rope_theta"], rope_scaling=scaling)
  rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
  if rope.get("rope_type", rope.get("type")) != "llama3":
    raise RuntimeError(f"config did not keep the llama3 RoPE scaling (got {rope}); check the transformers API")
  return cfg


def build_model(cfg, device: str):
  from transformers import LlamaForCausalLM  # noqa: PLC0415
  with torch.device(device):
    try:
      model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    except TypeError:  # transformers 4.x spelled it torch_dtype
      model = LlamaForCausalLM._from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
  model.eval()
  p = next(model.parameters())
  if p.dtype != torch.bfloat16 or p.device.type != device:
    raise RuntimeError(f"model parameters are {p.dtype} on {p.device}, expected bfloat16 on {device}")
  return model


def make_static_cache(model, batch: int, max_len: int, device: str):
  from transformers import StaticCache  # noqa: PLC0415
  # 5.x takes (config, max_cache_len) and sizes batch/dtype/device lazily from the first update, swallowing the
  # 4.x-only keywords; 4.x needs them. Passing both forms keeps one call valid for either.
  return StaticCache(config=model.config, max_cache_len=max_len, max_batch_size=batch, device=device,
                     dtype=torch.bfloat16)


def accepts(fn, name: str) -> bool:
  try:
    return name in inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return False


def dynamo_counters() -> dict:
  from torch._dynamo.utils import counters  # noqa: PLC0415
  return {
    "graph_breaks": sum(counters["graph_break"].values()),
    "unique_graphs": counters["stats"].get("unique_graphs", 0),
    "cudagraph_skips": counters["inductor"].get("cudagraph_skips", 0),
  }


def run_batch(model, cfg, batch: int, args, device: str) -> dict:
  torch._dynamo.reset()  # a fresh compile per batch size: no automatic-dynamic shapes, no stale cudagraph trees
  from torch._dynamo.utils import counters  # noqa: PLC0415
  counters.clear()
  if device == "cuda":
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
  # Slack: a fullgraph failure retried with fullgraph=False may have advanced the cache once more; running past the
  # last slot would be an out-of-bounds index_copy_ (a device-side assert that ends the process).
  steps = COMPILE_CALLS + args.warmup + args.iters + CACHE_SLACK
  prefill_len = args.context - steps
  if prefill_len < 1:
    raise ValueError(f"--context {args.context} leaves no room to prefill before {steps} decode steps")
  gen = torch.Generator(device=device).manual_seed(args.seed + batch)
  prompt = torch.randint(0, cfg.vocab_size, (batch, prefill_len), device=device, generator=gen)
  id_sets = [torch.randint(0, cfg.vocab_size, (batch, 1), device=device, generator=gen) for _ in range(8)]
  cache = make_static_cache(model, batch, args.context, device)
  wants_cache_position = accepts(model.model.forward, "cache_position")  # transformers 4.x needs it, 5.x removed it
  position = [prefill_len]

  t0 = time.perf_counter()
  with torch.no_grad():
    kw = {"cache_position": torch.arange(prefill_len, device=device)} if wants_cache_position else {}
    model.model(input_ids=prompt, past_key_values=cache, use_cache=True, **kw)  # base model: no 128k-wide logits
  bc.synchronize(device)
  prefill_s = time.perf_counter() - t0

  fullgraph = True
  if args.compile_mode == "none":
    step_fn = model.forward
  else:
    step_fn = torch.compile(model.forward, mode=args.compile_mode, fullgraph=True, dynamic=False)

  def step(i: int):
    if args.compile_mode == "reduce-overhead":
      torch.compiler.cudagraph_mark_step_begin()  # outputs of the previous replay are dead: let the tree reuse them
    kw = {}
    if wants_cache_position:
      kw["cache_position"] = torch.tensor([position[0]], device=device)
      position[0] += 1
    with torch.no_grad():
      return step_fn(input_ids=id_sets[i % len(id_sets)], past_key_values=cache, use_cache=True, **kw).logits

  t0 = time.perf_counter()
  try:
    logits = step(0)
  except Exception as e:  # keep a baseline rather than nothing, but say so in the row
    if args.compile_mode == "none":
      raise
    print(f"fullgraph compile failed ({type(e).__name__}: {str(e)[:200]}); retrying with fullgraph=False", flush=True)
    torch._dynamo.reset()
    fullgraph = False
    step_fn = torch.compile(model.forward, mode=args.compile_mode, fullgraph=False, dynamic=False)
    logits = step(0)
  finite = bool(torch.isfinite(logits.float()).all().item())
  for i in range(1, COMPILE_CALLS):
    step(i)
  bc.synchronize(device)
  compile_s = time.perf_counter() - t0
  for i in range(args.warmup):
    step(i)
  bc.synchronize(device)
  t0 = time.perf_counter()
  samples_us = bc.time_calls(lambda i: step(i), args.iters, device)
  wall_ms = (time.perf_counter() - t0) / args.iters * 1e3
  stats = bc.summarize(samples_us)
  row = {
    "batch": batch, "context": args.context, "prefill_tokens": prefill_len,
    "ms_median": stats["us_median"] / 1e3, "ms_p10": stats["us_p10"] / 1e3, "ms_p90": stats["us_p90"] / 1e3,
    "ms_wall_mean": wall_ms, "samples": stats["samples"],
    "tokens_per_s": batch / (stats["us_median"] * 1e-6),
    "compile_s": compile_s, "prefill_s": prefill_s, "compile_mode": args.compile_mode, "fullgraph": fullgraph,
    "logits_finite": finite,
    "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
    **dynamo_counters(),
  }
  del cache, step_fn, logits
  gc.collect()
  return row


COLUMNS = [
  ("batch", "batch", "d"), ("context", "ctx", "d"), ("ms_median", "ms_med", ".3f"), ("ms_p10", "ms_p10", ".3f"),
  ("ms_p90", "ms_p90", ".3f"), ("ms_wall_mean", "ms_wall", ".3f"), ("tokens_per_s", "tok/s", ".0f"),
  ("compile_s", "compile_s", ".1f"), ("peak_mem_gib", "peak_GiB", ".1f"), ("cudagraph_skips", "cg_skips", "d"),
  ("fullgraph", "fullgraph", ""), ("error", "error", ""),
]


def parse_args(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batches", default=None, help="comma list (default 1,8,32; 1,2 on cpu)")
  p.add_argument("--context", type=int, default=None, help="static cache length (default 1024; 64 on cpu)")
  p.add_argument("--layers", type=int, default=None, help="override num_hidden_layers (default: the config's 32)")
  p.add_argument("--compile-mode", default="reduce-overhead", help="torch.compile mode, or 'none' for eager")
  p.add_argument("--quick", action="store_true", help="fewer timed steps (30 instead of 100)")
  p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
  p.add_argument("--seed", type=int, default=20240601)
  p.add_argument("--json", default=None)
  a = p.parse_args(argv)
  cpu = a.device == "cpu"
  a.batches = bc.parse_int_list(a.batches or ("1,2" if cpu else "1,8,32"))
  a.context = a.context if a.context is not None else (64 if cpu else 1024)
  a.warmup, a.iters = (5, 30) if a.quick else (10, 100)
  if cpu:
    a.warmup, a.iters = 1, 3
  return a


def main(argv: list[str]) -> int:
  args = parse_args(argv)
  device = bc.pick_device(args.device)
  import transformers  # noqa: PLC0415
  values = dict(TINY if device == "cpu" else LLAMA31_8B)
  if args.layers is not None:
    values["num_hidden_layers"] = args.layers
  cfg = build_config(values)
  t0 = time.perf_counter()
  model = build_model(cfg, device)
  bc.synchronize(device)
  build_s = time.perf_counter() - t0
  n_params = sum(p.numel() for p in model.parameters())
  print(f"transformers {transformers.__version__}  torch {torch.__version__}  params {n_params / 1e9:.2f} B"
        f"  built in {build_s:.1f} s", flush=True)
  extra = {"transformers": transformers.__version__, "params": n_params, "build_s": build_s,
           "config": {k: values[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                             "num_key_value_heads", "intermediate_size", "vocab_size")}}
  rows: list[dict] = []
  failures = 0
  for batch in args.batches:
    try:
      row = run_batch(model, cfg, batch, args, device)
      if not row["logits_finite"]:
        failures += 1
    except Exception as e:  # one batch size failing must not cost the others
      import traceback  # noqa: PLC0415
      traceback.print_exc()
      failures += 1
      row = {"batch": batch, "context": args.context, "error": f"{type(e).__name__}: {e}"[:300]}
    rows.append(row)
    if device == "cuda" and args.compile_mode == "reduce-overhead" and row.get("cudagraph_skips"):
      print("WARNING: inductor skipped CUDA graphs for this step; the time includes kernel launches", flush=True)
    bc.print_table([row], COLUMNS)
    sys.stdout.flush()
    bc.write_json(args.json, "hf_llama_decode.py", vars(args), device, rows, {**extra, "failures": failures},
                  quiet=True)
  print("\n== summary (one decode step of the whole model, static cache) ==")
  bc.print_table(rows, COLUMNS)
  if args.json:
    print(f"wrote {args.json}")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
