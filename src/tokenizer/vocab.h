// The vocabulary of a byte-level BPE model (GPT-2 style, as every Qwen model uses) and its GGUF
// form: the tokenizer.* metadata llama.cpp reads, with the same keys, value types and token-type
// codes its converter (convert_hf_to_gguf.py) writes, so our files load there unchanged.
//
// Tokens are stored in the GPT-2 "byte-level unicode" form: each byte of the token's text is one
// printable code point (a space is "Ġ", a newline "Ċ"), so every token is valid UTF-8 and a merge
// "a b" can be split at its single space. Added tokens (<|im_start|>, <think>...) are plain text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::gguf {
class Reader;
class Writer;
}  // namespace strata::gguf

namespace strata::tokenizer {

// llama.cpp's llama_token_type codes, as stored in tokenizer.ggml.token_type (i32).
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,      // special tokens the tokenizer never produces from text (<|im_end|>)
  UserDefined = 4,  // added tokens matched verbatim in text (<think>, <tool_call>)
  Unused = 5,       // the [PADn] fillers
  Byte = 6,         // SentencePiece <0xNN> byte tokens; byte-level BPE vocabs do not use it
};

// tokenizer.ggml.pre values llama.cpp knows for the Qwen family. "qwen2" is the Qwen2/Qwen3
// pre-tokenizer regex; "qwen35" is the Qwen3.5 one (letters may carry combining marks, \p{M}),
// which only recent llama.cpp builds accept.
inline constexpr std::string_view kPreQwen2 = "qwen2";
inline constexpr std::string_view kPreQwen35 = "qwen35";

struct Vocab {
  std::vector<std::string> tokens;  // id -> token (byte-level unicode form)
  std::vector<TokenType> types;     // id -> type, same length as tokens
  std::vector<std::string> merges;  // "a b" in rank order
  std::optional<uint32_t> bos, eos, pad, unk;
  bool add_bos = false;
  std::string chat_template;          // Jinja, empty if none
  std::string pre{kPreQwen2};         // tokenizer.ggml.pre

  size_t size() const { return tokens.size(); }
  // Id of a token by its exact text; a linear scan, meant for a handful of look-ups.
  std::optional<uint32_t> find(std::string_view token) const;
};

// GPT-2 byte-level mapping: bytes -> token text and back. token_to_bytes returns nullopt for a
// string with a code point outside the 256 the mapping uses (an added token, say).
std::string bytes_to_token(std::string_view bytes);
std::optional<std::string> token_to_bytes(std::string_view token);

// Throws strata::Error naming `what` (a file, "generated vocab") and the first problem: lengths
// that disagree, an empty or duplicate token (llama.cpp rejects both), a special id out of range,
// a merge that is not "a b" with a, b and ab all tokens.
void check_vocab(const Vocab& vocab, const std::string& what);

// A real byte-level BPE of exactly vocab_size tokens, in Qwen's layout: the 256 byte tokens in
// GPT-2 order, then merges (each adds the token a+b, both parts earlier tokens), then the 26
// Qwen3 added tokens with Qwen3's types, ids (bos = pad = <|endoftext|>, eos = <|im_end|>) and
// chat template. The first merges are learned by BPE training on a small embedded multilingual
// text until no pair repeats; the rest are seeded synthetic word pieces. Same arguments, same
// vocab. vocab_size must leave room for the bytes and added tokens (>= 282).
Vocab generate_byte_level_bpe(uint32_t vocab_size, uint64_t seed);

// Appends "[PADn]" tokens (n = the id, type Unused, as llama.cpp's converter names them) until
// the vocab has n_vocab tokens: llama.cpp needs one token per embedding row. Throws if the vocab
// is already larger.
void pad_vocab(Vocab& vocab, uint32_t n_vocab);

// Loads a Hugging Face tokenizer.json (model.type "BPE"; merges as "a b" strings or [a, b]
// pairs; added_tokens) and, if present next to it, tokenizer_config.json (chat_template,
// bos/eos/pad/unk tokens, add_bos_token). Ids missing from both (gaps) become [PADn] fillers.
// The pre-tokenizer name is "qwen2"/"qwen35" when the Split regex is Qwen's, else "default".
// Throws strata::Error naming the file and the offending field.
Vocab load_hf_tokenizer_json(const std::string& path);
// The same from tokenizer.json's text, without a tokenizer_config.json; `name` goes into errors.
Vocab parse_hf_tokenizer_json(std::string_view text, const std::string& name);

// Writes the tokenizer.* keys (checks the vocab first).
void write_vocab_metadata(const Vocab& vocab, gguf::Writer& writer);
// Reads them back; throws strata::Error naming the file and key on missing or mistyped values.
Vocab read_vocab_metadata(const gguf::Reader& reader);

}  // namespace strata::tokenizer
