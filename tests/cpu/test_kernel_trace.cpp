// The analysis half of bench/kernel_trace.h (bench_decode_step / bench_prefill --trace) on made-up CUPTI records:
// cutting graph replays apart, the median replay, kernel names, the timeline's offsets / gaps / busy time, the
// repeating layer, and the last of several identical passes.
// The CUPTI half needs a GPU; this half decides what the printed tables and the JSON say.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../../bench/kernel_trace.h"

namespace {

using futransformer::bench::KernelRecord;
namespace kt = futransformer::bench;

KernelRecord rec(const std::string& name, uint64_t start_ns, uint64_t end_ns, uint32_t graph = 0, uint64_t node = 0,
                 uint32_t correlation = 0, int grid_x = 1) {
  KernelRecord r;
  r.name = name;
  r.start_ns = start_ns;
  r.end_ns = end_ns;
  r.graph_id = graph;
  r.graph_node_id = node;
  r.correlation_id = correlation;
  r.grid[0] = grid_x;
  r.grid[1] = r.grid[2] = 1;
  r.block[0] = 128;
  r.block[1] = r.block[2] = 1;
  return r;
}

// Three replays of graph 7 (nodes 1, 2, 3), the third cut short by the window, an eager kernel before them and one
// kernel of another graph in between.
std::vector<KernelRecord> three_replays() {
  std::vector<KernelRecord> v;
  v.push_back(rec("eager", 0, 500));
  uint64_t t = 1000;
  for (int r = 0; r < 3; ++r) {
    const int nodes = r == 2 ? 2 : 3;
    for (int n = 1; n <= nodes; ++n) {
      const uint64_t len = 100 + 10 * static_cast<uint64_t>(r);  // replay r is slower than r - 1
      v.push_back(rec("k" + std::to_string(n), t, t + len, 7, static_cast<uint64_t>(n), 100u + r));
      t += len + 5;
    }
    if (r == 0) v.push_back(rec("other", t, t + 50, 9, 1, 500));
    t += 1000;
  }
  return v;
}

TEST(KernelTraceAnalysis, SplitsReplaysWhereAGraphNodeRepeats) {
  const kt::ReplaySplit s = kt::split_graph_replays(three_replays());
  EXPECT_EQ(s.method, "graph node repeat");
  EXPECT_EQ(s.graph_id, 7u);
  EXPECT_EQ(s.kernels_per_replay, 3u);
  ASSERT_EQ(s.replays.size(), 2u);  // the cut-short third replay is left out
  EXPECT_EQ(s.partial, 2u);
  EXPECT_EQ(s.outside_graphs, 1u);
  EXPECT_EQ(s.other_graphs, 1u);
  for (const auto& r : s.replays) {
    ASSERT_EQ(r.size(), 3u);
    EXPECT_EQ(r[0].name, "k1");
    EXPECT_EQ(r[2].name, "k3");
  }
  EXPECT_LT(s.replays[0].front().start_ns, s.replays[1].front().start_ns);
}

TEST(KernelTraceAnalysis, FallsBackToCorrelationIdsWithoutNodeIds) {
  std::vector<KernelRecord> v = three_replays();
  for (KernelRecord& r : v)
    if (r.graph_id == 7) r.graph_node_id = 0;
  const kt::ReplaySplit s = kt::split_graph_replays(v);
  EXPECT_EQ(s.method, "correlation id");
  ASSERT_EQ(s.replays.size(), 2u);
  EXPECT_EQ(s.replays[1].front().correlation_id, 101u);
}

TEST(KernelTraceAnalysis, NoGraphNoReplays) {
  const kt::ReplaySplit s = kt::split_graph_replays({rec("a", 0, 10), rec("b", 20, 30)});
  EXPECT_TRUE(s.replays.empty());
  EXPECT_EQ(s.outside_graphs, 2u);
}

TEST(KernelTraceAnalysis, MedianReplayBySpan) {
  std::vector<std::vector<KernelRecord>> replays = {
      {rec("a", 0, 300)}, {rec("a", 1000, 1100)}, {rec("a", 2000, 2200)}, {rec("a", 3000, 3400)}};
  // Spans 300, 100, 200, 400 ns: the lower median of four is the 200 ns one.
  EXPECT_EQ(kt::median_replay(replays), 2u);
  replays.pop_back();  // 300, 100, 200: the middle one is 200 again
  EXPECT_EQ(kt::median_replay(replays), 2u);
  EXPECT_DOUBLE_EQ(kt::replay_span_us(replays[0]), 0.3);
}

TEST(KernelTraceAnalysis, ShortKernelNames) {
  EXPECT_EQ(kt::short_kernel_name("void futransformer::cuda::w4a16::gemm_w4a16_v4_kernel<1, 1, true, 28, 8, false>"
                                  "(futransformer::cuda::w4a16::KernelArgs)"),
            "gemm_w4a16_v4_kernel<1, 1, true, 28, 8, false>");
  EXPECT_EQ(kt::short_kernel_name("void ops::(anonymous namespace)::rotate_heads_vec_kernel<8>(const int *, int)"),
            "rotate_heads_vec_kernel<8>");
  EXPECT_EQ(kt::short_kernel_name("nvjet_sm90_tss_64x8"), "nvjet_sm90_tss_64x8");
  const std::string cut = kt::short_kernel_name("void k<" + std::string(100, 'x') + ">(int)", 20);
  EXPECT_EQ(cut.size(), 20u);
  EXPECT_EQ(cut.substr(17), "...");
}

TEST(KernelTraceAnalysis, TimelineGapsOverlapAndBusyTime) {
  // a: 0..100, b starts inside a (programmatic launch) 60..200, c after a 50 ns hole 250..300.
  const kt::Timeline t = kt::make_timeline({rec("c", 250, 300), rec("a", 0, 100), rec("b", 60, 200)});
  ASSERT_EQ(t.kernels.size(), 3u);
  EXPECT_EQ(t.kernels[0].name, "a");
  EXPECT_EQ(t.kernels[1].name, "b");
  EXPECT_DOUBLE_EQ(t.offset_us[2], 0.25);
  EXPECT_DOUBLE_EQ(t.gap_us[0], 0.0);
  EXPECT_DOUBLE_EQ(t.gap_us[1], -0.04);  // b started 40 ns before a ended
  EXPECT_DOUBLE_EQ(t.gap_us[2], 0.05);
  EXPECT_DOUBLE_EQ(t.sum_positive_gap_us, 0.05);
  EXPECT_DOUBLE_EQ(t.span_us, 0.3);
  EXPECT_DOUBLE_EQ(t.sum_duration_us, 0.1 + 0.14 + 0.05);
  EXPECT_DOUBLE_EQ(t.busy_us, 0.25);  // the union 0..200 and 250..300
  // What each kernel adds to the end: a its 100 ns, b the 100 ns past a's end, c 100 ns past b's (hole included).
  ASSERT_EQ(t.extends_us.size(), 3u);
  EXPECT_DOUBLE_EQ(t.extends_us[0], 0.1);
  EXPECT_DOUBLE_EQ(t.extends_us[1], 0.1);
  EXPECT_DOUBLE_EQ(t.extends_us[2], 0.1);
  // A kernel that ends inside an earlier one extends nothing; the extensions always add up to the span.
  const kt::Timeline inner = kt::make_timeline({rec("long", 0, 500), rec("short", 100, 200), rec("tail", 150, 650)});
  EXPECT_DOUBLE_EQ(inner.extends_us[1], 0.0);
  EXPECT_DOUBLE_EQ(inner.extends_us[2], 0.15);
  EXPECT_DOUBLE_EQ(inner.extends_us[0] + inner.extends_us[1] + inner.extends_us[2], inner.span_us);
  ASSERT_EQ(t.by_name.size(), 3u);
  EXPECT_EQ(t.by_name[0].name, "b");  // by descending total time
}

TEST(KernelTraceAnalysis, FindsTheRepeatingLayer) {
  // An embedding, three layers of (norm, gemm, gemm with another grid), then a head.
  std::vector<KernelRecord> v;
  uint64_t t = 0;
  auto add = [&](const std::string& n, int grid) {
    v.push_back(rec(n, t, t + 10, 1, v.size() + 1, 1, grid));
    t += 20;
  };
  add("embed", 1);
  for (int l = 0; l < 3; ++l) {
    add("norm", 1);
    add("gemm", 128);
    add("gemm", 224);
  }
  add("head", 4);
  const kt::Timeline tl = kt::make_timeline(v);
  const auto lp = kt::find_layer_pattern(tl, 3);
  ASSERT_TRUE(lp.has_value());
  EXPECT_EQ(lp->first, 1u);
  EXPECT_EQ(lp->period, 3u);
  EXPECT_EQ(lp->repeats, 3u);
  EXPECT_FALSE(kt::find_layer_pattern(tl, 4).has_value());  // no sequence repeats four times
  EXPECT_FALSE(kt::find_layer_pattern(tl, 1).has_value());  // one layer: nothing to find
}

// bench_prefill --trace: two passes of the same kernels in one window, the first delayed by CUPTI's start-up;
// the records arrive out of order. The second pass's kernels come back in start order, and a window whose passes
// differ (a kernel missing, another grid) or whose count does not divide is refused with a reason.
TEST(KernelTraceAnalysis, LastOfIdenticalPasses) {
  std::vector<KernelRecord> v;
  uint64_t t = 5'000'000;  // the first pass starts late
  for (int pass = 0; pass < 2; ++pass) {
    for (int k = 0; k < 3; ++k) {
      v.push_back(rec("k" + std::to_string(k), t, t + 100, 0, 0, 0, 10 + k));
      t += 200;
    }
    t += 1000;
  }
  std::vector<KernelRecord> shuffled = {v[4], v[1], v[5], v[0], v[3], v[2]};
  std::string why;
  const auto last = kt::last_of_identical_passes(shuffled, 2, &why);
  ASSERT_TRUE(last.has_value()) << why;
  ASSERT_EQ(last->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*last)[i].start_ns, v[3 + i].start_ns);
    EXPECT_EQ((*last)[i].name, "k" + std::to_string(i));
  }
  const auto one = kt::last_of_identical_passes(v, 1, &why);  // one pass: everything, sorted
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->size(), 6u);

  EXPECT_FALSE(kt::last_of_identical_passes({v[0], v[1], v[2], v[3], v[4]}, 2, &why).has_value());
  EXPECT_NE(why.find("5 kernel records for 2 identical passes"), std::string::npos) << why;
  std::vector<KernelRecord> other_grid = v;
  other_grid[4].grid[0] = 99;
  EXPECT_FALSE(kt::last_of_identical_passes(other_grid, 2, &why).has_value());
  EXPECT_NE(why.find("pass 1 differs from pass 0 at kernel 1"), std::string::npos) << why;
  std::vector<KernelRecord> other_name = v;
  other_name[3].name = "k9";
  EXPECT_FALSE(kt::last_of_identical_passes(other_name, 2, &why).has_value());
  EXPECT_NE(why.find("at kernel 0 (k0 against k9)"), std::string::npos) << why;
  EXPECT_FALSE(kt::last_of_identical_passes({}, 2, &why).has_value());
  EXPECT_FALSE(kt::last_of_identical_passes(v, 0, &why).has_value());
}

}  // namespace
