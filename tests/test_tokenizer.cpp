// The tokenizer's own properties: round trips, streaming detokenization, added tokens, invalid
// UTF-8, the pre-tokenizer's choices, errors, speed, and the CLI. The comparison with the
// reference encoder is in test_tokenizer_reference.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "gguf/gguf.h"
#include "test_tokenizer_util.h"
#include "tokenizer/detokenize.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/rng.h"
#include "test_util.h"

using strata::testing::error_of;

namespace strata::tokenizer::testing {
namespace {

constexpr uint32_t kImStart = 151644, kImEnd = 151645, kThink = 151667;


bool valid_utf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();)
    if (utf8::next(s, pos) == utf8::kInvalid) return false;
  return true;
}

std::vector<std::string_view> split(std::string_view pre, std::string_view text) {
  std::vector<std::string_view> words;
  PreTokenizer(pre).split(text, words);
  return words;
}

// Expected decode(encode(text)) for any bytes: added tokens as they are, and between them valid
// stretches NFC-normalized and invalid bytes kept.
std::string expected_decode(const Tokenizer& tok, std::string_view text) {
  std::vector<std::string_view> added;
  for (uint32_t id = 0; id < tok.size(); ++id)
    if (tok.vocab().types[id] == TokenType::Control || tok.vocab().types[id] == TokenType::UserDefined)
      added.push_back(tok.vocab().tokens[id]);
  std::sort(added.begin(), added.end(), [](auto a, auto b) { return a.size() > b.size(); });
  std::string out;
  size_t run = 0;
  const auto flush = [&](size_t end) {
    const std::string_view stretch = text.substr(run, end - run);
    for (size_t pos = 0, start = 0; pos <= stretch.size();) {
      const size_t at = pos;
      if (pos < stretch.size() && utf8::next(stretch, pos) != utf8::kInvalid) continue;
      out += normalize_nfc(stretch.substr(start, at - start));
      if (at == stretch.size()) break;
      out += stretch[at];
      start = pos;
    }
  };
  for (size_t pos = 0; pos < text.size();) {
    const auto it = std::find_if(added.begin(), added.end(), [&](auto a) { return text.substr(pos).starts_with(a); });
    if (it == added.end()) {
      ++pos;
      continue;
    }
    flush(pos);
    out += *it;
    pos += it->size();
    run = pos;
  }
  flush(text.size());
  return out;
}

// Where a UTF-8 reader (one byte forward on anything invalid) can stand in `text`.
std::vector<bool> character_boundaries(std::string_view text) {
  std::vector<bool> at(text.size() + 1, false);
  for (size_t pos = 0; pos < text.size(); utf8::next(text, pos)) at[pos] = true;
  at[text.size()] = true;
  return at;
}

TEST(TokenizerQwen3, KnownIdsAddedTokensAndErrors) {
  const Tokenizer& tok = qwen3_tokenizer();
  EXPECT_EQ(tok.vocab().pre, "qwen2");
  EXPECT_EQ(tok.encode("Hello, world!"), (std::vector<uint32_t>{9707, 11, 1879, 0}));
  const std::string chat = "<|im_start|>user\nhi<|im_end|><think>x</think>";
  EXPECT_EQ(tok.encode(chat), (std::vector<uint32_t>{kImStart, 872, 198, 6023, kImEnd, kThink, 87, 151668}));
  EXPECT_EQ(tok.decode(tok.encode(chat)), chat);
  // Without parse_special, control tokens are text; user-defined ones (<think>) still match.
  const std::vector<uint32_t> plain = tok.encode(chat, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), kImStart), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), kThink), 1);
  EXPECT_EQ(tok.decode(plain), chat);
  EXPECT_EQ(tok.decode(tok.encode("Cafe\u0301 \u212B")), "Caf\u00E9 \u00C5");  // NFC
  // Added tokens are cut out before NFC: a combining mark after one stays on its own.
  EXPECT_EQ(tok.decode(tok.encode("<think>\u0301")), "<think>\u0301");
  // Errors name the id and the vocab size; a failed push consumes nothing.
  const uint32_t n = uint32_t(tok.size());
  EXPECT_EQ(error_of([&] { tok.decode(std::vector<uint32_t>{1, n}); }),
            "tokenizer: token id 151669 is out of range (the vocab has 151669 tokens)");
  EXPECT_NE(error_of([&] { tok.piece(UINT32_MAX); }).find("out of range"), std::string::npos);
  StreamDecoder stream(tok);
  const uint32_t f0 = tok.encode("\xF0").at(0);  // the lone byte starts a 4-byte character
  EXPECT_EQ(stream.push(f0), "");
  EXPECT_NE(error_of([&] { stream.push(n); }).find("out of range"), std::string::npos);
  EXPECT_EQ(stream.flush(), "\xF0");
}

TEST(TokenizerQwen3, RoundTripStreamingAndInvalidUtf8) {
  const Tokenizer& tok = qwen3_tokenizer();
  Rng rng(7);
  for (const std::string& text : generate_test_strings(99, 1500)) {
    const std::vector<uint32_t> ids = tok.encode(text);
    ASSERT_EQ(tok.decode(ids), expected_decode(tok, text)) << text;
    // Streaming the ids of valid text yields valid UTF-8 at every step.
    StreamDecoder stream(tok);
    std::string streamed;
    for (uint32_t id : ids) {
      const std::string chunk = stream.push(id);
      ASSERT_TRUE(valid_utf8(chunk)) << text;
      streamed += chunk;
    }
    streamed += stream.flush();
    ASSERT_EQ(streamed, tok.decode(ids));
  }
  // Random ids, so random bytes: push-by-push output is the one-shot decode, and each push stops
  // at a character boundary of the whole text, at most 3 bytes short of what was pushed.
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint32_t> ids(1 + rng.below(12));
    for (uint32_t& id : ids) id = rng.below(2) ? rng.below(uint32_t(tok.size())) : 128 + rng.below(128);
    const std::string whole = tok.decode(ids);
    const std::vector<bool> boundary = character_boundaries(whole);
    StreamDecoder stream(tok);
    std::string streamed;
    size_t pushed = 0;
    for (uint32_t id : ids) {
      streamed += stream.push(id);
      pushed += tok.piece(id).size();
      ASSERT_TRUE(boundary[streamed.size()]);
      ASSERT_LE(pushed - streamed.size(), 3u);
    }
    streamed += stream.flush();
    ASSERT_EQ(streamed, whole);
  }
  // Invalid UTF-8 is kept byte for byte, each byte its own token.
  const std::string text = "ab\xFF" "cd\xC3 \xE2\x82 e\xCC\x81\xED\xA0\x80z";
  const std::vector<uint32_t> ids = tok.encode(text);
  EXPECT_EQ(ids, tok.encode(text));
  EXPECT_EQ(tok.decode(ids), expected_decode(tok, text));
  EXPECT_EQ(tok.decode(tok.encode("\xFF")), "\xFF");
  for (int trial = 0; trial < 500; ++trial) {
    std::string bytes(1 + rng.below(64), '\0');
    for (char& c : bytes) c = char(rng.below(4) ? 0x20 + rng.below(0x60) : rng.below(256));
    ASSERT_EQ(tok.decode(tok.encode(bytes)), expected_decode(tok, bytes));
  }
}

TEST(TokenizerQwen3, LongInputsAndSpeed) {
  const Tokenizer& tok = qwen3_tokenizer();
  // Long runs that stress the regex's backtracking and the merge heap.
  for (const std::string& text : {std::string(200000, ' '), std::string(200000, 'a'),
                                  std::string(100000, '!') + "\n\n", std::string(50000, '\t') + "x"}) {
    ASSERT_EQ(tok.decode(tok.encode(text)), text);
  }
  std::string text;
  for (const std::string& s : generate_test_strings(1234, 20000)) {
    if (text.size() >= (1u << 20)) break;
    text += s;
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<uint32_t> ids = tok.encode(text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("encoded %zu bytes into %zu tokens in %.3f s: %.0f tokens/s, %.2f MB/s\n", text.size(),
              ids.size(), seconds, double(ids.size()) / seconds, double(text.size()) / seconds / 1e6);
  EXPECT_EQ(tok.decode(ids), expected_decode(tok, text));
}

TEST(TokenizerQwen3, FromGgufMetadata) {
  const Tokenizer& json = qwen3_tokenizer();
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("strata_test_tokenizer_" + std::to_string(::getpid()) + ".gguf")).string();
  {
    gguf::Writer w(path);
    w.set("general.architecture", gguf::Value::string("qwen3moe"));
    write_vocab_metadata(json.vocab(), w);
    w.finish();
  }
  const Tokenizer gguf_tok(read_vocab_metadata(*gguf::Reader::open(path)));
  std::filesystem::remove(path);
  for (const std::string& text : generate_test_strings(5, 200)) ASSERT_EQ(gguf_tok.encode(text), json.encode(text));
}

TEST(TokenizerQwen3, Cli) {
  const std::string json = qwen3_package_dir() + "/models/tokenizer.json";
  const auto run = [](const std::string& command) {
    std::string out;
    FILE* pipe = popen(command.c_str(), "r");
    char buffer[4096];
    for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
    EXPECT_EQ(pclose(pipe), 0) << command;
    return out;
  };
  const std::string bin = STRATA_BINARY;
  EXPECT_EQ(run(bin + " tokenize --tokenizer-json '" + json + "' 'Hello, world!'"), "9707,11,1879,0\n");
  // stdin, and --verbose: pieces that are not whole characters are escaped.
  EXPECT_EQ(run("printf '<|im_start|> \\360\\237\\216\\211\\377\\n' | " + bin + " tokenize -v --tokenizer-json '" +
                json + "' - 2>/dev/null"),
            "151644\t\"<|im_start|>\"\n11162\t\" \\xF0\\x9F\"\n236\t\"\\x8E\"\n231\t\"\\x89\"\n"
            "187\t\"\\xFF\"\n198\t\"\\n\"\n");
}

TEST(Tokenizer, PreTokenizerChoices) {
  // qwen35 keeps combining marks with their letters; qwen2 starts a new word at one.
  EXPECT_EQ(split("qwen2", "e\u0301x"), (std::vector<std::string_view>{"e", "\u0301x"}));
  EXPECT_EQ(split("qwen35", "e\u0301x"), (std::vector<std::string_view>{"e\u0301x"}));
  // \s is Unicode White_Space: U+0085 is space, U+180E and U+FEFF are not.
  EXPECT_EQ(split("qwen2", "!\u0085"), (std::vector<std::string_view>{"!", "\u0085"}));
  EXPECT_EQ(split("qwen2", "!\u180E"), (std::vector<std::string_view>{"!\u180E"}));
  EXPECT_EQ(split("qwen2", "!\uFEFF"), (std::vector<std::string_view>{"!\uFEFF"}));
  // Contractions are ASCII only, like llama.cpp's and transformers.js's spelling.
  EXPECT_EQ(split("qwen2", "it'S 'ſ"), (std::vector<std::string_view>{"it", "'S", " '", "ſ"}));
  EXPECT_EQ(split("qwen2", "a  \n\n b 12"),
            (std::vector<std::string_view>{"a", "  \n\n", " b", " ", "1", "2"}));
  EXPECT_NE(error_of([] { PreTokenizer p("llama3"); }).find("\"llama3\" is not supported"), std::string::npos);
}

TEST(Tokenizer, CompleteUtf8Prefix) {
  EXPECT_EQ(complete_utf8_prefix(""), 0u);
  EXPECT_EQ(complete_utf8_prefix("ab"), 2u);
  EXPECT_EQ(complete_utf8_prefix("a\xC3"), 1u);
  EXPECT_EQ(complete_utf8_prefix("a\xC3\xA9"), 3u);
  EXPECT_EQ(complete_utf8_prefix("a\xF0\x9F\x8E"), 1u);
  EXPECT_EQ(complete_utf8_prefix("a\xF0\x9F\x8E\x89"), 5u);
  EXPECT_EQ(complete_utf8_prefix("a\xE0\x80"), 3u);  // overlong: never valid, not held
  EXPECT_EQ(complete_utf8_prefix("a\xED\xA0"), 3u);  // a surrogate
  EXPECT_EQ(complete_utf8_prefix("a\xF5"), 2u);
  EXPECT_EQ(complete_utf8_prefix("\x80\x80\x80\x80"), 4u);
}

TEST(Tokenizer, VocabErrors) {
  Vocab v = generate_byte_level_bpe(400, 1);
  v.pre = "gpt2";
  EXPECT_NE(error_of([&] { Tokenizer t(v); }).find("pre-tokenizer \"gpt2\" is not supported"), std::string::npos);
  Vocab tiny;
  tiny.tokens = {"a", "b", "ab"};
  tiny.types.assign(3, TokenType::Normal);
  tiny.merges = {"a b"};
  EXPECT_NE(error_of([&] { Tokenizer t(tiny); }).find("no token for byte 0"), std::string::npos);
  v = generate_byte_level_bpe(400, 1);
  v.merges.push_back("Ġ zzz");
  EXPECT_NE(error_of([&] { Tokenizer t(v); }).find("names a token the vocab lacks"), std::string::npos);
  v = generate_byte_level_bpe(400, 1);
  v.types.pop_back();
  EXPECT_NE(error_of([&] { Tokenizer t(v); }).find("token types"), std::string::npos);
}

}  // namespace
}  // namespace strata::tokenizer::testing
