// A Jinja2 chat template, parsed once and rendered many times: the subset of Jinja that Hugging
// Face chat templates use (docs/CHAT_TEMPLATE.md lists it), with Hugging Face's environment
// (trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now, a tojson that
// keeps non-ASCII text).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/ast.h"

namespace strata::chat {

class Template {
 public:
  // Throws strata::Error "chat template L:C: problem" on a syntax error.
  explicit Template(std::string source);

  // Renders with `variables` (a JSON object) as the template's globals. Throws strata::Error:
  // with the template's own text when it calls raise_exception(text), else
  // "chat template L:C: problem" (a type error, an undefined value read, a loop that runs past
  // its step budget, a macro recursing too deep, output over kMaxBytes).
  std::string render(const nlohmann::ordered_json& variables) const;

 private:
  std::string source_;
  std::shared_ptr<const ast::Body> body_;
};

}  // namespace strata::chat
