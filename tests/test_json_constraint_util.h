// Shared by the constrained-decoding tests: a toy vocabulary and a generation loop that samples
// from random logits under a JsonConstraint.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "decode/json_constraint.h"
#include "decode/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/rng.h"

namespace strata::decode::testing {

// A real byte-level BPE of 3000 tokens with Qwen's added tokens (eos <|im_end|>, <tool_call>).
inline const tokenizer::Tokenizer& toy_tokenizer() {
  static const tokenizer::Tokenizer tok(tokenizer::generate_byte_level_bpe(3000, 11));
  return tok;
}

inline const JsonVocab& toy_vocab() {
  static const JsonVocab vocab(toy_tokenizer());
  return vocab;
}

struct Generated {
  std::string text;
  bool completed = false;  // an end token was sampled
  size_t steps = 0;
  double apply_seconds = 0;
};

// Samples up to max_steps tokens from random logits (plus a bias, growing with the step count,
// towards tokens holding '"', ']' or '}' so that documents tend to finish) through the
// constraint, greedily or with the engine's Sampler (temperature 1, top-k 64). Fails the test if a mask
// leaves no token or the sampler picks a masked one. The logits are longer than the vocabulary,
// as a model's padded output is.
inline Generated generate_constrained(const JsonVocab& vocab, JsonGrammar grammar, uint64_t seed,
                                      size_t max_steps, bool greedy) {
  JsonConstraint constraint(vocab, std::move(grammar));
  Rng rng(seed);
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_k = 64;
  params.seed = seed;
  Sampler sampler(params, int64_t(vocab.size() + 7));
  std::vector<float> logits(vocab.size() + 7);
  std::vector<int32_t> history;
  std::vector<uint8_t> closes(vocab.size()), ends(vocab.size());
  for (size_t i = 0; i < vocab.size(); ++i) {
    closes[i] = vocab.bytes(int32_t(i)).find_first_of("\"]}") != std::string::npos;
    ends[i] = vocab.is_end(int32_t(i));
  }
  Generated out;
  for (; out.steps < max_steps; ++out.steps) {
    const float bias = 0.02f * float(out.steps);
    for (size_t i = 0; i < logits.size(); ++i) {
      logits[i] = 6.0f * rng.uniform();
      if (i < vocab.size()) logits[i] += float(closes[i]) * bias + float(ends[i]) * 1000.0f;
    }
    const auto start = std::chrono::steady_clock::now();
    constraint.apply(logits);
    out.apply_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    size_t finite = 0;
    for (float l : logits) finite += std::isfinite(l);
    EXPECT_GT(finite, 0u) << "empty mask after " << out.text;
    const int32_t id = greedy ? argmax(logits) : sampler.sample(logits, history);
    EXPECT_TRUE(std::isfinite(logits[size_t(id)])) << "picked masked token " << id << " after " << out.text;
    if (vocab.is_end(id)) {
      out.completed = true;
      break;
    }
    constraint.accept(id);
    history.push_back(id);
    out.text += vocab.bytes(id);
  }
  return out;
}

// Schemas the generation tests run: every keyword the compiler supports, anyOf forks, recursion.
inline const char* kSchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer"},
        "email":{"type":["string","null"]},"tags":{"type":"array","items":{"type":"string","enum":["a","b","c d"]},
        "minItems":1,"maxItems":3}},"required":["name","age","tags"],"additionalProperties":false})",
    R"({"anyOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},"required":["kind","r"],"additionalProperties":false},
                 {"type":"object","properties":{"kind":{"const":"square"},"side":{"type":"number"}},"required":["kind","side"],"additionalProperties":false}]})",
    R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
        "children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["value"],"additionalProperties":false}}})",
    R"({"type":"number"})",
    R"({"enum":[1,12,"x",null,{"a":[1]}]})",
    R"({"type":"object","properties":{"s":{"type":"string","minLength":2,"maxLength":4}},"required":["s"],"additionalProperties":false})",
    R"({"type":"array","items":{"type":"boolean"},"minItems":2})",
    R"({"oneOf":[{"type":"string","maxLength":30},{"type":"integer"}]})",
    R"({"type":"object","additionalProperties":{"type":"integer"}})",
    R"({"type":"object","properties":{"id":{"type":"string"},"meta":{}},"required":["id","meta"]})",
    "true",
    R"({"type":"object","properties":{"p":{"type":"number","minimum":0,"maximum":1},
        "n":{"type":"integer","minimum":-3,"exclusiveMaximum":7},"z":{"type":"number","exclusiveMinimum":0},
        "w":{"type":"number","minimum":-100,"maximum":-99}},"required":["p","n","z","w"],"additionalProperties":false})",
};

// Fails the test unless `text` parses and validates against `schema` (null: any object).
inline void check_document(const std::string& text, const nlohmann::json& schema) {
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << "does not parse: " << text << "\n" << e.what();
    return;
  }
  if (schema.is_null()) {
    EXPECT_TRUE(value.is_object()) << text;
  } else if (const auto problem = validate_json_schema(schema, value)) {
    ADD_FAILURE() << "does not validate: " << text << "\n" << *problem;
  }
}

}  // namespace strata::decode::testing
