// Constrained JSON decoding: the schema compiler's errors, the byte automaton on hand-written
// documents, the vocabulary mask against token-by-token acceptance, and random generation over a
// toy and the real Qwen vocabulary where every finished document must parse and validate.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "backend/cpu/cpu_backend.h"
#include "decode/generate.h"
#include "decode/tool_calls.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "synth/synth.h"
#include "test_json_constraint_util.h"
#include "test_tokenizer_util.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

namespace strata::decode {
namespace {

using nlohmann::json;
using testing::check_document;
using testing::generate_constrained;
using testing::kSchemas;
using testing::toy_vocab;

bool accepts(const JsonGrammar& g, std::string_view text) {
  const JsonAutomaton a(g);
  std::vector<Stack> stacks = {a.start()};
  for (char c : text) {
    std::vector<Stack> next, forks;
    for (Stack& s : stacks) {
      forks.clear();
      if (a.step(s, uint8_t(c), forks)) next.push_back(s);
      next.insert(next.end(), forks.begin(), forks.end());
    }
    stacks = std::move(next);
    if (stacks.empty()) return false;
  }
  return std::any_of(stacks.begin(), stacks.end(), [&](const Stack& s) { return a.can_end(s); });
}

std::string compile_error(const std::string& schema) {
  try {
    JsonGrammar::from_schema(json::parse(schema));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonConstraintSchema, UnsupportedKeywordsAndBadSchemasNameTheProblem) {
  EXPECT_EQ(compile_error(R"({"type":"object","properties":{"age":{"type":"integer","multipleOf":2}}})"),
            "json_schema /properties/age: unsupported keyword \"multipleOf\"");
  EXPECT_EQ(compile_error(R"({"type":"number","maximum":0.5})"),
            "json_schema /: \"maximum\" 0.5 on a number: only whole bounds are supported (or use type integer)");
  EXPECT_EQ(compile_error(R"({"type":"integer","minimum":3,"maximum":2.5})"),
            "json_schema /: no number lies between the minimum and the maximum");
  EXPECT_EQ(compile_error(R"({"type":"number","minimum":0,"exclusiveMinimum":0})"),
            "json_schema /: both \"minimum\" and \"exclusiveMinimum\"");
  EXPECT_EQ(compile_error(R"({"type":"number","exclusiveMinimum":true})"),
            "json_schema /: \"exclusiveMinimum\" must be a number, got true");
  EXPECT_EQ(compile_error(R"({"type":"integer","maximum":1e16})"),
            "json_schema /: \"maximum\" 1e+16 is beyond 15 digits");
  EXPECT_EQ(compile_error(R"({"type":"string","pattern":"^a"})"),
            "json_schema /: unsupported keyword \"pattern\"");
  EXPECT_EQ(compile_error(R"({"allOf":[{"type":"string"}]})"),
            "json_schema /: unsupported keyword \"allOf\"");
  EXPECT_EQ(compile_error(R"({"type":"strin"})"), "json_schema /: unknown type \"strin\"");
  EXPECT_EQ(compile_error(R"({"$ref":"#/$defs/missing"})"),
            "json_schema /: \"$ref\" \"#/$defs/missing\" points at nothing");
  EXPECT_EQ(compile_error(R"({"type":"string","minLength":5,"maxLength":2})"),
            "json_schema /: minLength > maxLength");
  EXPECT_EQ(compile_error(R"({"type":"array","items":[{"type":"string"}]})"),
            "json_schema /: \"items\" as an array (tuple validation) is not supported");
  EXPECT_EQ(
      compile_error(R"({"type":"object","required":["x"],"additionalProperties":false})"),
      "json_schema /: required property \"x\" is not in \"properties\" and additionalProperties is false");
  EXPECT_EQ(compile_error(R"({"type":"integer","enum":["a","b"]})"),
            "json_schema /: no \"enum\"/\"const\" value satisfies the rest of the schema");
  EXPECT_EQ(compile_error(R"({"type":"array","maxItems":-1})"),
            "json_schema /: \"maxItems\" must be a non-negative integer, got -1");
  EXPECT_EQ(
      compile_error(
          R"({"$ref":"#/$defs/a","$defs":{"a":{"type":"object","properties":{"a":{"$ref":"#/$defs/a"}},"required":["a"]}}})"),
      "json_schema: no finite JSON value satisfies the schema");
  EXPECT_EQ(compile_error(R"({"anyOf":[{"type":"string"}],"type":"string"})"),
            "json_schema /: \"type\" beside \"anyOf\" is not supported; move it into each alternative");
  std::string deep = R"({"type":"string"})";
  for (int i = 0; i < 40; ++i) deep = R"({"type":"array","minItems":1,"items":)" + deep + "}";
  EXPECT_EQ(compile_error(deep), "json_schema: the schema nests 41 levels deep, more than the limit of 31");
  EXPECT_EQ(compile_error(R"({"title":"x","description":"y","type":"string","default":"z"})"), "");
}

// Schemas built to explode the automaton are refused when they compile, naming the limit.
TEST(JsonConstraintSchema, ExplodingSchemasHitANamedLimit) {
  // Two array alternatives that both begin with '[', recursively: nesting k levels keeps 2^k
  // parses alive at once.
  const std::string doubling =
      R"({"$defs":{"a":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/a"}},)"
      R"({"type":"array","maxItems":3,"items":{"$ref":"#/$defs/a"}}]}},"$ref":"#/$defs/a"})";
  EXPECT_EQ(compile_error(doubling),
            "json_schema: anyOf/oneOf alternatives that begin alike could keep more than 1024 "
            "parses alive at once (the limit); make the alternatives differ in their first byte or "
            "nest fewer of them");
  // The same shape nested a few levels stays under the limit and compiles.
  std::string shallow = R"({"type":"string"})";
  for (int i = 0; i < 5; ++i)
    shallow = R"({"anyOf":[{"type":"array","items":)" + shallow + R"(},{"type":"array","maxItems":2,"items":)" +
              shallow + "}]}";
  EXPECT_EQ(compile_error(shallow), "");
  // Tens of thousands of alternatives: more states than the limit.
  std::string wide = R"({"anyOf":[)";
  for (int i = 0; i < 20000; ++i) wide += std::string(i ? "," : "") + R"({"type":"string"})";
  EXPECT_EQ(compile_error(wide + "]}"),
            "json_schema: the schema compiles to more than 16384 automaton states (the limit); "
            "simplify it");
}

// The time backstop: a mask that needs more automaton steps than the limit throws instead of
// running on (the generation then fails with that error).
TEST(JsonConstraintMask, AMaskPastItsStepLimitThrows) {
  GrammarLimits limits;
  limits.max_mask_steps = 20;
  JsonConstraint tight(toy_vocab(), JsonGrammar::from_schema(nullptr, limits));
  std::vector<float> logits(toy_vocab().size(), 0.0f);
  EXPECT_THROW(
      {
        try {
          tight.apply(logits);
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(),
                       "json constraint: a mask took more than 20 automaton steps (the limit); the "
                       "grammar is too ambiguous to enforce");
          throw;
        }
      },
      Error);
  JsonConstraint roomy(toy_vocab(), JsonGrammar::from_schema(nullptr));
  EXPECT_NO_THROW(roomy.apply(logits));
}

TEST(JsonConstraintAutomaton, AnyObjectFollowsJsonSyntax) {
  const JsonGrammar g = JsonGrammar::any_object();
  for (const char* ok :
       {"{}", " {\n  \"a\": [1, -0, -2.5e10, 3E+2, true, false, null, {}, []],\n  \"b\": {\"c\": \"\"}\n}\n",
        R"({"s":"x\u00e9\ud83d\ude00\n\"\\\/\b\f\r\t"})", "{\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\":0.5}",
        R"({"a":{"a":{"a":{}}}})"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad :
       {"[]", "{", "{\"a\":}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":1,}", "{\"a\" 1}", "{,}", "{\"a\":tru}",
        R"({"a":"\ud800"})", R"({"a":"\udc00"})", R"({"a":"\x"})", "{\"a\":\"\x01\"}", "{\"\xC0\x80\":1}",
        "{\"\xED\xA0\x80\":1}", "{\"\xF4\x90\x80\x80\":1}", "{\"a\":1}x", "{\"a\":1234567890123456}",
        "{\"a\":1e100}"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  // Between two tokens: nothing, one space, or one newline and at most 20 spaces or tabs.
  EXPECT_TRUE(accepts(g, "{\n" + std::string(20, ' ') + "}"));
  EXPECT_TRUE(accepts(g, " {\n\t\t\"a\": 1,\n\t\t\"b\" : [ 2 ]\n}\n"));
  for (const std::string& bad : {"{\n" + std::string(21, ' ') + "}", std::string("{  }"), std::string("{\n\n}"),
                                std::string("{\t}"), std::string("{\r\n}"), std::string("{} \n"),
                                std::string("{\"a\":1 \n}")})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  // Compact: one space at most, no newline.
  const JsonGrammar compact = JsonGrammar::any_object({.compact = true});
  EXPECT_TRUE(accepts(compact, R"({"a": 1, "b": [2, {}]} )"));
  EXPECT_FALSE(accepts(compact, "{\n\"a\": 1}"));
  EXPECT_FALSE(accepts(compact, "{\"a\": 1}\n"));

  // A null json_schema allows any value.
  const JsonGrammar any = JsonGrammar::from_schema(json());
  for (const char* ok : {"12", "-0.5e-3", "[1,[]]", "\"x\"", "null", "{}"}) EXPECT_TRUE(accepts(any, ok)) << ok;
  EXPECT_FALSE(accepts(any, "nul"));
}

TEST(JsonConstraintAutomaton, SchemaKeywords) {
  const JsonGrammar person = JsonGrammar::from_schema(json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 2, "maxLength": 4},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b c"]}, "minItems": 1, "maxItems": 2},
      "note": {"type": ["string", "null"]}
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": false})"));
  for (const char* ok :
       {R"({"name":"Al","age":3,"tags":["a"]})", R"({"tags":["b c","a"],"age":-7,"name":"\u00e9t\u00e9"})",
        R"({"name":"\ud83d\ude00xyz","age":0,"tags":["a"],"note":null})",
        "{\"name\":\"\xC3\xA9t\xC3\xA9!\",\"age\":1,\"tags\":[\"a\"],\"note\":\"\"}"})
    EXPECT_TRUE(accepts(person, ok)) << ok;
  for (const char* bad :
       {R"({"name":"Al","age":3})", R"({"name":"A","age":3,"tags":["a"]})",
        R"({"name":"Alice","age":3,"tags":["a"]})", R"({"name":"Al","age":3.5,"tags":["a"]})",
        R"({"name":"Al","age":3,"tags":[]})", R"({"name":"Al","age":3,"tags":["a","a","a"]})",
        R"({"name":"Al","age":3,"tags":["c"]})", R"({"name":"Al","age":3,"tags":["a"],"x":1})",
        R"({"name":"Al","name":"Bo","age":3,"tags":["a"]})",
        R"({"name":"Al","age":3,"tags":["a"],"note":1})"})
    EXPECT_FALSE(accepts(person, bad)) << bad;

  const JsonGrammar shapes = JsonGrammar::from_schema(json::parse(R"({"anyOf": [
    {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}}, "required": ["kind", "r"], "additionalProperties": false},
    {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}}, "required": ["kind", "side"], "additionalProperties": false}]})"));
  EXPECT_TRUE(accepts(shapes, R"({"kind":"circle","r":1.5})"));
  EXPECT_TRUE(accepts(shapes, R"({"side":2,"kind":"square"})"));
  EXPECT_FALSE(accepts(shapes, R"({"kind":"circle","side":2})"));

  const JsonGrammar tree =
      JsonGrammar::from_schema(json::parse(R"({"$ref": "#/$defs/node", "$defs": {"node": {
    "type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["v"], "additionalProperties": false}}})"));
  EXPECT_TRUE(accepts(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(accepts(tree, R"({"v":1,"kids":[{"w":2}]})"));
  const JsonGrammar self = JsonGrammar::from_schema(
      json::parse(R"({"type":"object","properties":{"child":{"$ref":"#"}},"additionalProperties":false})"));
  EXPECT_TRUE(accepts(self, R"({"child":{"child":{}}})"));
  EXPECT_FALSE(accepts(self, R"({"child":{"x":{}}})"));

  const JsonGrammar numbers =
      JsonGrammar::from_schema(json::parse(R"({"enum": [1, 12, "x", null, {"a": [1]}]})"));
  for (const char* ok : {"1", "12", "\"x\"", "null", "{\"a\":[1]}", " 12 "})
    EXPECT_TRUE(accepts(numbers, ok)) << ok;
  for (const char* bad : {"2", "123", "\"y\"", "{\"a\": [1]}", "true"})
    EXPECT_FALSE(accepts(numbers, bad)) << bad;

  const auto check = [](const char* schema, std::vector<const char*> ok, std::vector<const char*> bad) {
    const JsonGrammar g = JsonGrammar::from_schema(json::parse(schema));
    for (const char* text : ok) EXPECT_TRUE(accepts(g, text)) << schema << " " << text;
    for (const char* text : bad) EXPECT_FALSE(accepts(g, text)) << schema << " " << text;
  };
  check(R"({"type":"integer","minimum":1,"maximum":5})", {"1", "3", "5"}, {"0", "6", "-1", "10", "05", "1.0"});
  check(R"({"type":"integer","exclusiveMinimum":0})", {"1", "123456789012345"}, {"0", "-3", "-0"});
  check(R"({"type":"integer","minimum":0.5,"exclusiveMaximum":3.5})", {"1", "3"}, {"0", "4"});
  check(R"({"type":"number","minimum":0,"maximum":1})", {"0", "1", "0.5", "1.0", "1.000", "0.999", "-0"},
        {"1.5", "-0.1", "2", "1e0", "1.01", "10"});
  check(R"({"type":"number","exclusiveMinimum":0})", {"0.001", "7", "0.5"}, {"0", "0.0", "-0.5", "-1"});
  check(R"({"maximum":-2,"minimum":-10})", {"-2", "-10", "-5.5", "-2.0", "-10.0"}, {"-1.5", "-10.5", "3", "-11"});
  check(R"({"type":"number","exclusiveMaximum":1,"exclusiveMinimum":0})", {"0.5", "0.000000000000001"},
        {"0", "1", "0.0", "1.0", "0.000000000000000"});

  const JsonGrammar free_ints =
      JsonGrammar::from_schema(json::parse(R"({"type":"object","additionalProperties":{"type":"integer"}})"));
  EXPECT_TRUE(accepts(free_ints, R"({"any key":1,"other":-2})"));
  EXPECT_FALSE(accepts(free_ints, R"({"a":"b"})"));
  EXPECT_TRUE(accepts(
      JsonGrammar::from_schema(json::parse(R"({"type":"object","additionalProperties":false})")), "{ }"));
  EXPECT_FALSE(
      accepts(JsonGrammar::from_schema(json::parse(R"({"type":"object","additionalProperties":false})")),
              R"({"a":1})"));
}

TEST(JsonConstraintAutomaton, DepthLimitNeverStrandsARequiredValue) {
  // At the depth limit a property that needs more nesting is not offered.
  GrammarLimits limits;
  limits.max_depth = 4;
  const JsonGrammar g = JsonGrammar::from_schema(
      json::parse(
          R"({"$ref":"#/$defs/n","$defs":{"n":{"type":"object","properties":{"n":{"$ref":"#/$defs/n"}}}}})"),
      limits);
  EXPECT_TRUE(accepts(g, R"({"n":{"n":{}}})"));
  EXPECT_FALSE(accepts(g, R"({"n":{"n":{"n":{}}}})"));
}

TEST(JsonConstraintMask, EndTokenOnlyWhenCompleteAndWhitespaceBounded) {
  const tokenizer::Tokenizer& tok = testing::toy_tokenizer();
  const JsonVocab& vocab = toy_vocab();
  JsonConstraint c(vocab, JsonGrammar::any_object());
  const int32_t end = vocab.end_tokens().at(0);
  for (uint32_t id : tok.encode("{\"a\": 1")) c.accept(int32_t(id));
  EXPECT_FALSE(c.complete());
  EXPECT_FALSE(c.allows(end));
  EXPECT_THROW(c.accept(end), Error);
  for (uint32_t id : tok.encode("}")) c.accept(int32_t(id));
  EXPECT_TRUE(c.complete());
  std::vector<float> logits(vocab.size(), 0.0f);
  c.apply(logits);
  EXPECT_TRUE(std::isfinite(logits[size_t(end)]));
  EXPECT_FALSE(std::isfinite(logits[tok.encode("x")[0]]));
  const int32_t space = int32_t(tok.encode(" ")[0]);
  c.accept(space);
  EXPECT_FALSE(c.allows(space));
  EXPECT_FALSE(c.allows(int32_t(tok.encode("\n")[0])));
  EXPECT_THROW(c.accept(int32_t(tok.encode("{")[0])), Error);
  c.accept(end);
  EXPECT_TRUE(c.finished());
}

// Every token the mask allows is one accept() takes, and no other: the trie walk and the
// string-body token sets agree with feeding the token's bytes directly.
TEST(JsonConstraintMask, MaskEqualsTokenByTokenAcceptance) {
  const JsonVocab& vocab = toy_vocab();
  std::vector<json> schemas = {json()};
  for (const char* s : kSchemas) schemas.push_back(json::parse(s));
  for (size_t k = 0; k < schemas.size(); ++k) {
    const auto grammar = [&] {
      return schemas[k].is_null() ? JsonGrammar::any_object() : JsonGrammar::from_schema(schemas[k]);
    };
    JsonConstraint c(vocab, grammar());
    Rng rng(k + 100);
    std::vector<float> logits(vocab.size());
    for (int step = 0; step < 40 && !c.complete(); ++step) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      c.apply(logits);
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < vocab.size(); ++id) {
        const bool in_mask = std::isfinite(logits[id]);
        ASSERT_EQ(in_mask, c.allows(int32_t(id))) << "schema " << k << " step " << step << " token " << id
                                                  << " \"" << vocab.bytes(int32_t(id)) << "\"";
        if (in_mask && !vocab.is_end(int32_t(id))) allowed.push_back(int32_t(id));
      }
      ASSERT_FALSE(allowed.empty());
      c.accept(allowed[rng.below(uint32_t(allowed.size()))]);
    }
  }
}

TEST(JsonConstraintGenerate, ToyVocabularyOutputsParseAndValidate) {
  std::vector<json> schemas = {json()};
  for (const char* s : kSchemas) schemas.push_back(json::parse(s));
  size_t completed = 0, runs = 0;
  for (size_t k = 0; k < schemas.size(); ++k) {
    for (uint64_t seed = 0; seed < 64; ++seed) {
      JsonGrammar g = schemas[k].is_null() ? JsonGrammar::any_object() : JsonGrammar::from_schema(schemas[k]);
      const auto out = generate_constrained(toy_vocab(), std::move(g), seed * 31 + k, 400, seed % 2 == 0);
      ++runs;
      if (!out.completed) continue;
      ++completed;
      check_document(out.text, schemas[k]);
    }
  }
  // The bias towards closing tokens finishes most documents; the check above is on those.
  EXPECT_GT(completed, runs * 3 / 4) << completed << " of " << runs;
}

TEST(JsonConstraintGenerate, QwenVocabularyOutputsParseAndValidate) {
  try {
    tokenizer::testing::qwen3_package_dir();
  } catch (const std::exception& e) {
    GTEST_SKIP() << e.what();
  }
  const tokenizer::Tokenizer& tok = tokenizer::testing::qwen3_tokenizer();
  const auto build_start = std::chrono::steady_clock::now();
  const JsonVocab vocab(tok);
  const double build_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - build_start).count();
  std::vector<json> schemas = {json()};
  for (const char* s : kSchemas) schemas.push_back(json::parse(s));
  size_t completed = 0, runs = 0, steps = 0;
  double seconds = 0;
  for (size_t k = 0; k < schemas.size(); ++k) {
    for (uint64_t seed = 0; seed < 2; ++seed) {
      JsonGrammar g = schemas[k].is_null() ? JsonGrammar::any_object() : JsonGrammar::from_schema(schemas[k]);
      const auto out = generate_constrained(vocab, std::move(g), seed * 7 + k, 150, seed % 2 == 1);
      ++runs;
      steps += out.steps + out.completed;
      seconds += out.apply_seconds;
      if (!out.completed) continue;
      ++completed;
      check_document(out.text, schemas[k]);
    }
  }
  // Forced tool calls, whose tags are Qwen's added tokens.
  const json tools = json::parse(R"([{"type":"function","function":{"name":"lookup","parameters":{"type":"object",
      "properties":{"q":{"type":"string","maxLength":10},"k":{"type":"integer","minimum":1,"maximum":5}},
      "required":["q"],"additionalProperties":false}}},{"type":"function","function":{"name":"now"}}])");
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const auto out = generate_constrained(vocab, JsonGrammar::tool_calls(tools, std::nullopt, seed % 2 == 0), seed,
                                          150, seed < 2);
    ++runs;
    steps += out.steps + out.completed;
    seconds += out.apply_seconds;
    if (!out.completed) continue;
    ++completed;
    ToolCallParser parser;
    parser.feed(out.text);
    parser.finish();
    EXPECT_FALSE(parser.malformed()) << out.text;
    ASSERT_FALSE(parser.tool_calls().empty()) << out.text;
    for (const auto& call : parser.tool_calls()) {
      const json params = call.name == "lookup" ? tools[0]["function"]["parameters"] : json{{"type", "object"}};
      EXPECT_FALSE(validate_json_schema(params, json::parse(call.arguments))) << out.text;
    }
  }
  EXPECT_GT(completed, runs / 2) << completed << " of " << runs;
  std::printf("{\"qwen_vocab\": %zu, \"vocab_index_ms\": %.1f, \"apply_steps\": %zu, \"apply_ms_per_step\": %.3f}\n",
              vocab.size(), build_ms, steps, 1000.0 * seconds / double(steps));

  // The mask's cost by state: where the trie walk visits most nodes.
  std::vector<float> logits(vocab.size());
  for (const char* prefix : {"{", "{\"", "{\"key\": ", "{\"key\": \"some text", "{\"key\": \"x\\", "{\"key\": 12",
                             "{\"key\": [1, ", "{\"k\": {}}"}) {
    JsonConstraint c(vocab, JsonGrammar::any_object());
    for (uint32_t id : tok.encode(prefix)) c.accept(int32_t(id));
    // The fastest of several runs: the machine is shared, and contention only ever adds time.
    double ms = 1e9;
    size_t allowed = 0;
    for (int r = 0; r < 20; ++r) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      const auto start = std::chrono::steady_clock::now();
      c.apply(logits);
      ms = std::min(ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    for (float l : logits) allowed += std::isfinite(l);
    EXPECT_GT(allowed, 0u) << prefix;
    std::printf("{\"after\": %s, \"allowed_tokens\": %zu, \"apply_ms\": %.3f}\n", json(prefix).dump().c_str(),
                allowed, ms);
  }
}

// The constraint through decode::Session's hooks on a tiny random-weight model. Both grammars
// admit only documents of bounded length (no free strings or arrays, whitespace runs bounded),
// so every run must end with the end token on a valid document.
TEST(JsonConstraintSession, GeneratesValidDocumentsThroughTheHooks) {
  const gguf::testing::TempDir dir;
  synth::SynthOptions o;
  o.arch = "qwen35moe";
  o.preset = "tiny";
  o.output = dir.file("tiny.gguf");
  o.progress = false;
  o.seed = 3;
  synth::run_synth(o);
  backend::CpuBackend backend(1);
  const auto model = model::Model::load(o.output, backend);
  const tokenizer::Tokenizer tok(tokenizer::read_vocab_metadata(model->reader()));
  const JsonVocab vocab(tok);
  const json schema = json::parse(R"({"type":"object","properties":{"ok":{"type":"boolean"},
      "n":{"type":"integer","minimum":0,"maximum":99},"tag":{"enum":["x","y z"]}},
      "required":["ok","n","tag"],"additionalProperties":false})");
  const json tools = json::parse(R"([{"type":"function","function":{"name":"set","parameters":{"type":"object",
      "properties":{"on":{"type":"boolean"}},"required":["on"],"additionalProperties":false}}}])");
  const auto prompt_ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<int32_t> prompt(prompt_ids.begin(), prompt_ids.end());
  for (uint64_t seed = 0; seed < 6; ++seed) {
    const bool tool = seed % 2 == 1;
    JsonConstraint constraint(vocab, tool ? JsonGrammar::tool_calls(tools, std::nullopt, false)
                                          : JsonGrammar::from_schema(schema));
    GenerateParams params;
    params.max_tokens = 400;
    params.sampling.temperature = 1.0f;
    params.sampling.seed = seed;
    params.logits_filter = [&](std::span<float> logits) { constraint.apply(logits); };
    params.on_token = [&](int32_t id) { constraint.accept(id); };
    Session session(*model, tok, {.n_ctx = 512});
    const GenerateResult r = session.generate(prompt, params, {});
    ASSERT_EQ(r.finish, FinishReason::Eos) << r.text;
    EXPECT_TRUE(constraint.complete());
    if (tool) {
      ToolCallParser parser;
      parser.feed(r.text);
      parser.finish();
      ASSERT_EQ(parser.tool_calls().size(), 1u) << r.text;
      EXPECT_EQ(parser.tool_calls()[0].name, "set");
      EXPECT_FALSE(validate_json_schema(tools[0]["function"]["parameters"], json::parse(parser.tool_calls()[0].arguments)));
    } else {
      check_document(r.text, schema);
    }
  }
}

}  // namespace
}  // namespace strata::decode
