// Attribute and item access, slicing, Python's str and dict methods, the global functions and
// argument binding. Filters and tests are in builtins.cpp.
#include <algorithm>
#include <cctype>
#include <ctime>
#include <optional>

#include "chat/builtins.h"
#include "util/error.h"

namespace strata::chat {

namespace {

template <typename... Parts>
[[noreturn]] void eval_fail(Parts&&... parts) {
  throw EvalError(cat(std::forward<Parts>(parts)...));
}

// A range longer than this is an error, not a loop that runs for hours.
constexpr int64_t kMaxRange = 1'000'000;

bool is_py_space(std::string_view cp) {
  return cp == " " || cp == "\t" || cp == "\n" || cp == "\r" || cp == "\f" || cp == "\v" ||
         cp == "\x1c" || cp == "\x1d" || cp == "\x1e" || cp == "\x1f" || cp == "\xc2\x85" ||
         cp == "\xc2\xa0" || cp == "\xe3\x80\x80" || cp == "\xe2\x80\xa8" || cp == "\xe2\x80\xa9";
}

const std::string& str_arg(const char* fn, const Value& v) {
  if (!v.is_string()) eval_fail(fn, "() argument must be str, not ", v.type_name());
  return v.str();
}

// Python's str.split / rsplit.
Value split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_undefined() || sep.is_none()) {
    // Runs of whitespace separate; once maxsplit words are split off, the rest is one part
    // that keeps its inner and far-end whitespace.
    const auto cps = code_points(s);
    const auto join = [&](size_t a, size_t b) {
      std::string out;
      for (size_t k = a; k < b; ++k) out += cps[k];
      return out;
    };
    if (!from_right) {
      for (size_t i = 0;;) {
        while (i < cps.size() && is_py_space(cps[i])) ++i;
        if (i == cps.size()) break;
        if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
          parts.push_back(join(i, cps.size()));
          break;
        }
        size_t j = i;
        while (j < cps.size() && !is_py_space(cps[j])) ++j;
        parts.push_back(join(i, j));
        i = j;
      }
    } else {
      for (size_t e = cps.size();;) {
        while (e > 0 && is_py_space(cps[e - 1])) --e;
        if (e == 0) break;
        if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
          parts.push_back(join(0, e));
          break;
        }
        size_t j = e;
        while (j > 0 && !is_py_space(cps[j - 1])) --j;
        parts.push_back(join(j, e));
        e = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    const std::string& d = str_arg("split", sep);
    if (d.empty()) eval_fail("empty separator");
    if (!from_right) {
      size_t start = 0;
      for (size_t at; (maxsplit < 0 || int64_t(parts.size()) < maxsplit) && (at = s.find(d, start)) != std::string::npos;
           start = at + d.size())
        parts.push_back(s.substr(start, at - start));
      parts.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      std::vector<std::string> rev;
      while (maxsplit < 0 || int64_t(rev.size()) < maxsplit) {
        if (end < d.size()) break;
        const size_t at = s.rfind(d, end - d.size());
        if (at == std::string::npos) break;
        rev.push_back(s.substr(at + d.size(), end - at - d.size()));
        end = at;
      }
      parts.push_back(s.substr(0, end));
      parts.insert(parts.end(), rev.rbegin(), rev.rend());
    }
  }
  Array out;
  for (auto& p : parts) out.emplace_back(std::move(p));
  return Value(std::move(out));
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between code points (and at both ends).
    const auto cps = code_points(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size()) out += cps[i];
      if (out.size() > kMaxBytes) eval_fail("replace(): result larger than ", kMaxBytes, " bytes");
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  for (size_t at; (count < 0 || done < count) && (at = s.find(from, start)) != std::string::npos; ++done) {
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
    if (out.size() > kMaxBytes) eval_fail("replace(): result larger than ", kMaxBytes, " bytes");
  }
  out.append(s, start);
  return out;
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const char* fn) {
  const auto one = [&](const std::string& a) {
    return a.size() <= s.size() && (prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0);
  };
  if (affix.is_string()) return one(affix.str());
  if (affix.is_array()) {
    for (const Value& a : affix.array())
      if (one(str_arg(fn, a))) return true;
    return false;
  }
  eval_fail(fn, "() argument must be str or a tuple of str, not ", affix.type_name());
}

Value string_method(const std::string& s, const std::string& name) {
  const auto bind = [&](auto body) { return Value(Function([s, body](Args& args) -> Value { return body(s, args); })); };
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return bind([name](const std::string& self, Args& args) {
      Params p(name.c_str(), args, {"chars"});
      return Value(strip(self, p.get_or(0, Value()), name != "rstrip", name != "lstrip"));
    });
  if (name == "split" || name == "rsplit")
    return bind([name](const std::string& self, Args& args) {
      Params p(name.c_str(), args, {"sep", "maxsplit"});
      const Value maxsplit = p.get_or(1, Value(-1));
      if (!maxsplit.is_int()) eval_fail(name, "(): maxsplit must be an int");
      return split(self, p.get_or(0, Value()), maxsplit.as_int(), name == "rsplit");
    });
  if (name == "startswith" || name == "endswith")
    return bind([name](const std::string& self, Args& args) {
      Params p(name.c_str(), args, {"prefix"});
      return Value(affix_match(self, p.required(0), name == "startswith", name.c_str()));
    });
  if (name == "replace")
    return bind([](const std::string& self, Args& args) {
      Params p("replace", args, {"old", "new", "count"});
      const Value count = p.get_or(2, Value(-1));
      if (!count.is_int()) eval_fail("replace(): count must be an int");
      return Value(replace_all(self, str_arg("replace", p.required(0)), str_arg("replace", p.required(1)), count.as_int()));
    });
  if (name == "lower" || name == "upper" || name == "title" || name == "capitalize")
    return bind([name](const std::string& self, Args& args) {
      Args copy = args;
      Value operand(self);
      return apply_filter(name, operand, copy);
    });
  if (name == "find" || name == "count")
    return bind([name](const std::string& self, Args& args) {
      Params p(name.c_str(), args, {"sub"});
      const std::string& sub = str_arg(name.c_str(), p.required(0));
      if (name == "find") {
        const size_t at = self.find(sub);
        return Value(at == std::string::npos ? int64_t(-1) : int64_t(code_points(self.substr(0, at)).size()));
      }
      if (sub.empty()) return Value(int64_t(code_points(self).size() + 1));
      int64_t n = 0;
      for (size_t at = self.find(sub); at != std::string::npos; at = self.find(sub, at + sub.size())) ++n;
      return Value(n);
    });
  if (name == "join")
    return bind([](const std::string& self, Args& args) {
      Params p("join", args, {"iterable"});
      const Value& items = p.required(0);
      if (!items.is_array()) eval_fail("join() argument must be a list, not ", items.type_name());
      std::string out;
      for (size_t i = 0; i < items.array().size(); ++i) {
        if (i) out += self;
        out += str_arg("join", items.array()[i]);
        if (out.size() > kMaxBytes) eval_fail("join(): result larger than ", kMaxBytes, " bytes");
      }
      return Value(std::move(out));
    });
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum")
    return bind([name](const std::string& self, Args& args) {
      Params p(name.c_str(), args, {});
      if (self.empty()) return Value(false);
      for (unsigned char c : self) {
        const bool ok = name == "isdigit" ? std::isdigit(c) : name == "isspace" ? std::isspace(c)
                        : name == "isalpha" ? std::isalpha(c) : std::isalnum(c);
        if (!ok) return Value(false);
      }
      return Value(true);
    });
  return Value();
}

Value dict_method(const Value& dict, const std::string& name) {
  if (name == "get")
    return Value(Function([dict](Args& args) {
      Params p("get", args, {"key", "default"});
      const Value& key = p.required(0);
      const Value* found = key.is_string() ? dict.object().find(key.str()) : nullptr;
      return found ? *found : p.get_or(1, Value::none());
    }));
  if (name == "items" || name == "keys" || name == "values")
    return Value(Function([dict, name](Args& args) {
      Params p(name.c_str(), args, {});
      Array out;
      for (const auto& [k, v] : dict.object().items) {
        if (name == "items") out.emplace_back(Array{Value(k), v});
        else if (name == "keys") out.emplace_back(k);
        else out.push_back(v);
      }
      return Value(std::move(out));
    }));
  return Value();
}

// Python's index normalisation: negative counts from the end; nullopt when out of range.
std::optional<size_t> normalize_index(const Value& key, size_t size) {
  if (!key.is_int() && !key.is_bool()) return std::nullopt;
  int64_t i = key.is_int() ? key.as_int() : int64_t(key.as_bool());
  if (i < 0) i += int64_t(size);
  if (i < 0 || i >= int64_t(size)) return std::nullopt;
  return size_t(i);
}

}  // namespace

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto cps = code_points(s);
  std::vector<std::string_view> set;
  const bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) {
    const std::string& c = str_arg("strip", chars);
    set = code_points(c);
  }
  const auto strip_it = [&](std::string_view cp) {
    return whitespace ? is_py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  if (b == e) return "";
  const size_t begin = size_t(cps[b].data() - s.data());
  const size_t end = size_t(cps[e - 1].data() + cps[e - 1].size() - s.data());
  return s.substr(begin, end - begin);
}

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::Undefined:
      eval_fail("cannot read attribute '", name, "' of an undefined value");
    case Value::Kind::String:
      return string_method(obj.str(), name);
    case Value::Kind::Object: {
      if (obj.is_mapping()) {
        Value method = dict_method(obj, name);
        if (!method.is_undefined()) return method;
      }
      const Value* v = obj.object().find(name);
      return v ? *v : Value();
    }
    default:
      return Value();
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::Undefined:
      eval_fail("cannot read item ", repr(key), " of an undefined value");
    case Value::Kind::Object:
      if (key.is_string()) {
        const Value* v = obj.object().find(key.str());
        if (v) return *v;
        return get_attr(obj, key.str());
      }
      return Value();
    case Value::Kind::Array: {
      const auto i = normalize_index(key, obj.array().size());
      return i ? obj.array()[*i] : Value();
    }
    case Value::Kind::String: {
      if (key.is_string()) return get_attr(obj, key.str());
      const auto cps = code_points(obj.str());
      const auto i = normalize_index(key, cps.size());
      return i ? Value(std::string(cps[*i])) : Value();
    }
    default:
      return Value();
  }
}

Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  const auto as_opt = [](const Value* v, const char* what) -> std::optional<int64_t> {
    if (!v || v->is_none() || v->is_undefined()) return std::nullopt;
    if (!v->is_int()) eval_fail("slice ", what, " must be an int, not ", v->type_name());
    return v->as_int();
  };
  const int64_t st = as_opt(step, "step").value_or(1);
  if (st == 0) eval_fail("slice step cannot be zero");
  std::vector<std::string_view> cps;
  if (obj.is_string()) cps = code_points(obj.str());
  else if (!obj.is_array()) eval_fail("cannot slice a ", obj.type_name());
  const int64_t n = int64_t(obj.is_string() ? cps.size() : obj.array().size());
  // Python's PySlice_AdjustIndices.
  const auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v;
    if (i < 0) i = std::max<int64_t>(i + n, st < 0 ? -1 : 0);
    else if (i >= n) i = st < 0 ? n - 1 : n;
    return i;
  };
  const int64_t b = adjust(as_opt(start, "start"), st < 0 ? n - 1 : 0);
  const int64_t e = adjust(as_opt(stop, "stop"), st < 0 ? -1 : n);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out += cps[size_t(i)];
    return Value(std::move(out));
  }
  Array out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(obj.array()[size_t(i)]);
  return Value(std::move(out));
}

Object global_functions() {
  Object g;
  g.set("range", Value(Function([](Args& args) {
    Params p("range", args, {"start", "stop", "step"});
    for (size_t i = 0; i < 3; ++i)
      if (p.get(i) && !p.get(i)->is_int()) eval_fail("range() arguments must be int, not ", p.get(i)->type_name());
    int64_t start = 0, stop = p.required(0).as_int(), step = 1;
    if (p.get(1)) {
      start = stop;
      stop = p.get(1)->as_int();
    }
    if (p.get(2)) step = p.get(2)->as_int();
    if (step == 0) eval_fail("range() step must not be zero");
    Array out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (int64_t(out.size()) >= kMaxRange) eval_fail("range() longer than ", kMaxRange, " items");
      out.emplace_back(i);
    }
    return Value(std::move(out));
  })));
  const auto mapping = [](const char* fn, Args& args) {
    if (args.positional.size() > 1) eval_fail(fn, "() takes at most 1 positional argument");
    Object o;
    if (!args.positional.empty()) {
      const Value& src = args.positional[0];
      if (!src.is_object()) eval_fail(fn, "() argument must be a dict, not ", src.type_name());
      o = src.object();
    }
    for (auto& [k, v] : args.keyword) o.set(k, v);
    return o;
  };
  g.set("namespace", Value(Function([mapping](Args& args) { return Value::make_namespace(mapping("namespace", args)); })));
  g.set("dict", Value(Function([mapping](Args& args) { return Value(mapping("dict", args)); })));
  g.set("raise_exception", Value(Function([](Args& args) -> Value {
    Params p("raise_exception", args, {"message"});
    // The template's own message, unprefixed: it is addressed to whoever sent the messages.
    throw Error(to_str(p.get_or(0, Value("raise_exception() called"))));
  })));
  g.set("strftime_now", Value(Function([](Args& args) {
    Params p("strftime_now", args, {"format"});
    const std::string& fmt = str_arg("strftime_now", p.required(0));
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value(std::string(buf, n));
  })));
  return g;
}

Params::Params(const char* function, Args& args, std::initializer_list<const char*> names)
    : function_(function), names_(names), values_(names.size(), nullptr) {
  if (args.positional.size() > names_.size())
    eval_fail(function, "() takes at most ", names_.size(), " argument", names_.size() == 1 ? "" : "s", " (",
              args.positional.size(), " given)");
  for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = &args.positional[i];
  for (const auto& [k, v] : args.keyword) {
    const std::string& key = k;  // clang 14 cannot capture a structured binding in a lambda
    const auto it = std::find_if(names_.begin(), names_.end(), [&](const char* n) { return key == n; });
    if (it == names_.end()) eval_fail(function, "() got an unexpected keyword argument '", k, "'");
    const size_t i = size_t(it - names_.begin());
    if (values_[i]) eval_fail(function, "() got multiple values for argument '", k, "'");
    values_[i] = &v;
  }
}

const Value& Params::required(size_t i) const {
  if (!values_[i]) eval_fail(function_, "() missing required argument '", names_[i], "'");
  return *values_[i];
}

}  // namespace strata::chat
