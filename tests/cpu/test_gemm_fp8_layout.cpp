// CPU checks of every index map of the FP8 GEMM kernel (src/cuda/gemm_fp8_layout.h) against independent models
// of the hardware (tests/cpu/hopper_model.h): accumulator fragment, TMA swizzle vs wgmma descriptors, epilogue
// staging vs TMA store boxes, the persistent tile order, the mbarrier pipeline and the tile heuristic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "cpu/hopper_model.h"
#include "cuda/gemm_fp8_heuristics.h"
#include "cuda/gemm_fp8_layout.h"
#include "cuda/gemm_fp8_residual_ws_layout.h"
#include "cuda/gemm_fp8_swiglu_layout.h"

namespace {

namespace fp8 = futransformer::cuda::fp8;
namespace hw = futransformer::test::hopper;

constexpr int kBlockNs[] = {128, 192};

TEST(GemmFp8Layout, AccumulatorFragmentIsThePtxLayoutAndCoversTheTile) {
  for (int bn : kBlockNs) {
    std::vector<int> hits(static_cast<size_t>(fp8::kWgmmaM * bn), 0);
    for (int warp = 0; warp < 4; ++warp) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < bn / 2; ++i) {
          const int r = fp8::acc_row(warp, lane, i), c = fp8::acc_col(lane, i);
          ASSERT_EQ(r, hw::ptx_d_row(warp, lane, i)) << "warp " << warp << " lane " << lane << " reg " << i;
          ASSERT_EQ(c, hw::ptx_d_col(lane, i)) << "warp " << warp << " lane " << lane << " reg " << i;
          ASSERT_TRUE(r >= 0 && r < fp8::kWgmmaM && c >= 0 && c < bn);
          ++hits[static_cast<size_t>(r * bn + c)];
        }
      }
    }
    for (int h : hits) ASSERT_EQ(h, 1) << "block_n " << bn << ": the fragment must hold each output once";
  }
}

TEST(GemmFp8Layout, SmemBuffersAreAlignedAndDisjoint) {
  for (int bn : kBlockNs) {
    const int stages = fp8::stages_for(bn);
    const fp8::SmemLayout l = fp8::smem_layout(bn, stages);
    EXPECT_LE(l.alloc_bytes, 227u * 1024u) << "block_n " << bn;
    EXPECT_EQ(l.a_offset % 1024, 0u);
    EXPECT_EQ(l.b_offset % 1024, 0u);
    EXPECT_EQ(l.a_stage_bytes % 1024, 0u);
    EXPECT_EQ(l.b_stage_bytes % 1024, 0u);
    EXPECT_EQ(l.d_offset % 1024, 0u);
    EXPECT_EQ(l.d_wg_bytes % 1024, 0u);
    EXPECT_EQ(l.bar_offset % 8, 0u);
    EXPECT_GE(l.b_offset, l.a_offset + stages * l.a_stage_bytes);
    EXPECT_GE(l.d_offset, l.b_offset + stages * l.b_stage_bytes);
    EXPECT_GE(l.scale_offset, l.d_offset + fp8::kConsumerWarpgroups * l.d_wg_bytes);
    EXPECT_EQ(l.scale_offset % 8, 0u);
    EXPECT_GE(l.bar_offset, l.scale_offset + 4u * (fp8::kBlockM + bn));
    EXPECT_EQ(l.bytes, l.bar_offset + 16u * stages + 16u) << "stage barriers plus scale_full and scale_empty";
    EXPECT_EQ(fp8::stage_tx_bytes(bn), l.a_stage_bytes + l.b_stage_bytes) << "expect_tx must equal both boxes";
  }
}

// Fills a stage with TMA (model) from random global tiles and reads it back through the kernel's descriptors
// (decoded by the PTX model): every (row, k) of every wgmma must see the global element it stands for.
TEST(GemmFp8Layout, WgmmaDescriptorsReadWhatTmaWrote) {
  std::mt19937 rng(7);
  for (int bn : kBlockNs) {
    const int stages = fp8::stages_for(bn);
    const fp8::SmemLayout l = fp8::smem_layout(bn, stages);
    for (uint32_t raw : {16u, 1024u, 2000u}) {  // the dynamic window's start is only 16-byte aligned
      const uint32_t base = (raw + 1023u) & ~1023u;
      ASSERT_LE(base + l.bytes, raw + l.alloc_bytes) << "the aligned layout must fit the allocation";
      hw::Smem smem(raw + l.alloc_bytes);
      const int64_t rows = 300, K = 512;  // global A and B, larger than one box
      std::vector<uint8_t> g(static_cast<size_t>(rows * K));
      for (auto& v : g) v = static_cast<uint8_t>(rng());
      for (int stage : {0, stages - 1}) {
        const int64_t row0 = 128, k0 = 256;
        const uint32_t a_addr = base + l.a_offset + static_cast<uint32_t>(stage) * l.a_stage_bytes;
        const uint32_t b_addr = base + l.b_offset + static_cast<uint32_t>(stage) * l.b_stage_bytes;
        hw::tma_load_sw128(smem, a_addr, g.data(), rows, K, row0, k0, fp8::kBlockM);
        hw::tma_load_sw128(smem, b_addr, g.data(), rows, K, row0, k0, bn);
        for (int ks = 0; ks < fp8::kKSteps; ++ks) {
          for (int cw = 0; cw < fp8::kConsumerWarpgroups; ++cw) {
            const hw::Descriptor da = hw::decode_descriptor(fp8::make_smem_desc(fp8::a_desc_addr(a_addr, cw, ks)));
            for (int i = 0; i < fp8::kWgmmaM; ++i) {
              for (int j = 0; j < fp8::kWgmmaK; ++j) {
                const uint32_t addr = hw::wgmma_sw128_kmajor_address(da, i, j);
                ASSERT_TRUE(addr >= a_addr && addr < a_addr + l.a_stage_bytes) << "A read leaves its stage";
                const int64_t gr = row0 + cw * 64 + i, gk = k0 + ks * 32 + j;
                ASSERT_EQ(smem.get(addr), g[static_cast<size_t>(gr * K + gk)])
                    << "A: block_n " << bn << " stage " << stage << " wg " << cw << " ks " << ks << " row " << i
                    << " k " << j;
              }
            }
          }
          const hw::Descriptor db = hw::decode_descriptor(fp8::make_smem_desc(fp8::b_desc_addr(b_addr, ks)));
          for (int i = 0; i < bn; ++i) {
            for (int j = 0; j < fp8::kWgmmaK; ++j) {
              const uint32_t addr = hw::wgmma_sw128_kmajor_address(db, i, j);
              ASSERT_TRUE(addr >= b_addr && addr < b_addr + l.b_stage_bytes) << "B read leaves its stage";
              const int64_t gr = row0 + i, gk = k0 + ks * 32 + j;  // rows past 300 arrive as zeros
              ASSERT_EQ(smem.get(addr), gr < rows ? g[static_cast<size_t>(gr * K + gk)] : 0)
                  << "B: block_n " << bn << " stage " << stage << " ks " << ks << " n " << i << " k " << j;
            }
          }
        }
      }
    }
  }
}

// The main loops advance descriptors (advance_smem_desc: stage · stage bytes + k step · 32 added to stage 0's) instead
// of encoding every address: the same 64-bit descriptor as make_smem_desc of the address, for every stage, k step
// and row offset of every FP8 GEMM ring (gemm_fp8 at both tiles, the warp-specialised residual / QKV ring, the
// SwiGLU ring's two B halves), and for random 16-byte aligned shared-memory address pairs.
TEST(GemmFp8Layout, AdvancedDescriptorsEqualEncodedOnes) {
  struct Ring {
    uint32_t a_offset, a_stage_bytes, b_offset, b_stage_bytes;
    int stages;
    std::vector<uint32_t> a_rows, b_rows;  // the consumers' row offsets into a stage, in bytes
  };
  std::vector<Ring> rings;
  const uint32_t wg_rows = fp8::kWgmmaM * fp8::kSwizzleBytes;
  for (int bn : kBlockNs) {
    const fp8::SmemLayout l = fp8::smem_layout(bn, fp8::stages_for(bn));
    rings.push_back({l.a_offset, l.a_stage_bytes, l.b_offset, l.b_stage_bytes, fp8::stages_for(bn), {0, wg_rows}, {0}});
  }
  const auto rw = futransformer::cuda::fp8rw::smem_layout();
  rings.push_back({rw.a_offset, rw.a_stage_bytes, rw.b_offset, rw.b_stage_bytes, futransformer::cuda::fp8rw::kStages,
                   {0, wg_rows}, {0}});
  namespace sw = futransformer::cuda::fp8sw;
  const auto sl = sw::smem_layout();
  rings.push_back({sl.a_offset, sl.a_stage_bytes, sl.b_offset, sl.b_stage_bytes, sw::kStages, {0},
                   {0, static_cast<uint32_t>(sw::kHalfN * fp8::kSwizzleBytes)}});
  for (uint32_t raw : {16u, 1024u, 2000u}) {
    const uint32_t base = (raw + 1023u) & ~1023u;
    for (const Ring& r : rings) {
      for (int stage = 0; stage < r.stages; ++stage) {
        for (int ks = 0; ks < fp8::kKSteps; ++ks) {
          const uint32_t step = static_cast<uint32_t>(ks * fp8::kWgmmaK);
          for (uint32_t rows : r.a_rows) {
            const uint32_t a0 = base + r.a_offset + rows;
            ASSERT_EQ(fp8::advance_smem_desc(fp8::make_smem_desc(a0), stage * r.a_stage_bytes + step),
                      fp8::make_smem_desc(a0 + stage * r.a_stage_bytes + step))
                << "A ring at " << r.a_offset << " stage " << stage << " ks " << ks << " rows " << rows;
          }
          for (uint32_t rows : r.b_rows) {
            const uint32_t b0 = base + r.b_offset + rows;
            ASSERT_EQ(fp8::advance_smem_desc(fp8::make_smem_desc(b0), stage * r.b_stage_bytes + step),
                      fp8::make_smem_desc(b0 + stage * r.b_stage_bytes + step))
                << "B ring at " << r.b_offset << " stage " << stage << " ks " << ks << " rows " << rows;
          }
        }
      }
    }
  }
  std::mt19937 rng(3);
  const uint32_t kSmemBytes = 228u * 1024u;
  for (int i = 0; i < 100000; ++i) {
    const uint32_t a = (rng() % kSmemBytes) & ~15u, b = (rng() % kSmemBytes) & ~15u;
    const uint32_t lo = std::min(a, b), hi = std::max(a, b);
    ASSERT_EQ(fp8::advance_smem_desc(fp8::make_smem_desc(lo), hi - lo), fp8::make_smem_desc(hi)) << lo << " + " << hi - lo;
  }
}

// The epilogue's staging writes, read back by the TMA store model box by box, must reproduce the tile; a warp's
// 32 stores of one instruction must hit 32 different banks.
TEST(GemmFp8Layout, EpilogueStagingIsWhatTheTmaStoresWrite) {
  for (int bn : kBlockNs) {
    const uint32_t stage_bytes = static_cast<uint32_t>(bn / fp8::kDBoxCols) * fp8::kDBoxBytes;
    hw::Smem smem(stage_bytes);
    std::vector<int> written(stage_bytes, 0);
    // Value of output (r, c): a distinct 16-bit tag.
    auto tag = [&](int r, int c) { return static_cast<uint16_t>(r * bn + c); };
    for (int warp = 0; warp < 4; ++warp) {
      for (int j = 0; j < bn / 8; ++j) {
        for (int half = 0; half < 2; ++half) {  // the kernel's two stores per chunk: rows r_lo and r_hi
          std::set<uint32_t> banks;
          for (int lane = 0; lane < 32; ++lane) {
            const int r = fp8::acc_row(warp, lane, 2 * half), c = fp8::acc_col(lane, 4 * j);
            // The kernel packs registers 4j + 2 half and 4j + 2 half + 1 (columns c, c + 1) into one store.
            ASSERT_EQ(fp8::acc_col(lane, 4 * j + 2 * half), c);
            ASSERT_EQ(fp8::acc_col(lane, 4 * j + 2 * half + 1), c + 1);
            ASSERT_EQ(fp8::acc_row(warp, lane, 4 * j + 2 * half + 1), r);
            const uint32_t off = fp8::d_stage_offset(r, c);
            ASSERT_EQ(off % 4, 0u);
            ASSERT_LT(off + 3, stage_bytes);
            const uint16_t lo = tag(r, c), hi = tag(r, c + 1);
            smem.at(off) = static_cast<uint8_t>(lo);
            smem.at(off + 1) = static_cast<uint8_t>(lo >> 8);
            smem.at(off + 2) = static_cast<uint8_t>(hi);
            smem.at(off + 3) = static_cast<uint8_t>(hi >> 8);
            for (int b = 0; b < 4; ++b) ++written[off + b];
            banks.insert((off / 4) % 32);
          }
          EXPECT_EQ(banks.size(), 32u) << "bank conflict: block_n " << bn << " warp " << warp << " chunk " << j;
        }
      }
    }
    for (int w : written) ASSERT_EQ(w, 1) << "staging bytes must be written exactly once";
    // One warpgroup's 64 rows at global rows 0..63, columns 0..bn-1 of a [64, bn] BF16 matrix.
    std::vector<uint8_t> g(static_cast<size_t>(64 * bn * 2), 0);
    std::vector<int> writes(g.size(), 0);
    for (int b = 0; b < bn / fp8::kDBoxCols; ++b)
      hw::tma_store_sw128(smem, static_cast<uint32_t>(b * fp8::kDBoxBytes), g.data(), writes, 64, bn * 2, 0,
                          b * 128, 64);
    for (int r = 0; r < 64; ++r) {
      for (int c = 0; c < bn; ++c) {
        const size_t i = static_cast<size_t>(r * bn + c) * 2;
        ASSERT_EQ(static_cast<uint16_t>(g[i] | (g[i + 1] << 8)), tag(r, c)) << "row " << r << " col " << c;
        ASSERT_EQ(writes[i], 1);
      }
    }
  }
}

TEST(GemmFp8Scheduler, EveryTileExactlyOnceInGroupedOrder) {
  for (int m_blocks : {1, 2, 5, 16, 17, 33, 128}) {
    for (int n_blocks : {1, 3, 32, 48, 224}) {
      for (int group_m : {1, 3, 16}) {
        const int tiles = m_blocks * n_blocks;
        std::vector<int> seen(static_cast<size_t>(tiles), 0);
        for (int t = 0; t < tiles; ++t) {
          const fp8::TileCoord c = fp8::tile_coord(t, m_blocks, n_blocks, group_m);
          ASSERT_TRUE(c.m_block >= 0 && c.m_block < m_blocks && c.n_block >= 0 && c.n_block < n_blocks)
              << "tile " << t << " of " << m_blocks << " x " << n_blocks << " group " << group_m;
          ++seen[static_cast<size_t>(c.m_block * n_blocks + c.n_block)];
          // Inside a group m runs fastest: the next tile is the next m-block of the same n-block, or the group's
          // first m-block of the next n-block.
          if (t + 1 < tiles) {
            const fp8::TileCoord d = fp8::tile_coord(t + 1, m_blocks, n_blocks, group_m);
            const bool same_group = c.m_block / group_m == d.m_block / group_m;
            if (same_group && d.n_block == c.n_block) EXPECT_EQ(d.m_block, c.m_block + 1);
            if (same_group && d.n_block != c.n_block) EXPECT_EQ(d.n_block, c.n_block + 1);
          }
        }
        for (int s : seen) ASSERT_EQ(s, 1) << m_blocks << " x " << n_blocks << " group " << group_m;
        // The persistent walk (CTA b: b, b + grid, ...) visits each index once for any grid.
        for (int grid : {1, 7, 132, tiles}) {
          std::vector<int> visits(static_cast<size_t>(tiles), 0);
          for (int b = 0; b < std::min(grid, tiles); ++b)
            for (int t = b; t < tiles; t += grid) ++visits[static_cast<size_t>(t)];
          for (int v : visits) ASSERT_EQ(v, 1);
        }
      }
    }
  }
}

// The mbarrier protocol of the kernel, run under random interleavings of the producer, the TMA unit, the scale
// loader warp and the eight consumer warps: every consumer must read the (tile, k block) it expects and, in its
// epilogue, the scales of its tile; no stage or scale slot may be overwritten while some warp still reads it;
// nothing may deadlock.
struct Barrier {
  int expected = 0, pending = 0, tx = 0;
  uint32_t completed = 0;  // completed phases
  void init(int count) { expected = pending = count; }
  void maybe_complete() {
    if (pending == 0 && tx == 0) {
      ++completed;
      pending = expected;
    }
  }
  void arrive() {
    ASSERT_GT(pending, 0);
    --pending;
    maybe_complete();
  }
  void expect_tx(int bytes) { tx += bytes; }
  void complete_tx(int bytes) {
    tx -= bytes;
    maybe_complete();
  }
  // try_wait.parity(p): the phase with parity p has completed, i.e. the current phase's parity is not p.
  bool try_wait(uint32_t parity) const { return (completed & 1u) != parity; }
};

TEST(GemmFp8Pipeline, ProducerAndConsumersAgreeUnderRandomInterleavings) {
  std::mt19937 rng(11);
  for (int stages : {fp8::stages_for(128), fp8::stages_for(192), 2}) {
    for (int k_blocks : {1, 2, 5, 13}) {
      for (int trial = 0; trial < 20; ++trial) {
        const int tiles = 1 + static_cast<int>(rng() % 4);
        const int total = tiles * k_blocks;
        std::vector<Barrier> full(static_cast<size_t>(stages)), empty(static_cast<size_t>(stages));
        for (auto& b : full) b.init(1);
        for (auto& b : empty) b.init(fp8::kEmptyArrivals);
        std::vector<int> content(static_cast<size_t>(stages), -1), readers(static_cast<size_t>(stages), 0);
        struct Pending {
          int stage, item;
        };
        std::vector<Pending> in_flight;  // TMA copies issued, not yet landed
        fp8::PipeState prod;
        int produced = 0;
        std::vector<fp8::PipeState> cons(fp8::kEmptyArrivals);
        std::vector<int> consumed(fp8::kEmptyArrivals, 0), epilogues(fp8::kEmptyArrivals, 0);
        std::vector<uint32_t> scale_phase(fp8::kEmptyArrivals, 0);
        Barrier scale_full, scale_empty;
        scale_full.init(32);
        scale_empty.init(fp8::kEmptyArrivals);
        int loaded = 0, scale_tag = -1, scale_readers = 0;
        uint32_t loader_phase = 0;
        // A consumer warp whose main loop has finished tile t (and not yet its epilogue) is in its epilogue.
        auto in_epilogue = [&](int w) {
          return consumed[static_cast<size_t>(w)] / k_blocks > epilogues[static_cast<size_t>(w)];
        };
        int steps = 0;
        while (true) {
          // 0: producer, 1: TMA lands, 2: scale loader, 3 + w: consumer warp w
          std::vector<int> runnable;
          if (produced < total && empty[prod.stage].try_wait(prod.phase ^ 1u)) runnable.push_back(0);
          if (!in_flight.empty()) runnable.push_back(1);
          if (loaded < tiles && scale_empty.try_wait(loader_phase ^ 1u)) runnable.push_back(2);
          for (int w = 0; w < fp8::kEmptyArrivals; ++w) {
            const bool ready = in_epilogue(w) ? scale_full.try_wait(scale_phase[static_cast<size_t>(w)])
                                              : consumed[static_cast<size_t>(w)] < total &&
                                                    full[cons[w].stage].try_wait(cons[w].phase);
            if (ready) runnable.push_back(3 + w);
          }
          if (runnable.empty()) break;
          ASSERT_LT(++steps, 100000);
          const int pick = runnable[rng() % runnable.size()];
          if (pick == 2) {
            ASSERT_EQ(scale_readers, 0) << "the scale loader overwrote a slot still being read";
            scale_tag = loaded++;
            scale_readers = fp8::kEmptyArrivals;
            for (int lane = 0; lane < 32; ++lane) scale_full.arrive();
            loader_phase ^= 1u;
          } else if (pick >= 3 && in_epilogue(pick - 3)) {
            const size_t w = static_cast<size_t>(pick - 3);
            ASSERT_EQ(scale_tag, epilogues[w]) << "consumer warp " << w << " read another tile's scales";
            --scale_readers;
            scale_empty.arrive();
            scale_phase[w] ^= 1u;
            ++epilogues[w];
          } else if (pick == 0) {
            // arrive.expect_tx raises the expected bytes and arrives in one step, before the copies are issued.
            full[prod.stage].expect_tx(1);
            full[prod.stage].arrive();
            in_flight.push_back({static_cast<int>(prod.stage), produced++});
            fp8::advance(prod, stages);
          } else if (pick == 1) {
            const size_t i = rng() % in_flight.size();
            const Pending p = in_flight[i];
            in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
            ASSERT_EQ(readers[static_cast<size_t>(p.stage)], 0) << "TMA overwrote a stage still being read";
            content[static_cast<size_t>(p.stage)] = p.item;
            readers[static_cast<size_t>(p.stage)] = fp8::kEmptyArrivals;
            full[static_cast<size_t>(p.stage)].complete_tx(1);
          } else {
            const int w = pick - 3;
            const size_t s = cons[w].stage;
            ASSERT_EQ(content[s], consumed[static_cast<size_t>(w)]) << "consumer warp " << w << " read a wrong stage";
            --readers[s];
            empty[s].arrive();
            ++consumed[static_cast<size_t>(w)];
            fp8::advance(cons[w], stages);
          }
        }
        EXPECT_EQ(produced, total) << "deadlock: stages " << stages << " k_blocks " << k_blocks;
        EXPECT_EQ(loaded, tiles) << "deadlock: stages " << stages << " k_blocks " << k_blocks;
        for (int c : consumed) EXPECT_EQ(c, total) << "deadlock: stages " << stages << " k_blocks " << k_blocks;
        for (int e : epilogues) EXPECT_EQ(e, tiles) << "deadlock: stages " << stages << " k_blocks " << k_blocks;
      }
    }
  }
}

TEST(GemmFp8Heuristics, ConfigsAreLaunchableAndAvoidHalfEmptyWaves) {
  const fp8::DeviceLimits h200;
  struct NK {
    int N, K;
  };
  const NK shapes[] = {{6144, 4096},  {4096, 4096}, {28672, 4096}, {4096, 14336}, {10240, 8192},
                       {8192, 8192},  {57344, 8192}, {8192, 28672}, {8, 128},     {1000, 384}};
  for (const NK& s : shapes) {
    for (int M : {1, 17, 128, 129, 512, 2048, 8192, 16384}) {
      const fp8::Config c = fp8::choose_config(M, s.N, s.K, h200);
      SCOPED_TRACE(fp8::describe_config(c, M, s.N, s.K, h200));
      ASSERT_TRUE(c.block_n == 128 || c.block_n == 192);
      ASSERT_EQ(c.stages, fp8::stages_for(c.block_n));
      ASSERT_LE(static_cast<int64_t>(fp8::smem_layout(c.block_n, c.stages).alloc_bytes), h200.smem_per_block);
      ASSERT_EQ(c.m_blocks, (M + 127) / 128);
      ASSERT_EQ(c.n_blocks, (s.N + c.block_n - 1) / c.block_n);
      ASSERT_GE(c.grid, 1);
      ASSERT_LE(c.grid, h200.sm_count);
      ASSERT_LE(c.grid, c.m_blocks * c.n_blocks);
    }
  }
  // Llama-3.1-8B qkv at M = 512: 192 tiles of 128 x 128 would leave the second wave half empty.
  EXPECT_EQ(fp8::choose_config(512, 6144, 4096, h200).block_n, 192);
  EXPECT_EQ(fp8::choose_config(2048, 4096, 4096, h200).block_n, 128);
  EXPECT_EQ(fp8::choose_config(2048, 4096, 4096, h200, 192).block_n, 192);  // forced
  EXPECT_EQ(fp8::choose_config(512, 6144, 4096, h200, 128).block_n, 128);
  EXPECT_EQ(fp8::choose_config(512, 6144, 4096, h200, 100).block_n, 192);  // not a tile: ignored
}

}  // namespace
