"""Helpers shared by the PyTorch baseline scripts: timing, statistics, the result table and the JSON report.

Imported by torch_blocks.py, hf_llama_decode.py and prefill_attention.py (they sit in the same folder, so Python finds
this module through sys.path[0]). Nothing here needs a GPU; CUDA is touched only when the chosen device is cuda.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import time
from typing import Callable, Iterable, Sequence

import torch


def parse_int_list(text: str) -> list[int]:
  """'1,8,32' -> [1, 8, 32]; rejects empty items so a typo fails loudly instead of silently dropping a shape."""
  items = [t.strip() for t in text.split(",")]
  if any(not t for t in items):
    raise ValueError(f"empty item in integer list '{text}'")
  return [int(t) for t in items]


def parse_str_list(text: str) -> list[str]:
  items = [t.strip().lower() for t in text.split(",")]
  if any(not t for t in items):
    raise ValueError(f"empty item in list '{text}'")
  return items


def summarize(samples_us: Sequence[float]) -> dict:
  """Median plus a spread measure; the median is what tables compare, p10/p90 show how noisy the run was."""
  if not samples_us:
    raise ValueError("no timing samples")
  ordered = sorted(samples_us)
  n = len(ordered)

  def pct(p: float) -> float:
    return ordered[min(n - 1, max(0, int(round(p * (n - 1)))))]

  return {
    "us_median": statistics.median(ordered),
    "us_p10": pct(0.10),
    "us_p90": pct(0.90),
    "us_min": ordered[0],
    "samples": n,
  }


def time_calls(fn_for_iter: Callable[[int], None], iters: int, device: str) -> list[float]:
  """Times iters calls of fn_for_iter(i), one sample per call, in microseconds.

  On CUDA each call is bracketed by its own pair of events and nothing synchronises between calls, so the CPU keeps
  queueing ahead and a sample measures the GPU time of that call (plus any gap the CPU could not hide, which is real
  latency a caller would see too). On CPU a wall clock brackets each call.
  """
  samples: list[float] = []
  if device == "cuda":
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    torch.cuda.synchronize()
    for i in range(iters):
      starts[i].record()
      fn_for_iter(i)
      ends[i].record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
  else:
    for i in range(iters):
      t0 = time.perf_counter()
      fn_for_iter(i)
      samples.append((time.perf_counter() - t0) * 1e6)
  return samples


def synchronize(device: str) -> None:
  if device == "cuda":
    torch.cuda.synchronize()


def rel_l2(test: torch.Tensor, ref: torch.Tensor) -> float:
  """||test - ref|| / ||ref|| in fp64; the one error metric every check in these scripts reports."""
  t = test.detach().double()
  r = ref.detach().double()
  denom = r.norm().item()
  if denom == 0.0:
    return math.inf
  return (t - r).norm().item() / denom


def sdpa_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, enable_gqa: bool) -> str:
  """Name of the backend unforced SDPA picks for these shapes/dtypes: the math fallback would make a row meaningless,
  so every row that calls SDPA records it."""
  try:
    from torch.nn.attention import SDPBackend  # noqa: PLC0415
    code = torch._fused_sdp_choice(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)
    return SDPBackend(code).name.lower()
  except Exception as e:  # private API: report rather than fail the benchmark
    return f"unknown ({type(e).__name__})"


def l2_cache_bytes(device: str) -> int:
  if device != "cuda":
    return 0
  props = torch.cuda.get_device_properties(torch.cuda.current_device())
  return int(getattr(props, "L2_cache_size", 50 * 2**20))


def rotation_sets(set_bytes: int, device: str, cap: int = 32) -> int:
  """Enough input sets that one full rotation spans three times the L2, so each call reads its inputs from HBM."""
  if device != "cuda":
    return 2
  return int(min(cap, max(2, math.ceil(3 * l2_cache_bytes(device) / max(set_bytes, 1)))))


_ENV_CACHE: dict = {}


def environment(device: str) -> dict:
  if device in _ENV_CACHE:
    return _ENV_CACHE[device]
  env = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "torch": torch.__version__,
    "python": platform.python_version(),
    "host": platform.node(),
    "device": device,
    "git_commit": os.environ.get("FT_GIT_COMMIT", ""),
  }
  if device == "cuda":
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    env.update({
      "gpu": props.name,
      "sm_count": props.multi_processor_count,
      "capability": f"{props.major}.{props.minor}",
      "gpu_memory_bytes": props.total_memory,
      "l2_bytes": l2_cache_bytes(device),
      "cuda": torch.version.cuda,
    })
  else:
    env["gpu"] = None
  try:
    import triton  # noqa: PLC0415 - optional, only reported
    env["triton"] = triton.__version__
  except Exception:  # the report must not fail because an optional package is missing
    env["triton"] = None
  _ENV_CACHE[device] = env
  return env


def print_table(rows: Iterable[dict], columns: Sequence[tuple[str, str, str]]) -> None:
  """columns: (key, header, format spec). Missing keys print as '-'."""
  rows = list(rows)
  cells = []
  for r in rows:
    line = []
    for key, _, spec in columns:
      v = r.get(key)
      if v is None:
        line.append("-")
      elif isinstance(v, float) and not math.isfinite(v):
        line.append(str(v))
      else:
        line.append(format(v, spec))
    cells.append(line)
  widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h, _) in enumerate(columns)]
  print("  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths)))
  for line in cells:
    print("  ".join(c.rjust(w) for c, w in zip(line, widths)))


def write_json(path: str | None, script: str, args: dict, device: str, rows: list[dict], extra: dict | None = None,
               quiet: bool = False) -> None:
  if not path:
    return
  report = {"script": script, "environment": environment(device), "args": args, "rows": rows}
  if extra:
    report.update(extra)
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2, default=str)
    f.write("\n")
  os.replace(tmp, path)  # a reader (or a kill) never sees half a file
  if not quiet:
    print(f"wrote {path}")


def pick_device(requested: str) -> str:
  if requested == "cuda" and not torch.cuda.is_available():
    raise SystemExit("--device cuda requested but torch.cuda.is_available() is False (use --device cpu for a dry run)")
  return requested
