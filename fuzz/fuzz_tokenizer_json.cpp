// libFuzzer target for loading a Hugging Face tokenizer.json: any bytes as the file's text. It
// loads or throws strata::Error naming the file and field; a vocabulary that loads must build a
// Tokenizer (or be refused with strata::Error) whose encode and decode run on a fixed text.
// Anything else (another exception, a crash, a sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    strata::tokenizer::Vocab vocab = strata::tokenizer::parse_hf_tokenizer_json(text, "fuzz/tokenizer.json");
    const strata::tokenizer::Tokenizer tokenizer(std::move(vocab));
    const auto ids = tokenizer.encode("Hello, world! <|im_start|>caf\xc3\xa9 \xff 12345");
    volatile size_t sink = tokenizer.decode(ids).size();
    (void)sink;
  } catch (const strata::Error&) {
  }
  return 0;
}
