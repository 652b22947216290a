// Per-kernel GPU timeline through the CUPTI Activity API: KernelTrace::start(), run something, stop() returns every
// kernel that ran in between (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which keeps kernels concurrent and records the
// kernels of CUDA graph replays, each with its graph and graph node), sorted by start time. split_graph_replays()
// cuts the records of repeated launches of one graph into one kernel list per replay, and make_timeline() describes
// one replay: each kernel's offset, duration and gap to the end of the kernel before it — negative under
// programmatic dependent launch, where a kernel starts while its predecessor's last CTAs still run.
//
// Header-only because CMake builds every bench/*.cu as its own executable. The CUPTI part needs FT_HAVE_CUPTI=1
// (CMake defines it and links CUDA::cupti where FindCUDAToolkit finds CUPTI); without it KernelTrace::available()
// is false and start() throws. Everything else is plain C++ and compiles without CUDA.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#if FT_HAVE_CUPTI
#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <cstdlib>
#include <mutex>
#endif

namespace futransformer::bench {

struct KernelRecord {
  std::string name;  // demangled (CUPTI's name as is when it is not a mangled C++ name)
  uint64_t start_ns = 0, end_ns = 0;  // CUPTI timestamps
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  int registers = 0;                      // per thread
  int static_smem = 0, dynamic_smem = 0;  // bytes per CTA
  uint32_t graph_id = 0;                  // 0: not launched from a CUDA graph
  uint64_t graph_node_id = 0;             // 0: not launched from a CUDA graph
  uint32_t correlation_id = 0, stream_id = 0, device_id = 0;
  double duration_us() const { return static_cast<double>(end_ns - start_ns) * 1e-3; }
};

inline constexpr const char* kNoCuptiReason =
    "this build has no CUPTI: CMake found no CUDA::cupti target (FindCUDAToolkit), so the bench was built without "
    "FT_HAVE_CUPTI; rebuild with a CUDA toolkit that ships CUPTI (include/cupti.h, lib64/libcupti.so)";

#if FT_HAVE_CUPTI
namespace kernel_trace_detail {

// CUPTI owns the record stream; these callbacks run on CUPTI's worker thread or inside cuptiActivityFlushAll, so
// they share one process-wide state under a mutex and report failures through it (they cannot throw).
struct State {
  std::mutex mu;
  std::vector<KernelRecord> records;
  std::string error;  // the first failure seen inside a callback
  size_t dropped = 0, incomplete = 0;
  bool registered = false, active = false;
};
inline State& state() {
  static State s;
  return s;
}

// 8 MB holds ~30 000 kernel records; CUPTI asks for another buffer when one fills, so the size bounds only the
// number of buffer round trips. CUPTI needs buffers aligned to 8 bytes.
inline constexpr size_t kBufferBytes = size_t{8} << 20;
inline constexpr size_t kBufferAlign = 8;

inline std::string cupti_error(const char* call, CUptiResult r) {
  const char* text = nullptr;
  if (cuptiGetResultString(r, &text) != CUPTI_SUCCESS || text == nullptr) text = "unknown CUPTI result";
  return std::string(call) + " failed: " + text + " (CUptiResult " + std::to_string(static_cast<int>(r)) + ")";
}

inline void check(CUptiResult r, const char* call) {
  if (r != CUPTI_SUCCESS) throw std::runtime_error(cupti_error(call, r));
}

inline std::string demangle(const char* name) {
  if (name == nullptr) return "(unnamed kernel)";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? std::string(d) : std::string(name);
  std::free(d);
  return out;
}

inline void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;  // a null buffer makes CUPTI drop records; counted as dropped
  *max_records = 0;                               // as many as fit
}

inline void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t,
                                      size_t valid_bytes) {
  std::vector<KernelRecord> got;
  std::string error;
  size_t incomplete = 0;
  CUpti_Activity* rec = nullptr;
  while (buffer != nullptr && valid_bytes > 0) {
    const CUptiResult r = cuptiActivityGetNextRecord(buffer, valid_bytes, &rec);
    if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // end of the buffer
    if (r != CUPTI_SUCCESS) {
      error = cupti_error("cuptiActivityGetNextRecord", r);
      break;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    // The kernel record of this CUPTI (cupti_activity.h names the current version for both kernel kinds).
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    if (k->end <= k->start) {  // 0/0: CUPTI could not collect the timestamps
      ++incomplete;
      continue;
    }
    KernelRecord o;
    o.name = demangle(k->name);
    o.start_ns = k->start;
    o.end_ns = k->end;
    o.grid[0] = k->gridX, o.grid[1] = k->gridY, o.grid[2] = k->gridZ;
    o.block[0] = k->blockX, o.block[1] = k->blockY, o.block[2] = k->blockZ;
    o.registers = k->registersPerThread;
    o.static_smem = k->staticSharedMemory;
    o.dynamic_smem = k->dynamicSharedMemory;
    o.graph_id = k->graphId;
    o.graph_node_id = k->graphNodeId;
    o.correlation_id = k->correlationId;
    o.stream_id = k->streamId;
    o.device_id = k->deviceId;
    got.push_back(std::move(o));
  }
  size_t dropped = 0;
  const CUptiResult dr = cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped);
  if (dr != CUPTI_SUCCESS && error.empty()) error = cupti_error("cuptiActivityGetNumDroppedRecords", dr);
  std::free(buffer);
  State& s = state();
  const std::lock_guard<std::mutex> lock(s.mu);
  s.records.insert(s.records.end(), std::make_move_iterator(got.begin()), std::make_move_iterator(got.end()));
  if (s.error.empty()) s.error = error;
  s.dropped += dropped;
  s.incomplete += incomplete;
}

}  // namespace kernel_trace_detail
#endif

// One tracing window at a time per process (CUPTI's activity state is global). start() registers the buffer
// callbacks on first use and enables kernel records; stop() waits for the device, flushes every buffer, disables
// kernel records again and returns the kernels sorted by start. CUPTI is never finalised, so a process can open
// many windows. Every CUPTI failure is a std::runtime_error naming the call and CUPTI's result string.
class KernelTrace {
 public:
  static bool available() {
#if FT_HAVE_CUPTI
    return true;
#else
    return false;
#endif
  }

  KernelTrace() = default;
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;
  // A window left open (an exception between start() and stop()) is closed without reporting.
  ~KernelTrace() {
#if FT_HAVE_CUPTI
    if (active_) {
      cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
      cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
      kernel_trace_detail::state().active = false;
    }
#endif
  }

  void start() {
#if FT_HAVE_CUPTI
    using namespace kernel_trace_detail;
    State& s = state();
    if (s.active) throw std::runtime_error("KernelTrace::start: another trace window is open");
    if (!s.registered) {
      check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
      s.registered = true;
    }
    {
      const std::lock_guard<std::mutex> lock(s.mu);
      s.records.clear();
      s.error.clear();
      s.dropped = s.incomplete = 0;
    }
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
          "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)");
    s.active = active_ = true;
#else
    throw std::runtime_error(kNoCuptiReason);
#endif
  }

  std::vector<KernelRecord> stop() {
#if FT_HAVE_CUPTI
    using namespace kernel_trace_detail;
    if (!active_) throw std::runtime_error("KernelTrace::stop without start");
    State& s = state();
    // cuptiActivityFlushAll does not wait for the device: a kernel still running would come back without its end.
    const cudaError_t sync = cudaDeviceSynchronize();
    const CUptiResult flushed = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    const CUptiResult disabled = cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    s.active = active_ = false;
    if (sync != cudaSuccess)
      throw std::runtime_error(std::string("KernelTrace::stop: cudaDeviceSynchronize failed: ") +
                               cudaGetErrorString(sync));
    check(flushed, "cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)");
    check(disabled, "cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)");
    std::vector<KernelRecord> out;
    {
      const std::lock_guard<std::mutex> lock(s.mu);
      if (!s.error.empty()) throw std::runtime_error(s.error);
      out.swap(s.records);
      dropped_ = s.dropped;
      incomplete_ = s.incomplete;
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
    return out;
#else
    throw std::runtime_error(kNoCuptiReason);
#endif
  }

  // Of the last window: records CUPTI dropped (no buffer), and kernel records without timestamps (left out).
  size_t dropped() const { return dropped_; }
  size_t incomplete() const { return incomplete_; }

 private:
  bool active_ = false;
  size_t dropped_ = 0, incomplete_ = 0;
};

// ---- Analysis of a trace (plain C++) ----

// The replays of one CUDA graph in a trace. The graph is the one with the most kernel records; kernels launched
// outside any graph (an eager warm-up pass) and those of other graphs are left out. Cutting: records in start order,
// a replay ends where a graph node repeats — every replay runs each kernel node exactly once, so the first node seen
// twice opens the next replay. This needs no replay count, no timing threshold and no correlation ids (CUPTI 13.0
// gives graph launches wrong correlation ids in tracing windows after the first; fixed in 13.1 Update 1), but it
// assumes replays do not overlap in time (the caller synchronises between launches). Where CUPTI reports no node
// ids, kernels are grouped by correlation id instead (one per graph launch). Replays whose kernel count differs from
// the most common count (a window that cut one short) are left out.
struct ReplaySplit {
  std::vector<std::vector<KernelRecord>> replays;  // complete replays in launch order
  uint32_t graph_id = 0;
  size_t kernels_per_replay = 0;
  size_t outside_graphs = 0, other_graphs = 0, partial = 0;  // kernel records left out, by reason
  std::string method;                                        // "graph node repeat" or "correlation id"
};

inline ReplaySplit split_graph_replays(const std::vector<KernelRecord>& sorted) {
  ReplaySplit out;
  std::map<uint32_t, size_t> per_graph;
  for (const KernelRecord& r : sorted) {
    if (r.graph_id == 0) ++out.outside_graphs;
    else ++per_graph[r.graph_id];
  }
  if (per_graph.empty()) return out;
  size_t most = 0;
  for (const auto& [g, n] : per_graph)
    if (n > most) most = n, out.graph_id = g;
  out.other_graphs = sorted.size() - out.outside_graphs - most;
  std::vector<const KernelRecord*> g;
  bool all_nodes = true;
  for (const KernelRecord& r : sorted)
    if (r.graph_id == out.graph_id) {
      g.push_back(&r);
      all_nodes = all_nodes && r.graph_node_id != 0;
    }
  std::vector<std::vector<KernelRecord>> cut;
  if (all_nodes) {
    out.method = "graph node repeat";
    std::vector<uint64_t> seen;  // node ids of the open replay
    for (const KernelRecord* r : g) {
      if (cut.empty() || std::find(seen.begin(), seen.end(), r->graph_node_id) != seen.end()) {
        cut.emplace_back();
        seen.clear();
      }
      seen.push_back(r->graph_node_id);
      cut.back().push_back(*r);
    }
  } else {
    out.method = "correlation id";
    std::map<uint32_t, size_t> index;  // correlation id -> replay, in order of first kernel
    for (const KernelRecord* r : g) {
      auto [it, fresh] = index.emplace(r->correlation_id, cut.size());
      if (fresh) cut.emplace_back();
      cut[it->second].push_back(*r);
    }
  }
  std::map<size_t, size_t> sizes;  // kernels per replay -> replays
  for (const auto& c : cut) ++sizes[c.size()];
  size_t best = 0;
  for (const auto& [n, count] : sizes)
    if (count > best || (count == best && n > out.kernels_per_replay)) best = count, out.kernels_per_replay = n;
  for (auto& c : cut) {
    if (c.size() == out.kernels_per_replay) out.replays.push_back(std::move(c));
    else out.partial += c.size();
  }
  return out;
}

inline double replay_span_us(const std::vector<KernelRecord>& k) {
  if (k.empty()) return 0;
  uint64_t end = 0;
  for (const KernelRecord& r : k) end = std::max(end, r.end_ns);
  return static_cast<double>(end - k.front().start_ns) * 1e-3;
}

// The index of the median replay by span (the lower median for an even count, so it is a replay that ran).
inline size_t median_replay(const std::vector<std::vector<KernelRecord>>& replays) {
  std::vector<size_t> order(replays.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return replay_span_us(replays[a]) < replay_span_us(replays[b]); });
  return order.empty() ? 0 : order[(order.size() - 1) / 2];
}

// "void ns::(anonymous namespace)::kern<128, true>(Params)" -> "kern<128, true>": no return type, no parameter
// list, no namespaces before the kernel's name; template arguments kept, the whole cut to max_chars.
inline std::string short_kernel_name(const std::string& demangled, size_t max_chars = 70) {
  std::string s = demangled;
  if (!s.empty() && s.back() == ')') {  // drop the parameter list: the '(' matching the last ')'
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      else if (s[i] == '(' && --depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  for (size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  const size_t qual = s.rfind("::", s.find('<'));  // the last qualifier before the template arguments
  if (qual != std::string::npos) s.erase(0, qual + 2);
  if (s.size() > max_chars && max_chars > 3) s = s.substr(0, max_chars - 3) + "...";
  return s;
}

// The kernels of the last of `passes` identical host-launched passes traced in one window (bench_prefill --trace:
// CUPTI's first launches after start() delay the first pass's kernels by milliseconds, so a second pass is the one
// to read). The records are sorted by start and cut into `passes` equal runs; every run must launch the same kernels
// in the same order (name, grid, block), else nullopt with the reason in *why.
inline std::optional<std::vector<KernelRecord>> last_of_identical_passes(std::vector<KernelRecord> records,
                                                                         size_t passes, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<std::vector<KernelRecord>> {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (passes == 0) return fail("no passes");
  if (records.empty() || records.size() % passes != 0)
    return fail(std::to_string(records.size()) + " kernel records for " + std::to_string(passes) +
                " identical passes (expected a positive multiple)");
  std::stable_sort(records.begin(), records.end(),
                   [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  const size_t n = records.size() / passes;
  for (size_t p = 1; p < passes; ++p)
    for (size_t i = 0; i < n; ++i) {
      const KernelRecord &a = records[i], &b = records[p * n + i];
      if (a.name != b.name || !std::equal(a.grid, a.grid + 3, b.grid) || !std::equal(a.block, a.block + 3, b.block))
        return fail("pass " + std::to_string(p) + " differs from pass 0 at kernel " + std::to_string(i) + " (" +
                    a.name + " against " + b.name + ")");
    }
  records.erase(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(n * (passes - 1)));
  return records;
}

// One replay as a timeline: offsets from its first kernel's start; gap = this kernel's start − the previous
// kernel's end (negative: it started before the previous one ended, i.e. programmatic dependent launch overlap).
struct Timeline {
  struct Name {
    std::string name;  // short_kernel_name without the length cut (the grouping key)
    size_t count = 0;
    double total_us = 0;
  };
  std::vector<KernelRecord> kernels;  // start order
  std::vector<double> offset_us, gap_us;
  // How far each kernel's end moves the replay's end past every earlier kernel's (0 when it ends inside them): under
  // programmatic launch a kernel starts early and waits, so its duration over-counts; this is what it costs the
  // step, and the values add up to span_us.
  std::vector<double> extends_us;
  double span_us = 0;              // first start -> last end
  double sum_duration_us = 0;      // over-counts overlap
  double sum_positive_gap_us = 0;  // time between consecutive kernels
  double busy_us = 0;              // union of the kernels' intervals: span − busy is time no kernel ran
  std::vector<Name> by_name;       // by descending total
};

inline Timeline make_timeline(std::vector<KernelRecord> kernels) {
  Timeline t;
  std::stable_sort(kernels.begin(), kernels.end(),
                   [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  t.kernels = std::move(kernels);
  if (t.kernels.empty()) return t;
  const uint64_t t0 = t.kernels.front().start_ns;
  uint64_t frontier = t0;  // latest end so far (for the union)
  std::map<std::string, size_t> name_index;
  for (size_t i = 0; i < t.kernels.size(); ++i) {
    const KernelRecord& k = t.kernels[i];
    t.offset_us.push_back(static_cast<double>(k.start_ns - t0) * 1e-3);
    const double gap = i == 0 ? 0.0
                              : (static_cast<double>(k.start_ns) - static_cast<double>(t.kernels[i - 1].end_ns)) * 1e-3;
    t.gap_us.push_back(gap);
    t.sum_positive_gap_us += std::max(0.0, gap);
    t.sum_duration_us += k.duration_us();
    const uint64_t from = std::max(frontier, k.start_ns);
    if (k.end_ns > from) t.busy_us += static_cast<double>(k.end_ns - from) * 1e-3;
    t.extends_us.push_back(k.end_ns > frontier ? static_cast<double>(k.end_ns - frontier) * 1e-3 : 0.0);
    frontier = std::max(frontier, k.end_ns);
    const std::string key = short_kernel_name(k.name, std::string::npos);
    auto [it, fresh] = name_index.emplace(key, t.by_name.size());
    if (fresh) t.by_name.push_back({key, 0, 0.0});
    ++t.by_name[it->second].count;
    t.by_name[it->second].total_us += k.duration_us();
  }
  t.span_us = static_cast<double>(frontier - t0) * 1e-3;
  std::stable_sort(t.by_name.begin(), t.by_name.end(),
                   [](const Timeline::Name& a, const Timeline::Name& b) { return a.total_us > b.total_us; });
  return t;
}

// Where a replay of an L-layer model repeats one layer's kernel sequence: kernels [first, first + period·repeats)
// are `repeats` copies of the sequence [first, first + period), kernels compared by name, grid and block. The
// longest period that repeats `layers` times wins (a shorter one would only match a layer that is itself periodic),
// at its earliest start; positions are then in the order of that first copy. nullopt when no period fits.
struct LayerPattern {
  size_t first = 0, period = 0, repeats = 0;
};

inline std::optional<LayerPattern> find_layer_pattern(const Timeline& t, size_t layers) {
  const size_t n = t.kernels.size();
  if (layers < 2 || n < layers) return std::nullopt;
  auto same = [&](size_t a, size_t b) {
    const KernelRecord &x = t.kernels[a], &y = t.kernels[b];
    return x.name == y.name && std::equal(x.grid, x.grid + 3, y.grid) && std::equal(x.block, x.block + 3, y.block);
  };
  for (size_t p = n / layers; p >= 1; --p)
    for (size_t s = 0; s + p * layers <= n; ++s) {
      bool ok = true;
      for (size_t l = 1; l < layers && ok; ++l)
        for (size_t j = 0; j < p && ok; ++j) ok = same(s + j, s + l * p + j);
      if (ok) return LayerPattern{s, p, layers};
    }
  return std::nullopt;
}

inline std::string dims_text(const int32_t (&d)[3]) {
  return std::to_string(d[0]) + "x" + std::to_string(d[1]) + "x" + std::to_string(d[2]);
}

// The kernel table (when per_kernel) and the footer with span, sums and the per-name summary.
inline void print_timeline(const Timeline& t, const std::string& title, bool per_kernel) {
  std::printf("\nkernel timeline: %s (%zu kernels)\n", title.c_str(), t.kernels.size());
  if (per_kernel) {
    std::printf("| # | kernel | grid | block | regs | smem B | start µs | µs | gap µs | extends µs |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < t.kernels.size(); ++i) {
      const KernelRecord& k = t.kernels[i];
      std::printf("| %zu | %s | %s | %s | %d | %d | %.2f | %.2f | %.2f | %.2f |\n", i,
                  short_kernel_name(k.name).c_str(), dims_text(k.grid).c_str(), dims_text(k.block).c_str(),
                  k.registers, k.static_smem + k.dynamic_smem, t.offset_us[i], k.duration_us(), t.gap_us[i],
                  t.extends_us[i]);
    }
  }
  std::printf("span %.2f µs (first start -> last end) | sum of durations %.2f µs | sum of positive gaps %.2f µs | "
              "busy %.2f µs, idle %.2f µs (union of kernel intervals)\n",
              t.span_us, t.sum_duration_us, t.sum_positive_gap_us, t.busy_us, t.span_us - t.busy_us);
  std::printf("| kernel | count | total µs | share of span |\n|---|---|---|---|\n");
  for (const Timeline::Name& nm : t.by_name)
    std::printf("| %s | %zu | %.2f | %.1f%% |\n", short_kernel_name(nm.name).c_str(), nm.count, nm.total_us,
                t.span_us > 0 ? 100.0 * nm.total_us / t.span_us : 0.0);
}

// Per position of the repeated layer: the kernel, and its duration, gap and extension of the step's end averaged (and
// duration's min / max) over the layers.
inline void print_layer_positions(const Timeline& t, const LayerPattern& lp) {
  std::printf("per layer position (%zu layers of %zu kernels from kernel %zu; mean over layers)\n"
              "| pos | kernel | grid | mean µs | min µs | max µs | mean gap µs | mean extends µs |\n"
              "|---|---|---|---|---|---|---|---|\n",
              lp.repeats, lp.period, lp.first);
  double layer_total = 0;
  for (size_t j = 0; j < lp.period; ++j) {
    double sum = 0, gap = 0, ext = 0, lo = 1e30, hi = 0;
    for (size_t l = 0; l < lp.repeats; ++l) {
      const size_t i = lp.first + l * lp.period + j;
      const double us = t.kernels[i].duration_us();
      sum += us, gap += t.gap_us[i], ext += t.extends_us[i], lo = std::min(lo, us), hi = std::max(hi, us);
    }
    const double n = static_cast<double>(lp.repeats);
    layer_total += (sum + gap) / n;
    const KernelRecord& k = t.kernels[lp.first + j];
    std::printf("| %zu | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", j, short_kernel_name(k.name).c_str(),
                dims_text(k.grid).c_str(), sum / n, lo, hi, gap / n, ext / n);
  }
  std::printf("mean layer: %.2f µs (durations + gaps)\n", layer_total);
}

inline void json_string(FILE* f, const std::string& s) {
  std::fputc('"', f);
  for (const char c : s) {
    if (c == '"' || c == '\\') std::fputc('\\', f);
    if (static_cast<unsigned char>(c) >= 0x20) std::fputc(c, f);
  }
  std::fputc('"', f);
}

// The timeline's fields as JSON members (no braces): "span_us", sums, "kernels": [...], "by_name": [...].
inline void write_timeline_json(FILE* f, const Timeline& t) {
  std::fprintf(f, "\"span_us\": %.3f, \"sum_duration_us\": %.3f, \"sum_positive_gap_us\": %.3f, \"busy_us\": %.3f, ",
               t.span_us, t.sum_duration_us, t.sum_positive_gap_us, t.busy_us);
  std::fprintf(f, "\"kernels\": [");
  for (size_t i = 0; i < t.kernels.size(); ++i) {
    const KernelRecord& k = t.kernels[i];
    std::fprintf(f, "%s\n       {\"index\": %zu, \"name\": ", i ? "," : "", i);
    json_string(f, k.name);
    std::fprintf(f, ", \"short_name\": ");
    json_string(f, short_kernel_name(k.name));
    std::fprintf(f,
                 ", \"grid\": [%d, %d, %d], \"block\": [%d, %d, %d], \"registers\": %d, \"static_smem\": %d, "
                 "\"dynamic_smem\": %d, \"start_us\": %.3f, \"duration_us\": %.3f, \"gap_us\": %.3f, "
                 "\"extends_us\": %.3f, \"graph_id\": %u, \"graph_node_id\": %llu, \"correlation_id\": %u, "
                 "\"stream_id\": %u}",
                 k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2], k.registers, k.static_smem,
                 k.dynamic_smem, t.offset_us[i], k.duration_us(), t.gap_us[i], t.extends_us[i], k.graph_id,
                 static_cast<unsigned long long>(k.graph_node_id), k.correlation_id, k.stream_id);
  }
  std::fprintf(f, "],\n     \"by_name\": [");
  for (size_t i = 0; i < t.by_name.size(); ++i) {
    const Timeline::Name& nm = t.by_name[i];
    std::fprintf(f, "%s\n       {\"name\": ", i ? "," : "");
    json_string(f, nm.name);
    std::fprintf(f, ", \"count\": %zu, \"total_us\": %.3f, \"share_of_span\": %.4f}", nm.count, nm.total_us,
                 t.span_us > 0 ? nm.total_us / t.span_us : 0.0);
  }
  std::fprintf(f, "]");
}

}  // namespace futransformer::bench
