// The errors the server answers with, in OpenAI's shape:
//   {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}
// Request parsing throws ApiError; the routes turn it into the status and body.
#pragma once

#include <exception>
#include <string>

#include <nlohmann/json.hpp>

namespace strata::server {

struct ApiError : std::exception {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault; empty: null
  std::string code;   // machine-readable reason; empty: null

  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error")
      : status(status),
        message(std::move(message)),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  const char* what() const noexcept override { return message.c_str(); }
};

nlohmann::ordered_json error_body(const ApiError& e);

}  // namespace strata::server
