// `futransformer report` as a user runs it on the CPU reference engine: tiny settings, real files, exit codes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "test_paths.h"

namespace futransformer {
namespace {

using test::quote;
using test::run_cli;
using test::slurp;

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t i = s.find(needle); i != std::string::npos; i = s.find(needle, i + 1)) ++n;
  return n;
}

// A few paragraphs of evaluation text (enough for several 32-token windows with stories260K's 512-token vocabulary).
std::string write_eval_text(const std::string& dir) {
  const std::string path = dir + "/eval.txt";
  std::ofstream f(path);
  for (int i = 0; i < 6; ++i)
    f << "Once upon a time there was a little girl named Lily. She liked to play in the park with her dog.\n"
         "One day the sun was hot and the dog was tired, so they sat under a big tree and ate an apple.\n";
  return path;
}

TEST(ReportCli, Stories260KEndToEndWritesAllThreeFiles) {
  const std::string model = test::shared_path("models/stories260K/stories260K.bin");
  FT_REQUIRE_FILE(model);
  const std::string dir = test::make_temp_dir("report");
  const std::string out = dir + "/out";
  // stories260K: hidden 64, intermediate 172 (no INT4 group of 32 divides it: per-channel), head_dim 8 (bf16 KV).
  const test::CliResult r =
      run_cli("report -m " + quote(model) + " --data " + quote(write_eval_text(dir)) +
              " --device cpu --prompt-len 16 --batch 1,2 --decode-steps 4 --ctx 32 --max-windows 4 "
              "--configs int4-rtn-gch,full+kv-bf16 --out " + quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string md = slurp(out + "/report.md"), svg = slurp(out + "/report.svg");
  for (const char* h : {"| configuration | perplexity |", "| configuration | prompt tokens | median ms |",
                        "| configuration | batch | context | median ms/step | p90 ms/step | tokens/s |", "--configs"})
    EXPECT_NE(md.find(h), std::string::npos) << "missing '" << h << "' in\n" << md;
  EXPECT_EQ(md, r.out);  // the same tables on stdout
  // full (added as the baseline) + 2 configurations, each at batch 1 and 2.
  EXPECT_EQ(count(svg, "<circle"), 6u) << svg;
  EXPECT_EQ(count(svg, "<svg"), count(svg, "</svg>"));

  const nlohmann::json j = nlohmann::json::parse(slurp(out + "/report.json"));
  ASSERT_EQ(j["rows"].size(), 3u);
  EXPECT_EQ(j["rows"][0]["config"], "full");
  EXPECT_EQ(j["quality_settings"]["windows"], 4);
  for (const auto& row : j["rows"]) {
    EXPECT_EQ(row["not_run"], "") << row.dump();
    EXPECT_TRUE(row["quality"]["ppl"].is_number()) << row.dump();
    EXPECT_EQ(row["quality"]["predicted_tokens"], 4 * 31);
    ASSERT_EQ(row["latency"]["decode"].size(), 2u);
    EXPECT_EQ(row["latency"]["decode"][1]["batch"], 2);
    EXPECT_EQ(row["latency"]["decode"][1]["step_ms"].size(), 4u);
    EXPECT_EQ(row["latency"]["prefill"]["runs_ms"].size(), 3u);
  }
  EXPECT_TRUE(j["rows"][0]["quality"]["mean_kl_vs_baseline"].is_null());
  // Per-channel INT4 weights move the distribution; a bf16 cache barely does, and both stay below the INT4 damage.
  const double kl_int4 = j["rows"][1]["quality"]["mean_kl_vs_baseline"];
  const double kl_bf16 = j["rows"][2]["quality"]["mean_kl_vs_baseline"];
  EXPECT_GT(kl_int4, 0.0);
  EXPECT_GT(kl_bf16, 0.0);
  EXPECT_LT(kl_bf16, kl_int4);
  const double agree = j["rows"][2]["quality"]["top1_agreement_vs_baseline"];
  EXPECT_GT(agree, 0.5);
  EXPECT_LE(agree, 1.0);
  std::filesystem::remove_all(dir);
}

TEST(ReportCli, SyntheticWeightsGiveLatencyOnly) {
  const std::string dir = test::make_temp_dir("report-syn");
  const std::string out = dir + "/out";
  const test::CliResult r = run_cli("report --config tiny --device cpu --data " + quote(write_eval_text(dir)) +
                                    " --prompt-len 8 --batch 1 --decode-steps 2 --configs int4-rtn-gch -q --out " +
                                    quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string md = slurp(out + "/report.md"), svg = slurp(out + "/report.svg");
  EXPECT_NE(md.find("n/a (synthetic weights)"), std::string::npos) << md;
  EXPECT_EQ(count(svg, "<circle"), 0u);
  EXPECT_NE(svg.find("synthetic"), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(slurp(out + "/report.json"));
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& row : j["rows"]) {
    EXPECT_TRUE(row["quality"]["ppl"].is_null());
    EXPECT_EQ(row["latency"]["decode"][0]["step_ms"].size(), 2u);
  }
  EXPECT_TRUE(j["synthetic"].get<bool>());
  std::filesystem::remove_all(dir);
}

TEST(ReportCli, BadInputsFailBeforeAnyWork) {
  const std::string model = test::shared_path("models/stories260K/stories260K.bin");
  FT_REQUIRE_FILE(model);
  const std::string dir = test::make_temp_dir("report-bad");
  const std::string data = write_eval_text(dir);
  const std::string out = dir + "/out";
  const std::string base = "report -m " + quote(model) + " --device cpu --out " + quote(out) + " ";
  const std::string m = base + "--prompt-len 16 --decode-steps 4 ";
  const struct {
    std::string args;
    std::string message;
  } cases[] = {
      {m + "--data /nonexistent/wiki.test.raw", "/nonexistent/wiki.test.raw"},
      {m + "--batch 1,0", "--batch"},
      {m + "--batch 1,x", "'x'"},
      {base, "context of 512"},  // the default --prompt-len 2048
      {base + "--prompt-len 500 --decode-steps 20", "context of 512"},
      {base + "--prompt-len 0", "--prompt-len"},
      {m + "--data " + quote(data) + " --ctx 1000", "--ctx"},
      {m + "--configs int5-rtn-g32", "int5-rtn-g32"},
      {m + "--configs int4-rtn-g32", "172"},            // the group does not divide the down projection's input
      {m + "--configs full+kv-int4", "head_dim 8"},     // int4 KV needs head_dim a multiple of 32
      {m + "--configs full,full+kv-bf16,full", "twice"},
      {m + "--frobnicate", "frobnicate"},
      {"report --device cpu --out " + quote(out), "--model"},
      {"report --config tiny -m " + quote(model) + " --out " + quote(out), "exclude"},
      {"report --config llama-9b --out " + quote(out), "llama-9b"},
  };
  for (const auto& c : cases) {
    const test::CliResult r = run_cli(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.args << ": wrote output before failing";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace futransformer
