// llama-server's POST /tokenize and POST /detokenize, with its request and response shapes:
//   /tokenize   {"content": TEXT, "add_special": false, "parse_special": true, "with_pieces": false}
//               -> {"tokens": [ids]} or, with_pieces, {"tokens": [{"id": ID, "piece": TEXT}]}
//               (a piece that is not valid UTF-8 on its own is an array of its bytes)
//   /detokenize {"tokens": [ids]} -> {"content": TEXT}
// Errors are OpenAI-shaped 400s naming the field.
#pragma once

#include <httplib.h>

#include "decode/loaded_model.h"

namespace strata::server {

void tokenize(const decode::LoadedModel& model, const httplib::Request& req, httplib::Response& res);
void detokenize(const decode::LoadedModel& model, const httplib::Request& req, httplib::Response& res);

}  // namespace strata::server
