#include "chat/template.h"

#include "chat/interpreter.h"
#include "chat/parser.h"
#include "util/error.h"

namespace strata::chat {

Template::Template(std::string source)
    : source_(std::move(source)), body_(std::make_shared<ast::Body>(parse(source_))) {}

std::string Template::render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object()) fail("chat template: the variables must be a JSON object");
  return interpret(source_, *body_, Value::from_json(variables).object());
}

}  // namespace strata::chat
