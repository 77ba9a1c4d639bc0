// Typed, optional reads of a request's JSON object with OpenAI's error messages: a field that is
// absent or null reads as absent; a present one of the wrong type or out of range throws
// ApiError(400) naming it by its path ("messages[2].content").
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace strata::server {

using Json = nlohmann::ordered_json;

// "a string", "an object", ... as OpenAI's messages name JSON types.
std::string json_type_name(const Json& v);

[[noreturn]] void throw_invalid_type(const std::string& path, const Json& v, const char* expected);

class Fields {
 public:
  // `object` must be a JSON object; `prefix` is its path ("" at the top, "messages[0].").
  Fields(const Json& object, std::string prefix);

  // The value, or nullptr when absent or null.
  const Json* find(std::string_view key) const;
  // Throws 400 missing_required_parameter when absent or null.
  const Json& require(std::string_view key) const;

  std::optional<double> number(std::string_view key, double lo, double hi) const;
  std::optional<int64_t> integer(std::string_view key, int64_t lo, int64_t hi) const;
  std::optional<bool> boolean(std::string_view key) const;
  std::optional<std::string> string(std::string_view key) const;
  // An object or array field; throws invalid_type for anything else.
  const Json* object(std::string_view key) const;
  const Json* array(std::string_view key) const;

  // Throws 400 unrecognized_argument for a key outside `known`.
  void reject_unknown(std::initializer_list<std::string_view> known) const;

  std::string path(std::string_view key) const { return prefix_ + std::string(key); }

 private:
  const Json& object_;
  std::string prefix_;
};

// Parses a request body: 400 invalid_json for bad JSON or nesting deeper than max_depth,
// 400 invalid_type when the top level is not an object.
Json parse_body(std::string_view body, int max_depth);

}  // namespace strata::server
