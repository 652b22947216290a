// CPU emulation of the W4A16 chain kernel (src/cuda/w4a16_chain.cuh), which runs without a GPU. Every CTA's producer,
// its eight consumer warps and the copy engine are agents that a seeded random scheduler steps one action at a time,
// over models of the mbarrier (phase, pending arrivals, transaction bytes, try_wait.parity as PTX defines it), the
// consumers' named barrier, the bulk copies (each lands at a random later step) and the stage counters. The consumers
// compute through the kernel's index maps (w4a16_chain_layout.h, gemm_w4a16_layout.h) with the PTX fragment model
// (w4a16_emu.h), the producer throttled as stages_ahead says. Checks: no deadlock under any interleaving tried; a consumer's wait returns only when its slot holds
// the (stage, block, slot) it expects; the producer never refills a slot whose last use was not consumed; every
// output is written exactly once; each stage is within the v4 GEMM's bound of the fp64 twin on the activations the
// emulated CTAs staged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/w4a16_emu.h"
#include "cuda/gemm_w4a16_layout.h"
#include "cuda/w4a16_chain_layout.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/int4_mma.h"
#include "w4a16_cases.h"

namespace {

using namespace futransformer;
using formats::Int4Weight;
using formats::ScaleType;
namespace w4 = futransformer::cuda::w4a16;
using namespace test::w4a16;

enum class Input { first, previous, swiglu };

struct StageSpec {
  int N, K, group;
  Input input;
  int offset;
};

// mbarrier: `count` arrivals and the expected transaction bytes complete a phase. try_wait.parity(p) is true once
// the phase of parity p has completed, i.e. while the current (incomplete) phase has the other parity.
struct MBarrier {
  int count = 1, arrivals = 1, phase = 0;
  int64_t tx = 0;
  void init(int c) { count = arrivals = c; }
  void complete_if_done() {
    if (arrivals == 0 && tx == 0) {
      ++phase;
      arrivals = count;
    }
  }
  void arrive() {
    ASSERT_GT(arrivals, 0);
    --arrivals;
    complete_if_done();
  }
  void arrive_expect_tx(int64_t bytes) {
    tx += bytes;
    arrive();
  }
  void complete_tx(int64_t bytes) {
    tx -= bytes;
    ASSERT_GE(tx, 0);
    complete_if_done();
  }
  bool parity_done(uint32_t p) const { return static_cast<uint32_t>(phase & 1) != p; }
};

// The consumers' named barrier: an arrival waits until all eight of the generation have arrived.
struct NamedBarrier {
  int arrived = 0, generation = 0;
};

struct Tag {
  int s = -1, j = -1, q = -1;
  bool operator==(const Tag&) const = default;
};

struct Copy {
  int cta;
  uint32_t slot;
  Tag tag;
};

struct Stage {
  StageSpec spec;
  Int4Weight w;
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales;
  std::vector<uint16_t> y;    // BF16 bits, NaN until written
  std::vector<int> writes;
  std::vector<uint16_t> x;    // the activations CTA 0 staged (the twin's input)
};

enum class WarpState { stage_barrier, dependency, staging_barrier, slots, job_barrier, final_barrier, done };

struct Warp {
  WarpState state = WarpState::dependency;  // stage 0 has no first barrier
  int s = 0, job = 0, q = 0;
  uint32_t taken = 0;
  int barrier_generation = -1;  // the generation this warp waits to see pass
  float acc[2][32][4] = {}, part[2][32][4] = {}, corr[32][4] = {};
};

struct Cta {
  std::vector<unsigned char> ring;
  std::vector<Tag> tags;
  std::vector<bool> consumed;
  std::vector<MBarrier> full, empty;
  NamedBarrier bar;
  std::vector<Warp> warps;
  std::vector<uint16_t> xs;
  std::vector<std::vector<float>> red;  // [warp][np * 128 + lane * 4 + e]
  std::vector<Tag> produce;             // the producer's slots in order
  size_t next = 0;
  uint32_t filled[w4::kChainConsumerWarps] = {};
  int consumer_stage = 0;  // the producer's throttle
};

// The jobs (32-column blocks) of stage s that CTA c owns, in the kernel's order.
std::vector<int> jobs_of(int cta, int ctas, int64_t rot, int nblocks) {
  std::vector<int> out;
  for (int j = w4::chain_first_job(cta, ctas, rot); j < nblocks; j += ctas) out.push_back(j);
  return out;
}

double silu_mul(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

void run_emulation(const std::vector<StageSpec>& specs, int M, ScaleType st, int ctas, uint32_t seed,
                   int stages_ahead = w4::kChainAnyStagesAhead) {
  const int n = static_cast<int>(specs.size());
  std::vector<Stage> stages;
  for (int s = 0; s < n; ++s) {
    Stage g;
    g.spec = specs[static_cast<size_t>(s)];
    g.w = random_weight(g.spec.N, g.spec.K, g.spec.group, st, seed + 31 * static_cast<uint32_t>(s));
    g.packed = formats::repack_int4_for_mma(g.w);
    g.scales = formats::repack_int4_scales_for_mma(g.w);
    g.y.assign(static_cast<size_t>(M) * g.spec.N, 0xFFFF);
    g.writes.assign(g.y.size(), 0);
    stages.push_back(std::move(g));
  }
  const std::vector<uint16_t> x0 = random_x(M, specs[0].K, seed + 7);
  std::vector<int64_t> rot(static_cast<size_t>(n) + 1, 0);
  for (int s = 0; s < n; ++s) rot[static_cast<size_t>(s) + 1] = (rot[static_cast<size_t>(s)] + specs[s].N / 32) % ctas;
  std::vector<int> counters(static_cast<size_t>(n), 0);

  std::vector<Cta> cta(static_cast<size_t>(ctas));
  for (int c = 0; c < ctas; ++c) {
    Cta& C = cta[static_cast<size_t>(c)];
    C.ring.assign(static_cast<size_t>(w4::kChainRingBytes), 0xAB);
    C.tags.assign(w4::kChainSlots, Tag{});
    C.consumed.assign(w4::kChainSlots, true);
    C.full.resize(w4::kChainSlots);
    C.empty.resize(w4::kChainSlots);
    for (auto& b : C.full) b.init(1);
    for (auto& b : C.empty) b.init(1);
    C.warps.resize(w4::kChainConsumerWarps);
    C.red.assign(w4::kChainConsumerWarps, std::vector<float>(256, NAN));
    for (int s = 0; s < n; ++s)
      for (int j : jobs_of(c, ctas, rot[static_cast<size_t>(s)], specs[s].N / 32))
        for (int q = 0; q < specs[s].K / w4::kChainSlotK; ++q) C.produce.push_back({s, j, q});
  }
  std::vector<Copy> in_flight;
  const bool f16 = st == ScaleType::F16;
  uint32_t k136[32][4];
  for (auto& l : k136)
    for (auto& r : l) r = w4::kMagicSub;

  // Barrier arrival; true once the barrier of the warp's generation has passed.
  auto arrive = [&](Cta& C, Warp& w, auto on_complete) {
    w.barrier_generation = C.bar.generation;
    if (++C.bar.arrived == w4::kChainConsumerWarps) {
      C.bar.arrived = 0;
      on_complete();
      ++C.bar.generation;
    }
  };
  auto passed = [](const Cta& C, const Warp& w) { return C.bar.generation != w.barrier_generation; };

  auto stage_x = [&](int c, int s) {
    Cta& C = cta[static_cast<size_t>(c)];
    const StageSpec& p = specs[static_cast<size_t>(s)];
    const int pitch = p.K + w4::kChainXPad;
    C.xs.assign(static_cast<size_t>(M) * pitch, 0xFFFF);  // the pads stay NaN: a read of one shows
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < p.K; ++k) {
        uint16_t v;
        if (s == 0) {
          v = x0[static_cast<size_t>(m) * p.K + k];
        } else {
          const Stage& prev = stages[static_cast<size_t>(s) - 1];
          const size_t at = static_cast<size_t>(m) * prev.spec.N + p.offset + k;
          EXPECT_EQ(prev.writes[at], 1) << "stage " << s << " read an output of stage " << s - 1 << " not written once";
          v = prev.y[at];
          if (p.input == Input::swiglu)
            v = f32_to_bf16(static_cast<float>(silu_mul(bf16_to_f32(prev.y[at]), bf16_to_f32(prev.y[at + p.K]))));
        }
        C.xs[static_cast<size_t>(m) * pitch + k] = v;
      }
    if (c == 0) {
      Stage& g = stages[static_cast<size_t>(s)];
      g.x.assign(static_cast<size_t>(M) * p.K, 0);
      for (int m = 0; m < M; ++m)
        for (int k = 0; k < p.K; ++k)
          g.x[static_cast<size_t>(m) * p.K + k] = C.xs[static_cast<size_t>(m) * pitch + k];
    }
  };

  // A consumer warp takes slot q of the current block of stage s from ring slot `slot`: the kernel's loop body.
  auto consume_slot = [&](Cta& C, Warp& w, int s, int q, uint32_t slot) {
    const StageSpec& p = specs[static_cast<size_t>(s)];
    const int pitch = p.K + w4::kChainXPad, bpg = p.group / 32;
    const unsigned char* sl = C.ring.data() + static_cast<size_t>(slot) * w4::kChainSlotBytes;
    for (int b = 0; b < w4::kChainSlotBlocks; ++b) {
      uint32_t words[32][4];
      for (int lane = 0; lane < 32; ++lane)
        std::memcpy(words[lane], sl + b * 512 + lane * 16, 16);
      int64_t addr[32];
      for (int lane = 0; lane < 32; ++lane)
        addr[lane] = w4::xb_frag_offset(lane, int64_t{q} * w4::kChainSlotK + b * 32, pitch, M);
      uint32_t xb[32][4];
      emu_ldmatrix(C.xs, addr, 4, xb);
      for (int ks = 0; ks < 2; ++ks) {
        uint32_t bx[32][2];
        for (int lane = 0; lane < 32; ++lane) {
          bx[lane][0] = xb[lane][2 * ks];
          bx[lane][1] = xb[lane][2 * ks + 1];
        }
        for (int np = 0; np < 2; ++np) {
          uint32_t a[32][4];
          for (int lane = 0; lane < 32; ++lane)
            for (int r = 0; r < 4; ++r) a[lane][r] = emu_biased(words[lane][2 * ks + np], 4 * w4::v4_slot(true, r));
          emu_mma(w.part[np], a, bx);
        }
        emu_mma(w.corr, k136, bx);
      }
      if ((b + 1) % bpg == 0) {
        const int gl = (b + 1) / bpg - 1;
        for (int lane = 0; lane < 32; ++lane) {
          const unsigned char* sv =
              sl + w4::kChainSlotWeightBytes + (gl * w4::kScalesPerGroupBlock + w4::swap_scale_t(lane) * 8) * 2;
          const uint32_t sel = w4::scale_prmt_selector(w4::swap_scale_half(lane), f16);
          float sc[4];
          for (int tile = 0; tile < 4; ++tile) {
            uint32_t pair;
            std::memcpy(&pair, sv + 4 * tile, 4);
            const uint32_t bits = emu_prmt(pair, 0, sel);
            if (f16) {
              sc[tile] = f16_to_f32(static_cast<uint16_t>(bits));
            } else {
              std::memcpy(&sc[tile], &bits, 4);
            }
          }
          for (int np = 0; np < 2; ++np)
            for (int e = 0; e < 4; ++e) {
              w.acc[np][lane][e] =
                  std::fma(w.part[np][lane][e] - w.corr[lane][e], sc[2 * np + (e >> 1)], w.acc[np][lane][e]);
              w.part[np][lane][e] = 0.0f;
            }
          for (int e = 0; e < 4; ++e) w.corr[lane][e] = 0.0f;
        }
      }
    }
  };

  // Warp 0's reduction and stores of block j (at the job barrier, after every warp wrote its sums).
  auto finish_job = [&](Cta& C, int s, int j) {
    Stage& g = stages[static_cast<size_t>(s)];
    Warp& w0 = C.warps[0];
    for (int w2 = 1; w2 < w4::kChainConsumerWarps; ++w2)
      for (int np = 0; np < 2; ++np)
        for (int lane = 0; lane < 32; ++lane)
          for (int e = 0; e < 4; ++e) w0.acc[np][lane][e] += C.red[static_cast<size_t>(w2)][np * 128 + lane * 4 + e];
    for (int np = 0; np < 2; ++np)
      for (int lane = 0; lane < 32; ++lane)
        for (int e = 0; e < 4; ++e) {
          const int m = w4::swap_c_m(lane, e);
          if (m >= M) continue;
          const size_t at = static_cast<size_t>(m) * g.spec.N + static_cast<size_t>(j) * 32 + w4::swap_c_n(lane, np, e);
          g.y[at] = f32_to_bf16(w0.acc[np][lane][e]);
          ++g.writes[at];
        }
  };

  // Advance a warp past its last slot of the current block: red, then the job barrier.
  std::mt19937 rng(seed);
  int64_t steps = 0;
  for (;;) {
    // Runnable agents: (kind 0 producer / 1 copy engine / 2 warp, cta, warp).
    struct Agent {
      int kind, c, w;
    };
    std::vector<Agent> runnable;
    bool all_done = true;
    for (int c = 0; c < ctas; ++c) {
      Cta& C = cta[static_cast<size_t>(c)];
      if (C.next < C.produce.size()) {
        const Tag& t = C.produce[C.next];
        const int wq = w4::chain_slot_warp(t.q);
        const uint32_t cnt = C.filled[wq], slot = w4::chain_ring_slot(wq, cnt), use = w4::chain_slot_use(cnt);
        const bool throttled = t.s - stages_ahead > 0 && C.consumer_stage < t.s - stages_ahead;
        if (!throttled && (use == 0 || C.empty[slot].parity_done((use - 1) & 1))) runnable.push_back({0, c, 0});
      }
      for (int wi = 0; wi < w4::kChainConsumerWarps; ++wi) {
        const Warp& w = C.warps[static_cast<size_t>(wi)];
        if (w.state == WarpState::done) continue;
        all_done = false;
        bool can = false;
        switch (w.state) {
          case WarpState::stage_barrier:
          case WarpState::staging_barrier:
          case WarpState::job_barrier:
          case WarpState::final_barrier:
            can = w.barrier_generation < 0 || passed(C, w);
            break;
          case WarpState::dependency:
            can = wi != 0 || w.s == 0 || counters[static_cast<size_t>(w.s) - 1] == ctas;
            break;
          case WarpState::slots: {
            const uint32_t slot = w4::chain_ring_slot(wi, w.taken), use = w4::chain_slot_use(w.taken);
            can = C.full[slot].parity_done(use & 1);
            break;
          }
          case WarpState::done:
            break;
        }
        if (can) runnable.push_back({2, c, wi});
      }
    }
    if (!in_flight.empty()) runnable.push_back({1, 0, 0});
    if (all_done) break;
    ASSERT_FALSE(runnable.empty()) << "deadlock after " << steps << " steps";
    ASSERT_LT(++steps, 50'000'000) << "no progress";
    const Agent a = runnable[std::uniform_int_distribution<size_t>(0, runnable.size() - 1)(rng)];
    if (a.kind == 0) {
      Cta& C = cta[static_cast<size_t>(a.c)];
      const Tag t = C.produce[C.next++];
      const int wq = w4::chain_slot_warp(t.q);
      const uint32_t slot = w4::chain_ring_slot(wq, C.filled[wq]++);
      ASSERT_TRUE(C.consumed[slot]) << "slot " << slot << " refilled before its last use was consumed";
      C.consumed[slot] = false;
      C.full[slot].arrive_expect_tx(w4::kChainSlotWeightBytes + w4::chain_slot_scale_bytes(specs[t.s].group));
      in_flight.push_back({a.c, slot, t});
      continue;
    }
    if (a.kind == 1) {
      const size_t i = std::uniform_int_distribution<size_t>(0, in_flight.size() - 1)(rng);
      const Copy cp = in_flight[i];
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      Cta& C = cta[static_cast<size_t>(cp.cta)];
      const Stage& g = stages[static_cast<size_t>(cp.tag.s)];
      unsigned char* dst = C.ring.data() + static_cast<size_t>(cp.slot) * w4::kChainSlotBytes;
      const int64_t wo = w4::chain_slot_weight_offset(cp.tag.j, g.spec.K, cp.tag.q);
      const int64_t so = w4::chain_slot_scale_offset(cp.tag.j, g.spec.K, g.spec.group, cp.tag.q);
      const int sbytes = w4::chain_slot_scale_bytes(g.spec.group);
      ASSERT_LE(wo + w4::kChainSlotWeightBytes, static_cast<int64_t>(g.packed.size() * 4));
      ASSERT_LE(so + sbytes, static_cast<int64_t>(g.scales.size() * 2));
      std::memcpy(dst, reinterpret_cast<const unsigned char*>(g.packed.data()) + wo, w4::kChainSlotWeightBytes);
      std::memcpy(dst + w4::kChainSlotWeightBytes, reinterpret_cast<const unsigned char*>(g.scales.data()) + so,
                  static_cast<size_t>(sbytes));
      C.tags[cp.slot] = cp.tag;
      C.full[cp.slot].complete_tx(w4::kChainSlotWeightBytes + sbytes);
      continue;
    }
    Cta& C = cta[static_cast<size_t>(a.c)];
    Warp& w = C.warps[static_cast<size_t>(a.w)];
    const int wi = a.w;
    auto begin_jobs = [&]() {
      w.job = 0;
      w.q = wi;
      const std::vector<int> jobs = jobs_of(a.c, ctas, rot[static_cast<size_t>(w.s)], specs[w.s].N / 32);
      if (jobs.empty()) {
        // No block of this stage: on to the next stage's first barrier (or the final one).
        w.state = w.s + 1 < n ? WarpState::stage_barrier : WarpState::final_barrier;
        if (w.s + 1 < n) ++w.s;
        w.barrier_generation = -1;
        return;
      }
      w.state = WarpState::slots;
    };
    // After the warp's last slot of the current block: its sums to red, then the job barrier.
    auto to_job_barrier = [&]() {
      if (wi > 0)
        for (int np = 0; np < 2; ++np)
          for (int lane = 0; lane < 32; ++lane)
            for (int e = 0; e < 4; ++e) C.red[static_cast<size_t>(wi)][np * 128 + lane * 4 + e] = w.acc[np][lane][e];
      const int s = w.s;
      const int j = jobs_of(a.c, ctas, rot[static_cast<size_t>(s)], specs[s].N / 32)[static_cast<size_t>(w.job)];
      w.state = WarpState::job_barrier;
      arrive(C, w, [&] { finish_job(C, s, j); });
    };
    switch (w.state) {
      case WarpState::stage_barrier:
        if (w.barrier_generation < 0) {
          arrive(C, w, [] {});
          break;
        }
        // The barrier passed: warp 0 publishes the previous stage and waits for every CTA's.
        if (wi == 0) ++counters[static_cast<size_t>(w.s) - 1];
        w.state = WarpState::dependency;
        w.barrier_generation = -1;
        break;
      case WarpState::dependency:
        if (wi == 0) {
          C.consumer_stage = w.s;
          stage_x(a.c, w.s);
        }
        w.state = WarpState::staging_barrier;
        arrive(C, w, [] {});
        break;
      case WarpState::staging_barrier:
        w.barrier_generation = -1;
        begin_jobs();
        if (w.state == WarpState::slots && w.q >= specs[w.s].K / w4::kChainSlotK) to_job_barrier();
        break;
      case WarpState::slots: {
        const int s = w.s;
        const int j = jobs_of(a.c, ctas, rot[static_cast<size_t>(s)], specs[s].N / 32)[static_cast<size_t>(w.job)];
        const uint32_t slot = w4::chain_ring_slot(wi, w.taken);
        ++w.taken;
        ASSERT_EQ(C.tags[slot], (Tag{s, j, w.q})) << "warp " << wi << " of CTA " << a.c << " read slot " << slot
                                                  << " holding stage " << C.tags[slot].s << " block "
                                                  << C.tags[slot].j << " slot " << C.tags[slot].q;
        consume_slot(C, w, s, w.q, slot);
        C.consumed[slot] = true;
        C.empty[slot].arrive();
        w.q += w4::kChainConsumerWarps;
        if (w.q >= specs[s].K / w4::kChainSlotK) to_job_barrier();
        break;
      }
      case WarpState::job_barrier: {
        // Passed: the next block of this stage, or the next stage.
        w.barrier_generation = -1;
        for (auto& t : w.acc)
          for (auto& l : t)
            for (float& e : l) e = 0.0f;
        const size_t jobs = jobs_of(a.c, ctas, rot[static_cast<size_t>(w.s)], specs[w.s].N / 32).size();
        if (static_cast<size_t>(++w.job) < jobs) {
          w.q = wi;
          w.state = WarpState::slots;
          if (w.q >= specs[w.s].K / w4::kChainSlotK) to_job_barrier();
        } else if (w.s + 1 < n) {
          ++w.s;
          w.state = WarpState::stage_barrier;
        } else {
          w.state = WarpState::final_barrier;
        }
        break;
      }
      case WarpState::final_barrier:
        if (w.barrier_generation < 0) {
          arrive(C, w, [&] { ++counters[static_cast<size_t>(n) - 1]; });
          break;
        }
        w.state = WarpState::done;
        break;
      case WarpState::done:
        break;
    }
  }
  EXPECT_TRUE(in_flight.empty());
  for (int s = 0; s < n; ++s) EXPECT_EQ(counters[static_cast<size_t>(s)], ctas) << "counter of stage " << s;
  for (const Cta& C : cta) EXPECT_EQ(C.next, C.produce.size());

  for (int s = 0; s < n; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    const Stage& g = stages[static_cast<size_t>(s)];
    std::vector<float> abs_dot;
    const std::vector<float> ref = formats::gemm_w4a16_reference(g.x, M, g.w, &abs_dot);
    const std::vector<double> off = offset_dot(g.x, M, g.w);
    for (size_t i = 0; i < g.y.size(); ++i) {
      ASSERT_EQ(g.writes[i], 1) << "output " << i << " written " << g.writes[i] << " times";
      const double got = bf16_to_f32(g.y[i]);
      ASSERT_LE(std::fabs(got - ref[i]), error_bound(w4::Variant::v4, ref[i], abs_dot[i], off[i]))
          << "row " << i / g.spec.N << " col " << i % g.spec.N << ": got " << got << ", ref " << ref[i];
    }
  }
}

// Five stages through every input kind and group size; the last has 24 slots per block (warps 0..7 take two), the
// first and third fewer slots than warps.
std::vector<StageSpec> mixed_chain() {
  return {{256, 512, 128, Input::first, 0},
          {512, 256, 64, Input::previous, 0},
          {256, 256, 32, Input::swiglu, 0},
          {3072, 256, 128, Input::previous, 0},
          {64, 3072, 128, Input::previous, 0}};
}

TEST(W4A16ChainEmulation, ThreeCtasOneRowBf16Scales) { run_emulation(mixed_chain(), 1, ScaleType::BF16, 3, 1u); }
TEST(W4A16ChainEmulation, OneCtaEightRowsF16Scales) { run_emulation(mixed_chain(), 8, ScaleType::F16, 1, 2u); }
TEST(W4A16ChainEmulation, FiveCtasThreeRowsAnotherInterleaving) {
  run_emulation(mixed_chain(), 3, ScaleType::BF16, 5, 3u);
}
TEST(W4A16ChainEmulation, ProducerHeldToItsStageOrOneAhead) {
  run_emulation(mixed_chain(), 2, ScaleType::BF16, 3, 4u, 0);
  run_emulation(mixed_chain(), 2, ScaleType::F16, 2, 5u, 1);
}

}  // namespace
