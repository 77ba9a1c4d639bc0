// The warm-up window after idle (server/warmup.h, strata serve --warmup-after): it runs only when a
// request comes after the idle time, once, never when turned off, and changes no request's reply;
// in-process servers at --parallel 1 and 2 count it on /metrics.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "decode/loaded_model.h"
#include "server/server.h"
#include "server/warmup.h"
#include "test_server_util.h"

namespace strata::server {
namespace {

using gguf::testing::TempDir;
using nlohmann::json;
using namespace std::chrono_literals;

class WarmUpAfterIdle : public testing::TinyModelSuite<WarmUpAfterIdle> {
 protected:
  static void SetUpTestSuite() { load_tiny_model(256); }

  static testing::RunningServer start(size_t parallel, double warmup_after_s) {
    ServerOptions o;
    o.generation.parallel = parallel;
    o.generation.warmup_after_s = warmup_after_s;
    return testing::RunningServer(*model_, o);
  }
  static std::string reply(int port) {
    const json body = {{"model", "tiny"},
                       {"messages", {{{"role", "user"}, {"content", "Warm or cold?"}}}},
                       {"max_tokens", 12},
                       {"temperature", 0}};
    // Twice the usual read bound: the reply may wait for a warm-up window first.
    auto res = testing::post_json(port, "/v1/chat/completions", body.dump(), 120);
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
    return res ? json::parse(res->body)["choices"][0]["message"].dump() : "";
  }
  static double warmups(int port) {
    const auto m = testing::scrape_metrics(port);
    return m.count("strata_warmup_windows_total") ? m.at("strata_warmup_windows_total") : -1;
  }
};

TEST_F(WarmUpAfterIdle, RunsOnceWhenARequestComesAfterTheIdleTime) {
  WarmUp w(model_->model(), 1.0);
  w.before_request();
  EXPECT_EQ(w.windows(), 0u) << "not idle long enough since start-up";
  std::this_thread::sleep_for(1100ms);
  w.before_request();
  EXPECT_EQ(w.windows(), 1u);
  EXPECT_GT(w.seconds(), 0.0);
  w.before_request();
  EXPECT_EQ(w.windows(), 1u) << "the warm-up counts as activity";
  std::this_thread::sleep_for(600ms);
  w.after_window();
  std::this_thread::sleep_for(600ms);
  w.before_request();
  EXPECT_EQ(w.windows(), 1u) << "idle is measured from the last window";
  WarmUp never(model_->model(), 0);
  std::this_thread::sleep_for(50ms);
  never.before_request();
  EXPECT_EQ(never.windows(), 0u);
}

TEST_F(WarmUpAfterIdle, RunsOnEveryArchitecture) {
  for (const char* arch : {"qwen3moe", "qwen3next", "qwen4exp"}) {
    SCOPED_TRACE(arch);
    TempDir dir;
    synth::SynthOptions o;
    o.arch = arch;
    o.preset = "tiny";
    o.output = dir.file("m.gguf");
    o.progress = false;
    synth::run_synth(o);
    decode::LoadOptions load;
    load.path = o.output;
    load.threads = 1;
    decode::LoadedModel m(load);
    WarmUp w(m.model(), 1e-9);
    w.before_request();
    EXPECT_EQ(w.windows(), 1u) << "the window ran to its end";
  }
}

TEST_F(WarmUpAfterIdle, ServersCountItAndRepliesDoNotChange) {
  std::string cold_reply;
  {
    auto off = start(1, 0);
    std::this_thread::sleep_for(250ms);
    cold_reply = reply(off.port());
    EXPECT_EQ(warmups(off.port()), 0);
  }
  for (size_t parallel : {size_t(1), size_t(2)}) {
    SCOPED_TRACE(cat("--parallel ", parallel));
    auto on = start(parallel, 1.0);
    std::this_thread::sleep_for(1100ms);
    EXPECT_EQ(reply(on.port()), cold_reply) << "a warm-up never changes a reply";
    EXPECT_EQ(warmups(on.port()), 1);
    EXPECT_EQ(reply(on.port()), cold_reply);
    EXPECT_EQ(warmups(on.port()), 1) << "no warm-up right after a request";
    std::this_thread::sleep_for(1100ms);
    reply(on.port());
    EXPECT_EQ(warmups(on.port()), 2);
  }
}

}  // namespace
}  // namespace strata::server
