// scripts/sweep_decode_tilings.sh (the in-step A/B of decode settings for GPU sessions) against a stand-in for
// bench_decode_step: a shell script that writes that bench's JSON rows with graph times set by its environment. The
// sweep must alternate defaults and candidate runs, pass each candidate's assignments to the bench, read only the
// step rows, and tabulate both sides and the change of their medians; bad arguments end with exit code 2 and one
// line naming the problem.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "cli_runner.h"
#include "test_paths.h"

namespace {

using futransformer::test::quote;
using futransformer::test::slurp;

// The stand-in bench: step rows of 2000 µs x batch (1900 with FT_W4A16_TUNED_EXTRA set, 2100 with FT_SLOWER=1), and
// block rows of 1 µs that the sweep must ignore. It also records each run's FT_W4A16_TUNED_EXTRA in calls.txt.
std::string write_stand_in(const std::string& dir) {
  const std::string path = dir + "/bench";
  std::ofstream f(path);
  f << R"(#!/usr/bin/env bash
while (($#)); do case "$1" in --json) json="$2"; shift;; --batches) batches="$2"; shift;; --configs) config="$2"; shift;; esac; shift; done
v=2000
[ -n "${FT_W4A16_TUNED_EXTRA:-}" ] && v=1900
[ "${FT_SLOWER:-}" = 1 ] && v=2100
echo "${FT_W4A16_TUNED_EXTRA:-none}" >> "$(dirname "$0")/calls.txt"
rows=""
for b in ${batches//,/ }; do
  rows="$rows{\"shape\": \"$config step\", \"batch\": $b, \"graph_us\": $((v * b)).0},"
  rows="$rows{\"shape\": \"$config block\", \"batch\": $b, \"graph_us\": 1.0},"
done
printf '{"rows": [%s]}\n' "${rows%,}" > "$json"
)";
  f.close();
  chmod(path.c_str(), 0755);
  return path;
}

struct SweepResult {
  int exit_code;
  std::string err;
};

SweepResult sweep(const std::string& bench, const std::string& args) {
  const std::string dir = futransformer::test::make_temp_dir("sweep-run");
  const std::string cmd = "FT_SWEEP_BENCH=" + quote(bench) + " bash " +
                          quote(futransformer::test::source_path("scripts/sweep_decode_tilings.sh")) + " " + args +
                          " >" + dir + "/out 2>" + dir + "/err";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir + "/err")};
}

TEST(SweepDecodeTilingsScript, AlternatesRunsAndTabulatesTheStepRows) {
  const std::string dir = futransformer::test::make_temp_dir("sweep");
  const std::string bench = write_stand_in(dir), out = dir + "/out";
  const SweepResult r = sweep(bench, "/no-build " + quote(out) +
                                 " --pairs 2 --batches 1,8 'fast=FT_W4A16_TUNED_EXTRA=6144:4096:1:2:24:8:0:0:0' "
                                 "'slow=FT_SLOWER=1 FT_ATTN_DECODE_SPLITS=4'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string table = slurp(out + "/sweep.md");
  EXPECT_NE(table.find("| fast (`FT_W4A16_TUNED_EXTRA=6144:4096:1:2:24:8:0:0:0`) | 1 | 2000.0, 2000.0 | 1900.0, "
                       "1900.0 | -5.0 % |"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| fast (`FT_W4A16_TUNED_EXTRA=6144:4096:1:2:24:8:0:0:0`) | 8 | 16000.0, 16000.0 | "
                       "15200.0, 15200.0 | -5.0 % |"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| slow (`FT_SLOWER=1 FT_ATTN_DECODE_SPLITS=4`) | 1 | 2000.0, 2000.0 | 2100.0, 2100.0 | +5.0 % |"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("| 1.0"), std::string::npos) << "a block row was read as a step row:\n" << table;
  // Defaults and candidate alternate, pair by pair, one candidate after the other.
  EXPECT_EQ(slurp(dir + "/calls.txt"),
            "none\n6144:4096:1:2:24:8:0:0:0\nnone\n6144:4096:1:2:24:8:0:0:0\nnone\nnone\nnone\nnone\n");
  for (const char* f : {"/001-base-for-fast.json", "/002-fast.json", "/004-fast.json", "/005-base-for-slow.json",
                        "/008-slow.json"})
    EXPECT_TRUE(futransformer::test::file_exists(out + f)) << f;
}

TEST(SweepDecodeTilingsScript, RejectsBadArguments) {
  const std::string dir = futransformer::test::make_temp_dir("sweep-bad");
  const std::string bench = write_stand_in(dir), out = quote(dir + "/out");
  struct Case {
    std::string bench, args;
    int exit_code;
    const char* message;
  };
  const Case cases[] = {
      {bench, "", 2, "no candidate given"},
      {bench, " fast", 2, "'fast' is not LABEL=ASSIGNMENTS"},
      {bench, " --pairs 0 a=B=1", 2, "--pairs must be a positive count"},
      {bench, " --warmup 3 a=B=1", 2, "unknown option --warmup"},
      {bench, " 'a b=B=1'", 2, "label 'a b' must be"},
      {dir + "/missing-bench", " a=B=1", 1, "is not an executable"},
  };
  for (const Case& c : cases) {
    const SweepResult r = sweep(c.bench, "/no-build " + out + c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
  }
}

}  // namespace
