// `strata serve` end to end, from the outside, as its users meet it: each test runs one node
// script of tests/e2e/ that makes its own synthetic model with `strata synth`, starts the server
// on a free port, drives it and always stops it (tests/e2e/harness.mjs):
//   - openai_client.mjs: the official `openai` npm client (chat, streaming, tool calls, JSON
//     mode, completions, error classes);
//   - anthropic_client.mjs: the official `@anthropic-ai/sdk` against /v1/messages (streaming,
//     tools, thinking, count_tokens, errors);
//   - responses_client.mjs: the `openai` client's responses.create / responses.stream;
//   - chat_page.mjs: the chat page at / in headless Chromium driven by playwright-core;
//   - load.mjs: concurrent clients past --queue get 429 + Retry-After, the rest complete, the
//     server survives and its RSS stays bounded.
// The npm packages come from scripts/test.sh (build/npm, or the npm prefix in $STRATA_NPM_DIR).
// A failing script's own output says what failed; a screenshot of a failed page test is in
// <build>/e2e/.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace strata::server {
namespace {

namespace fs = std::filesystem;

constexpr const char* kChromium = "/usr/bin/chromium";

fs::path npm_modules() {
  if (const char* prefix = std::getenv("STRATA_NPM_DIR")) return fs::path(prefix) / "node_modules";
  return STRATA_SOURCE_DIR "/build/npm/node_modules";
}

std::string quoted(const fs::path& p) { return std::string("'").append(p.string()).append("'"); }

// Fails the test unless every package is installed where the scripts look.
void require_packages(std::initializer_list<const char*> names) {
  for (const char* name : names)
    ASSERT_TRUE(fs::exists(npm_modules() / name / "package.json"))
        << "npm package " << name << " is missing under " << npm_modules()
        << "; scripts/test.sh installs it (or set STRATA_NPM_DIR to an npm prefix that has it)";
}

// Runs tests/e2e/<script> under node; returns its exit code.
int run_script(const std::string& script) {
  const fs::path out = fs::path(STRATA_BINARY).parent_path() / "e2e";
  const std::string command = "node " + quoted(fs::path(STRATA_SOURCE_DIR) / "tests/e2e" / script) +
                              " --strata " + quoted(STRATA_BINARY) + " --modules " +
                              quoted(npm_modules()) + " --out " + quoted(out) + " 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ServerE2E, OpenAiClient) {
  ASSERT_NO_FATAL_FAILURE(require_packages({"openai"}));
  EXPECT_EQ(run_script("openai_client.mjs"), 0) << "the openai client tests failed (output above)";
}

TEST(ServerE2E, AnthropicClient) {
  ASSERT_NO_FATAL_FAILURE(require_packages({"@anthropic-ai/sdk"}));
  EXPECT_EQ(run_script("anthropic_client.mjs"), 0) << "the Anthropic SDK tests failed (output above)";
}

TEST(ServerE2E, OpenAiResponsesClient) {
  ASSERT_NO_FATAL_FAILURE(require_packages({"openai"}));
  EXPECT_EQ(run_script("responses_client.mjs"), 0) << "the Responses API tests failed (output above)";
}

TEST(ServerE2E, ChatPageInChromium) {
  if (!fs::exists(kChromium))
    GTEST_SKIP() << kChromium << " is missing (scripts/setup.sh installs Debian's chromium)";
  ASSERT_NO_FATAL_FAILURE(require_packages({"playwright-core"}));
  EXPECT_EQ(run_script("chat_page.mjs"), 0) << "the chat page test failed (output above)";
}

TEST(ServerE2E, LoadQueueingAndMemory) {
  EXPECT_EQ(run_script("load.mjs"), 0) << "the load test failed (output above)";
}

}  // namespace
}  // namespace strata::server
