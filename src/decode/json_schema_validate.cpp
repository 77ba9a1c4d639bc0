// A direct JSON Schema check of a finished document, written from the keyword definitions and
// not from the grammar, so the tests can hold the automaton against it.
#include <algorithm>
#include <cmath>

#include "decode/json_schema.h"
#include "util/error.h"

namespace strata::decode {

namespace {

using nlohmann::json;

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool has_type(const json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "number") return v.is_number();
  if (type == "integer")
    return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  return false;
}

class Validator {
 public:
  explicit Validator(const json& document) : doc_(document) {}

  std::optional<std::string> check(const json& schema, const json& v, const std::string& at,
                                   int depth) const {
    if (depth > 256) return at + ": $ref recursion too deep";
    if (schema.is_boolean()) return schema.get<bool>() ? std::nullopt : std::optional(at + ": schema false");
    if (!schema.is_object()) return at + ": not a schema";
    if (const auto it = schema.find("$ref"); it != schema.end()) {
      const json::json_pointer p(it->get<std::string>().substr(1));
      return check(doc_.at(p), v, at, depth + 1);
    }
    if (const auto it = schema.find("type"); it != schema.end()) {
      const json types = it->is_array() ? *it : json::array({*it});
      bool any = false;
      for (const auto& t : types) any = any || has_type(v, t.get<std::string>());
      if (!any) return cat(at, ": ", v.dump(), " is not of type ", it->dump());
    }
    if (const auto it = schema.find("enum"); it != schema.end())
      if (std::find(it->begin(), it->end(), v) == it->end())
        return cat(at, ": ", v.dump(), " is not in the enum");
    if (const auto it = schema.find("const"); it != schema.end())
      if (*it != v) return cat(at, ": ", v.dump(), " is not the const ", it->dump());
    if (const auto it = schema.find("anyOf"); it != schema.end()) {
      size_t ok = 0;
      for (const auto& alt : *it) ok += !check(alt, v, at, depth + 1);
      if (ok == 0) return at + ": matches no anyOf alternative";
    }
    if (const auto it = schema.find("oneOf"); it != schema.end()) {
      size_t ok = 0;
      for (const auto& alt : *it) ok += !check(alt, v, at, depth + 1);
      if (ok != 1) return cat(at, ": matches ", ok, " oneOf alternatives, not exactly one");
    }
    if (v.is_number()) {
      const double x = v.get<double>();
      if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return cat(at, ": below minimum");
      if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return cat(at, ": above maximum");
      if (schema.contains("exclusiveMinimum") && x <= schema["exclusiveMinimum"].get<double>())
        return cat(at, ": not above exclusiveMinimum");
      if (schema.contains("exclusiveMaximum") && x >= schema["exclusiveMaximum"].get<double>())
        return cat(at, ": not below exclusiveMaximum");
    }
    if (v.is_object()) return check_object(schema, v, at, depth);
    if (v.is_array()) return check_array(schema, v, at, depth);
    if (v.is_string()) {
      const size_t n = code_points(v.get<std::string>());
      if (schema.contains("minLength") && n < schema["minLength"].get<size_t>())
        return cat(at, ": shorter than minLength");
      if (schema.contains("maxLength") && n > schema["maxLength"].get<size_t>())
        return cat(at, ": longer than maxLength");
    }
    return std::nullopt;
  }

 private:
  std::optional<std::string> check_object(const json& schema, const json& v, const std::string& at,
                                          int depth) const {
    const json properties = schema.value("properties", json::object());
    for (const auto& name : schema.value("required", json::array()))
      if (!v.contains(name.get<std::string>()))
        return cat(at, ": required property ", name.dump(), " is missing");
    const auto additional = schema.find("additionalProperties");
    for (const auto& [key, value] : v.items()) {
      const std::string sub = at + "/" + key;
      if (properties.contains(key)) {
        if (auto e = check(properties[key], value, sub, depth + 1)) return e;
      } else if (additional != schema.end()) {
        if (auto e = check(*additional, value, sub, depth + 1)) return e;
      }
    }
    return std::nullopt;
  }

  std::optional<std::string> check_array(const json& schema, const json& v, const std::string& at,
                                         int depth) const {
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>())
      return at + ": fewer than minItems";
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>())
      return at + ": more than maxItems";
    if (const auto it = schema.find("items"); it != schema.end())
      for (size_t i = 0; i < v.size(); ++i)
        if (auto e = check(*it, v[i], cat(at, "/", i), depth + 1)) return e;
    return std::nullopt;
  }

  const json& doc_;
};

}  // namespace

std::optional<std::string> validate_json_schema_in(const nlohmann::json& document,
                                                   const nlohmann::json& schema,
                                                   const nlohmann::json& value) {
  if (schema.is_null()) return std::nullopt;  // as JsonGrammar::from_schema: any value
  try {
    return Validator(document).check(schema, value, "", 0);
  } catch (const nlohmann::json::exception& e) {
    return cat("malformed schema: ", e.what());
  }
}

std::optional<std::string> validate_json_schema(const nlohmann::json& schema, const nlohmann::json& value) {
  return validate_json_schema_in(schema, schema, value);
}

}  // namespace strata::decode
