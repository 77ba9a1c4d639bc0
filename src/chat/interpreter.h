// Executes a parsed template.
#pragma once

#include <string>
#include <string_view>

#include "chat/ast.h"

namespace strata::chat {

// Evaluation limits: every template terminates and stays in memory, whatever it does.
inline constexpr int64_t kMaxSteps = 5'000'000;  // statements run plus loop iterations
inline constexpr int kMaxCallDepth = 100;         // nested macro calls

// Renders `body` (parsed from `source`, which error messages quote positions in) with
// `variables` as globals over the built-in functions.
std::string interpret(std::string_view source, const ast::Body& body, Object variables);

}  // namespace strata::chat
