#include "server/json_fields.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace strata::server {

std::string json_type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

void throw_invalid_type(const std::string& path, const Json& v, const char* expected) {
  throw ApiError(400,
                 cat("Invalid type for '", path, "': expected ", expected, ", but got ",
                     json_type_name(v), " instead."),
                 path, "invalid_type");
}

Fields::Fields(const Json& object, std::string prefix)
    : object_(object), prefix_(std::move(prefix)) {}

const Json* Fields::find(std::string_view key) const {
  const auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

const Json& Fields::require(std::string_view key) const {
  const Json* v = find(key);
  if (!v)
    throw ApiError(400, cat("Missing required parameter: '", path(key), "'."), path(key),
                   "missing_required_parameter");
  return *v;
}

namespace {

template <typename T>
std::string show(T v) {
  return cat(v);
}

std::string show(double v) {
  // Integral values print without a fraction, as OpenAI's messages do.
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) return cat(int64_t(v));
  return cat(v);
}

template <typename T>
void check_range(const std::string& path, T v, T lo, T hi, const char* kind) {
  if (v < lo)
    throw ApiError(400,
                   cat("Invalid '", path, "': ", kind, " below minimum value. Expected a value >= ",
                       show(lo), ", but got ", show(v), " instead."),
                   path, cat(kind, "_below_min_value"));
  if (v > hi)
    throw ApiError(400,
                   cat("Invalid '", path, "': ", kind, " above maximum value. Expected a value <= ",
                       show(hi), ", but got ", show(v), " instead."),
                   path, cat(kind, "_above_max_value"));
}

}  // namespace

std::optional<double> Fields::number(std::string_view key, double lo, double hi) const {
  const Json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw_invalid_type(path(key), *v, "a number");
  const double d = v->get<double>();
  check_range(path(key), d, lo, hi, "decimal");
  return d;
}

std::optional<int64_t> Fields::integer(std::string_view key, int64_t lo, int64_t hi) const {
  const Json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) throw_invalid_type(path(key), *v, "an integer");
  // An unsigned value past int64 is simply too large.
  const int64_t i = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)
                        ? INT64_MAX
                        : v->get<int64_t>();
  check_range(path(key), i, lo, hi, "integer");
  return i;
}

std::optional<bool> Fields::boolean(std::string_view key) const {
  const Json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw_invalid_type(path(key), *v, "a boolean");
  return v->get<bool>();
}

std::optional<std::string> Fields::string(std::string_view key) const {
  const Json* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw_invalid_type(path(key), *v, "a string");
  return v->get<std::string>();
}

const Json* Fields::object(std::string_view key) const {
  const Json* v = find(key);
  if (v && !v->is_object()) throw_invalid_type(path(key), *v, "an object");
  return v;
}

const Json* Fields::array(std::string_view key) const {
  const Json* v = find(key);
  if (v && !v->is_array()) throw_invalid_type(path(key), *v, "an array");
  return v;
}

void Fields::reject_unknown(std::initializer_list<std::string_view> known) const {
  for (const auto& [key, value] : object_.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw ApiError(400, cat("Unrecognized request argument supplied: ", path(key)), path(key),
                     "unrecognized_argument");
}

Json parse_body(std::string_view body, int max_depth) {
  const ApiError too_deep(400, cat("The JSON body nests deeper than ", max_depth, " levels."), "",
                          "invalid_json");
  // Stops at the first value past the limit: a body of 10^6 open brackets costs no more than
  // max_depth levels of document.
  const Json::parser_callback_t track_depth = [&](int depth, Json::parse_event_t, Json&) {
    if (depth > max_depth) throw too_deep;
    return true;
  };
  Json doc;
  try {
    doc = Json::parse(body.begin(), body.end(), track_depth);
  } catch (const Json::exception& e) {
    // nlohmann names the byte offset and what it expected, which is what a client needs.
    throw ApiError(400, cat("The request body is not valid JSON: ", e.what()), "",
                   "invalid_json");
  }
  if (!doc.is_object())
    throw ApiError(400,
                   cat("Invalid type for the request body: expected an object, but got ",
                       json_type_name(doc), " instead."),
                   "", "invalid_type");
  return doc;
}

}  // namespace strata::server
