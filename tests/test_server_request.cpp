// The server's pure parts: request parsing and validation (every bad-input class gets OpenAI's
// status, param and code; good requests fill the generation parameters), and the scheduler
// (one job at a time, a bounded queue, cancellation and shutdown) with jobs the test controls.
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/request.h"
#include "server/scheduler.h"

namespace strata::server {
namespace {

const RequestLimits kLimits{"tiny", 512};

struct Expected {
  int status;
  std::string code;
  std::string param;
};

Expected chat_error(const std::string& body) {
  try {
    parse_chat_request(body, kLimits);
  } catch (const ApiError& e) {
    const auto j = error_body(e);
    EXPECT_FALSE(e.message.empty());
    // A strict dump: the body is valid UTF-8 even when the message quotes bytes that are not.
    EXPECT_NO_THROW(j.dump()) << e.message;
    EXPECT_EQ(j["error"]["type"], e.type);
    return {e.status, e.code, e.param};
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

Expected completion_error(const std::string& body) {
  try {
    parse_completion_request(body, kLimits);
  } catch (const ApiError& e) {
    return {e.status, e.code, e.param};
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

// A valid chat body with `extra` fields spliced in.
std::string chat(const std::string& extra = "") {
  return R"({"model":"tiny","messages":[{"role":"user","content":"hi"}])" +
         (extra.empty() ? "" : "," + extra) + "}";
}

TEST(ServerRequest, MinimalChatHasDefaults) {
  const auto r = parse_chat_request(chat(), kLimits);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0]["role"], "user");
  EXPECT_EQ(r.messages[0]["content"], "hi");
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_EQ(r.response_format.type, ResponseFormatType::Text);
  EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
}

TEST(ServerRequest, ChatFieldsReachTheGenerationParameters) {
  const auto r = parse_chat_request(
      chat(R"("temperature":0.5,"top_p":0.9,"seed":-1,"max_completion_tokens":7,)"
           R"("presence_penalty":1.5,"frequency_penalty":-0.5,"stop":["a","bc"],"top_k":40,)"
           R"("stream":true,"stream_options":{"include_usage":true},"logit_bias":{"5":-100},)"
           R"("user":"u","chat_template_kwargs":{"enable_thinking":false})"),
      kLimits);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(r.seed, ~uint64_t(0));
  EXPECT_EQ(r.gen.max_tokens, 7);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_FLOAT_EQ(r.gen.sampling.presence_penalty, 1.5f);
  EXPECT_FLOAT_EQ(r.gen.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.gen.sampling.top_k, 40);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ASSERT_EQ(r.logit_bias.size(), 1u);
  EXPECT_EQ(r.logit_bias[0], (std::pair<int32_t, float>{5, -100.0f}));
  EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(parse_chat_request(chat(R"("top_p":0,"temperature":1)"), kLimits)
                .gen.sampling.temperature,
            0.0f)
      << "top_p 0 keeps only the most likely token";
}

TEST(ServerRequest, MessagesAreNormalisedForTheTemplate) {
  const auto r = parse_chat_request(
      R"({"model":"tiny","messages":[
        {"role":"developer","content":"be brief"},
        {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
          "function":{"name":"f","arguments":"{\"x\":1}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"42"}]})",
      kLimits);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.messages[2]["content"], "");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
}

TEST(ServerRequest, ToolsAndResponseFormat) {
  const auto r = parse_chat_request(
      chat(R"("tools":[{"type":"function","function":{"name":"get_weather",)"
           R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],)"
           R"("tool_choice":{"type":"function","function":{"name":"get_weather"}},)"
           R"("response_format":{"type":"json_schema","json_schema":{"name":"w",)"
           R"("schema":{"type":"object"},"strict":true}})"),
      kLimits);
  ASSERT_TRUE(r.tools.is_array());
  EXPECT_EQ(r.tool_choice.mode, ToolChoiceMode::Function);
  EXPECT_EQ(r.tool_choice.function, "get_weather");
  EXPECT_EQ(r.response_format.type, ResponseFormatType::JsonSchema);
  EXPECT_EQ(r.response_format.name, "w");
  EXPECT_EQ(r.response_format.schema["type"], "object");
  EXPECT_TRUE(r.response_format.strict);
  EXPECT_EQ(parse_chat_request(chat(R"("response_format":{"type":"json_object"})"), kLimits)
                .response_format.type,
            ResponseFormatType::JsonObject);
}

TEST(ServerRequest, MalformedBodies) {
  for (const std::string body : {"", "{", "nul", "{\"model\":\"tiny\",}", "\xff\xfe",
                                 "{\"model\":\"tin\xc3\"}"})
    EXPECT_EQ(chat_error(body).code, "invalid_json") << body;
  EXPECT_EQ(chat_error("[1,2]").code, "invalid_type");
  EXPECT_EQ(chat_error("42").status, 400);
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  EXPECT_EQ(chat_error(R"({"model":"tiny","messages":)" + deep + "}").code, "invalid_json");
}

TEST(ServerRequest, WrongTypesNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("temperature":"hot")", "temperature"},
      {R"("max_tokens":1.5)", "max_tokens"},
      {R"("stream":"yes")", "stream"},
      {R"("stop":7)", "stop"},
      {R"("stop":["a",1])", "stop[1]"},
      {R"("seed":"1")", "seed"},
      {R"("tools":{})", "tools"},
      {R"("response_format":"json")", "response_format"},
  };
  for (const auto& [extra, param] : cases) {
    const auto e = chat_error(chat(extra));
    EXPECT_EQ(e.status, 400) << extra;
    EXPECT_EQ(e.code, "invalid_type") << extra;
    EXPECT_EQ(e.param, param) << extra;
  }
  const auto m = chat_error(R"({"model":"tiny","messages":[{"role":"user","content":5}]})");
  EXPECT_EQ(m.param, "messages[0].content");
  EXPECT_EQ(chat_error(R"({"model":"tiny","messages":"hi"})").param, "messages");
  EXPECT_EQ(chat_error(R"({"model":7,"messages":[]})").param, "model");
}

TEST(ServerRequest, MissingAndUnknownFields) {
  auto e = chat_error(R"({"model":"tiny"})");
  EXPECT_EQ(e.code, "missing_required_parameter");
  EXPECT_EQ(e.param, "messages");
  e = chat_error(R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(e.param, "model");
  e = chat_error(R"({"model":"tiny","messages":[]})");
  EXPECT_EQ(e.code, "empty_array");
  e = chat_error(R"({"model":"tiny","messages":[{"content":"hi"}]})");
  EXPECT_EQ(e.param, "messages[0].role");
  e = chat_error(R"({"model":"tiny","messages":[{"role":"wizard","content":"hi"}]})");
  EXPECT_EQ(e.code, "invalid_value");
  e = chat_error(R"({"model":"tiny","messages":[{"role":"user"}]})");
  EXPECT_EQ(e.param, "messages[0].content");
  e = chat_error(R"({"model":"tiny","messages":[{"role":"tool","content":"1"}]})");
  EXPECT_EQ(e.param, "messages[0].tool_call_id");
  e = chat_error(chat(R"("temprature":1)"));
  EXPECT_EQ(e.code, "unrecognized_argument");
  EXPECT_EQ(e.param, "temprature");
  EXPECT_EQ(chat_error(chat(R"("tool_choice":"auto")")).param, "tool_choice");
  EXPECT_EQ(chat_error(chat(R"("stream_options":{"include_usage":true})")).param,
            "stream_options");
}

TEST(ServerRequest, UnknownModelIs404) {
  const auto e = chat_error(R"({"model":"gpt-4o","messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_EQ(completion_error(R"({"model":"other","prompt":"x"})").status, 404);
}

TEST(ServerRequest, OutOfRangeValues) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("temperature":2.5)", "decimal_above_max_value"},
      {R"("temperature":-0.1)", "decimal_below_min_value"},
      {R"("top_p":1.01)", "decimal_above_max_value"},
      {R"("presence_penalty":3)", "decimal_above_max_value"},
      {R"("frequency_penalty":-2.5)", "decimal_below_min_value"},
      {R"("max_tokens":0)", "integer_below_min_value"},
      {R"("top_k":-1)", "integer_below_min_value"},
      {R"("min_p":2)", "decimal_above_max_value"},
      {R"("n":0)", "integer_below_min_value"},
      {R"("stop":"")", "empty_string"},
      {R"("logit_bias":{"512":1})", "invalid_value"},
      {R"("logit_bias":{"x":1})", "invalid_value"},
      {R"("logit_bias":{"3":101})", "decimal_above_max_value"},
      {R"("tools":[])", "empty_array"},
      {R"("tools":[{"type":"function","function":{"name":"bad name"}}])", "invalid_value"},
  };
  for (const auto& [extra, code] : cases) {
    const auto e = chat_error(chat(extra));
    EXPECT_EQ(e.status, 400) << extra;
    EXPECT_EQ(e.code, code) << extra;
  }
}

TEST(ServerRequest, UnsupportedFeaturesAre422) {
  for (const std::string extra :
       {R"("n":2)", R"("logprobs":true)", R"("modalities":["audio"])", R"("functions":[])"}) {
    const auto e = chat_error(chat(extra));
    EXPECT_EQ(e.status, 422) << extra;
    EXPECT_EQ(e.code, "unsupported_value") << extra;
  }
  const auto img = chat_error(
      R"({"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url",)"
      R"("image_url":{"url":"x"}}]}]})");
  EXPECT_EQ(img.status, 422);
  EXPECT_EQ(img.param, "messages[0].content[0].type");
}

// Hostile bodies (issue 14): each is refused with its 4xx, quickly and in bounded memory.
TEST(ServerRequest, HostileBodiesAreRefused) {
  // 10^5 levels of nesting, in every place a body can nest: parsing stops at the limit.
  for (const std::string open : {"[", "{\"a\":"}) {
    std::string deep;
    for (int i = 0; i < 100000; ++i) deep += open;
    const auto e = chat_error(R"({"model":"tiny","messages":)" + deep);
    EXPECT_EQ(e.status, 400) << open;
    EXPECT_EQ(e.code, "invalid_json") << open;
    EXPECT_EQ(completion_error(R"({"model":"tiny","prompt":"x","stop":)" + deep).code,
              "invalid_json");
  }
  // At the limit itself it still parses (and fails on its type instead).
  const std::string at_limit = std::string(kMaxJsonDepth - 1, '[') + std::string(kMaxJsonDepth - 1, ']');
  EXPECT_EQ(chat_error(R"({"model":"tiny","messages":)" + at_limit + "}").code, "invalid_type");

  // max_tokens and n far past any limit: out of range, never an overflow.
  for (const std::string extra : {R"("max_tokens":1e300)", R"("max_tokens":18446744073709551616)",
                                  R"("max_tokens":-9223372036854775809)", R"("n":1e300)",
                                  R"("n":-1)", R"("max_completion_tokens":1e19)"}) {
    const auto e = chat_error(chat(extra));
    EXPECT_EQ(e.status, 400) << extra;
    EXPECT_NE(e.code, "") << extra;
  }
  EXPECT_EQ(chat_error(chat(R"("n":9223372036854775807)")).status, 422);
  // A max_tokens that parses is still checked against the context before anything runs
  // (ServerLoopback.BadInputGetsTheRight4xx): here it must at least survive parsing intact.
  EXPECT_EQ(parse_chat_request(chat(R"("max_tokens":9223372036854775807)"), kLimits).gen.max_tokens,
            INT64_MAX);

  // 10,000 tools: refused by count before any is rendered into a prompt.
  std::string tools = R"("tools":[)";
  for (int i = 0; i < 10000; ++i)
    tools += std::string(i ? "," : "") + R"({"type":"function","function":{"name":"f)" +
             std::to_string(i) + R"("}})";
  const auto e = chat_error(chat(tools + "]"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "array_above_max_length");
  EXPECT_EQ(e.param, "tools");
}

TEST(ServerRequest, CompletionPrompts) {
  auto r = parse_completion_request(R"({"model":"tiny","prompt":"once"})", kLimits);
  EXPECT_EQ(r.prompt, "once");
  EXPECT_FALSE(r.prompt_tokens.has_value());
  EXPECT_EQ(r.gen.max_tokens, 16) << "OpenAI's default for completions";
  r = parse_completion_request(R"({"model":"tiny","prompt":[1,2,3],"echo":true})", kLimits);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(r.echo);
  r = parse_completion_request(R"({"model":"tiny","prompt":["once"]})", kLimits);
  EXPECT_EQ(r.prompt, "once");
  EXPECT_EQ(completion_error(R"({"model":"tiny","prompt":[1,512]})").param, "prompt[1]");
  EXPECT_EQ(completion_error(R"({"model":"tiny","prompt":[1,-1]})").code, "invalid_value");
  EXPECT_EQ(completion_error(R"({"model":"tiny","prompt":[1,"a"]})").code, "invalid_type");
  EXPECT_EQ(completion_error(R"({"model":"tiny","prompt":["a","b"]})").status, 422);
  EXPECT_EQ(completion_error(R"({"model":"tiny"})").code, "missing_required_parameter");
  EXPECT_EQ(completion_error(R"({"model":"tiny","prompt":{}})").code, "invalid_type");
  EXPECT_EQ(completion_error(R"({"model":"tiny","prompt":"a","suffix":"b"})").status, 422);
  EXPECT_EQ(completion_error(R"({"model":"tiny","prompt":"a","messages":[]})").code,
            "unrecognized_argument");
}

// A job that blocks its worker until the test releases it.
struct Gate {
  std::promise<void> entered, release;
  std::shared_future<void> released{release.get_future().share()};

  // Submits the gated job and returns once the worker is inside it.
  std::shared_ptr<Job> start(Scheduler& s) {
    auto j = job();
    EXPECT_EQ(s.submit(j), Scheduler::Admission::Accepted);
    entered.get_future().wait();
    return j;
  }

  std::shared_ptr<Job> job() {
    return std::make_shared<Job>(
        [this](Job& self) {
          entered.set_value();
          released.wait();
          self.emit("done");
          return decode::GenerateResult{};
        },
        Clock::now() + std::chrono::hours(1));
  }
};

std::shared_ptr<Job> quick_job(std::string text, std::vector<std::string>* order = nullptr) {
  return std::make_shared<Job>(
      [text, order](Job& self) {
        if (order) order->push_back(text);
        self.emit(text);
        decode::GenerateResult r;
        r.text = text;
        return r;
      },
      Clock::now() + std::chrono::hours(1));
}

std::string drain(Job& job) {
  std::vector<std::string> pieces;
  while (job.next(pieces, Clock::now() + std::chrono::seconds(30))) {
  }
  std::string all;
  for (const auto& p : pieces) all += p;
  return all;
}

TEST(ServerScheduler, RunsJobsInOrderAndStreamsTheirText) {
  Scheduler s(4);
  std::vector<std::string> order;
  auto a = quick_job("a", &order), b = quick_job("b", &order);
  ASSERT_EQ(s.submit(a), Scheduler::Admission::Accepted);
  ASSERT_EQ(s.submit(b), Scheduler::Admission::Accepted);
  EXPECT_EQ(drain(*a), "a");
  EXPECT_EQ(drain(*b), "b");
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(b->result().has_value());
  EXPECT_EQ(b->result()->text, "b");
}

TEST(ServerScheduler, FullQueueRefusesAndShutdownDropsTheQueued) {
  Scheduler s(1);
  Gate gate;
  auto running = gate.start(s);
  EXPECT_EQ(s.running(), 1u);
  auto waiting = quick_job("w");
  ASSERT_EQ(s.submit(waiting), Scheduler::Admission::Accepted);
  EXPECT_EQ(s.queued(), 1u);
  EXPECT_EQ(s.submit(quick_job("x")), Scheduler::Admission::Full);

  std::thread stopper([&] { s.shutdown(); });
  // The running job sees the shutdown as a stop request at its next window.
  while (!running->should_stop()) std::this_thread::yield();
  gate.release.set_value();
  stopper.join();
  EXPECT_EQ(drain(*running), "done");
  EXPECT_EQ(waiting->wait_started(Clock::now()), Job::Phase::Done);
  EXPECT_TRUE(waiting->dropped());
  EXPECT_EQ(s.submit(quick_job("late")), Scheduler::Admission::Closed);
}

TEST(ServerScheduler, SeveralWorkersRunJobsAtOnceAndTheQueueCountsBeyondThem) {
  Scheduler s(1, 2);
  EXPECT_EQ(s.workers(), 2u);
  Gate first, second;
  auto a = first.start(s);
  auto b = second.start(s);  // returns only once its worker is inside it: both run at once
  EXPECT_EQ(s.running(), 2u);
  EXPECT_EQ(s.queued(), 0u);
  auto waiting = quick_job("w");
  ASSERT_EQ(s.submit(waiting), Scheduler::Admission::Accepted);
  EXPECT_EQ(s.queued(), 1u);
  EXPECT_EQ(s.submit(quick_job("x")), Scheduler::Admission::Full);
  first.release.set_value();
  EXPECT_EQ(drain(*a), "done");
  EXPECT_EQ(drain(*waiting), "w");
  second.release.set_value();
  EXPECT_EQ(drain(*b), "done");
}

TEST(ServerScheduler, CapacityZeroStillRunsOneJob) {
  Scheduler s(0);
  auto a = quick_job("a");
  ASSERT_EQ(s.submit(a), Scheduler::Admission::Accepted);
  EXPECT_EQ(drain(*a), "a");
}

TEST(ServerScheduler, CancelledOrExpiredJobsNeverStart) {
  Scheduler s(4);
  Gate gate;
  auto blocker = gate.start(s);
  std::vector<std::string> order;
  auto cancelled = quick_job("c", &order);
  auto expired = std::make_shared<Job>([](Job&) { return decode::GenerateResult{}; },
                                       Clock::now() - std::chrono::seconds(1));
  ASSERT_EQ(s.submit(cancelled), Scheduler::Admission::Accepted);
  ASSERT_EQ(s.submit(expired), Scheduler::Admission::Accepted);
  cancelled->cancel();
  gate.release.set_value();
  drain(*blocker);
  drain(*cancelled);
  drain(*expired);
  EXPECT_TRUE(cancelled->dropped());
  EXPECT_TRUE(expired->dropped());
  EXPECT_TRUE(order.empty());
}

TEST(ServerScheduler, AWorkErrorIsKept) {
  Scheduler s(1);
  auto bad = std::make_shared<Job>(
      [](Job&) -> decode::GenerateResult { throw std::runtime_error("boom"); },
      Clock::now() + std::chrono::hours(1));
  ASSERT_EQ(s.submit(bad), Scheduler::Admission::Accepted);
  drain(*bad);
  EXPECT_FALSE(bad->result().has_value());
  EXPECT_EQ(bad->error(), "boom");
}

}  // namespace
}  // namespace strata::server
