// Data taken from Qwen3's tokenizer files (see qwen3_data.cpp for the source and licence).
#pragma once

#include <string>
#include <vector>

#include "tokenizer/vocab.h"

namespace strata::tokenizer::qwen3 {

struct AddedToken {
  std::string text;
  TokenType type;
};

// The 26 added tokens in id order (Qwen3 gives them ids 151643..151668).
const std::vector<AddedToken>& added_tokens();
// The ChatML chat template with tools and thinking (<think>, enable_thinking).
const char* chat_template();

}  // namespace strata::tokenizer::qwen3
