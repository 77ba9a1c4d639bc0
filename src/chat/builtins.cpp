// Jinja's filters and tests, with Python's semantics where Jinja defers to Python (str(),
// len(), sorting). Text case mapping (lower, upper, title, capitalize) covers ASCII only.
#include "chat/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace strata::chat {
namespace {

template <typename... Parts>
[[noreturn]] void eval_fail(Parts&&... parts) {
  throw EvalError(cat(std::forward<Parts>(parts)...));
}

std::string ascii_map(const std::string& s, int (*f)(int)) {
  std::string out = s;
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x80) c = char(f(static_cast<unsigned char>(c)));
  return out;
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return 0;
    case Value::Kind::String:
      return int64_t(code_points(v.str()).size());
    case Value::Kind::Array:
      return int64_t(v.array().size());
    case Value::Kind::Object:
      if (v.is_mapping()) return int64_t(v.object().items.size());
      break;
    default:
      break;
  }
  eval_fail("object of type '", v.type_name(), "' has no len()");
}

// What `for x in v` and list(v) iterate: list items, dict keys, string code points.
Array iterate(const Value& v, const char* what) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::Array:
      return v.array();
    case Value::Kind::String: {
      Array out;
      for (auto cp : code_points(v.str())) out.emplace_back(std::string(cp));
      return out;
    }
    case Value::Kind::Object:
      if (v.is_mapping()) {
        Array out;
        for (const auto& kv : v.object().items) out.emplace_back(kv.first);
        return out;
      }
      break;
    default:
      break;
  }
  eval_fail(what, ": '", v.type_name(), "' object is not iterable");
}

// Jinja's attribute paths for map/selectattr/sort: "a.b" or "items.0".
Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur.is_undefined()) return cur;
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      cur = get_item(cur, Value(int64_t(std::stoll(part))));
    else
      cur = get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Python's int(str): optional sign and surrounding whitespace, digits with single underscores.
std::optional<int64_t> parse_int(const std::string& text) {
  const std::string s = strip(text, Value(), true, true);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i == s.size()) return std::nullopt;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    if (s[i] == '_' && prev_digit && i + 1 < s.size()) {
      prev_digit = false;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return std::nullopt;
    if (v > (INT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + (s[i] - '0');
    prev_digit = true;
  }
  return negative ? -v : v;
}

std::optional<double> parse_float(const std::string& text) {
  const std::string s = strip(text, Value(), true, true);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

// json.dumps(ensure_ascii=True): every non-ASCII code point as \uXXXX (surrogate pairs above
// U+FFFF). Outside strings JSON text is ASCII, so the whole text can be mapped.
std::string ascii_escape(const std::string& json) {
  std::string out;
  size_t pos = 0;
  while (pos < json.size()) {
    const size_t start = pos;
    uint32_t cp = tokenizer::utf8::next(json, pos);
    if (cp < 0x80) {
      out.append(json, start, pos - start);
      continue;
    }
    if (cp == tokenizer::utf8::kInvalid) cp = 0xFFFD;
    char buf[16];
    if (cp > 0xFFFF) {
      cp -= 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    }
    out += buf;
  }
  return out;
}

// Jinja's sort key: strings compared case-insensitively unless case_sensitive.
Value sort_key(const Value& v, const Value* attribute, bool case_sensitive) {
  Value k = attribute ? attribute_path(v, to_str(*attribute)) : v;
  if (!case_sensitive && k.is_string()) return Value(ascii_map(k.str(), [](int c) { return std::tolower(c); }));
  return k;
}

Array sorted(Array items, bool reverse, bool case_sensitive, const Value* attribute) {
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(x, attribute, case_sensitive), ky = sort_key(y, attribute, case_sensitive);
    return reverse ? less(ky, kx) : less(kx, ky);
  });
  return items;
}

// select/reject/selectattr/rejectattr: args are [attr,] test name, test args...
Value select_items(const std::string& name, const Value& operand, Args& args) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep_matches = name == "select" || name == "selectattr";
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    if (args.positional.empty() || !args.positional[0].is_string())
      eval_fail(name, "() needs an attribute name");
    attr = args.positional[next++].str();
  }
  std::string test;
  if (next < args.positional.size()) test = to_str(args.positional[next++]);
  Args test_args;
  test_args.positional.assign(args.positional.begin() + std::ptrdiff_t(next), args.positional.end());
  test_args.keyword = args.keyword;
  Array out;
  for (const Value& item : iterate(operand, name.c_str())) {
    const Value subject = by_attr ? attribute_path(item, attr) : item;
    Args copy = test_args;
    const bool hit = test.empty() ? subject.truthy() : apply_test(test, subject, copy);
    if (hit == keep_matches) out.push_back(item);
  }
  return Value(std::move(out));
}

Value map_items(const Value& operand, Args& args) {
  Array out;
  for (const auto& [k, v] : args.keyword)
    if (k != "attribute" && k != "default") eval_fail("map() got an unexpected keyword argument '", k, "'");
  const auto attr = std::find_if(args.keyword.begin(), args.keyword.end(), [](auto& kv) { return kv.first == "attribute"; });
  if (attr != args.keyword.end()) {
    const auto dflt = std::find_if(args.keyword.begin(), args.keyword.end(), [](auto& kv) { return kv.first == "default"; });
    for (const Value& item : iterate(operand, "map")) {
      Value v = attribute_path(item, to_str(attr->second));
      out.push_back(v.is_undefined() && dflt != args.keyword.end() ? dflt->second : v);
    }
    return Value(std::move(out));
  }
  if (args.positional.empty()) eval_fail("map() needs a filter name or attribute=");
  const std::string filter = to_str(args.positional[0]);
  Args filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  for (const Value& item : iterate(operand, "map")) {
    Args copy = filter_args;
    out.push_back(apply_filter(filter, item, copy));
  }
  return Value(std::move(out));
}

std::string indent_text(const std::string& s, const Value& width, bool first, bool blank) {
  const std::string pad = width.is_string() ? width.str() : std::string(size_t(std::max<int64_t>(0, width.is_int() ? width.as_int() : 4)), ' ');
  std::string out;
  size_t start = 0;
  for (size_t line = 0;; ++line) {
    const size_t nl = s.find('\n', start);
    const std::string_view text = std::string_view(s).substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    const bool is_blank = strip(std::string(text), Value(), true, true).empty();
    if ((line > 0 || first) && (blank || !is_blank)) out += pad;
    out += text;
    if (nl == std::string::npos) return out;
    out += '\n';
    start = nl + 1;
  }
}

Value number_filter(const std::string& name, const Value& v, Args& args) {
  if (name == "int") {
    Params p("int", args, {"default", "base"});
    const Value dflt = p.get_or(0, Value(0));
    if (v.is_int()) return v;
    if (v.is_bool()) return Value(int64_t(v.as_bool()));
    if (v.is_float()) return std::isfinite(v.as_double()) ? Value(int64_t(std::trunc(v.as_double()))) : dflt;
    if (v.is_string()) {
      if (auto i = parse_int(v.str())) return Value(*i);
      if (auto f = parse_float(v.str()); f && std::isfinite(*f)) return Value(int64_t(std::trunc(*f)));
    }
    return dflt;
  }
  if (name == "float") {
    Params p("float", args, {"default"});
    if (v.is_number() || v.is_bool()) return Value(v.as_double());
    if (v.is_string())
      if (auto f = parse_float(v.str())) return Value(*f);
    return p.get_or(0, Value(0.0));
  }
  if (name == "abs") {
    Params p("abs", args, {});
    if (v.is_int()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    if (v.is_float()) return Value(std::fabs(v.as_double()));
    eval_fail("bad operand type for abs(): '", v.type_name(), "'");
  }
  Params p("round", args, {"precision", "method"});
  if (!v.is_number()) eval_fail("round: expected a number, got ", v.type_name());
  const int64_t precision = p.get_or(0, Value(0)).is_int() ? p.get_or(0, Value(0)).as_int() : 0;
  const std::string method = to_str(p.get_or(1, Value("common")));
  const double scale = std::pow(10.0, double(precision));
  const double x = v.as_double() * scale;
  const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
  return Value(r / scale);
}

}  // namespace

Value apply_filter(const std::string& name, const Value& v, Args& args) {
  if (name == "safe") return v;
  if (name == "tojson") {
    Params p("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
    const Value indent = p.get_or(1, Value::none());
    if (!indent.is_none() && !indent.is_int()) eval_fail("tojson: indent must be an int or None");
    if (p.get(2) && !p.get(2)->is_none()) eval_fail("tojson: custom separators are not supported");
    const std::string json = to_json_text(v, indent.is_none() ? -1 : int(std::max<int64_t>(0, indent.as_int())),
                                          p.get_or(3, Value(false)).truthy());
    return Value(p.get_or(0, Value(false)).truthy() ? ascii_escape(json) : json);
  }
  if (name == "string") {
    Params p("string", args, {});
    return v.is_string() ? v : Value(to_str(v));
  }
  if (name == "length" || name == "count") {
    Params p(name.c_str(), args, {});
    return Value(length(v));
  }
  if (name == "trim") {
    Params p("trim", args, {"chars"});
    return Value(strip(to_str(v), p.get_or(0, Value()), true, true));
  }
  if (name == "lower" || name == "upper") {
    Params p(name.c_str(), args, {});
    return Value(ascii_map(to_str(v), name == "lower" ? [](int c) { return std::tolower(c); } : [](int c) { return std::toupper(c); }));
  }
  if (name == "capitalize" || name == "title") {
    Params p(name.c_str(), args, {});
    std::string s = ascii_map(to_str(v), [](int c) { return std::tolower(c); });
    bool start = true;
    for (char& c : s) {
      const bool letter = std::isalpha(static_cast<unsigned char>(c));
      if (start && letter) c = char(std::toupper(static_cast<unsigned char>(c)));
      start = name == "title" && !letter;
    }
    return Value(std::move(s));
  }
  if (name == "default" || name == "d") {
    Params p("default", args, {"default_value", "boolean"});
    const bool use_default = p.get_or(1, Value(false)).truthy() ? !v.truthy() : v.is_undefined();
    return use_default ? p.get_or(0, Value("")) : v;
  }
  if (name == "items") {
    Params p("items", args, {});
    if (v.is_undefined()) return Value(Array{});
    if (!v.is_mapping()) eval_fail("items: expected a dict, got ", v.type_name());
    Array out;
    for (const auto& [k, e] : v.object().items) out.emplace_back(Array{Value(k), e});
    return Value(std::move(out));
  }
  if (name == "dictsort") {
    Params p("dictsort", args, {"case_sensitive", "by", "reverse"});
    if (!v.is_mapping()) eval_fail("dictsort: expected a dict, got ", v.type_name());
    Array pairs;
    for (const auto& [k, e] : v.object().items) pairs.emplace_back(Array{Value(k), e});
    const Value index(int64_t(to_str(p.get_or(1, Value("key"))) == "value" ? 1 : 0));
    const Value attr(to_str(index));
    return Value(sorted(std::move(pairs), p.get_or(2, Value(false)).truthy(), p.get_or(0, Value(false)).truthy(), &attr));
  }
  if (name == "first" || name == "last") {
    Params p(name.c_str(), args, {});
    const Array items = iterate(v, name.c_str());
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    Params p("join", args, {"d", "attribute"});
    const std::string sep = to_str(p.get_or(0, Value("")));
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v, "join")) {
      if (!first) out += sep;
      first = false;
      out += to_str(p.get(1) ? attribute_path(item, to_str(*p.get(1))) : item);
      if (out.size() > kMaxBytes) eval_fail("join: result larger than ", kMaxBytes, " bytes");
    }
    return Value(std::move(out));
  }
  if (name == "replace") {
    Params p("replace", args, {"old", "new", "count"});
    Args inner;
    inner.positional = {p.required(0), p.required(1)};
    if (p.get(2) && !p.get(2)->is_none()) inner.positional.push_back(*p.get(2));
    return get_attr(Value(to_str(v)), "replace").function()(inner);
  }
  if (name == "int" || name == "float" || name == "abs" || name == "round") return number_filter(name, v, args);
  if (name == "list") {
    Params p("list", args, {});
    return Value(iterate(v, "list"));
  }
  if (name == "reverse") {
    Params p("reverse", args, {});
    const Value step(-1);
    if (v.is_string()) return slice(v, nullptr, nullptr, &step);
    Array items = iterate(v, "reverse");
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "unique") {
    Params p("unique", args, {"case_sensitive", "attribute"});
    Array out;
    for (const Value& item : iterate(v, "unique")) {
      const Value key = sort_key(item, p.get(1), p.get_or(0, Value(false)).truthy());
      if (std::none_of(out.begin(), out.end(), [&](const Value& seen) {
            return equal(sort_key(seen, p.get(1), p.get_or(0, Value(false)).truthy()), key);
          }))
        out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "sort") {
    Params p("sort", args, {"reverse", "case_sensitive", "attribute"});
    return Value(sorted(iterate(v, "sort"), p.get_or(0, Value(false)).truthy(), p.get_or(1, Value(false)).truthy(), p.get(2)));
  }
  if (name == "min" || name == "max") {
    Params p(name.c_str(), args, {"case_sensitive", "attribute"});
    Array items = sorted(iterate(v, name.c_str()), name == "max", p.get_or(0, Value(false)).truthy(), p.get(1));
    return items.empty() ? Value() : items.front();
  }
  if (name == "sum") {
    Params p("sum", args, {"attribute", "start"});
    Value total = p.get_or(1, Value(0));
    for (const Value& item : iterate(v, "sum")) {
      const Value x = p.get(0) ? attribute_path(item, to_str(*p.get(0))) : item;
      if (!(x.is_number() || x.is_bool()) || !(total.is_number() || total.is_bool()))
        eval_fail("sum: unsupported operand types '", total.type_name(), "' and '", x.type_name(), "'");
      total = total.is_float() || x.is_float() ? Value(total.as_double() + x.as_double())
                                              : Value(int64_t(total.as_double()) + int64_t(x.as_double()));
    }
    return total;
  }
  if (name == "map") return map_items(v, args);
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") return select_items(name, v, args);
  if (name == "indent") {
    Params p("indent", args, {"width", "first", "blank"});
    return Value(indent_text(to_str(v), p.get_or(0, Value(4)), p.get_or(1, Value(false)).truthy(), p.get_or(2, Value(false)).truthy()));
  }
  eval_fail("unknown filter '", name, "'");
}

bool apply_test(const std::string& name, const Value& v, Args& args) {
  const auto one_arg = [&]() {
    Params p(name.c_str(), args, {"other"});
    return p.required(0);
  };
  const auto no_args = [&] { Params p(name.c_str(), args, {}); };
  if (name == "defined" || name == "undefined") {
    no_args();
    return v.is_undefined() == (name == "undefined");
  }
  if (name == "none") return no_args(), v.is_none();
  if (name == "boolean") return no_args(), v.is_bool();
  if (name == "true" || name == "false") return no_args(), v.is_bool() && v.as_bool() == (name == "true");
  if (name == "integer") return no_args(), v.is_int();
  if (name == "float") return no_args(), v.is_float();
  if (name == "number") return no_args(), v.is_number() || v.is_bool();
  if (name == "string") return no_args(), v.is_string();
  if (name == "mapping") return no_args(), v.is_mapping();
  if (name == "iterable") return no_args(), v.is_string() || v.is_array() || v.is_mapping() || v.is_undefined();
  if (name == "sequence") return no_args(), v.is_string() || v.is_array() || v.is_mapping();
  if (name == "callable") return no_args(), v.is_function();
  if (name == "lower" || name == "upper") {
    no_args();
    if (!v.is_string()) return false;
    const std::string& s = v.str();
    const auto cased = [&](int (*f)(int)) { return std::any_of(s.begin(), s.end(), [&](char c) { return std::isalpha(static_cast<unsigned char>(c)) && f(static_cast<unsigned char>(c)); }); };
    return name == "lower" ? !cased(std::isupper) : !cased(std::islower);
  }
  if (name == "odd" || name == "even") {
    no_args();
    if (!v.is_int()) eval_fail("test '", name, "' needs an int, got ", v.type_name());
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value n = one_arg();
    if (!v.is_int() || !n.is_int() || n.as_int() == 0) eval_fail("divisibleby needs non-zero ints");
    return v.as_int() % n.as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, one_arg());
  if (name == "ne" || name == "!=") return !equal(v, one_arg());
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, one_arg());
  if (name == "gt" || name == "greaterthan" || name == ">") return less(one_arg(), v);
  if (name == "le" || name == "<=") return !less(one_arg(), v);
  if (name == "ge" || name == ">=") return !less(v, one_arg());
  if (name == "sameas") {
    const Value other = one_arg();
    if (v.kind() != other.kind()) return false;
    if (v.is_array()) return &v.array() == &other.array();
    if (v.is_object()) return &v.object() == &other.object();
    return equal(v, other);
  }
  if (name == "in") {
    const Value seq = one_arg();
    if (seq.is_string()) return v.is_string() && seq.str().find(v.str()) != std::string::npos;
    if (seq.is_mapping()) return v.is_string() && seq.object().find(v.str());
    for (const Value& item : iterate(seq, "in"))
      if (equal(item, v)) return true;
    return false;
  }
  eval_fail("unknown test '", name, "'");
}

}  // namespace strata::chat
