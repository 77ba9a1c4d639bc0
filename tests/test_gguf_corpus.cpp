// The fuzzer's seed files (fuzz/corpus/gguf) are made here, so they stay valid as the format code
// changes: the test fails when a committed seed differs from what the Writer makes now, and
// STRATA_REGEN_FUZZ_CORPUS=1 rewrites them.
#include <cstdlib>

#include "gguf_test_util.h"

namespace strata::gguf {
namespace {

using quant::Type;

void seed_minimal(Writer&) {}

void seed_metadata(Writer& w) {
  w.set("general.architecture", Value::string("qwen3moe"));
  w.set("u8", Value::u8(200));
  w.set("i8", Value::i8(-100));
  w.set("u16", Value::u16(60000));
  w.set("i16", Value::i16(-30000));
  w.set("u32", Value::u32(4000000000u));
  w.set("i32", Value::i32(-2000000000));
  w.set("u64", Value::u64(1ull << 40));
  w.set("i64", Value::i64(-(1ll << 40)));
  w.set("f32", Value::f32(0.125f));
  w.set("f64", Value::f64(-2.5));
  w.set("bool", Value::boolean(true));
  w.set("tokenizer.ggml.tokens", Value::strings({"<s>", "a", "bc", "\xc4\xa0the"}));
  w.set("tokenizer.ggml.token_type", Value::i32s({3, 1, 1, 1}));
  w.set("nested", Value::array(ValueType::ARRAY,
                               {Value::f32s({1, 2}), Value::strings({"x"}),
                                Value::array(ValueType::ARRAY, {Value::i32s({})})}));
}

void seed_tensors(Writer& w) {
  w.set("general.architecture", Value::string("qwen3moe"));
  w.set("qwen3moe.block_count", Value::u32(1));
  w.add_tensor("token_embd.weight", Type::F16, {4, 3});
  w.add_tensor("blk.0.ffn_up_exps.weight", Type::Q4_K, {256, 1, 2});
  w.add_tensor("blk.0.attn_q.weight", Type::Q8_0, {32, 2});
  w.add_tensor("output_norm.weight", Type::F32, {8});
}

void seed_aligned64(Writer& w) {
  w.set("general.alignment", Value::u32(64));
  w.set("general.name", Value::string("seed"));
  w.add_tensor("a", Type::BF16, {5});
  w.add_tensor("b", Type::IQ2_XS, {256});
}

struct Seed {
  const char* file;
  void (*fill)(Writer&);
};
constexpr Seed kSeeds[] = {
    {"minimal.gguf", seed_minimal},
    {"metadata.gguf", seed_metadata},
    {"tensors.gguf", seed_tensors},
    {"aligned64.gguf", seed_aligned64},
};

std::vector<uint8_t> make_seed(const Seed& seed, const std::string& path) {
  {
    Writer w(path);
    seed.fill(w);
    w.begin_data();
    for (size_t t = 0; t < w.tensors().size(); ++t) {
      std::vector<uint8_t> data(w.tensors()[t].nbytes);
      for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7 + t);
      w.write(data.data(), data.size());
    }
    w.finish();
  }
  return testing::read_bytes(path);
}

TEST(GgufCorpus, SeedsAreCurrent) {
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/fuzz/corpus/gguf/";
  const char* regen = std::getenv("STRATA_REGEN_FUZZ_CORPUS");
  testing::TempDir tmp;
  for (const Seed& seed : kSeeds) {
    SCOPED_TRACE(seed.file);
    const auto bytes = make_seed(seed, tmp.file(seed.file));
    EXPECT_LT(bytes.size(), 4096u);
    EXPECT_EQ(testing::parse_error(bytes), "");
    if (regen && std::string(regen) == "1") testing::write_bytes(dir + seed.file, bytes);
    EXPECT_EQ(testing::read_bytes(dir + seed.file), bytes)
        << "run with STRATA_REGEN_FUZZ_CORPUS=1 to rewrite the seed";
  }
}

}  // namespace
}  // namespace strata::gguf
