// Broken and hostile GGUF images: each must give one strata::Error that names the file and the
// problem, never a crash, a huge allocation or an out-of-bounds read.
#include <limits>

#include "gguf_test_util.h"

namespace strata::gguf {
namespace {

using testing::Bytes;
using testing::parse_error;

constexpr uint32_t kF32 = uint32_t(quant::Type::F32);
constexpr uint32_t kQ4K = uint32_t(quant::Type::Q4_K);
constexpr uint32_t kArray = uint32_t(ValueType::ARRAY);
constexpr uint64_t kHuge = std::numeric_limits<uint64_t>::max();

// A file with one string key and one [4] f32 tensor, valid as written.
Bytes one_tensor_file(std::vector<int64_t> shape = {4}, uint32_t type = kF32, uint64_t offset = 0,
                      size_t data_bytes = 16) {
  Bytes f;
  f.header(1, 1).kv_str("general.architecture", "x").tensor("w", shape, type, offset);
  f.pad().zeros(data_bytes);
  return f;
}

// A file whose only metadata is `key` holding a value of type `type` with the given payload.
Bytes one_kv_file(uint32_t type, const Bytes& payload, const std::string& key = "k") {
  Bytes f;
  f.header(0, 1).str(key).u32(type);
  f.b.insert(f.b.end(), payload.b.begin(), payload.b.end());
  return f;
}

Bytes nested_arrays(int depth) {
  Bytes p;
  for (int d = 1; d < depth; ++d) p.u32(kArray).u64(1);
  return p.u32(uint32_t(ValueType::U8)).u64(1).u8(7);
}

struct Case {
  const char* what;
  std::vector<uint8_t> bytes;
  const char* expect;
};

std::vector<Case> broken_files() {
  std::vector<Case> cases;
  auto add = [&](const char* what, const Bytes& b, const char* expect) {
    cases.push_back({what, b.b, expect});
  };
  add("bad magic", Bytes().u32(0x4c4d4747).u32(3).u64(0).u64(0),
      "t.gguf: not a GGUF file (starts with 'GGML', expected 'GGUF')");
  add("version 1", Bytes().header(0, 0, 1), "t.gguf: GGUF version 1 is not supported");
  add("version 2", Bytes().header(0, 0, 2), "t.gguf: GGUF version 2 is not supported");
  add("version 4", Bytes().header(0, 0, 4), "t.gguf: unsupported GGUF version 4");
  add("big-endian", Bytes().header(0, 0, 0x03000000), "t.gguf: big-endian GGUF");
  add("short header", Bytes().u32(kMagic).u32(3).u32(0),
      "t.gguf: truncated at byte 8 while reading header tensor count (need 8 bytes, 4 left)");
  add("n_tensors huge", Bytes().header(kHuge, 0), "header claims 18446744073709551615 tensors");
  add("n_kv huge", Bytes().header(0, uint64_t(1) << 60).zeros(64),
      "and 1152921504606846976 metadata keys, more than the remaining 64 bytes can hold");
  add("counts together too many", Bytes().header(2, 3).zeros(100),
      "header claims 2 tensors and 3 metadata keys, more than the remaining 100 bytes");
  add("key length huge", Bytes().header(0, 1).u64(kHuge).zeros(16),
      "metadata key #0 name: string length 18446744073709551615 exceeds the 16 bytes left");
  add("string value length huge",
      one_kv_file(uint32_t(ValueType::STRING), Bytes().u64(1000).zeros(10), "s"),
      "metadata key #0 ('s') value: string length 1000 exceeds the 10 bytes left");
  add("array count huge",
      one_kv_file(kArray, Bytes().u32(uint32_t(ValueType::U32)).u64(kHuge / 2).zeros(8), "a"),
      "metadata key #0 ('a') value: array of 9223372036854775807 u32 elements needs at least "
      "2^64 bytes but only 8 are left");
  add("array of arrays count huge", one_kv_file(kArray, Bytes().u32(kArray).u64(100).zeros(64)),
      "array of 100 array elements needs at least 1200 bytes but only 64 are left");
  add("array of strings count huge",
      one_kv_file(kArray, Bytes().u32(uint32_t(ValueType::STRING)).u64(9).zeros(64)),
      "array of 9 string elements needs at least 72 bytes");
  add("nesting too deep", one_kv_file(kArray, nested_arrays(9), "deep"),
      "metadata key #0 ('deep') value, element 0.0.0.0.0.0.0.0: arrays nested deeper than 8");
  add("unknown value type", one_kv_file(13, Bytes().u32(0)),
      "t.gguf: metadata key #0 ('k') value type: unknown value type 13");
  add("unknown array element type", one_kv_file(kArray, Bytes().u32(99).u64(0)),
      "metadata key #0 ('k') value: unknown value type 99");
  add("bool not 0/1", one_kv_file(uint32_t(ValueType::BOOL), Bytes().u8(2)),
      "metadata key #0 ('k') value: bool byte is 2 (must be 0 or 1)");
  add("duplicate key", Bytes().header(0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2),
      "t.gguf: metadata key #1 ('a.b') name: duplicate key (also metadata key #0)");
  add("truncated array element",
      Bytes()
          .header(0, 2)
          .kv_u32("x", 1)
          .str("tokenizer.ggml.tokens")
          .u32(kArray)
          .u32(uint32_t(ValueType::STRING))
          .u64(3)
          .str("a")
          .str("b")
          .zeros(7),
      "truncated at byte 104 while reading metadata key #1 ('tokenizer.ggml.tokens') value, "
      "element 2 (need 8 bytes, 7 left)");
  add("alignment 0", Bytes().header(0, 1).kv_u32("general.alignment", 0),
      "t.gguf: general.alignment 0 is not a power of two");
  add("alignment 3", Bytes().header(0, 1).kv_u32("general.alignment", 3),
      "t.gguf: general.alignment 3 is not a power of two");
  add("alignment u64",
      Bytes().header(0, 1).str("general.alignment").u32(uint32_t(ValueType::U64)).u64(32),
      "t.gguf: general.alignment must be u32, found u64");
  add("alignment string", Bytes().header(0, 1).kv_str("general.alignment", "32"),
      "t.gguf: general.alignment must be u32, found string");
  add("unknown tensor type", one_tensor_file({4}, 99),
      "t.gguf: tensor info #0 ('w') type: unknown tensor type id 99");
  add("n_dims 0", one_tensor_file({}), "tensor info #0 ('w') n_dims: n_dims is 0 (must be 1 to 4)");
  add("n_dims 5", one_tensor_file({1, 1, 1, 1, 4}), "n_dims is 5 (must be 1 to 4)");
  add("ne zero", one_tensor_file({4, 0}), "t.gguf: tensor 'w': ne[1] = 0 (must be positive)");
  add("ne negative", one_tensor_file({-4}), "t.gguf: tensor 'w': ne[0] = -4 (must be positive)");
  add("ne product overflows", one_tensor_file({int64_t(1) << 32, int64_t(1) << 32}),
      "tensor 'w': shape [4294967296, 4294967296] has more than 2^63 elements");
  add("nbytes overflows", one_tensor_file({int64_t(1) << 62}),
      "tensor 'w': shape [4611686018427387904] of f32 is too large (bytes overflow 64 bits)");
  add("ne[0] not a block multiple", one_tensor_file({128}, kQ4K),
      "t.gguf: tensor 'w': ne[0] = 128 is not a multiple of the q4_K block size 256");
  add("misaligned offset", one_tensor_file({4}, kF32, 4),
      "t.gguf: tensor 'w': offset 4 is not a multiple of the alignment 32");
  add("data past EOF", one_tensor_file({4}, kF32, 0, 15),
      "t.gguf: tensor 'w': data [offset 0, 16 bytes] ends past end of file (data section starts "
      "at 128, file size 143)");
  add("offset past EOF", one_tensor_file({4}, kF32, uint64_t(1) << 63),
      "tensor 'w': data [offset 9223372036854775808, 16 bytes] ends past end of file");
  add("empty tensor name", Bytes().header(1, 0).tensor("", {4}, kF32, 0).pad().zeros(16),
      "tensor info #0 name: empty tensor name");
  add("tensor name too long",
      Bytes().header(1, 0).tensor(std::string(64, 'n'), {4}, kF32, 0).pad().zeros(16),
      "name is 64 bytes, the limit is 63 (ggml's GGML_MAX_NAME)");
  add("duplicate tensor name",
      Bytes().header(2, 0).tensor("w", {4}, kF32, 0).tensor("w", {4}, kF32, 32).pad().zeros(64),
      "t.gguf: tensor info #1 ('w') name: duplicate tensor name (also tensor info #0)");
  add("overlapping tensors",
      Bytes().header(2, 0).tensor("a", {16}, kF32, 32).tensor("b", {16}, kF32, 0).pad().zeros(128),
      "t.gguf: tensors 'b' [offset 0, 64 bytes] and 'a' [offset 32, 64 bytes] overlap");
  {
    Bytes f;
    f.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {4}, kF32, 32).pad(64).zeros(64);
    add("offset aligned to 32 but not to general.alignment 64", f,
        "tensor 'w': offset 32 is not a multiple of the alignment 64");
  }
  add("truncated tensor info", Bytes().header(1, 0).str("wwwwwwwww").u32(4).i64(4).i64(4),
      "truncated at byte 61 while reading tensor info #0 ('wwwwwwwww') shape (need 8 bytes, 0 "
      "left)");
  return cases;
}

TEST(GgufErrors, BrokenFilesNameTheProblem) {
  for (const Case& c : broken_files()) {
    SCOPED_TRACE(c.what);
    EXPECT_CONTAINS(parse_error(c.bytes), c.expect);
  }
}

TEST(GgufErrors, HandMadeFilesThatAreValid) {
  EXPECT_EQ(parse_error(one_tensor_file().b), "");
  EXPECT_EQ(parse_error(one_kv_file(kArray, nested_arrays(8)).b), "");
  EXPECT_EQ(parse_error(Bytes().header(0, 0).b), "");
  // Tensors may come in any order in the data section, with gaps.
  Bytes f;
  f.header(2, 0).tensor("a", {8}, kF32, 64).tensor("b", {8}, kF32, 0).pad().zeros(96);
  EXPECT_EQ(parse_error(f.b), "");
  auto r = Reader::from_memory(f.b.data(), f.b.size(), "t.gguf");
  EXPECT_EQ(r->tensor("a").data, f.b.data() + r->data_offset() + 64);
}

// A file with a bit of everything, for the exhaustive sweeps below.
std::vector<uint8_t> sample_file() {
  testing::TempDir dir;
  const auto path = dir.file("s.gguf");
  Writer w(path);
  w.set("general.architecture", Value::string("qwen3moe"));
  w.set("n", Value::u64(7));
  w.set("f", Value::f32(1.5f));
  w.set("b", Value::boolean(true));
  w.set("tok", Value::strings({"a", "bc", ""}));
  w.set("nest", Value::array(ValueType::ARRAY, {Value::i32s({1, 2}), Value::f32s({3})}));
  w.add_tensor("x", quant::Type::Q8_0, {32, 2});
  w.add_tensor("y", quant::Type::F16, {3});
  w.begin_data();
  std::vector<uint8_t> data(68, 0x11);
  w.write(data.data(), 68);
  w.write(data.data(), 6);
  w.finish();
  return testing::read_bytes(path);
}

TEST(GgufErrors, EveryTruncationIsAnError) {
  const auto full = sample_file();
  ASSERT_EQ(parse_error(full), "");
  const auto r = Reader::from_memory(full.data(), full.size(), "t.gguf");
  const TensorInfo& last = r->tensors().back();
  const uint64_t data_end = r->data_offset() + last.offset + last.nbytes;
  for (size_t cut = 0; cut < full.size(); ++cut) {
    SCOPED_TRACE(cut);
    // Cut into a fresh buffer so AddressSanitizer sees any read past the end.
    std::vector<uint8_t> prefix(full.begin(), full.begin() + ptrdiff_t(cut));
    const std::string err = parse_error(prefix);
    if (cut >= data_end) {
      EXPECT_EQ(err, "");  // only the final padding is missing
    } else if (cut == 0) {
      EXPECT_CONTAINS(err, "t.gguf: empty file");
    } else if (cut < r->data_offset()) {
      EXPECT_EQ(err.rfind("t.gguf: ", 0), 0u) << err;
    } else {
      EXPECT_CONTAINS(err, "ends past end of file");
    }
  }
}

TEST(GgufErrors, EveryCorruptByteParsesOrFails) {
  const auto full = sample_file();
  const auto r = Reader::from_memory(full.data(), full.size(), "t.gguf");
  for (size_t i = 0; i < r->data_offset(); ++i) {
    for (uint8_t v : {uint8_t(0x00), uint8_t(0x01), uint8_t(0x7f), uint8_t(0x80), uint8_t(0xff)}) {
      std::vector<uint8_t> bad = full;
      bad[i] = v;
      const std::string err = parse_error(bad);
      if (!err.empty()) {
        EXPECT_EQ(err.rfind("t.gguf: ", 0), 0u) << err;
      }
    }
  }
}

}  // namespace
}  // namespace strata::gguf
