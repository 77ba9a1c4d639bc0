// strata tokenize: the token ids of a text, with the vocabulary of a GGUF model or a tokenizer.json.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace strata::cli {

namespace {

struct TokenizeOptions {
  std::string model;
  std::string tokenizer_json;
  std::string text;
  bool verbose = false;
  bool parse_special = true;
};

// A token's bytes as a quoted, printable string: whole UTF-8 characters as they are, control
// characters and bytes outside a character (half of an emoji, say) escaped.
std::string quote_piece(std::string_view bytes) {
  std::string out = "\"";
  for (size_t pos = 0; pos < bytes.size();) {
    const size_t at = pos;
    const uint32_t cp = tokenizer::utf8::next(bytes, pos);
    char escaped[8];
    if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '"' || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == tokenizer::utf8::kInvalid || cp < 0x20 || cp == 0x7F) {
      std::snprintf(escaped, sizeof escaped, "\\x%02X", unsigned(uint8_t(bytes[at])));
      out += escaped;
    } else {
      out.append(bytes.substr(at, pos - at));
    }
  }
  return out + "\"";
}

void run_tokenize(const TokenizeOptions& o) {
  tokenizer::Vocab vocab;
  if (!o.model.empty()) {
    vocab = tokenizer::read_vocab_metadata(*gguf::Reader::open(o.model));
  } else if (!o.tokenizer_json.empty()) {
    vocab = tokenizer::load_hf_tokenizer_json(o.tokenizer_json);
  } else {
    fail("tokenize: give a model (-m MODEL.gguf) or --tokenizer-json PATH");
  }
  const tokenizer::Tokenizer tok(std::move(vocab));
  std::string text = o.text;
  if (text == "-") text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  const std::vector<uint32_t> ids = tok.encode(text, o.parse_special);
  if (o.verbose) {
    for (uint32_t id : ids) std::printf("%u\t%s\n", id, quote_piece(tok.piece(id)).c_str());
    std::fprintf(stderr, "%zu tokens, %zu bytes\n", ids.size(), text.size());
    return;
  }
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
  std::printf("%s\n", line.c_str());
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  auto* model = cmd->add_option("-m,--model", opts->model, "GGUF model whose tokenizer.* metadata to use");
  cmd->add_option("--tokenizer-json", opts->tokenizer_json, "Hugging Face tokenizer.json to use instead")
      ->excludes(model);
  cmd->add_option("text", opts->text, "The text, or - to read it from stdin")->required();
  cmd->add_flag("-v,--verbose", opts->verbose, "One line per token: the id and its bytes");
  cmd->add_flag("!--no-parse-special", opts->parse_special,
                "Encode control tokens such as <|im_start|> as plain text");
  cmd->callback([opts] { run_tokenize(*opts); });
}

}  // namespace strata::cli
