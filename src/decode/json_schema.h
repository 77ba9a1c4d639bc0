// What a constrained reply may be: a JSON grammar compiled from OpenAI's response_format
// (json_object, or json_schema with the subset of JSON Schema docs/CONSTRAINED.md lists) or from a
// request's tools (tool_choice "required" or a named function). The byte automaton in
// json_automaton.h runs it; validate_json_schema checks a finished document independently.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::decode {

inline constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();

// One compiled schema. Nodes refer to each other by index, so a recursive $ref is a cycle.
struct SchemaNode {
  enum class Kind : uint8_t { Object, Array, String, Number, Literal, Union };
  Kind kind = Kind::Literal;

  // Object. Declared properties are keyed by their JSON-encoded name (quotes included) in the
  // sorted literal set `keys`; property i of `values`/`required` is keys' i-th string. With no
  // declared properties and additionalProperties not false, any key is allowed (free_keys) and
  // its value follows `free_value`.
  uint32_t keys = 0;
  std::vector<uint32_t> values{};
  uint64_t required = 0;
  bool free_keys = false;
  uint32_t free_value = 0;

  // Array.
  uint32_t items = 0;
  uint32_t min_items = 0, max_items = kUnbounded;

  // String: lengths in code points, as JSON Schema counts them.
  uint32_t min_length = 0, max_length = kUnbounded;

  // Number: digits only (no fraction or exponent) for "integer". Bounds are whole numbers
  // (minimum/maximum and their exclusive forms); a bounded number has no exponent.
  bool integer = false;
  std::optional<int64_t> minimum{}, maximum{};
  bool exclusive_minimum = false, exclusive_maximum = false;

  // Literal: the value must be one of these texts (index into JsonGrammar::literals).
  uint32_t literal = 0;

  // Union (anyOf/oneOf, type lists): alternatives, none of them a Union.
  std::vector<uint32_t> alternatives{};

  // The fewest automaton frames a value of this node needs; kUnbounded when no finite value
  // satisfies it (a property that requires itself).
  uint32_t height = kUnbounded;
};

// Text around the JSON value(s): empty for response_format; Qwen's
// "<tool_call>\n" ... "\n</tool_call>" for forced tool calls, up to max_values of them
// separated by `separator`.
struct Envelope {
  std::string open, close, separator;
  uint32_t max_values = 1;
};

// Bounds on what a request may make the automaton do; compiling a grammar past one of the first
// three is a strata::Error naming it (the server answers 400).
struct GrammarLimits {
  // Whitespace between two tokens of the document: "", " ", or "\n" and at most max_indent
  // spaces or tabs (at most 200); compact allows only "" and " ".
  uint32_t max_indent = 20;
  bool compact = false;
  uint32_t max_depth = 32;       // deepest nesting of objects and arrays (the root counts as 1)
  uint32_t max_nodes = 16384;    // schema nodes (automaton states) after compiling
  // Parses that could be alive at once: anyOf alternatives that begin with the same byte all
  // start, and nested ones multiply. Bounds the work of a mask (JsonConstraint::apply).
  uint32_t max_parses = 1024;
  // Automaton steps one mask may take, a backstop on time: past it the mask throws
  // strata::Error and the generation fails instead of running on.
  uint64_t max_mask_steps = 50'000'000;
};

class JsonGrammar {
 public:
  // response_format {"type": "json_object"}: any JSON object.
  static JsonGrammar any_object(const GrammarLimits& limits = {});

  // response_format {"type": "json_schema"}: `schema` is json_schema.schema (null or true: any
  // JSON value). Throws strata::Error naming the JSON pointer and the problem, e.g.
  // "json_schema /properties/age: unsupported keyword \"minimum\"".
  static JsonGrammar from_schema(const nlohmann::json& schema, const GrammarLimits& limits = {});

  // A forced tool call: Qwen's <tool_call> block(s) whose JSON is {"name": N, "arguments": A}
  // with N one of `tools` (OpenAI's [{"type": "function", "function": {"name", "parameters"}}])
  // and A matching that tool's parameters schema. `only` restricts the choice to one function
  // (tool_choice {"type": "function", ...}); `parallel` allows several blocks. Throws
  // strata::Error naming the tool and the problem.
  static JsonGrammar tool_calls(const nlohmann::json& tools, std::optional<std::string_view> only,
                                bool parallel, const GrammarLimits& limits = {});

  std::vector<SchemaNode> nodes;
  std::vector<std::vector<std::string>> literals;  // each sorted bytewise, unique
  uint32_t root = 0;
  uint32_t free_string = 0;  // a String node without limits: the keys of free objects
  Envelope envelope;
  GrammarLimits limits;
};

// Checks `value` against `schema` (the same keyword subset the compiler accepts; oneOf means
// exactly one; a null schema allows anything). Returns nullopt when valid, else the first problem with its JSON pointer.
// Independent of the compiled grammar, so tests can check the automaton against it.
std::optional<std::string> validate_json_schema(const nlohmann::json& schema, const nlohmann::json& value);
// The same for a schema inside `document`, against which its "$ref"s resolve.
std::optional<std::string> validate_json_schema_in(const nlohmann::json& document,
                                                   const nlohmann::json& schema, const nlohmann::json& value);

}  // namespace strata::decode
