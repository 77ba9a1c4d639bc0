// JSON Schema (the subset in docs/CONSTRAINED.md) -> JsonGrammar nodes.
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>

#include "decode/json_schema.h"
#include "util/error.h"

namespace strata::decode {

namespace {

using nlohmann::json;

// Keywords that only describe: accepted and ignored.
const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "default",    "examples", "$schema",   "$id",    "$comment",
    "$defs", "definitions", "deprecated", "readOnly", "writeOnly", "$anchor"};
const std::set<std::string, std::less<>> kObjectKeywords = {"properties", "required", "additionalProperties"};
const std::set<std::string, std::less<>> kArrayKeywords = {"items", "minItems", "maxItems"};
const std::set<std::string, std::less<>> kStringKeywords = {"minLength", "maxLength"};
const std::set<std::string, std::less<>> kNumberKeywords = {"minimum", "maximum", "exclusiveMinimum",
                                                            "exclusiveMaximum"};
const std::set<std::string, std::less<>> kOtherKeywords = {"type", "enum", "const", "anyOf", "oneOf", "$ref"};
const std::vector<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};

std::string pointer_token(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string where(const std::string& pointer) { return pointer.empty() ? "/" : pointer; }

// Builds nodes into one grammar; shared by the compilers of several documents (tool parameters).
class Builder {
 public:
  explicit Builder(JsonGrammar& g) : g_(g) {}

  uint32_t add(SchemaNode node) {
    if (g_.nodes.size() >= g_.limits.max_nodes)
      fail("json_schema: the schema compiles to more than ", g_.limits.max_nodes,
           " automaton states (the limit); simplify it");
    g_.nodes.push_back(std::move(node));
    return uint32_t(g_.nodes.size() - 1);
  }

  uint32_t add_literals(std::vector<std::string> texts) {
    std::sort(texts.begin(), texts.end());
    texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
    g_.literals.push_back(std::move(texts));
    return uint32_t(g_.literals.size() - 1);
  }

  SchemaNode literal_node(std::vector<std::string> texts) {
    SchemaNode n;
    n.kind = SchemaNode::Kind::Literal;
    n.literal = add_literals(std::move(texts));
    return n;
  }

  uint32_t free_string() {
    if (!free_string_) {
      SchemaNode n;
      n.kind = SchemaNode::Kind::String;
      free_string_ = add(n);
    }
    return *free_string_;
  }

  // Any JSON value: a union of a free object, a free array, string, number, true/false/null.
  uint32_t any_value() {
    if (any_) return *any_;
    any_ = add(SchemaNode{.kind = SchemaNode::Kind::Union});
    SchemaNode object{.kind = SchemaNode::Kind::Object};
    object.keys = add_literals({});
    object.free_keys = true;
    object.free_value = *any_;
    SchemaNode array{.kind = SchemaNode::Kind::Array};
    array.items = *any_;
    SchemaNode number{.kind = SchemaNode::Kind::Number};
    const std::vector<uint32_t> alternatives = {add(object), add(array), free_string(), add(number),
                                                add(literal_node({"false", "null", "true"}))};
    g_.nodes[*any_].alternatives = alternatives;
    any_object_ = alternatives[0];
    return *any_;
  }

  uint32_t any_object() {
    any_value();
    return *any_object_;
  }

  JsonGrammar& grammar() { return g_; }

 private:
  JsonGrammar& g_;
  std::optional<uint32_t> free_string_, any_, any_object_;
};

uint32_t count_limit(const json& schema, const char* key, const std::string& pointer, uint32_t fallback) {
  const auto it = schema.find(key);
  if (it == schema.end()) return fallback;
  if (!it->is_number_unsigned() || it->get<uint64_t>() >= kUnbounded)
    fail("json_schema ", where(pointer), ": \"", key, "\" must be a non-negative integer, got ", it->dump());
  return it->get<uint32_t>();
}

// Compiles one schema document; $ref pointers resolve inside it.
class Compiler {
 public:
  Compiler(Builder& builder, const json& document) : b_(builder), doc_(document) {}

  uint32_t compile(const json& schema, const std::string& pointer) {
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) fail("json_schema ", where(pointer), ": the schema false admits no value");
      return b_.any_value();
    }
    if (!schema.is_object())
      fail("json_schema ", where(pointer), ": a schema must be an object, got ", schema.dump());
    for (const auto& [key, _] : schema.items())
      if (!kAnnotations.contains(key) && !kObjectKeywords.contains(key) && !kArrayKeywords.contains(key) &&
          !kStringKeywords.contains(key) && !kNumberKeywords.contains(key) && !kOtherKeywords.contains(key))
        fail("json_schema ", where(pointer), ": unsupported keyword \"", key, "\"");
    if (schema.contains("$ref")) return compile_ref(schema, pointer);

    // Register before descending so that a $ref back to this schema finds it.
    const uint32_t id = b_.add(SchemaNode{});
    by_pointer_[pointer] = id;
    std::vector<uint32_t> alternatives;
    if (schema.contains("enum") || schema.contains("const")) {
      alternatives.push_back(b_.add(literals(schema, pointer)));
    } else {
      for (const auto& type : types(schema, pointer))
        alternatives.push_back(b_.add(typed(schema, type, pointer)));
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!schema.contains(key)) continue;
      for (const auto& [other, _] : schema.items())
        if (other != key && !kAnnotations.contains(other))
          fail("json_schema ", where(pointer), ": \"", other, "\" beside \"", key,
               "\" is not supported; move it into each alternative");
      alternatives = branches(schema.at(key), pointer + "/" + key);
    }

    SchemaNode& node = b_.grammar().nodes[id];
    if (alternatives.size() == 1 && b_.grammar().nodes[alternatives[0]].kind != SchemaNode::Kind::Union) {
      node = b_.grammar().nodes[alternatives[0]];
    } else {
      node.kind = SchemaNode::Kind::Union;
      node.alternatives = std::move(alternatives);
    }
    return id;
  }

 private:
  uint32_t compile_ref(const json& schema, const std::string& pointer) {
    for (const auto& [key, _] : schema.items())
      if (key != "$ref" && !kAnnotations.contains(key))
        fail("json_schema ", where(pointer), ": \"$ref\" beside \"", key, "\" is not supported");
    const auto& ref = schema.at("$ref");
    if (!ref.is_string() || !ref.get<std::string>().starts_with("#"))
      fail("json_schema ", where(pointer), ": \"$ref\" must point inside the schema (\"#/$defs/...\"), got ",
           ref.dump());
    const std::string target = ref.get<std::string>().substr(1);
    if (const auto it = by_pointer_.find(target); it != by_pointer_.end()) return it->second;
    if (!resolving_.insert(target).second)
      fail("json_schema ", where(pointer), ": \"$ref\" ", ref.dump(),
           " refers to itself without a schema between");
    const json* resolved = nullptr;
    try {
      const json::json_pointer p(target);
      if (doc_.contains(p)) resolved = &doc_.at(p);
    } catch (const json::exception&) {
    }
    if (!resolved) fail("json_schema ", where(pointer), ": \"$ref\" ", ref.dump(), " points at nothing");
    const uint32_t id = compile(*resolved, target);
    resolving_.erase(target);
    return id;
  }

  std::vector<uint32_t> branches(const json& list, const std::string& pointer) {
    if (!list.is_array() || list.empty()) fail("json_schema ", where(pointer), ": must be a non-empty array");
    std::vector<uint32_t> out;
    for (size_t i = 0; i < list.size(); ++i)
      out.push_back(compile(list[i], pointer + "/" + std::to_string(i)));
    return out;
  }

  // The types a schema without enum/const admits: its "type", else the types its keywords
  // constrain, else all of them.
  std::vector<std::string> types(const json& schema, const std::string& pointer) {
    std::vector<std::string> out;
    if (const auto it = schema.find("type"); it != schema.end()) {
      const json list = it->is_array() ? *it : json::array({*it});
      for (const auto& t : list) {
        if (!t.is_string() || std::find(kTypes.begin(), kTypes.end(), t.get<std::string>()) == kTypes.end())
          fail("json_schema ", where(pointer), ": unknown type ", t.dump());
        out.push_back(t.get<std::string>());
      }
      if (out.empty()) fail("json_schema ", where(pointer), ": \"type\" is an empty list");
      return out;
    }
    const auto has_any = [&](const auto& keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const auto& k) { return schema.contains(k); });
    };
    if (has_any(kObjectKeywords)) out.push_back("object");
    if (has_any(kArrayKeywords)) out.push_back("array");
    if (has_any(kStringKeywords)) out.push_back("string");
    if (has_any(kNumberKeywords)) out.push_back("number");
    if (out.empty() && !schema.contains("anyOf") && !schema.contains("oneOf")) out = {"any"};
    return out;
  }

  SchemaNode typed(const json& schema, const std::string& type, const std::string& pointer) {
    if (type == "any") return b_.grammar().nodes[b_.any_value()];
    if (type == "object") return object(schema, pointer);
    if (type == "array") return array(schema, pointer);
    if (type == "boolean") return b_.literal_node({"false", "true"});
    if (type == "null") return b_.literal_node({"null"});
    SchemaNode n;
    if (type == "string") {
      n.kind = SchemaNode::Kind::String;
      n.min_length = count_limit(schema, "minLength", pointer, 0);
      n.max_length = count_limit(schema, "maxLength", pointer, kUnbounded);
      if (n.min_length > n.max_length) fail("json_schema ", where(pointer), ": minLength > maxLength");
    } else {
      n.kind = SchemaNode::Kind::Number;
      n.integer = type == "integer";
      bounds(schema, pointer, n);
    }
    return n;
  }

  // minimum/maximum and the exclusive forms. An integer's become inclusive whole bounds; a
  // number's must be whole, which covers the usual 0..1, 0..100, > 0, and keeps the automaton
  // exact (a value's side of a whole bound depends only on its integer part and whether a
  // fraction follows).
  void bounds(const json& schema, const std::string& pointer, SchemaNode& n) {
    constexpr double kLimit = 1e15;  // the automaton's 15 digits
    const auto read = [&](const char* key) -> std::optional<double> {
      const auto it = schema.find(key);
      if (it == schema.end()) return std::nullopt;
      if (!it->is_number()) fail("json_schema ", where(pointer), ": \"", key, "\" must be a number, got ", it->dump());
      const double v = it->get<double>();
      if (std::abs(v) >= kLimit) fail("json_schema ", where(pointer), ": \"", key, "\" ", it->dump(), " is beyond 15 digits");
      if (!n.integer && v != std::floor(v))
        fail("json_schema ", where(pointer), ": \"", key, "\" ", it->dump(),
             " on a number: only whole bounds are supported (or use type integer)");
      return v;
    };
    for (const bool upper : {false, true}) {
      const char* inclusive_key = upper ? "maximum" : "minimum";
      const char* exclusive_key = upper ? "exclusiveMaximum" : "exclusiveMinimum";
      const auto inclusive = read(inclusive_key), exclusive = read(exclusive_key);
      if (inclusive && exclusive)
        fail("json_schema ", where(pointer), ": both \"", inclusive_key, "\" and \"", exclusive_key, "\"");
      if (!inclusive && !exclusive) continue;
      double v = inclusive ? *inclusive : *exclusive;
      bool open = exclusive.has_value();
      if (n.integer) {
        v = upper ? (open ? std::ceil(v) - 1 : std::floor(v)) : (open ? std::floor(v) + 1 : std::ceil(v));
        open = false;
      }
      (upper ? n.maximum : n.minimum) = int64_t(v);
      (upper ? n.exclusive_maximum : n.exclusive_minimum) = open;
    }
    if (n.minimum && n.maximum &&
        (*n.minimum > *n.maximum || (*n.minimum == *n.maximum && (n.exclusive_minimum || n.exclusive_maximum))))
      fail("json_schema ", where(pointer), ": no number lies between the minimum and the maximum");
  }

  SchemaNode object(const json& schema, const std::string& pointer) {
    SchemaNode n{.kind = SchemaNode::Kind::Object};
    std::map<std::string, uint32_t> props;  // encoded key -> node
    std::vector<std::string> required;
    if (const auto it = schema.find("properties"); it != schema.end()) {
      if (!it->is_object()) fail("json_schema ", where(pointer), ": \"properties\" must be an object");
      for (const auto& [name, sub] : it->items())
        props[json(name).dump()] = compile(sub, pointer + "/properties/" + pointer_token(name));
    }
    const auto additional = schema.find("additionalProperties");
    const bool closed = additional != schema.end() && additional->is_boolean() && !additional->get<bool>();
    if (const auto it = schema.find("required"); it != schema.end()) {
      if (!it->is_array()) fail("json_schema ", where(pointer), ": \"required\" must be an array of names");
      for (const auto& name : *it) {
        if (!name.is_string())
          fail("json_schema ", where(pointer), ": \"required\" holds ", name.dump(), ", not a name");
        const std::string key = name.dump();
        if (!props.contains(key)) {
          if (closed)
            fail("json_schema ", where(pointer), ": required property ", key,
                 " is not in \"properties\" and additionalProperties is false");
          props[key] = b_.any_value();
        }
        required.push_back(key);
      }
    }
    if (props.size() > 64)
      fail("json_schema ", where(pointer), ": ", props.size(), " properties; at most 64 are supported");
    std::vector<std::string> keys;
    for (const auto& [key, value] : props) {
      if (std::find(required.begin(), required.end(), key) != required.end())
        n.required |= uint64_t(1) << keys.size();
      keys.push_back(key);
      n.values.push_back(value);
    }
    n.keys = b_.add_literals(keys);
    if (props.empty() && !closed) {
      n.free_keys = true;
      n.free_value = additional != schema.end() && !additional->is_boolean()
                         ? compile(*additional, pointer + "/additionalProperties")
                         : b_.any_value();
    }
    return n;
  }

  SchemaNode array(const json& schema, const std::string& pointer) {
    SchemaNode n{.kind = SchemaNode::Kind::Array};
    const auto items = schema.find("items");
    if (items != schema.end() && items->is_array())
      fail("json_schema ", where(pointer), ": \"items\" as an array (tuple validation) is not supported");
    n.items = items == schema.end() ? b_.any_value() : compile(*items, pointer + "/items");
    n.min_items = count_limit(schema, "minItems", pointer, 0);
    n.max_items = count_limit(schema, "maxItems", pointer, kUnbounded);
    if (n.min_items > n.max_items) fail("json_schema ", where(pointer), ": minItems > maxItems");
    return n;
  }

  // enum/const: the values' compact texts, keeping those the rest of the schema admits.
  SchemaNode literals(const json& schema, const std::string& pointer) {
    json candidates = json::array();
    if (const auto it = schema.find("enum"); it != schema.end()) {
      if (!it->is_array() || it->empty())
        fail("json_schema ", where(pointer), ": \"enum\" must be a non-empty array");
      candidates = *it;
    } else {
      candidates.push_back(schema.at("const"));
    }
    std::vector<std::string> texts;
    for (const auto& value : candidates)
      if (!validate_json_schema_in(doc_, schema, value)) texts.push_back(value.dump());
    if (texts.empty())
      fail("json_schema ", where(pointer), ": no \"enum\"/\"const\" value satisfies the rest of the schema");
    return b_.literal_node(std::move(texts));
  }

  Builder& b_;
  const json& doc_;
  std::map<std::string, uint32_t> by_pointer_;
  std::set<std::string> resolving_;
};

// Replaces union alternatives that are unions by their own alternatives and merges the literal
// alternatives into one set, so the automaton forks only where two alternatives really share a
// first byte (two objects, a string and a string enum).
void flatten_unions(JsonGrammar& g) {
  for (size_t u = 0; u < g.nodes.size(); ++u) {
    if (g.nodes[u].kind != SchemaNode::Kind::Union) continue;
    std::vector<uint32_t> flat, pending(g.nodes[u].alternatives.rbegin(), g.nodes[u].alternatives.rend());
    std::set<uint32_t> seen = {uint32_t(u)};
    std::vector<std::string> merged;
    size_t literal_at = 0, literal_count = 0;
    while (!pending.empty()) {
      const uint32_t a = pending.back();
      pending.pop_back();
      if (!seen.insert(a).second) continue;
      const SchemaNode& alt = g.nodes[a];
      if (alt.kind == SchemaNode::Kind::Union) {
        pending.insert(pending.end(), alt.alternatives.rbegin(), alt.alternatives.rend());
        continue;
      }
      if (alt.kind == SchemaNode::Kind::Literal) {
        const auto& texts = g.literals[alt.literal];
        merged.insert(merged.end(), texts.begin(), texts.end());
        if (literal_count++ > 0) continue;
        literal_at = flat.size();
      }
      flat.push_back(a);
    }
    if (literal_count > 1) {
      std::sort(merged.begin(), merged.end());
      merged.erase(std::unique(merged.begin(), merged.end()), merged.end());
      g.literals.push_back(std::move(merged));
      g.nodes.push_back(
          SchemaNode{.kind = SchemaNode::Kind::Literal, .literal = uint32_t(g.literals.size() - 1)});
      flat[literal_at] = uint32_t(g.nodes.size() - 1);
    }
    g.nodes[u].alternatives = std::move(flat);
  }
}

// Least fixpoint of the frame height each node needs: kUnbounded stays for nodes no finite
// value satisfies.
void compute_heights(JsonGrammar& g) {
  const auto add = [](uint32_t a, uint32_t b) {
    return a == kUnbounded || b == kUnbounded ? kUnbounded : a + b;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& n : g.nodes) {
      uint32_t h = kUnbounded;
      switch (n.kind) {
        case SchemaNode::Kind::String:
        case SchemaNode::Kind::Number:
          h = 1;
          break;
        case SchemaNode::Kind::Literal:
          h = g.literals[n.literal].empty() ? kUnbounded : 1;
          break;
        case SchemaNode::Kind::Array:
          h = add(1, n.min_items > 0 ? g.nodes[n.items].height : 0);
          break;
        case SchemaNode::Kind::Object: {
          // A key's frame sits where its value's does, so values alone set the height.
          uint32_t deepest = 0;
          for (size_t i = 0; i < n.values.size(); ++i)
            if (n.required >> i & 1) deepest = std::max(deepest, g.nodes[n.values[i]].height);
          h = add(1, deepest);
          break;
        }
        case SchemaNode::Kind::Union:
          for (uint32_t a : n.alternatives) h = std::min(h, g.nodes[a].height);
          break;
      }
      if (h < n.height) {
        n.height = h;
        changed = true;
      }
    }
  }
}

// The first bytes a value of `node` (not a union) can begin with.
std::vector<uint8_t> first_bytes(const JsonGrammar& g, const SchemaNode& n) {
  switch (n.kind) {
    case SchemaNode::Kind::Object: return {'{'};
    case SchemaNode::Kind::Array: return {'['};
    case SchemaNode::Kind::String: return {'"'};
    case SchemaNode::Kind::Number: return {'-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'};
    case SchemaNode::Kind::Literal: {
      std::vector<uint8_t> out;
      for (const auto& t : g.literals[n.literal])
        if (!t.empty()) out.push_back(uint8_t(t[0]));
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
      return out;
    }
    case SchemaNode::Kind::Union: return {};
  }
  return {};
}

// An upper bound on the parses a value of the root can keep alive at once. A union opening with
// byte c starts every alternative that begins with c, each of which may split further; an
// object or array has one value open at a time. Computed for each nesting depth up to the limit
// (recursive $refs are cycles), saturating just past `cap`.
uint64_t parse_bound(const JsonGrammar& g, uint64_t cap) {
  const size_t n = g.nodes.size();
  std::vector<uint64_t> below(n, 1), here(n, 1);
  for (uint32_t depth = 1; depth <= g.limits.max_depth; ++depth) {
    // Non-unions first: their children's bounds are those one level down (`below`).
    for (size_t i = 0; i < n; ++i) {
      const SchemaNode& node = g.nodes[i];
      uint64_t p = 1;
      if (node.kind == SchemaNode::Kind::Array) p = std::max(p, below[node.items]);
      if (node.kind == SchemaNode::Kind::Object) {
        for (uint32_t v : node.values) p = std::max(p, below[v]);
        if (node.free_keys) p = std::max(p, below[node.free_value]);
      }
      here[i] = p;
    }
    // Unions (flattened: their alternatives are never unions) sum per first byte.
    for (size_t i = 0; i < n; ++i) {
      const SchemaNode& node = g.nodes[i];
      if (node.kind != SchemaNode::Kind::Union) continue;
      std::array<uint64_t, 256> by_byte{};
      for (uint32_t a : node.alternatives)
        for (uint8_t c : first_bytes(g, g.nodes[a])) by_byte[c] = std::min(cap + 1, by_byte[c] + here[a]);
      here[i] = std::max<uint64_t>(1, *std::max_element(by_byte.begin(), by_byte.end()));
    }
    std::swap(below, here);
  }
  return below[g.root];
}

void finish(JsonGrammar& g, Builder& b, const std::string& what) {
  if (g.limits.max_indent > 200) fail(what, ": max_indent ", g.limits.max_indent, " is above 200");
  g.free_string = b.free_string();
  flatten_unions(g);
  compute_heights(g);
  const uint32_t h = g.nodes[g.root].height;
  if (h == kUnbounded) fail(what, ": no finite JSON value satisfies the schema");
  if (h + 1 > g.limits.max_depth)
    fail(what, ": the schema nests ", h, " levels deep, more than the limit of ", g.limits.max_depth - 1);
  const uint64_t parses = parse_bound(g, g.limits.max_parses);
  if (parses > g.limits.max_parses)
    fail(what, ": anyOf/oneOf alternatives that begin alike could keep more than ",
         g.limits.max_parses, " parses alive at once (the limit); make the alternatives differ in "
         "their first byte or nest fewer of them");
}

}  // namespace

JsonGrammar JsonGrammar::any_object(const GrammarLimits& limits) {
  JsonGrammar g;
  g.limits = limits;
  Builder b(g);
  g.root = b.any_object();
  finish(g, b, "json_object");
  return g;
}

JsonGrammar JsonGrammar::from_schema(const nlohmann::json& schema, const GrammarLimits& limits) {
  JsonGrammar g;
  g.limits = limits;
  Builder b(g);
  g.root = schema.is_null() ? b.any_value() : Compiler(b, schema).compile(schema, "");
  finish(g, b, "json_schema");
  return g;
}

JsonGrammar JsonGrammar::tool_calls(const nlohmann::json& tools, std::optional<std::string_view> only,
                                    bool parallel, const GrammarLimits& limits) {
  JsonGrammar g;
  g.limits = limits;
  g.envelope = {.open = "<tool_call>\n",
                .close = "\n</tool_call>",
                .separator = "\n",
                .max_values = parallel ? 16u : 1u};
  Builder b(g);
  if (!tools.is_array() || tools.empty()) fail("tools: must be a non-empty array");
  std::vector<uint32_t> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = cat("tools[", i, "]");
    const auto& tool = tools[i];
    if (!tool.is_object() || !tool.contains("type") || tool.at("type") != "function" ||
        !tool.contains("function") || !tool.at("function").is_object())
      fail(at, ": expected {\"type\": \"function\", \"function\": {...}}");
    const auto& function = tool.at("function");
    if (!function.contains("name") || !function.at("name").is_string())
      fail(at, ".function.name: missing or not a string");
    const std::string name = function.at("name").get<std::string>();
    if (only && name != *only) continue;
    uint32_t arguments = b.any_object();
    if (const auto it = function.find("parameters"); it != function.end()) {
      try {
        arguments = Compiler(b, *it).compile(*it, "");
      } catch (const Error& e) {
        fail(at, ".function.parameters: ", e.what());
      }
      const SchemaNode& p = g.nodes[arguments];
      const bool objects = p.kind == SchemaNode::Kind::Object ||
                           (p.kind == SchemaNode::Kind::Union &&
                            std::all_of(p.alternatives.begin(), p.alternatives.end(), [&](uint32_t a) {
                              return g.nodes[a].kind == SchemaNode::Kind::Object;
                            }));
      if (!objects) fail(at, ".function.parameters: must describe an object");
    }
    SchemaNode call{.kind = SchemaNode::Kind::Object};
    call.keys = b.add_literals({"\"arguments\"", "\"name\""});
    call.values = {arguments, b.add(b.literal_node({json(name).dump()}))};
    call.required = 0b11;
    calls.push_back(b.add(call));
  }
  if (calls.empty()) fail("tool_choice: no tool named \"", only.value_or(""), "\" in tools");
  if (calls.size() > 64) fail("tools: ", calls.size(), " tools; a forced tool call supports at most 64");
  g.root = calls.size() == 1 ? calls[0]
                             : b.add(SchemaNode{.kind = SchemaNode::Kind::Union, .alternatives = calls});
  finish(g, b, "tools");
  return g;
}

}  // namespace strata::decode
