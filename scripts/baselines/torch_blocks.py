#!/usr/bin/env python3
"""One Llama decoder block in plain PyTorch, compiled, timed on the GPU: the baseline our kernels are measured against.

Block: RMSNorm -> fused QKV projection -> RoPE (Llama-3.1 frequency scaling) -> GQA attention (SDPA) over a KV cache
-> O projection + residual -> RMSNorm -> fused gate/up projection -> SwiGLU -> down projection + residual.
Shapes: Llama-3.1-8B (hidden 4096, 32 heads, 8 KV heads, head_dim 128, ffn 14336) and 70B (8192, 64, 8, 128, 28672).
Weights are random (no checkpoint is read): timing does not depend on the values, and the checks below compare each
quantised variant against the BF16 block built from the same random weights.

DECODE (one new token per sequence, static KV cache pre-filled to --context tokens, the new token attends to context+1):
  bf16  F.linear with BF16 weights
  int4  torch._weight_int4pack_mm (tinygemm), asymmetric INT4 weights, group 128, BF16 activations
  Each variant is torch.compile'd (--compile-mode, default max-autotune-no-cudagraphs), then captured in CUDA graphs,
  one graph per rotating input set (activations + KV cache) so the KV cache is not served from L2; the median of
  per-replay CUDA-event times is reported.
PREFILL (batch 1, --prefill-tokens tokens, causal SDPA, K/V written to a cache):
  bf16  F.linear with BF16 weights
  fp8   torch._scaled_mm: e4m3 weights with per-output-channel scales, activations quantised per token to e4m3 inside
        the compiled function, BF16 output
  compiled with --prefill-compile-mode (default 'default'), timed with CUDA events per call (no graph: launch costs
  are negligible at these sizes).

Checks (printed and stored, never silently skipped): each quantised linear layer is compared against the fp32 product
of its own dequantised operands (rel L2 must stay under LINEAR_CHECK_TOL: this catches packing/layout mistakes), and
each quantised block's residual update is compared against the BF16 block's (informational: the format's error).

Usage (GPU):
  python3 scripts/baselines/torch_blocks.py --json out/blocks.json            # decode + prefill, 8b and 70b
  python3 scripts/baselines/torch_blocks.py --decode --models 8b --quick      # fewer iterations
  python3 scripts/baselines/torch_blocks.py --prefill --variants fp8 --prefill-compile-mode max-autotune-no-cudagraphs
CPU dry run (tiny shapes, exercises everything except the CUDA-only kernels; fp8 is emulated there):
  python3 scripts/baselines/torch_blocks.py --device cpu --quick --compile-mode none --prefill-compile-mode none
"""
from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import bench_common as bc

INT4_GROUP = 128
# tinygemm's tile depth: K must be a multiple of INT4_INNER_K_TILES * 16; 8 is what gpt-fast/torchao pick for speed.
INT4_INNER_K_TILES = 8
FP8_MAX = 448.0  # largest finite float8_e4m3fn
# A quantised GEMM against the fp32 product of its own dequantised operands differs only by fp32-vs-kernel
# accumulation order and the BF16 rounding of the output (2^-9 relative): 1e-2 leaves room for K up to 28672 while a
# wrong nibble order or scale layout gives errors of order 1.
LINEAR_CHECK_TOL = 1e-2


@dataclass(frozen=True)
class BlockShape:
  name: str
  hidden: int
  heads: int
  kv_heads: int
  head_dim: int
  ffn: int
  rms_eps: float = 1e-5
  rope_theta: float = 500000.0
  # Llama-3.1 "llama3" RoPE frequency scaling.
  rope_factor: float = 8.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_pos: int = 8192


SHAPES = {
  "8b": BlockShape("8b", 4096, 32, 8, 128, 14336),
  "70b": BlockShape("70b", 8192, 64, 8, 128, 28672),
  # CPU dry runs only: every dimension keeps the divisibility the INT4 packer needs (K % 128 == 0, N % 8 == 0).
  "tiny": BlockShape("tiny", 256, 4, 2, 64, 768),
}


def rope_inv_freq(s: BlockShape) -> torch.Tensor:
  """Llama-3.1 RoPE: long wavelengths are slowed down by rope_factor, short ones kept, a smooth blend in between."""
  inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float64) / s.head_dim))
  wavelen = 2 * math.pi / inv
  low_wavelen = s.rope_original_max_pos / s.rope_low_freq_factor
  high_wavelen = s.rope_original_max_pos / s.rope_high_freq_factor
  smooth = (s.rope_original_max_pos / wavelen - s.rope_low_freq_factor) / (
    s.rope_high_freq_factor - s.rope_low_freq_factor)
  blended = (1 - smooth) * inv / s.rope_factor + smooth * inv
  out = torch.where(wavelen > low_wavelen, inv / s.rope_factor, blended)
  out = torch.where(wavelen < high_wavelen, inv, out)
  return out.float()


def rope_tables(s: BlockShape, positions: torch.Tensor, device: str) -> tuple[torch.Tensor, torch.Tensor]:
  angles = positions.double()[:, None] * rope_inv_freq(s).double()[None, :]
  return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
  """Rotate-half RoPE (the HF Llama layout), computed in fp32 and rounded back once."""
  half = x.shape[-1] // 2
  xf = x.float()
  x1, x2 = xf[..., :half], xf[..., half:]
  return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
  xf = x.float()
  xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
  return (xf * weight.float()).to(x.dtype)


# ---------------------------------------------------------------------------------------------------------------------
# Linear layers. Each takes a 2-D BF16 activation [M, K] and returns [M, N] BF16.

class Bf16Linear(nn.Module):
  def __init__(self, w: torch.Tensor):
    super().__init__()
    self.register_buffer("w", w)
    self.weight_bytes = w.numel() * w.element_size()
    self.n, self.k = w.shape

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, self.w)


def quantize_int4_g128(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
  """Asymmetric 4-bit, one (scale, zero) per 128 inputs of an output row, in tinygemm's convention:
  w ~= (q - 8) * scale + zero with q in 0..15 and zero = min + 8 * scale.
  Returns q (uint8 [N, K]), scale_zero (BF16 [K/128, N, 2], the layout tinygemm reads) and the dequantised fp32 weight
  computed from the BF16-rounded scales and zeros the kernel will actually use."""
  n, k = w.shape
  wg = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
  lo = wg.amin(dim=-1, keepdim=True)
  hi = wg.amax(dim=-1, keepdim=True)
  scale = ((hi - lo) / 15.0).clamp(min=1e-6)
  q = ((wg - lo) / scale).round().clamp(0, 15)
  zero = lo + 8.0 * scale
  scale_b, zero_b = scale.to(torch.bfloat16), zero.to(torch.bfloat16)
  deq = ((q - 8.0) * scale_b.float() + zero_b.float()).reshape(n, k)
  scale_zero = torch.cat([scale_b, zero_b], dim=-1).transpose(0, 1).contiguous()  # [K/128, N, 2]
  return q.reshape(n, k).to(torch.uint8), scale_zero, deq


class Int4Linear(nn.Module):
  def __init__(self, w: torch.Tensor):
    super().__init__()
    self.n, self.k = w.shape
    if self.k % (INT4_INNER_K_TILES * 16) or self.k % INT4_GROUP or self.n % 8:
      raise ValueError(f"INT4 linear needs K % {INT4_INNER_K_TILES * 16} == 0, K % {INT4_GROUP} == 0 and N % 8 == 0,"
                       f" got N={self.n} K={self.k}")
    q, scale_zero, deq = quantize_int4_g128(w)
    self.on_cuda = w.is_cuda
    if self.on_cuda:
      # Since torch 2.5 the CUDA packer takes two nibbles per byte, even k in the high nibble: [N, K/2] uint8.
      packed_bytes = ((q[:, ::2] << 4) | q[:, 1::2]).contiguous()
      packed = torch._convert_weight_to_int4pack(packed_bytes, INT4_INNER_K_TILES)
    else:
      packed = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), INT4_INNER_K_TILES)
    self.register_buffer("packed", packed)
    self.register_buffer("scale_zero", scale_zero)
    self.weight_bytes = packed.numel() * packed.element_size() + scale_zero.numel() * scale_zero.element_size()
    self.check_rel_l2 = check_linear(self, deq)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    if self.on_cuda:
      return torch._weight_int4pack_mm(x, self.packed, INT4_GROUP, self.scale_zero)
    return torch._weight_int4pack_mm_for_cpu(x, self.packed, INT4_GROUP, self.scale_zero)


def quantize_per_token_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
  """Per-row (per-token) e4m3 quantisation with an fp32 scale per row; runs inside the compiled graph."""
  amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
  scale = amax / FP8_MAX
  xq = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
  return xq, scale


class Fp8Linear(nn.Module):
  """e4m3 weights with one fp32 scale per output channel; activations quantised per token at run time.
  On CUDA the product is torch._scaled_mm with row-wise scales (Hopper). CPU's _scaled_mm only takes per-tensor
  scales, so a CPU dry run emulates the same arithmetic with an fp32 matmul and names the variant fp8-emulated."""

  def __init__(self, w: torch.Tensor):
    super().__init__()
    self.n, self.k = w.shape
    wf = w.float()
    w_scale = (wf.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX)  # [N, 1]
    wq = (wf / w_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    self.on_cuda = w.is_cuda
    self.register_buffer("wq", wq)  # [N, K] row-major, so wq.t() is the column-major [K, N] _scaled_mm wants
    self.register_buffer("w_scale_row", w_scale.reshape(1, self.n).contiguous())
    self.weight_bytes = wq.numel() + w_scale.numel() * 4
    self.check_rel_l2 = check_linear(self, wq.float() * w_scale, quantize_activations=True)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    xq, x_scale = quantize_per_token_fp8(x)
    if self.on_cuda:
      return torch._scaled_mm(xq, self.wq.t(), scale_a=x_scale, scale_b=self.w_scale_row, out_dtype=torch.bfloat16,
                              use_fast_accum=True)
    return ((xq.float() * x_scale) @ (self.wq.float().t() * self.w_scale_row)).to(torch.bfloat16)


def check_linear(layer: nn.Module, deq_weight: torch.Tensor, quantize_activations: bool = False) -> float:
  """rel L2 of the layer's output against the fp32 product of the operands it really multiplies."""
  gen = torch.Generator(device=deq_weight.device).manual_seed(1234)
  x = torch.randn(16, layer.k, device=deq_weight.device, generator=gen).to(torch.bfloat16)
  with torch.no_grad():
    out = layer(x)
    if quantize_activations:
      xq, xs = quantize_per_token_fp8(x)
      xr = xq.float() * xs
    else:
      xr = x.float()
    ref = xr @ deq_weight.t()
  return bc.rel_l2(out.float(), ref)


LINEAR_KINDS = {"bf16": Bf16Linear, "int4": Int4Linear, "fp8": Fp8Linear}


# ---------------------------------------------------------------------------------------------------------------------

class LlamaBlock(nn.Module):
  def __init__(self, s: BlockShape, weights: dict[str, torch.Tensor], linear_kind: str):
    super().__init__()
    self.s = s
    self.kind = linear_kind
    make = LINEAR_KINDS[linear_kind]
    self.wqkv = make(weights["wqkv"])
    self.wo = make(weights["wo"])
    self.w_gate_up = make(weights["w_gate_up"])
    self.w_down = make(weights["w_down"])
    self.register_buffer("attn_norm", weights["attn_norm"])
    self.register_buffer("mlp_norm", weights["mlp_norm"])

  def linears(self) -> list[nn.Module]:
    return [self.wqkv, self.wo, self.w_gate_up, self.w_down]

  def weight_bytes(self) -> int:
    return sum(m.weight_bytes for m in self.linears()) + 2 * self.attn_norm.numel() * 2

  def linear_params(self) -> int:
    return sum(m.n * m.k for m in self.linears())

  def _mlp(self, x: torch.Tensor) -> torch.Tensor:
    h = rms_norm(x, self.mlp_norm, self.s.rms_eps)
    gate, up = self.w_gate_up(h).chunk(2, dim=-1)
    return x + self.w_down(F.silu(gate) * up)

  def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = self.s
    h = rms_norm(x, self.attn_norm, s.rms_eps)
    return self.wqkv(h).split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)

  def decode(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> torch.Tensor:
    """x [B, hidden]; cos/sin [1, head_dim/2] for the new position; caches [B, kv_heads, context+1, head_dim] whose
    last slot receives the new token's K/V (the same slot every step: shapes and addresses stay static for graphs)."""
    s = self.s
    b = x.shape[0]
    q, k, v = self._qkv(x)
    q = apply_rope(q.view(b, s.heads, 1, s.head_dim), cos, sin)
    k = apply_rope(k.view(b, s.kv_heads, 1, s.head_dim), cos, sin)
    k_cache[:, :, -1:, :] = k
    v_cache[:, :, -1:, :] = v.view(b, s.kv_heads, 1, s.head_dim)
    attn = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
    x = x + self.wo(attn.reshape(b, s.heads * s.head_dim))
    return self._mlp(x)

  def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor) -> torch.Tensor:
    """x [T, hidden] (batch 1); cos/sin [T, head_dim/2]; caches [1, kv_heads, T, head_dim] are overwritten."""
    s = self.s
    t = x.shape[0]
    q, k, v = self._qkv(x)
    q = apply_rope(q.view(t, s.heads, s.head_dim).transpose(0, 1), cos, sin).unsqueeze(0)
    k = apply_rope(k.view(t, s.kv_heads, s.head_dim).transpose(0, 1), cos, sin).unsqueeze(0)
    v = v.view(t, s.kv_heads, s.head_dim).transpose(0, 1).unsqueeze(0)
    k_cache.copy_(k)
    v_cache.copy_(v)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + self.wo(attn.squeeze(0).transpose(0, 1).reshape(t, s.heads * s.head_dim))
    return self._mlp(x)


def make_weights(s: BlockShape, device: str, seed: int) -> dict[str, torch.Tensor]:
  """Random BF16 weights scaled by 1/sqrt(K) so activations stay O(1) through the block; norms near 1."""
  gen = torch.Generator(device=device).manual_seed(seed)

  def lin(n: int, k: int) -> torch.Tensor:
    return (torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * (k ** -0.5)).contiguous()

  def norm() -> torch.Tensor:
    return (1.0 + 0.1 * torch.randn(s.hidden, device=device, generator=gen)).to(torch.bfloat16)

  qkv_n = (s.heads + 2 * s.kv_heads) * s.head_dim
  return {
    "wqkv": lin(qkv_n, s.hidden),
    "wo": lin(s.hidden, s.heads * s.head_dim),
    "w_gate_up": lin(2 * s.ffn, s.hidden),
    "w_down": lin(s.hidden, s.ffn),
    "attn_norm": norm(),
    "mlp_norm": norm(),
  }


# ---------------------------------------------------------------------------------------------------------------------
# Compile, capture, time.

def compile_fn(fn, mode: str):
  if mode == "none":
    return fn
  # fullgraph: a graph break would silently time a different program; dynamic=False: one specialised graph per shape.
  return torch.compile(fn, mode=mode, fullgraph=True, dynamic=False)


class Prepared:
  """A compiled step bound to its input sets: run(i) executes it on set i % len(sets); output0() returns set 0's
  result."""

  def __init__(self, fn, input_sets: list[tuple], device: str, compile_mode: str, use_graphs: bool):
    torch._dynamo.reset()  # the same code object (LlamaBlock.decode) is compiled per row: start each from scratch
    self.sets = input_sets
    compiled = compile_fn(fn, compile_mode)
    t0 = time.perf_counter()
    with torch.no_grad():
      compiled(*input_sets[0])
    bc.synchronize(device)
    self.compile_s = time.perf_counter() - t0
    self.graphs: list[torch.cuda.CUDAGraph] = []
    self.outs: list[torch.Tensor] = []
    self.compiled = compiled
    if use_graphs:
      # Capture needs a warmed-up side stream (cuBLAS workspaces, autotuning and lazy init all happen outside it).
      side = torch.cuda.Stream()
      side.wait_stream(torch.cuda.current_stream())
      with torch.cuda.stream(side), torch.no_grad():
        for inputs in input_sets:
          compiled(*inputs)
      torch.cuda.current_stream().wait_stream(side)
      for inputs in input_sets:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
          self.outs.append(compiled(*inputs))
        self.graphs.append(graph)
      torch.cuda.synchronize()

  def run(self, i: int) -> None:
    if self.graphs:
      self.graphs[i % len(self.graphs)].replay()
    else:
      with torch.no_grad():
        self.compiled(*self.sets[i % len(self.sets)])

  def output0(self) -> torch.Tensor:
    if self.graphs:
      self.graphs[0].replay()
      return self.outs[0].clone()
    with torch.no_grad():
      return self.compiled(*self.sets[0]).clone()


def decode_inputs(s: BlockShape, batch: int, context: int, n_sets: int, device: str, seed: int) -> list[tuple]:
  cos, sin = rope_tables(s, torch.tensor([context]), device)
  sets = []
  for i in range(n_sets):
    gen = torch.Generator(device=device).manual_seed(seed * 1000003 + batch * 101 + i)
    cache_shape = (batch, s.kv_heads, context + 1, s.head_dim)
    x = torch.randn(batch, s.hidden, device=device, generator=gen).to(torch.bfloat16)
    k = torch.randn(cache_shape, device=device, generator=gen).to(torch.bfloat16)
    v = torch.randn(cache_shape, device=device, generator=gen).to(torch.bfloat16)
    sets.append((x, cos, sin, k, v))
  return sets


def prefill_inputs(s: BlockShape, tokens: int, device: str, seed: int) -> list[tuple]:
  cos, sin = rope_tables(s, torch.arange(tokens), device)
  gen = torch.Generator(device=device).manual_seed(seed * 1000003 + tokens)
  x = torch.randn(tokens, s.hidden, device=device, generator=gen).to(torch.bfloat16)
  k = torch.empty(1, s.kv_heads, tokens, s.head_dim, device=device, dtype=torch.bfloat16)
  v = torch.empty_like(k)
  return [(x, cos, sin, k, v)]


def measure(block: LlamaBlock, part: str, s: BlockShape, size: int, args, device: str, base_deltas: dict) -> dict:
  # CPU has no row-wise _scaled_mm: the dry run emulates FP8, and its rows say so.
  variant_name = "fp8-emulated" if (block.kind == "fp8" and device != "cuda") else block.kind
  if part == "decode":
    kv_bytes = 2 * size * s.kv_heads * (args.context + 1) * s.head_dim * 2
    n_sets = bc.rotation_sets(kv_bytes + size * s.hidden * 2, device)
    sets = decode_inputs(s, size, args.context, n_sets, device, args.seed)
    prep = Prepared(block.decode, sets, device, args.compile_mode, use_graphs=(device == "cuda" and not args.no_graphs))
    warmup, iters = args.decode_warmup, args.decode_iters
    q_probe = torch.empty(size, s.heads, 1, s.head_dim, device=device, dtype=torch.bfloat16)
    sdpa = bc.sdpa_choice(q_probe, sets[0][3], sets[0][4], is_causal=False, enable_gqa=True)
  else:
    sets = prefill_inputs(s, size, device, args.seed)
    prep = Prepared(block.prefill, sets, device, args.prefill_compile_mode, use_graphs=False)
    warmup, iters = args.prefill_warmup, args.prefill_iters
    q_probe = torch.empty(1, s.heads, size, s.head_dim, device=device, dtype=torch.bfloat16)
    sdpa = bc.sdpa_choice(q_probe, sets[0][3], sets[0][4], is_causal=True, enable_gqa=True)
  for i in range(warmup):
    prep.run(i)
  samples = bc.time_calls(prep.run, iters, device)
  stats = bc.summarize(samples)
  x0 = sets[0][0]
  delta = (prep.output0().float() - x0.float())
  key = (part, s.name, size)
  if block.kind == "bf16":
    base_deltas[key] = delta
  rel_vs_bf16 = bc.rel_l2(delta, base_deltas[key]) if key in base_deltas and block.kind != "bf16" else None
  checks = [m.check_rel_l2 for m in block.linears() if hasattr(m, "check_rel_l2")]
  t_s = stats["us_median"] * 1e-6
  row = {
    "part": part, "model": s.name, "variant": variant_name,
    "batch": size if part == "decode" else 1,
    "tokens": 1 if part == "decode" else size,
    "context": args.context if part == "decode" else size,
    **stats,
    "compile_s": prep.compile_s,
    "input_sets": len(sets),
    "weight_bytes": block.weight_bytes(),
    "check_rel_l2": max(checks) if checks else None,
    "check_ok": (max(checks) <= LINEAR_CHECK_TOL) if checks else None,
    "rel_err_vs_bf16": rel_vs_bf16,
    "compile_mode": args.compile_mode if part == "decode" else args.prefill_compile_mode,
    "cuda_graph": bool(prep.graphs),
    "sdpa_backend": sdpa,
  }
  if part == "decode":
    moved = block.weight_bytes() + kv_bytes
    row["bytes"] = moved
    row["gbps"] = moved / t_s / 1e9
  else:
    flops = 2 * size * block.linear_params() + 2 * size * size * s.heads * s.head_dim
    row["flops"] = flops
    row["tflops"] = flops / t_s / 1e12
  del prep, sets
  return row


COLUMNS = [
  ("part", "part", ""), ("model", "model", ""), ("batch", "batch", "d"), ("tokens", "tokens", "d"),
  ("context", "ctx", "d"), ("variant", "variant", ""), ("us_median", "us_med", ".1f"),
  ("us_p10", "us_p10", ".1f"), ("us_p90", "us_p90", ".1f"), ("gbps", "GB/s", ".0f"), ("tflops", "TFLOP/s", ".1f"),
  ("compile_s", "compile_s", ".1f"), ("sdpa_backend", "sdpa", ""), ("check_rel_l2", "lin_chk", ".1e"),
  ("rel_err_vs_bf16", "vs_bf16", ".1e"), ("error", "error", ""),
]


def parse_args(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--decode", action="store_true", help="run the decode part (default: both parts)")
  p.add_argument("--prefill", action="store_true", help="run the prefill part (default: both parts)")
  p.add_argument("--models", default=None, help="comma list of 8b,70b,tiny (default 8b,70b; tiny on cpu)")
  p.add_argument("--variants", default="bf16,int4,fp8", help="decode uses bf16,int4; prefill uses bf16,fp8")
  p.add_argument("--batches", default=None, help="decode batch sizes (default 1,8,32; 1,4 on cpu)")
  p.add_argument("--context", type=int, default=None, help="decode KV context (default 1024; 64 on cpu)")
  p.add_argument("--prefill-tokens", default=None, help="prefill lengths (default 2048,8192; 128 on cpu)")
  p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                 help="decode torch.compile mode, or 'none' for eager (CUDA graphs are captured by this script)")
  p.add_argument("--prefill-compile-mode", default="default",
                 help="prefill torch.compile mode (default 'default': at 2k-8k tokens the GEMMs are compute-bound and"
                      " ATen's cuBLAS/cuBLASLt calls are what autotuning keeps, while tuning 16 shapes costs minutes)")
  p.add_argument("--no-graphs", action="store_true",
                 help="decode without CUDA graph capture (times then include kernel launches; for diagnosis only)")
  p.add_argument("--quick", action="store_true", help="fewer iterations (decode 50, prefill 5)")
  p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
  p.add_argument("--seed", type=int, default=20240601)
  p.add_argument("--json", default=None, help="write the report here")
  a = p.parse_args(argv)
  cpu = a.device == "cpu"
  if not a.decode and not a.prefill:
    a.decode = a.prefill = True
  a.models = bc.parse_str_list(a.models or ("tiny" if cpu else "8b,70b"))
  for m in a.models:
    if m not in SHAPES:
      p.error(f"unknown model '{m}' (known: {', '.join(SHAPES)})")
  a.variants = bc.parse_str_list(a.variants)
  for v in a.variants:
    if v not in LINEAR_KINDS:
      p.error(f"unknown variant '{v}' (known: {', '.join(LINEAR_KINDS)})")
  a.batches = bc.parse_int_list(a.batches or ("1,4" if cpu else "1,8,32"))
  a.context = a.context if a.context is not None else (64 if cpu else 1024)
  a.prefill_tokens = bc.parse_int_list(a.prefill_tokens or ("128" if cpu else "2048,8192"))
  a.decode_warmup, a.decode_iters = (5, 50) if a.quick else (20, 200)
  a.prefill_warmup, a.prefill_iters = (1, 5) if a.quick else (3, 20)
  if cpu:
    a.decode_warmup, a.decode_iters, a.prefill_warmup, a.prefill_iters = 1, 3, 1, 2
  return a


def main(argv: list[str]) -> int:
  args = parse_args(argv)
  device = bc.pick_device(args.device)
  torch.manual_seed(args.seed)
  if device == "cuda":
    print(f"GPU {torch.cuda.get_device_name()}  torch {torch.__version__}  decode compile {args.compile_mode}"
          f"  prefill compile {args.prefill_compile_mode}", flush=True)
  plan = []  # (part, variant kinds in bf16-first order, sizes)
  if args.decode:
    plan.append(("decode", [v for v in ("bf16", "int4") if v in args.variants], args.batches))
  if args.prefill:
    plan.append(("prefill", [v for v in ("bf16", "fp8") if v in args.variants], args.prefill_tokens))
  rows: list[dict] = []
  failures = 0

  def report(rows_so_far: list[dict], n_failed: int) -> None:
    # Rewritten after every row so a run cut short by a time limit still leaves its finished rows.
    bc.write_json(args.json, "torch_blocks.py", vars(args), device, rows_so_far,
                  {"linear_check_tol": LINEAR_CHECK_TOL, "failures": n_failed}, quiet=True)

  for model in args.models:
    shape = SHAPES[model]
    weights = make_weights(shape, device, args.seed)
    base_deltas: dict = {}
    for part, kinds, sizes in plan:
      for kind in kinds:
        try:
          block = LlamaBlock(shape, weights, kind)
        except Exception as e:  # one broken variant must not cost the rest of a GPU lease
          failures += 1
          rows.append({"part": part, "model": model, "variant": kind, "error": f"{type(e).__name__}: {e}"[:300]})
          print(f"[{part} {model} {kind}] setup FAILED: {rows[-1]['error']}", flush=True)
          report(rows, failures)
          continue
        for size in sizes:
          try:
            row = measure(block, part, shape, size, args, device, base_deltas)
            if row["check_ok"] is False:
              failures += 1
          except Exception as e:
            failures += 1
            row = {"part": part, "model": model, "variant": kind, "batch": size if part == "decode" else 1,
                   "tokens": 1 if part == "decode" else size, "error": f"{type(e).__name__}: {e}"[:300]}
            import traceback  # noqa: PLC0415 - only on failure
            traceback.print_exc()
          rows.append(row)
          bc.print_table([row], COLUMNS)
          sys.stdout.flush()
          report(rows, failures)
        del block
        gc.collect()
        if device == "cuda":
          torch.cuda.empty_cache()
    del weights
    gc.collect()
  print("\n== summary ==")
  bc.print_table(rows, COLUMNS)
  if device == "cuda":
    print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
  report(rows, failures)
  if args.json:
    print(f"wrote {args.json}")
  if failures:
    print(f"{failures} row(s) failed or missed their check", file=sys.stderr)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
