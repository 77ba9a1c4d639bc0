// GGUF Writer -> Reader round trips, the exact bytes of a tiny file, and the Writer's rules.
#include <signal.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "gguf_test_util.h"
#include "test_util.h"

using strata::testing::error_of;

namespace strata::gguf {
namespace {

using testing::Bytes;
using testing::read_bytes;
using testing::TempDir;

std::vector<std::pair<std::string, Value>> every_value_type() {
  using L = std::numeric_limits<int64_t>;
  return {
      {"u8", Value::u8(255)},
      {"i8", Value::i8(-128)},
      {"u16", Value::u16(65535)},
      {"i16", Value::i16(-32768)},
      {"u32", Value::u32(4294967295u)},
      {"i32", Value::i32(-2147483647 - 1)},
      {"u64", Value::u64(std::numeric_limits<uint64_t>::max())},
      {"i64", Value::i64(L::min())},
      {"f32", Value::f32(-1.5e-7f)},
      {"f64", Value::f64(3.141592653589793)},
      {"bool.t", Value::boolean(true)},
      {"bool.f", Value::boolean(false)},
      {"str", Value::string("h\xc3\xa9llo")},
      {"str.empty", Value::string("")},
      {"str.nul", Value::string(std::string("a\0b", 3))},
      {"arr.empty", Value::array(ValueType::U8, {})},
      {"arr.i32", Value::i32s({1, -2, 3})},
      {"arr.f32", Value::f32s({0.5f, -0.0f, std::numeric_limits<float>::infinity()})},
      {"arr.str", Value::strings({"a", "", "ccc"})},
      {"arr.bool", Value::array(ValueType::BOOL, {Value::boolean(true), Value::boolean(false)})},
      {"arr.u64", Value::array(ValueType::U64, {Value::u64(1), Value::u64(1ull << 63)})},
      {"arr.nested", Value::array(ValueType::ARRAY, {Value::i32s({1, 2}), Value::strings({"x"}),
                                                     Value::array(ValueType::F64, {})})},
      {"arr.nested3",
       Value::array(ValueType::ARRAY,
                    {Value::array(ValueType::ARRAY, {Value::i32s({7}), Value::i32s({})})})},
  };
}

TEST(GgufRoundTrip, EveryMetadataType) {
  TempDir dir;
  const auto path = dir.file("meta.gguf");
  const auto values = every_value_type();
  {
    Writer w(path);
    for (const auto& [k, v] : values) w.set(k, v);
    w.finish();
  }
  auto r = Reader::open(path);
  ASSERT_EQ(r->metadata().size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& [key, want] = values[i];
    const auto& [got_key, got] = r->metadata()[i];
    EXPECT_EQ(got_key, key);
    EXPECT_EQ(got.type(), want.type()) << key;
    EXPECT_EQ(got.to_string(100), want.to_string(100)) << key;
    if (want.type() == ValueType::ARRAY) {
      EXPECT_EQ(got.elem_type(), want.elem_type()) << key;
      EXPECT_EQ(got.as_array().size(), want.as_array().size()) << key;
    }
  }
  EXPECT_EQ(r->get_u64("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(r->get("i64").as_i64(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(r->get("str.nul").as_string(), std::string("a\0b", 3));
  EXPECT_FLOAT_EQ(float(r->get_f64("f32")), -1.5e-7f);
  EXPECT_TRUE(std::signbit(r->get("arr.f32").as_array()[1].as_f64()));
  EXPECT_EQ(r->get("arr.nested3").as_array()[0].as_array()[0].as_array()[0].as_i64(), 7);
  EXPECT_EQ(r->tensors().size(), 0u);
}

// Fills a tensor with bytes that depend on its index and position, so misplaced data shows.
uint8_t pattern(size_t tensor, uint64_t i) { return uint8_t((i * 131 + tensor * 17 + i / 251)); }

void round_trip_tensors(size_t alignment) {
  struct Spec {
    const char* name;
    quant::Type type;
    std::vector<int64_t> shape;
  };
  const std::vector<Spec> specs = {
      {"f32.vec", quant::Type::F32, {3}},
      {"f16.mat", quant::Type::F16, {5, 2}},
      {"q8_0", quant::Type::Q8_0, {64, 3}},
      {"q4_K.3d", quant::Type::Q4_K, {256, 2, 2}},
      {"iq2_xs.4d", quant::Type::IQ2_XS, {512, 1, 1, 3}},
      {"bf16", quant::Type::BF16, {7}},
      {"fp8", quant::Type::FP8_E4M3, {128, 2}},
      {"i32", quant::Type::I32, {1}},
  };
  TempDir dir;
  const auto path = dir.file("t.gguf");
  uint64_t declared_bytes = 0;
  {
    Writer w(path, alignment);
    w.set("general.architecture", Value::string("test"));
    for (const auto& s : specs) w.add_tensor(s.name, s.type, s.shape);
    w.begin_data();
    declared_bytes = w.total_data_bytes();
    for (size_t t = 0; t < specs.size(); ++t) {
      const uint64_t n = w.tensors()[t].nbytes;
      std::vector<uint8_t> data(n);
      for (uint64_t i = 0; i < n; ++i) data[i] = pattern(t, i);
      // Uneven chunks, including empty ones, must all land in place.
      size_t done = 0, chunk = 0;
      while (done < n) {
        const size_t len = std::min<size_t>(chunk % 7 * 3, n - done);
        w.write(data.data() + done, len);
        done += len;
        ++chunk;
      }
    }
    w.finish();
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  }
  auto r = Reader::open(path);
  EXPECT_EQ(r->alignment(), alignment);
  EXPECT_EQ(r->architecture(), "test");
  EXPECT_EQ(r->data_offset() % alignment, 0u);
  EXPECT_EQ(r->file_size(), r->data_offset() + declared_bytes);
  ASSERT_EQ(r->tensors().size(), specs.size());
  for (size_t t = 0; t < specs.size(); ++t) {
    const TensorInfo& ti = r->tensor(specs[t].name);
    EXPECT_EQ(&ti, &r->tensors()[t]);
    EXPECT_EQ(ti.type, specs[t].type);
    EXPECT_EQ(ti.shape, specs[t].shape);
    EXPECT_EQ(ti.offset % alignment, 0u);
    EXPECT_EQ(ti.nbytes, ti.row_stride() * uint64_t(ti.n_rows()));
    for (uint64_t i = 0; i < ti.nbytes; ++i)
      ASSERT_EQ(ti.data[i], pattern(t, i)) << specs[t].name << " byte " << i;
  }
  EXPECT_EQ(r->tensor("q4_K.3d").shape_string(), "[256, 2, 2]");
  EXPECT_EQ(r->tensor("q4_K.3d").n_elements(), 1024);
  EXPECT_EQ(r->tensor("q4_K.3d").n_rows(), 4);
  EXPECT_EQ(r->tensor("q4_K.3d").row_stride(), 144u);
}

TEST(GgufRoundTrip, TensorsDefaultAlignment) { round_trip_tensors(32); }
TEST(GgufRoundTrip, TensorsAlignment1) { round_trip_tensors(1); }
TEST(GgufRoundTrip, TensorsAlignment4096) { round_trip_tensors(4096); }

TEST(GgufRoundTrip, RewriteIsByteIdentical) {
  TempDir dir;
  const auto a = dir.file("a.gguf"), b = dir.file("b.gguf");
  {
    Writer w(a, 64);
    for (const auto& [k, v] : every_value_type()) w.set(k, v);
    w.add_tensor("x", quant::Type::Q8_0, {32, 2});
    w.add_tensor("y", quant::Type::F32, {5});
    w.begin_data();
    std::vector<uint8_t> bytes(68 + 20, 0x5a);
    w.write(bytes.data(), 68);
    w.write(bytes.data(), 20);
    w.finish();
  }
  auto r = Reader::open(a);
  {
    Writer w(b);  // alignment comes from the copied general.alignment
    for (const auto& [k, v] : r->metadata()) w.set(k, v);
    for (const auto& t : r->tensors()) w.add_tensor(t.name, t.type, t.shape);
    w.begin_data();
    for (const auto& t : r->tensors()) w.write(t.data, t.nbytes);
    w.finish();
  }
  EXPECT_EQ(read_bytes(a), read_bytes(b));
}

TEST(GgufRoundTrip, LargeChunksBypassTheBuffer) {
  TempDir dir;
  const auto path = dir.file("big.gguf");
  const int64_t n = 5'000'000;  // 20 MB, larger than the writer's buffer
  std::vector<float> data(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) data[size_t(i)] = float(i);
  {
    Writer w(path);
    w.add_tensor("small", quant::Type::F32, {3});
    w.add_tensor("big", quant::Type::F32, {n});
    w.begin_data();
    w.write(data.data(), 12);
    w.write(data.data(), 4);
    w.write(data.data() + 1, size_t(n - 2) * 4);
    w.write(data.data() + n - 1, 4);
    w.finish();
  }
  auto r = Reader::open(path);
  const float* big = reinterpret_cast<const float*>(r->tensor("big").data);
  EXPECT_EQ(big[0], 0.0f);
  EXPECT_EQ(big[1], 1.0f);
  EXPECT_EQ(big[n - 1], float(n - 1));
  EXPECT_EQ(std::memcmp(big, data.data(), size_t(n) * 4), 0);
}

// One u32 key and one 2-element f32 tensor, laid out by hand from the GGUF v3 specification.
TEST(GgufRoundTrip, TinyFileIsByteExact) {
  TempDir dir;
  const auto path = dir.file("tiny.gguf");
  {
    Writer w(path);
    w.set("a", Value::u32(7));
    w.add_tensor("t", quant::Type::F32, {2});
    w.begin_data();
    const float data[2] = {1.0f, 2.0f};
    w.write(data, sizeof data);
    w.finish();
  }
  // clang-format off
  const std::vector<uint8_t> want = {
      'G', 'G', 'U', 'F',                // magic
      3, 0, 0, 0,                        // version
      1, 0, 0, 0, 0, 0, 0, 0,            // tensor count
      1, 0, 0, 0, 0, 0, 0, 0,            // metadata key count
      1, 0, 0, 0, 0, 0, 0, 0, 'a',       // key: u64 length, bytes
      4, 0, 0, 0,                        // value type u32
      7, 0, 0, 0,                        // value
      1, 0, 0, 0, 0, 0, 0, 0, 't',       // tensor name
      1, 0, 0, 0,                        // n_dims
      2, 0, 0, 0, 0, 0, 0, 0,            // ne[0]
      0, 0, 0, 0,                        // type f32
      0, 0, 0, 0, 0, 0, 0, 0,            // offset in the data section
      // 74 bytes so far: zeros up to the data section at 96
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
      0, 0, 0x80, 0x3f, 0, 0, 0, 0x40,   // 1.0f, 2.0f
      // the last tensor is padded too, so the file ends aligned (128)
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
  };
  // clang-format on
  EXPECT_EQ(read_bytes(path), want);
  auto r = Reader::open(path);
  EXPECT_EQ(r->data_offset(), 96u);
  EXPECT_EQ(r->tensor("t").data, r->base() + 96);
}

TEST(GgufWriter, SetReplacesAndKeepsOrder) {
  TempDir dir;
  const auto path = dir.file("s.gguf");
  {
    Writer w(path);
    w.set("first", Value::u32(1));
    w.set("second", Value::string("x"));
    w.set("first", Value::f32(2.5f));
    w.finish();
  }
  auto r = Reader::open(path);
  ASSERT_EQ(r->metadata().size(), 2u);
  EXPECT_EQ(r->metadata()[0].first, "first");
  EXPECT_EQ(r->metadata()[0].second.type(), ValueType::F32);
  EXPECT_EQ(r->get_f64("first"), 2.5);
  EXPECT_EQ(r->metadata()[1].first, "second");
}


TEST(GgufWriter, RejectsBadDeclarations) {
  TempDir dir;
  const auto path = dir.file("w.gguf");
  Writer w(path);
  w.add_tensor("a", quant::Type::F32, {4});
  EXPECT_CONTAINS(error_of([&] { w.add_tensor("a", quant::Type::F32, {4}); }),
                  "w.gguf: tensor 'a' declared twice");
  EXPECT_CONTAINS(error_of([&] { w.add_tensor("b", quant::Type::Q4_K, {128}); }),
                  "tensor 'b': ne[0] = 128 is not a multiple of the q4_K block size 256");
  EXPECT_CONTAINS(error_of([&] { w.add_tensor("b", quant::Type::F32, {}); }),
                  "has 0 dimensions (must be 1 to 4)");
  EXPECT_CONTAINS(error_of([&] {
                    w.add_tensor("b", quant::Type::F32, {1, 1, 1, 1, 1});
                  }),
                  "has 5 dimensions");
  EXPECT_CONTAINS(error_of([&] {
                    w.add_tensor("b", quant::Type::F32, {4, 0});
                  }),
                  "ne[1] = 0 (must be positive)");
  EXPECT_CONTAINS(error_of([&] { w.add_tensor(std::string(64, 'n'), quant::Type::F32, {4}); }),
                  "name is 64 bytes, the limit is 63");
  EXPECT_CONTAINS(error_of([&] { w.add_tensor("", quant::Type::F32, {4}); }),
                  "tensor name is empty");
  EXPECT_CONTAINS(error_of([&] { w.set("general.alignment", Value::u32(48)); }),
                  "general.alignment 48 is not a power of two");
  EXPECT_CONTAINS(error_of([&] { w.set("general.alignment", Value::u64(64)); }),
                  "general.alignment must be u32, not u64");
  EXPECT_CONTAINS(error_of([] { Writer bad("x.gguf", 24); }),
                  "x.gguf: alignment 24 is not a power of two");
  EXPECT_CONTAINS(error_of([&] { w.write("x", 1); }), "write() before begin_data()");
  // A failed declaration leaves the name free.
  w.add_tensor("b", quant::Type::F32, {2});
  w.begin_data();
  EXPECT_CONTAINS(error_of([&] { w.set("k", Value::u8(1)); }), "metadata k set after begin_data()");
  EXPECT_CONTAINS(error_of([&] { w.add_tensor("c", quant::Type::F32, {4}); }),
                  "tensor 'c' added after begin_data()");
  const uint8_t data[32] = {};
  EXPECT_CONTAINS(error_of([&] { w.write(data, 17); }),
                  "tensor 'a': chunk of 17 bytes but only 16 bytes of the tensor remain");
  w.write(data, 10);
  EXPECT_CONTAINS(error_of([&] { w.finish(); }),
                  "finish() with tensor 'a' at 10 of 16 bytes (2 of 2 tensors incomplete)");
  w.write(data, 6);
  w.write(data, 8);
  EXPECT_CONTAINS(error_of([&] { w.write(data, 1); }),
                  "write() of 1 bytes after the last tensor was complete");
  w.finish();
  EXPECT_EQ(Reader::open(path)->tensors().size(), 2u);
}

TEST(GgufWriter, DataSectionOverflowIsAnError) {
  TempDir dir;
  Writer w(dir.file("o.gguf"));
  w.add_tensor("a", quant::Type::F32, {int64_t(1) << 61});
  w.add_tensor("b", quant::Type::F32, {int64_t(1) << 61});
  EXPECT_CONTAINS(error_of([&] { w.begin_data(); }),
                  "o.gguf: tensor 'b': the data section would exceed 2^64 bytes");
  EXPECT_FALSE(std::filesystem::exists(dir.file("o.gguf.tmp")));
}

TEST(GgufWriter, UnfinishedFileIsRemoved) {
  TempDir dir;
  const auto path = dir.file("u.gguf");
  {
    Writer w(path);
    w.add_tensor("a", quant::Type::F32, {4});
    w.begin_data();
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
    EXPECT_FALSE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(GgufWriter, UncreatableFileNamesPathAndErrno) {
  TempDir dir;
  Writer w(dir.file("missing/dir/x.gguf"));
  EXPECT_CONTAINS(error_of([&] { w.begin_data(); }),
                  "missing/dir/x.gguf.tmp: cannot create: No such file or directory");
}

// A file-size limit stands in for a full disk: the write fails with EFBIG instead of ENOSPC.
void write_past_size_limit(const std::string& path) {
  signal(SIGXFSZ, SIG_IGN);
  const rlimit limit{1 << 20, 1 << 20};
  setrlimit(RLIMIT_FSIZE, &limit);
  std::vector<uint8_t> data(size_t(4) << 20);
  try {
    Writer w(path);
    w.add_tensor("big", quant::Type::I32, {int64_t(data.size() / 4)});
    w.begin_data();
    for (size_t at = 0; at < data.size(); at += 100'000)
      w.write(data.data() + at, std::min<size_t>(100'000, data.size() - at));
    w.finish();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(std::filesystem::exists(path + ".tmp") || std::filesystem::exists(path) ? 2 : 0);
  }
  std::exit(1);
}

TEST(GgufWriterDeathTest, WriteFailureNamesFileAndReason) {
  TempDir dir;
  const auto path = dir.file("full.gguf");
  EXPECT_EXIT(write_past_size_limit(path), ::testing::ExitedWithCode(0),
              "full.gguf.tmp: write failed: File too large");
}

TEST(GgufReader, OpenMissingFileOrDirectory) {
  TempDir dir;
  EXPECT_CONTAINS(error_of([&] { Reader::open(dir.file("nope.gguf")); }),
                  "nope.gguf: cannot open: No such file or directory");
  EXPECT_CONTAINS(error_of([&] { Reader::open(dir.path().string()); }),
                  ": is a directory, not a GGUF file");
  testing::write_bytes(dir.file("empty.gguf"), {});
  EXPECT_CONTAINS(error_of([&] { Reader::open(dir.file("empty.gguf")); }),
                  "empty.gguf: empty file, not GGUF");
}

TEST(GgufReader, AccessorsNameFileAndKey) {
  TempDir dir;
  const auto path = dir.file("acc.gguf");
  {
    Writer w(path);
    w.set("n", Value::i32(-3));
    w.set("s", Value::string("v"));
    w.set("f", Value::f32(0.25f));
    w.finish();
  }
  auto r = Reader::open(path);
  EXPECT_CONTAINS(error_of([&] { r->get("missing"); }), "acc.gguf: missing metadata key missing");
  EXPECT_CONTAINS(error_of([&] { r->get_u64("n"); }),
                  "acc.gguf: metadata n: expected a non-negative integer, found i32 -3");
  EXPECT_CONTAINS(error_of([&] { r->get_string("n"); }),
                  "acc.gguf: metadata n: expected string, found i32");
  EXPECT_CONTAINS(error_of([&] { r->get_u64("s", 5); }),
                  "metadata s: expected an unsigned integer, found string");
  EXPECT_CONTAINS(error_of([&] { r->architecture(); }),
                  "acc.gguf: missing metadata key general.architecture");
  EXPECT_CONTAINS(error_of([&] { r->tensor("w"); }), "acc.gguf: no tensor named 'w'");
  EXPECT_EQ(r->get_u64("absent", 9), 9u);
  EXPECT_EQ(r->get_f64("absent", 1.5), 1.5);
  EXPECT_EQ(r->get_string("absent", "fb"), "fb");
  EXPECT_EQ(r->get_string("s", "fb"), "v");
  EXPECT_EQ(r->get_f64("n"), -3.0);
  EXPECT_EQ(r->get_f64("f"), 0.25);
  EXPECT_EQ(r->find_tensor("w"), nullptr);
  EXPECT_EQ(r->find("absent"), nullptr);
}

TEST(GgufValue, ToStringAndChecks) {
  EXPECT_EQ(Value::f32(0.1f).to_string(), "0.1");
  EXPECT_EQ(Value::i8(-5).to_string(), "-5");
  EXPECT_EQ(Value::string("a\"b\n\x01").to_string(), "\"a\\\"b\\n\\x01\"");
  EXPECT_EQ(Value::i32s({1, 2}).to_string(), "[1, 2]");
  EXPECT_EQ(Value::strings(std::vector<std::string>(10, "t")).to_string(), "[10 strings]");
  EXPECT_EQ(Value::array(ValueType::ARRAY, {Value::i32s({1}), Value::strings({})}).to_string(),
            "[[1], []]");
  EXPECT_THROW(Value::array(ValueType::I32, {Value::u8(1)}), Error);
  EXPECT_THROW(Value::u64(1ull << 63).as_i64(), Error);
  EXPECT_THROW(Value::string("x").as_f64(), Error);
  EXPECT_THROW(Value::u8(1).as_bool(), Error);
  EXPECT_THROW(Value::u8(1).as_array(), Error);
  EXPECT_TRUE(Value::u8(1).is_integer());
  EXPECT_TRUE(Value::f64(1).is_number());
  EXPECT_FALSE(Value::f64(1).is_integer());
  EXPECT_FALSE(Value::string("1").is_number());
}

}  // namespace
}  // namespace strata::gguf
