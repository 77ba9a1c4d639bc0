#include "server/api_error.h"

namespace strata::server {

nlohmann::ordered_json error_body(const ApiError& e) {
  using Json = nlohmann::ordered_json;
  const auto or_null = [](const std::string& s) { return s.empty() ? Json() : Json(s); };
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", or_null(e.param)},
            {"code", or_null(e.code)}}}};
}

}  // namespace strata::server
