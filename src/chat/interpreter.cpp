#include "chat/interpreter.h"

#include <cmath>
#include <unordered_set>

#include "chat/builtins.h"
#include "chat/lexer.h"
#include "util/error.h"

namespace strata::chat {
namespace {

using ast::Expr;
using ast::Stmt;
using EK = Expr::Kind;
using SK = Stmt::Kind;

template <typename... Parts>
[[noreturn]] void eval_fail(Parts&&... parts) {
  throw EvalError(cat(std::forward<Parts>(parts)...));
}

// Jinja scoping: a for-loop iteration and a macro call get a fresh scope over the enclosing
// one; `set` writes to the innermost scope; if-blocks share their parent's.
struct Scope {
  std::shared_ptr<Scope> parent;
  Object vars;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      if (const Value* v = s->vars.find(name)) return v;
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

// Whether `v` holds the object `target` anywhere inside. Assigning a namespace into itself (or
// into a value it holds) would make a cycle of shared pointers that is never freed: every render
// of such a template would leak. `seen` keeps shared parts from being walked twice.
bool holds(const Value& v, const Object* target, std::unordered_set<const void*>& seen, int depth) {
  if (!v.is_object() && !v.is_array()) return false;
  if (depth > 512) eval_fail("value nested deeper than 512 levels");
  if (v.is_object()) {
    const Object* o = &v.object();
    if (o == target) return true;
    if (!seen.insert(o).second) return false;
    for (const auto& [key, item] : o->items)
      if (holds(item, target, seen, depth + 1)) return true;
    return false;
  }
  if (!seen.insert(&v.array()).second) return false;
  for (const Value& item : v.array())
    if (holds(item, target, seen, depth + 1)) return true;
  return false;
}

bool num(const Value& v) { return v.is_number() || v.is_bool(); }
bool int_like(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t int_of(const Value& v) { return v.is_int() ? v.as_int() : int64_t(v.as_bool()); }

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  eval_fail("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'");
}

// Python ints are unbounded; ours are 64-bit and overflow is an error, not a wrap.
template <typename Op>
Value checked_int(int64_t x, int64_t y, Op op) {
  int64_t r = 0;
  if (op(x, y, &r)) eval_fail("integer overflow");
  return Value(r);
}

Value repeat(const Value& seq, int64_t times) {
  const size_t n = size_t(std::max<int64_t>(0, times));
  if (seq.is_string()) {
    if (n && seq.str().size() > kMaxBytes / n) eval_fail("string repetition larger than ", kMaxBytes, " bytes");
    std::string out;
    for (size_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  if (n && seq.array().size() > (kMaxBytes / 16) / n) eval_fail("list repetition too large");
  Array out;
  for (size_t i = 0; i < n; ++i) out.insert(out.end(), seq.array().begin(), seq.array().end());
  return Value(std::move(out));
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    if (s.size() > kMaxBytes) eval_fail("string larger than ", kMaxBytes, " bytes");
    return Value(std::move(s));
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.str().size() + b.str().size() > kMaxBytes) eval_fail("string larger than ", kMaxBytes, " bytes");
      return Value(a.str() + b.str());
    }
    if (a.is_array() && b.is_array()) {
      Array out = a.array();
      out.insert(out.end(), b.array().begin(), b.array().end());
      return Value(std::move(out));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_array()) && int_like(b)) return repeat(a, int_of(b));
    if (int_like(a) && (b.is_string() || b.is_array())) return repeat(b, int_of(a));
  }
  if (!num(a) || !num(b)) bad_operands(op, a, b);
  if (int_like(a) && int_like(b)) {
    const int64_t x = int_of(a), y = int_of(b);
    if (op == "+") return checked_int(x, y, [](int64_t a, int64_t b, int64_t* r) { return __builtin_add_overflow(a, b, r); });
    if (op == "-") return checked_int(x, y, [](int64_t a, int64_t b, int64_t* r) { return __builtin_sub_overflow(a, b, r); });
    if (op == "*") return checked_int(x, y, [](int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); });
    if (op == "//" || op == "%") {
      if (y == 0) eval_fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) eval_fail("integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value(op == "//" ? q : m);
    }
    if (op == "**" && y >= 0) {
      int64_t acc = 1;
      for (int64_t i = 0; i < y; ++i)
        if (__builtin_mul_overflow(acc, x, &acc)) eval_fail("integer overflow");
      return Value(acc);
    }
  }
  const double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "/" || op == "//" || op == "%") {
    if (y == 0) eval_fail("division by zero");
    if (op == "/") return Value(x / y);
    if (op == "//") return Value(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value(m);
  }
  if (x == 0 && y < 0) eval_fail("0.0 cannot be raised to a negative power");
  return Value(std::pow(x, y));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::Undefined:
      return false;
    case Value::Kind::String:
      if (!item.is_string()) eval_fail("'in <string>' requires string as left operand, not ", item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::Array:
      for (const Value& v : container.array())
        if (equal(v, item)) return true;
      return false;
    case Value::Kind::Object:
      if (container.is_mapping()) return item.is_string() && container.object().find(item.str());
      break;
    default:
      break;
  }
  eval_fail("argument of type '", container.type_name(), "' is not iterable");
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return !less(b, a);
  if (op == ">=") return !less(a, b);
  if (op == "in") return contains(b, a);
  return !contains(b, a);  // not in
}

Array loop_items(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_array()) return v.array();
  if (v.is_string() || v.is_mapping()) {
    Args none;
    return apply_filter("list", v, none).array();
  }
  eval_fail("'", v.type_name(), "' object is not iterable");
}

class Interpreter {
 public:
  explicit Interpreter(std::string_view source) : src_(source) {}

  std::string run(const ast::Body& body, Object variables) {
    auto root = std::make_shared<Scope>();
    root->vars = global_functions();
    auto top = std::make_shared<Scope>(Scope{root, std::move(variables)});
    std::string out;
    if (exec(body, top, out) != Flow::Normal) fail("chat template: 'break' or 'continue' outside a loop");
    return out;
  }

 private:
  enum class Flow { Normal, Break, Continue };

  [[noreturn]] void located(size_t pos, const std::string& message) const {
    fail("chat template ", location(src_, pos), ": ", message);
  }

  void step(size_t pos) {
    if (++steps_ > kMaxSteps) located(pos, cat("template ran more than ", kMaxSteps, " steps"));
  }

  Flow exec(const ast::Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
    step(s.pos);
    switch (s.kind) {
      case SK::Text:
        out += s.text;
        break;
      case SK::Output:
        out += guarded(s.expr->pos, [&] { return to_str(eval(*s.expr, scope)); });
        break;
      case SK::If:
        for (size_t i = 0; i < s.conds.size(); ++i)
          if (eval(*s.conds[i], scope).truthy()) return exec(s.bodies[i], scope, out);
        return exec(s.else_body, scope, out);
      case SK::For:
        exec_for(s, scope, out);
        break;
      case SK::Set:
        exec_set(s, scope);
        break;
      case SK::Macro:
        scope->vars.set(s.name, make_macro(s, scope));
        break;
      case SK::Break:
        return Flow::Break;
      case SK::Continue:
        return Flow::Continue;
      case SK::Block:
        return exec(s.bodies[0], scope, out);
    }
    if (out.size() > kMaxBytes) located(s.pos, cat("output larger than ", kMaxBytes, " bytes"));
    return Flow::Normal;
  }

  void bind(const Stmt& s, Scope& scope, const Value& item) {
    if (s.targets.size() == 1) {
      scope.vars.set(s.targets[0], item);
      return;
    }
    if (!item.is_array() || item.array().size() != s.targets.size())
      located(s.pos, cat("cannot unpack ", repr(item), " into ", s.targets.size(), " variables"));
    for (size_t i = 0; i < s.targets.size(); ++i) scope.vars.set(s.targets[i], item.array()[i]);
  }

  void exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    Array items = guarded(s.expr->pos, [&] { return loop_items(eval(*s.expr, scope)); });
    if (s.filter) {
      Array kept;
      for (const Value& item : items) {
        Scope probe{scope, {}};
        bind(s, probe, item);
        if (eval(*s.filter, std::make_shared<Scope>(std::move(probe))).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      step(s.pos);
      auto iter = std::make_shared<Scope>(Scope{scope, {}});
      bind(s, *iter, items[size_t(i)]);
      Object loop;
      loop.items = {{"index", Value(i + 1)},
                    {"index0", Value(i)},
                    {"revindex", Value(n - i)},
                    {"revindex0", Value(n - i - 1)},
                    {"first", Value(i == 0)},
                    {"last", Value(i == n - 1)},
                    {"length", Value(n)},
                    {"previtem", i > 0 ? items[size_t(i - 1)] : Value()},
                    {"nextitem", i + 1 < n ? items[size_t(i + 1)] : Value()},
                    {"depth", Value(1)},
                    {"depth0", Value(0)}};
      loop.items.emplace_back("cycle", Value(Function([i](Args& args) {
                                if (args.positional.empty()) eval_fail("loop.cycle() needs at least one value");
                                return args.positional[size_t(i) % args.positional.size()];
                              })));
      iter->vars.set("loop", Value(std::move(loop)));
      if (exec(s.bodies[0], iter, out) == Flow::Break) break;
    }
    if (n == 0) exec(s.else_body, scope, out);
  }

  void exec_set(const Stmt& s, const ScopePtr& scope) {
    Value v;
    if (s.expr) {
      v = eval(*s.expr, scope);
    } else {
      std::string body;
      if (exec(s.bodies[0], scope, body) != Flow::Normal) located(s.pos, "'break' or 'continue' inside a set block");
      v = Value(std::move(body));
    }
    if (!s.attr.empty()) {
      const Value* target = scope->find(s.targets[0]);
      if (!target || !target->is_namespace())
        located(s.pos, cat("cannot assign attribute '", s.attr, "' on '", s.targets[0],
                           "': only namespace() objects have assignable attributes"));
      std::unordered_set<const void*> seen;
      bool cycle = false;
      try {
        cycle = holds(v, &target->object(), seen, 0);
      } catch (const EvalError& e) {
        located(s.pos, e.what());
      }
      if (cycle)
        located(s.pos, cat("cannot assign '", s.targets[0], ".", s.attr, "': the value holds '",
                           s.targets[0], "' itself"));
      target->mutable_object().set(s.attr, std::move(v));
      return;
    }
    Scope& into = *scope;
    bind(s, into, v);
  }

  Value make_macro(const Stmt& s, const ScopePtr& scope) {
    std::weak_ptr<Scope> defined_in = scope;
    return Value(Function([this, &s, defined_in](Args& args) {
      const ScopePtr parent = defined_in.lock();
      if (!parent) eval_fail("macro '", s.name, "' called after the block that defined it ended");
      if (args.positional.size() > s.params.size())
        eval_fail("macro '", s.name, "' takes ", s.params.size(), " arguments (", args.positional.size(), " given)");
      if (call_depth_ >= kMaxCallDepth) eval_fail("macro calls nested deeper than ", kMaxCallDepth, " levels");
      auto local = std::make_shared<Scope>(Scope{parent, {}});
      std::vector<const Value*> given(s.params.size(), nullptr);
      for (size_t i = 0; i < args.positional.size(); ++i) given[i] = &args.positional[i];
      for (const auto& [k, v] : args.keyword) {
        size_t i = 0;
        while (i < s.params.size() && s.params[i].name != k) ++i;
        if (i == s.params.size()) eval_fail("macro '", s.name, "' has no parameter '", k, "'");
        given[i] = &v;
      }
      ++call_depth_;
      struct Leave {
        int& depth;
        ~Leave() { --depth; }
      } leave{call_depth_};
      for (size_t i = 0; i < s.params.size(); ++i) {
        const auto& p = s.params[i];
        local->vars.set(p.name, given[i] ? *given[i] : p.default_value ? eval(*p.default_value, local) : Value());
      }
      std::string out;
      if (exec(s.bodies[0], local, out) != Flow::Normal) located(s.pos, "'break' or 'continue' outside a loop");
      return Value(std::move(out));
    }));
  }

  // Runs f, turning an EvalError into strata::Error located at pos.
  template <typename F>
  auto guarded(size_t pos, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const EvalError& e) {
      located(pos, e.what());
    }
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    return guarded(e.pos, [&] { return eval_node(e, scope); });
  }

  Args eval_args(const std::vector<ast::Arg>& args, const ScopePtr& scope) {
    Args out;
    for (const auto& a : args) {
      if (a.name.empty()) out.positional.push_back(eval(*a.value, scope));
      else out.keyword.emplace_back(a.name, eval(*a.value, scope));
    }
    return out;
  }

  // How a callee is named in errors: 'x', 'x.y.z', or "the value" for anything else.
  static std::string describe(const Expr& e) {
    const std::string path = dotted(e);
    return path.empty() ? "the value" : "'" + path + "'";
  }
  static std::string dotted(const Expr& e) {
    if (e.kind == EK::Name) return e.name;
    if (e.kind != EK::Attr) return "";
    const std::string base = dotted(*e.a);
    return base.empty() ? "" : base + "." + e.name;
  }

  Value eval_node(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case EK::Literal:
        return e.value;
      case EK::Name: {
        const Value* v = scope->find(e.name);
        return v ? *v : Value();
      }
      case EK::List: {
        Array out;
        for (const auto& item : e.items) out.push_back(eval(*item, scope));
        return Value(std::move(out));
      }
      case EK::Dict: {
        Object out;
        for (size_t i = 0; i < e.keys.size(); ++i) {
          const Value k = eval(*e.keys[i], scope);
          if (!k.is_string()) eval_fail("dict keys must be strings, not ", k.type_name());
          out.set(k.str(), eval(*e.items[i], scope));
        }
        return Value(std::move(out));
      }
      case EK::Unary: {
        const Value v = eval(*e.a, scope);
        if (e.op == "not") return Value(!v.truthy());
        if (!num(v)) eval_fail("bad operand type for unary ", e.op, ": '", v.type_name(), "'");
        if (e.op == "+") return v.is_bool() ? Value(int_of(v)) : v;
        if (v.is_float()) return Value(-v.as_double());
        if (int_of(v) == INT64_MIN) eval_fail("integer overflow");
        return Value(-int_of(v));
      }
      case EK::Binary: {
        Value a = eval(*e.a, scope);
        if (e.op == "and") return a.truthy() ? eval(*e.b, scope) : a;
        if (e.op == "or") return a.truthy() ? a : eval(*e.b, scope);
        return arithmetic(e.op, a, eval(*e.b, scope));
      }
      case EK::Compare: {
        Value left = eval(*e.a, scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.items[i], scope);
          if (!compare(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case EK::Attr:
        return get_attr(eval(*e.a, scope), e.name);
      case EK::Index:
        return get_item(eval(*e.a, scope), eval(*e.b, scope));
      case EK::Slice: {
        const Value obj = eval(*e.a, scope);
        const Value b = e.b ? eval(*e.b, scope) : Value(), c = e.c ? eval(*e.c, scope) : Value(),
                    d = e.d ? eval(*e.d, scope) : Value();
        return slice(obj, &b, &c, &d);
      }
      case EK::Call: {
        const Value callee = eval(*e.a, scope);
        if (!callee.is_function())
          eval_fail(describe(*e.a), callee.is_undefined() ? " is undefined" : " is not callable");
        Args args = eval_args(e.args, scope);
        return callee.function()(args);
      }
      case EK::Filter: {
        const Value operand = eval(*e.a, scope);
        Args args = eval_args(e.args, scope);
        return apply_filter(e.name, operand, args);
      }
      case EK::Test: {
        const Value operand = eval(*e.a, scope);
        Args args = eval_args(e.args, scope);
        return Value(apply_test(e.name, operand, args) != e.negated);
      }
      case EK::Cond:
        if (eval(*e.a, scope).truthy()) return eval(*e.b, scope);
        return e.c ? eval(*e.c, scope) : Value();
    }
    return Value();
  }

  std::string_view src_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

std::string interpret(std::string_view source, const ast::Body& body, Object variables) {
  return Interpreter(source).run(body, std::move(variables));
}

}  // namespace strata::chat
