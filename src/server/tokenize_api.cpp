#include "server/tokenize_api.h"

#include "decode/json_automaton.h"
#include "server/json_fields.h"
#include "server/request.h"
#include "server/respond.h"
#include "util/error.h"

namespace strata::server {

namespace {

bool valid_utf8(const std::string& bytes) {
  uint8_t state = 0;
  for (unsigned char c : bytes) {
    const int next = decode::utf8_step(state, c);
    if (next < 0) return false;
    state = uint8_t(next);
  }
  return state == 0;
}

}  // namespace

void tokenize(const decode::LoadedModel& model, const httplib::Request& req, httplib::Response& res) {
  const Json doc = parse_body(req.body, kMaxJsonDepth);
  const Fields f(doc, "");
  f.reject_unknown({"content", "add_special", "parse_special", "with_pieces"});
  const Json& content = f.require("content");
  if (!content.is_string()) throw_invalid_type("content", content, "a string");
  const auto& tok = model.tokenizer();
  std::vector<uint32_t> ids;
  // add_special adds what the model's vocabulary asks for at the start (Qwen's: nothing).
  if (f.boolean("add_special").value_or(false) && tok.vocab().add_bos && tok.vocab().bos)
    ids.push_back(*tok.vocab().bos);
  const auto text = tok.encode(content.get<std::string>(), f.boolean("parse_special").value_or(true));
  ids.insert(ids.end(), text.begin(), text.end());
  Json tokens = Json::array();
  const bool pieces = f.boolean("with_pieces").value_or(false);
  for (uint32_t id : ids) {
    if (!pieces) {
      tokens.push_back(id);
      continue;
    }
    const std::string& piece = tok.piece(id);
    Json bytes = Json::array();
    if (!valid_utf8(piece))
      for (unsigned char c : piece) bytes.push_back(int(c));
    tokens.push_back({{"id", id}, {"piece", valid_utf8(piece) ? Json(piece) : bytes}});
  }
  res.set_content(to_text({{"tokens", std::move(tokens)}}), "application/json");
}

void detokenize(const decode::LoadedModel& model, const httplib::Request& req, httplib::Response& res) {
  const Json doc = parse_body(req.body, kMaxJsonDepth);
  const Fields f(doc, "");
  f.reject_unknown({"tokens"});
  const Json* tokens = f.array("tokens");
  if (!tokens)
    throw ApiError(400, "Missing required parameter: 'tokens'.", "tokens", "missing_required_parameter");
  const auto& tok = model.tokenizer();
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& id = (*tokens)[i];
    const std::string at = cat("tokens[", i, "]");
    if (!id.is_number_integer()) throw_invalid_type(at, id, "an integer");
    if (id.is_number_unsigned() ? id.get<uint64_t>() >= tok.size()
                                : (id.get<int64_t>() < 0 || id.get<int64_t>() >= int64_t(tok.size())))
      throw ApiError(400, cat("Invalid '", at, "': token id ", id.dump(), " is outside the vocabulary of ",
                              tok.size(), " tokens."),
                     at, "invalid_value");
    ids.push_back(uint32_t(id.get<uint64_t>()));
  }
  res.set_content(to_text({{"content", tok.decode(ids)}}), "application/json");
}

}  // namespace strata::server
