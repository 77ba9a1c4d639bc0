// The syntax tree of a parsed template. Every node keeps the byte offset of its first token so
// runtime errors can name a line and column.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace strata::chat::ast {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// A call argument: positional when name is empty, else name=value.
struct Arg {
  std::string name;
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    Literal,    // value
    Name,       // name
    List,       // items (a tuple literal is a list too)
    Dict,       // keys, items
    Unary,      // op ("not", "-", "+"), a
    Binary,     // op ("and", "or", "+", "-", "*", "/", "//", "%", "**", "~"), a, b
    Compare,    // a, then (ops[i], items[i]) chained as Python does: a < b < c
    Attr,       // a.name
    Index,      // a[b]
    Slice,      // a[b:c:d], any of b, c, d may be null
    Call,       // a(args)
    Filter,     // a | name(args)
    Test,       // a is [not] name(args)
    Cond,       // b if a else c (c may be null: undefined)
  };
  Kind kind;
  size_t pos;
  Value value;
  std::string name;
  std::string op;
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> items;
  std::vector<ExprPtr> keys;
  std::vector<std::string> ops;
  std::vector<Arg> args;
  bool negated = false;

  Expr(Kind k, size_t p) : kind(k), pos(p) {}
};

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // conds[i] -> bodies[i]; else_body
    For,       // targets in expr [if filter]: bodies[0]; else_body
    Set,       // targets (or target.attr) = expr; or block form: bodies[0]
    Macro,     // name(params): bodies[0]
    Break,
    Continue,
    Block,     // a transparent wrapper ({% generation %}): bodies[0]
  };
  Kind kind;
  size_t pos;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body else_body;
  std::vector<std::string> targets;
  std::string attr;  // Set: `set targets[0].attr = ...`
  std::string name;
  std::vector<Param> params;

  Stmt(Kind k, size_t p) : kind(k), pos(p) {}
};

}  // namespace strata::chat::ast
