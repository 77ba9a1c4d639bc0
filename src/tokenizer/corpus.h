// The small text the generated vocab's first merges are learned from.
#pragma once

namespace strata::tokenizer {

// A few KB of varied UTF-8 (English prose, code, numbers, other scripts, emoji), written for
// strata so that learned merges look like a real tokenizer's first merges.
const char* training_text();

}  // namespace strata::tokenizer
