// Parses a template into its syntax tree, with Jinja2's grammar and operator precedence
// (lowest first): `x if c else y`, or, and, not, comparisons and in / not in (chained as in
// Python), + -, ~, * / // %, **, unary - +, then postfix .attr [index] [a:b:c] (call) and the
// filters `| f` and tests `is [not] t`.
#pragma once

#include <string_view>

#include "chat/ast.h"

namespace strata::chat {

// Throws strata::Error "chat template L:C: problem" on any syntax error; never recurses deeper
// than a fixed nesting limit, whatever the input.
ast::Body parse(std::string_view source);

}  // namespace strata::chat
