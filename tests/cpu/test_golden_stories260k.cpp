// stories260K through the whole stack (llama2.c loader, llama2.c tokenizer, reference engine, greedy generation)
// must reproduce llama2.c's run.c exactly: the shared golden file, and outputs of run.c for other prompts
// (recorded with `run stories260K.bin -z tok512.bin -t 0 -n STEPS -i PROMPT`).
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "futransformer/generate.h"
#include "futransformer/model.h"
#include "futransformer/reference_engine.h"
#include "futransformer/tokenizer.h"
#include "test_paths.h"

namespace futransformer {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// What run.c prints for `steps` steps with greedy sampling: every token after BOS (prompt tokens included), each
// decoded with its predecessor and filtered like run.c's safe_printf (lone non-printable bytes are dropped), then
// a newline.
std::string run_c_greedy(const std::string& prompt, int steps) {
  const std::string dir = test::shared_path("models/stories260K/");
  const Model model = load_model(dir + "stories260K.bin");
  const auto tokenizer = load_tokenizer_for_model(model, dir + "tok512.bin");
  std::vector<int32_t> ids{tokenizer->bos_id()};
  for (int32_t id : tokenizer->encode(prompt)) ids.push_back(id);
  const auto engine = make_reference_engine(model);
  GenerateOptions opt;
  opt.max_new_tokens = steps - static_cast<int64_t>(ids.size() - 1);
  opt.sampling.temperature = 0.0f;
  opt.stop_at_eos = true;  // run.c stops only when BOS comes out
  const std::vector<int32_t> fresh =
      generate(*engine, 0, ids, opt, [](int32_t) { return true; }, [&](int32_t t) { return t == tokenizer->bos_id(); });
  ids.insert(ids.end(), fresh.begin(), fresh.end());
  std::string out;
  for (size_t i = 1; i < ids.size(); ++i) {
    if (ids[i] == tokenizer->bos_id()) break;
    const std::string piece = tokenizer->piece(ids[i - 1], ids[i]);
    if (piece.size() == 1 && !std::isprint(static_cast<unsigned char>(piece[0])) &&
        !std::isspace(static_cast<unsigned char>(piece[0])))
      continue;
    out += piece;
  }
  return out + "\n";
}

TEST(GoldenStories260K, OnceUponATimeMatchesLlama2cExactly) {
  const std::string golden = test::shared_path("models/stories260K/golden-once-upon-a-time.txt");
  FT_REQUIRE_FILE(golden);
  FT_REQUIRE_FILE(test::shared_path("models/stories260K/stories260K.bin"));
  EXPECT_EQ(run_c_greedy("Once upon a time", 200), read_file(golden));
}

TEST(GoldenStories260K, OtherPromptsMatchLlama2c) {
  FT_REQUIRE_FILE(test::shared_path("models/stories260K/stories260K.bin"));
  struct Case {
    const char* prompt;
    int steps;
    const char* expected;
  };
  const Case cases[] = {
    {"She said hello", 120,
     "She said hello toys. She had a big box of colors and a big box. She was very happy and wanted to see what was inside. She wanted to see what was inside.\n\"Hello, little boy,\" said Lily. \"What are you doing?\"\n\"I'm sorry,\" said Lily.\n\"I'm sorry,\" said Lily.\n"},
    {"The little dog", 120,
     "The little dog was a little girl named Lily. She loved to play with her toys and her toys. One day, she saw a big box with a big box. It was a big, red ball. She wanted to play with it, but she did not want to play with it.\nLily's mom said, \"Lily, let's go to the box.\" Lily said, \"Yes, it is. It's a sm\n"},
    {"Tom and Sam went to the park.", 120,
     "Tom and Sam went to the park. They saw a big box. They wanted to play with it. They wanted to play with the box. They wanted to play with the box.\n\"Look, Mom!\" Tom said. \"Let's go to the park.\"\n\"Let's go to the park,\" Tom said. \"Let's go to the park.\"\n\"OK, let'\n"},
  };
  for (const Case& c : cases) EXPECT_EQ(run_c_greedy(c.prompt, c.steps), c.expected) << "prompt: " << c.prompt;
}

}  // namespace
}  // namespace futransformer
