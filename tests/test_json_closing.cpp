// Structured output that finishes: JsonClosing's shortest-completion count is exact in every state
// the automaton reaches, and under a token budget the constraint steers every reply, however
// random the logits, to a complete document within the budget.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "decode/json_closing.h"
#include "decode/tool_calls.h"
#include "test_json_constraint_util.h"
#include "util/rng.h"

namespace strata::decode {
namespace {

using nlohmann::json;
using testing::check_document;
using testing::kSchemas;
using testing::toy_vocab;

const json kTools = json::parse(R"([{"type":"function","function":{"name":"lookup","parameters":{"type":"object",
    "properties":{"q":{"type":"string","minLength":3,"maxLength":10},"k":{"type":"integer","minimum":100,"maximum":250}},
    "required":["q","k"],"additionalProperties":false}}},{"type":"function","function":{"name":"now"}}])");

// Text for a failure message, whatever bytes it holds.
std::string show(const std::string& text) { return json(text).dump(-1, ' ', true, json::error_handler_t::replace); }

struct Case {
  std::string name;
  std::function<JsonGrammar()> grammar;
  json schema;  // null: any object; for tool calls unused
  bool tools = false;
};

std::vector<Case> cases() {
  std::vector<Case> out = {{"json_object", [] { return JsonGrammar::any_object(); }, json()}};
  for (size_t k = 0; k < std::size(kSchemas); ++k) {
    const json schema = json::parse(kSchemas[k]);
    out.push_back({"schema " + std::to_string(k), [schema] { return JsonGrammar::from_schema(schema); }, schema});
  }
  const json extra[] = {
      json::parse(R"({"type":"object","properties":{"a":{"type":"integer","minimum":1000},
          "b":{"type":"number","exclusiveMinimum":20,"maximum":21},"c":{"type":"integer","maximum":-12},
          "d":{"type":"string","minLength":3}},"required":["a","b","c","d"]})"),
      json::parse(R"({"type":"array","items":{"type":"array","items":{"enum":["xyz",12,true]},"minItems":2},"minItems":3})"),
  };
  for (size_t k = 0; k < std::size(extra); ++k)
    out.push_back({"bounds " + std::to_string(k), [s = extra[k]] { return JsonGrammar::from_schema(s); }, extra[k]});
  GrammarLimits shallow;
  shallow.max_depth = 4;
  const json recursive = json::parse(
      R"({"$ref":"#/$defs/n","$defs":{"n":{"type":"object","properties":{"n":{"$ref":"#/$defs/n"},"v":{"type":"integer"}},"required":["v"]}}})");
  out.push_back({"depth 4", [recursive, shallow] { return JsonGrammar::from_schema(recursive, shallow); }, recursive});
  out.push_back({"tool call", [] { return JsonGrammar::tool_calls(kTools, std::nullopt, false); }, json(), true});
  out.push_back({"parallel tool calls", [] { return JsonGrammar::tool_calls(kTools, std::nullopt, true, {.compact = true}); },
                 json(), true});
  return out;
}

// The count is the exact shortest completion iff, in every state, it is 0 exactly where the
// document may end, no byte lowers it by more than one, and some byte lowers it by one. Checked
// for all 256 bytes along random walks through each grammar.
TEST(JsonClosing, CountIsTheExactShortestCompletion) {
  for (const Case& c : cases()) {
    const JsonGrammar g = c.grammar();
    const JsonAutomaton a(g);
    const JsonClosing closing(g);
    for (uint64_t seed = 0; seed < 12; ++seed) {
      Rng rng(seed * 977 + 5);
      Stack s = a.start();
      std::string text;
      for (int step = 0; step < 80; ++step) {
        const uint32_t rest = closing.rest(s);
        ASSERT_NE(rest, kUnbounded) << c.name << " after " << show(text);
        ASSERT_EQ(rest == 0, a.can_end(s)) << c.name << " after " << show(text);
        std::vector<std::pair<char, Stack>> next;
        bool lowered = false;
        for (int byte = 0; byte < 256; ++byte) {
          Stack t = s;
          std::vector<Stack> forks;
          if (!a.step(t, uint8_t(byte), forks)) continue;
          forks.push_back(std::move(t));
          for (Stack& f : forks) {
            const uint32_t after = closing.rest(f);
            ASSERT_GE(int64_t(after), int64_t(rest) - 1)
                << c.name << " after " << show(text) << " byte " << byte;
            lowered |= after + 1 == rest;
            next.emplace_back(char(byte), std::move(f));
          }
        }
        if (rest > 0) {
          ASSERT_TRUE(lowered) << c.name << " after " << show(text);
        }
        if (next.empty() || (rest == 0 && rng.below(4) == 0)) break;
        auto& [byte, chosen] = next[rng.below(uint32_t(next.size()))];
        text += byte;
        s = std::move(chosen);
      }
    }
  }
}

// Samples from uniformly random logits under a budget: no bias towards closing at all.
struct Budgeted {
  std::string text;
  bool ended = false;
  int64_t steps = 0;
};

Budgeted generate_within(const JsonVocab& vocab, JsonGrammar grammar, int64_t budget, uint64_t seed) {
  JsonConstraint constraint(vocab, std::move(grammar));
  constraint.set_token_budget(budget);
  Rng rng(seed);
  Budgeted out;
  std::vector<float> logits(vocab.size());
  for (; out.steps < budget; ++out.steps) {
    for (float& l : logits) l = 8.0f * rng.uniform();
    constraint.apply(logits);
    // Sample in proportion to exp(logit) among the allowed tokens.
    double total = 0;
    for (float l : logits) total += std::isfinite(l) ? std::exp(double(l)) : 0.0;
    double u = rng.uniform() * total;
    int32_t id = -1;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (!std::isfinite(logits[i])) continue;
      id = int32_t(i);
      u -= std::exp(double(logits[i]));
      if (u <= 0) break;
    }
    EXPECT_GE(id, 0);
    if (vocab.is_end(id)) {
      out.ended = true;
      ++out.steps;
      break;
    }
    constraint.accept(id);
    out.text += vocab.bytes(id);
  }
  return out;
}

TEST(JsonClosing, ABudgetThatFitsAlwaysEndsOnAValidDocument) {
  const JsonVocab& vocab = toy_vocab();
  for (const Case& c : cases()) {
    const JsonGrammar g = c.grammar();
    const uint32_t shortest = JsonClosing(g).rest(JsonAutomaton(g).start());
    for (uint64_t seed = 0; seed < 12; ++seed) {
      // From no slack at all (the shortest document, byte by byte, and the end token) upwards.
      const int64_t budget = int64_t(shortest) + 1 + int64_t(seed * seed);
      const Budgeted out = generate_within(vocab, c.grammar(), budget, seed + 1000);
      ASSERT_TRUE(out.ended) << c.name << ", budget " << budget << ": " << out.text;
      EXPECT_LE(out.steps, budget);
      if (c.tools) {
        ToolCallParser parser;
        parser.feed(out.text);
        parser.finish();
        EXPECT_FALSE(parser.malformed()) << out.text;
        EXPECT_FALSE(parser.tool_calls().empty()) << out.text;
      } else {
        check_document(out.text, c.schema);
      }
    }
  }
}

// A budget below the shortest document cannot be met: the mask then keeps the tokens that get
// closest to an end, and never leaves nothing.
TEST(JsonClosing, ABudgetTooSmallStillSteersTowardsTheEnd) {
  const JsonVocab& vocab = toy_vocab();
  const json schema = json::parse(R"({"type":"object","properties":{"name":{"type":"string","minLength":30}},
      "required":["name"]})");
  const Budgeted out = generate_within(vocab, JsonGrammar::from_schema(schema), 8, 3);
  EXPECT_FALSE(out.ended);
  EXPECT_EQ(out.steps, 8);
  EXPECT_EQ(out.text.rfind("{\"name\":\"", 0), 0u) << out.text;
}

// The mask under a budget equals the rule computed token by token: a token is allowed iff the
// shortest completion after it fits the budget left (less the end token), or, when none fits,
// iff it leaves the shortest completion of all.
TEST(JsonClosing, MaskUnderABudgetEqualsTheTokenByTokenRule) {
  const JsonVocab& vocab = toy_vocab();
  for (const Case& c : cases()) {
    const JsonGrammar g = c.grammar();
    const int64_t shortest = JsonClosing(g).rest(JsonAutomaton(g).start());
    for (int64_t slack : {-3, 0, 4}) {
      JsonConstraint constraint(vocab, c.grammar());
      int64_t left = shortest + 1 + slack;
      constraint.set_token_budget(left);
      Rng rng(uint64_t(slack + 10));
      std::vector<float> logits(vocab.size());
      for (; left > 0; --left) {
        std::vector<std::optional<uint32_t>> after(vocab.size());
        bool end = false, fits = false;
        uint32_t best = kUnbounded;
        for (size_t id = 0; id < vocab.size(); ++id) {
          after[id] = constraint.closing_after(int32_t(id));
          if (!after[id]) continue;
          if (vocab.is_end(int32_t(id))) {
            end = true;
            continue;
          }
          best = std::min(best, *after[id]);
          fits |= int64_t(*after[id]) <= left - 2;
        }
        const int64_t limit = end || fits ? left - 2 : int64_t(best);
        std::fill(logits.begin(), logits.end(), 0.0f);
        constraint.apply(logits);
        std::vector<int32_t> allowed;
        for (size_t id = 0; id < vocab.size(); ++id) {
          const bool expected = after[id] && (vocab.is_end(int32_t(id)) || int64_t(*after[id]) <= limit);
          ASSERT_EQ(std::isfinite(logits[id]), expected)
              << c.name << " slack " << slack << " left " << left << " token " << id << " "
              << show(vocab.bytes(int32_t(id))) << ": shortest after it "
              << (after[id] ? int64_t(*after[id]) : -1) << ", limit " << limit;
          if (expected) allowed.push_back(int32_t(id));
        }
        const int32_t pick = allowed[rng.below(uint32_t(allowed.size()))];
        if (vocab.is_end(pick)) break;
        constraint.accept(pick);
      }
    }
  }
}

}  // namespace
}  // namespace strata::decode
