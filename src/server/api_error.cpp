#include "server/api_error.h"

namespace strata::server {

namespace {

using Json = nlohmann::ordered_json;

// Messages can quote request bytes (a JSON syntax error shows what it read), which need not be
// UTF-8; the body must be, whoever serializes it.
std::string valid_utf8(const std::string& s) {
  return Json::parse(Json(s).dump(-1, ' ', false, Json::error_handler_t::replace))
      .get<std::string>();
}

}  // namespace

nlohmann::ordered_json error_body(const ApiError& e) {
  const auto or_null = [](const std::string& s) { return s.empty() ? Json() : Json(valid_utf8(s)); };
  return {{"error",
           {{"message", valid_utf8(e.message)},
            {"type", e.type},
            {"param", or_null(e.param)},
            {"code", or_null(e.code)}}}};
}

}  // namespace strata::server
