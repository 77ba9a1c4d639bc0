#include "chat/parser.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "chat/lexer.h"
#include "util/error.h"

namespace strata::chat {
namespace {

using ast::Expr;
using ast::ExprPtr;
using ast::Stmt;
using ast::StmtPtr;
using EK = Expr::Kind;
using SK = Stmt::Kind;

// Nesting of blocks and expressions; deeper input is rejected rather than overflowing the stack.
constexpr int kMaxDepth = 200;

class Parser {
 public:
  Parser(std::string_view src) : src_(src), toks_(tokenize(src)) {}

  ast::Body run() {
    ast::Body body = block({});
    return body;
  }

 private:
  // ---- token helpers

  const Token& peek(size_t ahead = 0) const { return toks_[std::min(at_ + ahead, toks_.size() - 1)]; }
  const Token& next() { return toks_[at_ < toks_.size() - 1 ? at_++ : at_]; }
  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).type == Tok::Op && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).type == Tok::Name && peek(ahead).text == name;
  }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    ++at_;
    return true;
  }
  bool accept_name(std::string_view name) {
    if (!is_name(name)) return false;
    ++at_;
    return true;
  }
  [[noreturn]] void error(const Token& t, const std::string& message) const { syntax_error(src_, t.pos, message); }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::End: return "end of template";
      case Tok::Text: return "text";
      case Tok::ExprClose: return "'}}'";
      case Tok::StmtClose: return "'%}'";
      case Tok::ExprOpen: return "'{{'";
      case Tok::StmtOpen: return "'{%'";
      case Tok::String: return "string literal";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) error(peek(), cat("expected '", op, "', found ", describe(peek())));
  }
  std::string expect_name(const char* what) {
    if (peek().type != Tok::Name) error(peek(), cat("expected ", what, ", found ", describe(peek())));
    return next().text;
  }
  void expect_close(Tok close) {
    if (peek().type != close)
      error(peek(), cat("expected ", close == Tok::StmtClose ? "'%}'" : "'}}'", ", found ", describe(peek())));
    ++at_;
  }

  struct DepthGuard {
    DepthGuard(Parser& p) : p(p) {
      if (++p.depth_ > kMaxDepth) p.error(p.peek(), cat("nesting deeper than ", kMaxDepth, " levels"));
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };

  // ---- statements

  // Parses until a {% tag %} whose name is in `stops` (left unconsumed: at_ points at its name).
  ast::Body block(std::initializer_list<std::string_view> stops, const Token* opener = nullptr,
                  std::string_view opener_name = {}) {
    DepthGuard guard(*this);
    if (opener) open_.push_back({opener_name, opener->pos, *(stops.end() - 1)});
    ast::Body body;
    while (true) {
      const Token& t = peek();
      if (t.type == Tok::End) {
        if (stops.size() == 0) return body;
        error(*opener, cat("'{% ", opener_name, " %}' is never closed (expected '{% ", *(stops.end() - 1),
                           " %}' before the end of the template)"));
      }
      if (t.type == Tok::Text) {
        auto s = std::make_unique<Stmt>(SK::Text, t.pos);
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (t.type == Tok::ExprOpen) {
        next();
        auto s = std::make_unique<Stmt>(SK::Output, t.pos);
        s->expr = expression();
        expect_close(Tok::ExprClose);
        body.push_back(std::move(s));
      } else if (t.type == Tok::StmtOpen) {
        const Token& name = peek(1);
        if (name.type != Tok::Name) error(name, cat("expected a tag name after '{%', found ", describe(name)));
        for (std::string_view stop : stops)
          if (name.text == stop) {
            next();
            if (opener) open_.pop_back();
            return body;
          }
        next();
        body.push_back(statement(t));
      } else {
        error(t, cat("unexpected ", describe(t)));
      }
    }
  }

  // The tag name that closed a block(): consumes it.
  std::string closing_tag() { return next().text; }

  StmtPtr statement(const Token& open) {
    const Token& name_tok = next();
    const std::string& name = name_tok.text;
    if (name == "if") return if_stmt(open);
    if (name == "for") return for_stmt(open);
    if (name == "set") return set_stmt(open);
    if (name == "macro") return macro_stmt(open);
    if (name == "break" || name == "continue") {
      expect_close(Tok::StmtClose);
      return std::make_unique<Stmt>(name == "break" ? SK::Break : SK::Continue, open.pos);
    }
    if (name == "generation") {
      expect_close(Tok::StmtClose);
      auto s = std::make_unique<Stmt>(SK::Block, open.pos);
      s->bodies.push_back(block({"endgeneration"}, &open, "generation"));
      closing_tag();
      expect_close(Tok::StmtClose);
      return s;
    }
    if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      if (open_.empty()) error(name_tok, cat("unexpected '{% ", name, " %}' outside any block"));
      const OpenBlock& b = open_.back();
      error(name_tok, cat("unexpected '{% ", name, " %}': the innermost open block is '{% ", b.name, " %}' at ",
                          location(src_, b.pos), ", closed by '{% ", b.closer, " %}'"));
    }
    error(name_tok, cat("unsupported tag '", name, "' (supported: if, for, set, macro, break, continue, raw, generation)"));
  }

  StmtPtr if_stmt(const Token& open) {
    auto s = std::make_unique<Stmt>(SK::If, open.pos);
    s->conds.push_back(expression());
    expect_close(Tok::StmtClose);
    while (true) {
      s->bodies.push_back(block({"elif", "else", "endif"}, &open, "if"));
      const std::string tag = closing_tag();
      if (tag == "elif") {
        s->conds.push_back(expression());
        expect_close(Tok::StmtClose);
        continue;
      }
      expect_close(Tok::StmtClose);
      if (tag == "else") {
        s->else_body = block({"endif"}, &open, "if");
        closing_tag();
        expect_close(Tok::StmtClose);
      }
      return s;
    }
  }

  StmtPtr for_stmt(const Token& open) {
    auto s = std::make_unique<Stmt>(SK::For, open.pos);
    do {
      s->targets.push_back(expect_name("a loop variable name"));
    } while (accept_op(","));
    if (!accept_name("in")) error(peek(), cat("expected 'in' after the loop variables, found ", describe(peek())));
    s->expr = tuple(false);
    if (accept_name("if")) s->filter = or_expr();
    if (is_name("recursive")) error(peek(), "recursive loops are not supported");
    expect_close(Tok::StmtClose);
    s->bodies.push_back(block({"else", "endfor"}, &open, "for"));
    const std::string tag = closing_tag();
    expect_close(Tok::StmtClose);
    if (tag == "else") {
      s->else_body = block({"endfor"}, &open, "for");
      closing_tag();
      expect_close(Tok::StmtClose);
    }
    return s;
  }

  StmtPtr set_stmt(const Token& open) {
    auto s = std::make_unique<Stmt>(SK::Set, open.pos);
    s->targets.push_back(expect_name("a variable name"));
    if (accept_op(".")) {
      s->attr = expect_name("an attribute name");
    } else {
      while (accept_op(",")) s->targets.push_back(expect_name("a variable name"));
    }
    if (accept_op("=")) {
      s->expr = tuple(true);
      expect_close(Tok::StmtClose);
      return s;
    }
    if (s->targets.size() != 1 || !s->attr.empty()) error(peek(), cat("expected '=', found ", describe(peek())));
    expect_close(Tok::StmtClose);
    s->bodies.push_back(block({"endset"}, &open, "set"));
    closing_tag();
    expect_close(Tok::StmtClose);
    return s;
  }

  StmtPtr macro_stmt(const Token& open) {
    auto s = std::make_unique<Stmt>(SK::Macro, open.pos);
    s->name = expect_name("a macro name");
    expect_op("(");
    while (!accept_op(")")) {
      ast::Param p;
      p.name = expect_name("a parameter name");
      if (accept_op("=")) p.default_value = expression();
      s->params.push_back(std::move(p));
      if (!is_op(")")) expect_op(",");
    }
    expect_close(Tok::StmtClose);
    s->bodies.push_back(block({"endmacro"}, &open, "macro"));
    closing_tag();
    if (peek().type == Tok::Name) next();  // {% endmacro name %}
    expect_close(Tok::StmtClose);
    return s;
  }

  // ---- expressions

  ExprPtr make(EK kind, size_t pos) { return std::make_unique<Expr>(kind, pos); }

  // `a, b` without brackets (set values, loop iterables) is a tuple.
  ExprPtr tuple(bool with_cond) {
    const size_t pos = peek().pos;
    ExprPtr first = with_cond ? expression() : or_expr();
    if (!is_op(",")) return first;
    auto list = make(EK::List, pos);
    list->items.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().type == Tok::StmtClose || peek().type == Tok::ExprClose || is_op(")")) break;
      list->items.push_back(with_cond ? expression() : or_expr());
    }
    return list;
  }

  ExprPtr expression() {
    DepthGuard guard(*this);
    ExprPtr e = or_expr();
    while (is_name("if")) {
      const size_t pos = next().pos;
      auto cond = make(EK::Cond, pos);
      cond->a = or_expr();
      cond->b = std::move(e);
      if (accept_name("else")) cond->c = expression();
      e = std::move(cond);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b, size_t pos) {
    auto e = make(EK::Binary, pos);
    e->op = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      const size_t pos = next().pos;
      e = binary("or", std::move(e), and_expr(), pos);
    }
    return e;
  }

  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      const size_t pos = next().pos;
      e = binary("and", std::move(e), not_expr(), pos);
    }
    return e;
  }

  ExprPtr not_expr() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto e = make(EK::Unary, next().pos);
      e->op = "not";
      e->a = not_expr();
      return e;
    }
    return compare();
  }

  ExprPtr compare() {
    const size_t pos = peek().pos;
    ExprPtr first = math1();
    ExprPtr chain;
    while (true) {
      std::string op;
      if (peek().type == Tok::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                     peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        at_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!chain) {
        chain = make(EK::Compare, pos);
        chain->a = std::move(first);
      }
      chain->ops.push_back(op);
      chain->items.push_back(math1());
    }
    return chain ? std::move(chain) : std::move(first);
  }

  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t.text, std::move(e), concat(), t.pos);
    }
    return e;
  }

  ExprPtr concat() {
    ExprPtr e = math2();
    while (is_op("~")) {
      const size_t pos = next().pos;
      e = binary("~", std::move(e), math2(), pos);
    }
    return e;
  }

  ExprPtr math2() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t.text, std::move(e), power(), t.pos);
    }
    return e;
  }

  ExprPtr power() {
    ExprPtr e = unary(true);
    while (is_op("**")) {
      const size_t pos = next().pos;
      e = binary("**", std::move(e), unary(true), pos);
    }
    return e;
  }

  ExprPtr unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(EK::Unary, t.pos);
      e->op = t.text;
      e->a = unary(false);
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  ExprPtr primary() {
    const Token& t = next();
    switch (t.type) {
      case Tok::Name: {
        if (t.text == "true" || t.text == "True") return literal(Value(true), t.pos);
        if (t.text == "false" || t.text == "False") return literal(Value(false), t.pos);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.pos);
        auto e = make(EK::Name, t.pos);
        e->name = t.text;
        return e;
      }
      case Tok::String: {
        std::string s = t.text;
        while (peek().type == Tok::String) s += next().text;  // adjacent literals concatenate
        return literal(Value(std::move(s)), t.pos);
      }
      case Tok::Int: {
        int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) error(t, cat("integer literal ", t.text, " out of range"));
        return literal(Value(v), t.pos);
      }
      case Tok::Float:
        return literal(Value(std::strtod(t.text.c_str(), nullptr)), t.pos);
      case Tok::Op:
        if (t.text == "(") {
          if (accept_op(")")) return make(EK::List, t.pos);
          ExprPtr e = tuple(true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto e = make(EK::List, t.pos);
          while (!accept_op("]")) {
            e->items.push_back(expression());
            if (!is_op("]")) expect_op(",");
          }
          return e;
        }
        if (t.text == "{") {
          auto e = make(EK::Dict, t.pos);
          while (!accept_op("}")) {
            e->keys.push_back(expression());
            expect_op(":");
            e->items.push_back(expression());
            if (!is_op("}")) expect_op(",");
          }
          return e;
        }
        break;
      default:
        break;
    }
    error(t, cat("expected an expression, found ", describe(t)));
  }

  ExprPtr literal(Value v, size_t pos) {
    auto e = make(EK::Literal, pos);
    e->value = std::move(v);
    return e;
  }

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const size_t pos = next().pos;
        const Token& t = next();
        if (t.type == Tok::Int) {
          auto idx = make(EK::Index, pos);
          idx->a = std::move(e);
          idx->b = literal(Value(int64_t(std::atoll(t.text.c_str()))), t.pos);
          e = std::move(idx);
          continue;
        }
        if (t.type != Tok::Name) error(t, cat("expected an attribute name after '.', found ", describe(t)));
        auto attr = make(EK::Attr, pos);
        attr->a = std::move(e);
        attr->name = t.text;
        e = std::move(attr);
      } else if (is_op("[")) {
        e = subscript(std::move(e));
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr object) {
    const size_t pos = next().pos;
    ExprPtr parts[3];
    int colons = 0;
    while (!is_op("]")) {
      if (accept_op(":")) {
        if (++colons > 2) error(peek(), "a slice takes at most three parts");
        continue;
      }
      if (parts[colons]) error(peek(), cat("expected ':' or ']', found ", describe(peek())));
      parts[colons] = expression();
    }
    next();
    if (colons == 0) {
      if (!parts[0]) syntax_error(src_, pos, "empty subscript '[]'");
      auto e = make(EK::Index, pos);
      e->a = std::move(object);
      e->b = std::move(parts[0]);
      return e;
    }
    auto e = make(EK::Slice, pos);
    e->a = std::move(object);
    e->b = std::move(parts[0]);
    e->c = std::move(parts[1]);
    e->d = std::move(parts[2]);
    return e;
  }

  std::vector<ast::Arg> arguments() {
    expect_op("(");
    std::vector<ast::Arg> args;
    while (!accept_op(")")) {
      ast::Arg arg;
      if (peek().type == Tok::Name && is_op("=", 1)) {
        arg.name = next().text;
        next();
      } else if (is_op("*") || is_op("**")) {
        error(peek(), "argument unpacking (*args, **kwargs) is not supported");
      } else if (!args.empty() && !args.back().name.empty()) {
        error(peek(), "positional argument follows keyword argument");
      }
      arg.value = expression();
      args.push_back(std::move(arg));
      if (!is_op(")")) expect_op(",");
    }
    return args;
  }

  ExprPtr call(ExprPtr callee) {
    auto e = make(EK::Call, peek().pos);
    e->a = std::move(callee);
    e->args = arguments();
    return e;
  }

  ExprPtr filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        const size_t pos = next().pos;
        auto f = make(EK::Filter, pos);
        f->name = expect_name("a filter name");
        f->a = std::move(e);
        if (is_op("(")) f->args = arguments();
        e = std::move(f);
      } else if (is_name("is")) {
        const size_t pos = next().pos;
        auto t = make(EK::Test, pos);
        t->negated = accept_name("not");
        t->name = expect_name("a test name");
        t->a = std::move(e);
        if (is_op("(")) {
          t->args = arguments();
        } else if (test_argument_follows()) {
          ast::Arg arg;
          arg.value = postfix(primary());
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // Jinja lets one test argument follow without parentheses: `x is divisibleby 3`.
  bool test_argument_follows() const {
    const Token& t = peek();
    if (t.type == Tok::Name)
      return t.text != "else" && t.text != "or" && t.text != "and" && t.text != "if" && t.text != "in" &&
             t.text != "not" && t.text != "is";
    return t.type == Tok::String || t.type == Tok::Int || t.type == Tok::Float || is_op("[") || is_op("{");
  }

  struct OpenBlock {
    std::string_view name;
    size_t pos;
    std::string_view closer;
  };

  std::string_view src_;
  std::vector<Token> toks_;
  std::vector<OpenBlock> open_;  // blocks being parsed, innermost last
  size_t at_ = 0;
  int depth_ = 0;
};

}  // namespace

ast::Body parse(std::string_view source) { return Parser(source).run(); }

}  // namespace strata::chat
