// A synthetic yet real byte-level BPE vocab: learned merges from the embedded text, then seeded
// synthetic word pieces, then Qwen3's added tokens.
#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "tokenizer/corpus.h"
#include "tokenizer/qwen3_data.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::tokenizer {

namespace {

enum class CharClass { Letter, Digit, Space, Newline, Other };

// An approximation of Unicode's categories that is good enough for choosing training chunks:
// the non-ASCII blocks our text uses are letters except punctuation and symbol blocks (general
// punctuation, CJK punctuation, full-width forms, arrows, dingbats, emoji).
CharClass classify(uint32_t cp) {
  if (cp == '\n' || cp == '\r') return CharClass::Newline;
  if (cp == ' ' || cp == '\t' || cp == '\f' || cp == '\v') return CharClass::Space;
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::Letter;
    if (cp >= '0' && cp <= '9') return CharClass::Digit;
    return CharClass::Other;
  }
  if (cp < 0xC0 || cp == 0xD7 || cp == 0xF7) return CharClass::Other;  // Latin-1 punctuation
  if ((cp >= 0x2000 && cp < 0x3040) || (cp >= 0xFE00 && cp < 0xFF21) || cp >= 0x1F000)
    return CharClass::Other;
  return CharClass::Letter;
}

// Splits text the way Qwen's pre-tokenizer regex does (contractions; one optional non-letter
// before a letter run; single digits; punctuation runs with one optional leading space and
// trailing newlines; whitespace up to the last newline; a space run leaving its last space to
// the next word), so learned merges never cross those boundaries.
std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<uint32_t> cps;
  std::vector<size_t> at;  // byte offset of each code point, plus the end
  for (size_t pos = 0; pos < text.size();) {
    at.push_back(pos);
    cps.push_back(utf8::next(text, pos));
  }
  at.push_back(text.size());
  const size_t n = cps.size();
  const auto cls = [&](size_t i) { return i < n ? classify(cps[i]) : CharClass::Newline; };
  const auto run = [&](size_t i, auto pred) {
    while (i < n && pred(cls(i))) ++i;
    return i;
  };
  std::vector<std::string_view> chunks;
  for (size_t i = 0; i < n;) {
    size_t end = i + 1;
    const CharClass c = cls(i);
    const auto lower = [&](size_t k) { return k < n && cps[k] < 0x80 ? (cps[k] | 0x20) : 0u; };
    if (cps[i] == '\'' && (lower(i + 1) == 's' || lower(i + 1) == 't' || lower(i + 1) == 'm' ||
                           lower(i + 1) == 'd')) {
      end = i + 2;
    } else if (cps[i] == '\'' && ((lower(i + 1) == 'r' && lower(i + 2) == 'e') ||
                                  (lower(i + 1) == 'v' && lower(i + 2) == 'e') ||
                                  (lower(i + 1) == 'l' && lower(i + 2) == 'l'))) {
      end = i + 3;
    } else if (c == CharClass::Letter ||
               (c != CharClass::Digit && c != CharClass::Newline && cls(i + 1) == CharClass::Letter)) {
      end = run(i + 1, [](CharClass k) { return k == CharClass::Letter; });
    } else if (c == CharClass::Digit) {
      end = i + 1;
    } else if (c == CharClass::Other || (cps[i] == ' ' && cls(i + 1) == CharClass::Other)) {
      end = run(i + 1, [](CharClass k) { return k == CharClass::Other; });
      end = run(end, [](CharClass k) { return k == CharClass::Newline; });
    } else {
      const size_t ws_end =
          run(i, [](CharClass k) { return k == CharClass::Space || k == CharClass::Newline; });
      size_t last_newline = ws_end;
      for (size_t k = i; k < ws_end; ++k)
        if (cls(k) == CharClass::Newline) last_newline = k;
      if (last_newline != ws_end) end = last_newline + 1;
      else if (ws_end == n || ws_end - i == 1) end = ws_end;
      else end = ws_end - 1;
    }
    chunks.push_back(text.substr(at[i], at[end] - at[i]));
    i = end;
  }
  return chunks;
}

struct Builder {
  std::vector<std::string> tokens;  // byte form
  std::vector<std::string> merges;  // byte-level form "a b"
  std::unordered_set<std::string> known;

  void add_merge(uint32_t a, uint32_t b) {
    std::string joined = tokens[a] + tokens[b];
    merges.push_back(bytes_to_token(tokens[a]) + " " + bytes_to_token(tokens[b]));
    known.insert(joined);
    tokens.push_back(std::move(joined));
  }
};

// Classic BPE training on the pre-tokenized text: repeatedly merge the most frequent adjacent
// pair (ties: the smallest ids) until no pair occurs twice or `budget` merges were made.
void learn_merges(Builder& b, size_t budget) {
  std::unordered_map<std::string_view, uint32_t> counts;
  for (std::string_view chunk : pretokenize(training_text())) ++counts[chunk];
  uint32_t byte_id[256];  // the byte tokens are not in byte order
  for (uint32_t id = 0; id < 256; ++id) byte_id[uint8_t(b.tokens[id][0])] = id;
  std::vector<std::pair<std::vector<uint32_t>, uint32_t>> words;
  for (const auto& [chunk, count] : counts) {
    std::vector<uint32_t> symbols;
    for (char c : chunk) symbols.push_back(byte_id[uint8_t(c)]);
    words.emplace_back(std::move(symbols), count);
  }
  // Sorted so the result does not depend on the hash map's iteration order.
  std::sort(words.begin(), words.end());
  std::unordered_map<uint64_t, uint32_t> pairs;
  while (b.merges.size() < budget) {
    pairs.clear();
    for (const auto& [symbols, count] : words)
      for (size_t i = 0; i + 1 < symbols.size(); ++i)
        pairs[uint64_t(symbols[i]) << 32 | symbols[i + 1]] += count;
    uint64_t best = 0;
    uint32_t best_count = 1;
    for (const auto& [pair, count] : pairs)
      if (count > best_count || (count == best_count && count > 1 && pair < best)) {
        best = pair;
        best_count = count;
      }
    if (best_count < 2) return;
    const uint32_t left = uint32_t(best >> 32), right = uint32_t(best), merged = uint32_t(b.tokens.size());
    b.add_merge(left, right);
    for (auto& [symbols, count] : words) {
      size_t out = 0;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          symbols[out++] = merged;
          ++i;
        } else {
          symbols[out++] = symbols[i];
        }
      }
      symbols.resize(out);
    }
  }
}

// Pools of "word piece" tokens the synthetic merges combine, per script: a head may start a word
// (leading space, and for Latin a capital first letter), a tail only continues one (lowercase).
// Pieces join only pieces of their own script, so synthetic tokens look like words.
struct Pools {
  enum Script { kLatin, kCyrillic, kCjk, kKana, kHangul, kOtherLetters, kScripts };
  std::vector<uint32_t> heads[kScripts], tails[kScripts];

  static Script script_of(uint32_t cp) {
    if (cp < 0x80) return kLatin;
    if (cp >= 0x400 && cp < 0x530) return kCyrillic;
    if (cp >= 0x4E00 && cp < 0xA000) return kCjk;
    if (cp >= 0x3040 && cp < 0x3100) return kKana;
    if (cp >= 0xAC00 && cp < 0xD7B0) return kHangul;
    return kOtherLetters;
  }

  void add(std::string_view bytes, uint32_t id) {
    const bool leading_space = !bytes.empty() && bytes[0] == ' ';
    if (leading_space) bytes.remove_prefix(1);
    if (bytes.empty()) return;
    std::optional<Script> script;
    bool capital = false;
    for (size_t pos = 0; pos < bytes.size();) {
      const bool first = pos == 0;
      const uint32_t cp = utf8::next(bytes, pos);
      if (cp == utf8::kInvalid || classify(cp) != CharClass::Letter) return;
      if (script && *script != script_of(cp)) return;
      script = script_of(cp);
      if (cp >= 'A' && cp <= 'Z') {
        if (!first) return;
        capital = true;
      }
    }
    heads[*script].push_back(id);
    if (!leading_space && !capital) tails[*script].push_back(id);
  }
};

// Index into a pool of n, biased towards early (short, frequent) pieces on the first attempts.
uint32_t pick(Rng& rng, size_t n, int attempt) {
  if (attempt >= 8) return rng.below(uint32_t(n));
  const float u = rng.uniform();
  return std::min(uint32_t(n - 1), uint32_t(float(n) * u * u));
}

void synthesize_merges(Builder& b, size_t budget, uint64_t seed) {
  Pools pools;
  for (uint32_t id = 0; id < b.tokens.size(); ++id) pools.add(b.tokens[id], id);
  std::vector<int> other_scripts;  // those with pieces to combine
  for (int s = Pools::kLatin + 1; s < Pools::kScripts; ++s)
    if (pools.tails[s].size() >= 2) other_scripts.push_back(s);
  Rng rng(seed);
  while (b.merges.size() < budget) {
    // About one synthetic token in eight is non-Latin, as in a multilingual vocab.
    int s = rng.below(8) == 0 && !other_scripts.empty()
                ? other_scripts[rng.below(uint32_t(other_scripts.size()))]
                : Pools::kLatin;
    for (int attempt = 0;; ++attempt) {
      // A script with few pieces runs out of new combinations; Latin never does.
      if (attempt == 64) s = Pools::kLatin;
      const size_t max_bytes = s == Pools::kLatin ? 16 : 12;
      const uint32_t head = pools.heads[s][pick(rng, pools.heads[s].size(), attempt)];
      const uint32_t tail = pools.tails[s][pick(rng, pools.tails[s].size(), attempt)];
      if (b.tokens[head].size() + b.tokens[tail].size() > max_bytes ||
          b.known.count(b.tokens[head] + b.tokens[tail]))
        continue;
      b.add_merge(head, tail);
      pools.add(b.tokens.back(), uint32_t(b.tokens.size() - 1));
      break;
    }
  }
}

}  // namespace

Vocab generate_byte_level_bpe(uint32_t vocab_size, uint64_t seed) {
  const auto& added = qwen3::added_tokens();
  const size_t fixed = 256 + added.size();
  if (vocab_size < fixed)
    fail("vocab size ", vocab_size, " is too small: a byte-level vocab with Qwen's added tokens "
         "needs at least ", fixed);
  Builder b;
  b.tokens.reserve(vocab_size);
  b.merges.reserve(vocab_size - fixed);
  b.known.reserve(vocab_size);
  // Bytes in GPT-2 order, as Qwen's ids 0..255: those that map to themselves (printable) first.
  std::vector<uint32_t> order;
  for (int pass = 0; pass < 2; ++pass)
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const std::string token = bytes_to_token(std::string(1, char(byte)));
      size_t pos = 0;
      if ((utf8::next(token, pos) == byte) == (pass == 0)) order.push_back(byte);
    }
  for (uint32_t byte : order) {
    b.tokens.emplace_back(1, char(byte));
    b.known.insert(b.tokens.back());
  }
  const size_t n_merges = vocab_size - fixed;
  learn_merges(b, n_merges);
  synthesize_merges(b, n_merges, seed);

  Vocab v;
  v.tokens.reserve(vocab_size);
  for (const std::string& t : b.tokens) v.tokens.push_back(bytes_to_token(t));
  v.types.assign(v.tokens.size(), TokenType::Normal);
  v.merges = std::move(b.merges);
  for (const auto& a : added) {
    v.tokens.push_back(a.text);
    v.types.push_back(a.type);
  }
  const auto added_id = [&](std::string_view text) {
    const auto it = std::find_if(added.begin(), added.end(), [&](const auto& a) { return a.text == text; });
    return uint32_t(b.tokens.size() + size_t(it - added.begin()));
  };
  v.bos = v.pad = added_id("<|endoftext|>");
  v.eos = added_id("<|im_end|>");
  v.chat_template = qwen3::chat_template();
  v.pre = kPreQwen2;
  return v;
}

}  // namespace strata::tokenizer
