// The safetensors reader: valid files and shards read back exactly; every kind of broken file is
// one clear strata::Error naming the file, the tensor and the problem.
#include <gtest/gtest.h>

#include "convert/safetensors.h"
#include "test_convert_util.h"
#include "util/error.h"

namespace strata::convert {
namespace {

using namespace testing;

std::string error_of(const std::vector<uint8_t>& image) {
  try {
    SafetensorsFile::from_memory(image.data(), image.size(), "bad.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::vector<Entry> sample() {
  return {
      {"a.weight", "F32", {2, 3}, bytes_of({1, 2, 3, 4, 5, 6})},
      {"b.bf16", "BF16", {2}, {0x80, 0x3f, 0x00, 0x40}},
      {"c.i64", "I64", {1}, {7, 0, 0, 0, 0, 0, 0, 0}},
      {"d.fp8", "F8_E4M3", {4}, {0x38, 0x40, 0xb8, 0x00}},
      {"e.empty", "F32", {0, 5}, {}},
  };
}

TEST(Safetensors, ReadsWhatWasWritten) {
  const auto image = safetensors_image(sample());
  const auto f = SafetensorsFile::from_memory(image.data(), image.size(), "ok.safetensors");
  ASSERT_EQ(f->tensors().size(), 5u);
  for (const auto& want : sample()) {
    const StTensor* got = nullptr;
    for (const auto& t : f->tensors())
      if (t.name == want.name) got = &t;
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(dtype_name(got->dtype), want.dtype);
    EXPECT_EQ(got->shape, want.shape);
    ASSERT_EQ(got->nbytes, want.data.size());
    if (!want.data.empty()) {
      EXPECT_EQ(0, std::memcmp(got->data, want.data.data(), want.data.size()));
    }
  }
}

TEST(Safetensors, BrokenFilesGiveClearErrors) {
  const auto good = safetensors_image(sample());
  const std::string hdr = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  struct Case {
    std::vector<uint8_t> image;
    const char* expect;
  };
  std::vector<uint8_t> truncated(good.begin(), good.end() - 3);
  const Case cases[] = {
      {{1, 2, 3}, "truncated: 3 bytes"},
      {raw_image(hdr, 8, 1ull << 40), "exceeds the"},
      {raw_image(hdr, 8, hdr.size() + 100), "runs past the end of the file"},
      {truncated, "run past the data section"},
      {raw_image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8), "not valid JSON"},
      {raw_image("[1,2]", 0), "must be a JSON object"},
      {raw_image(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8), "dtype F64 is not supported"},
      {raw_image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8), "tensor x: data_offsets [0, 16] run past"},
      {raw_image(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 16), "needs 12"},
      {raw_image(R"({"x":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8), "span 8 bytes, but F16 [2] needs 4"},
      {raw_image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "reversed"},
      {raw_image(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative integer"},
      {raw_image(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8), "needs more bytes"},
      {raw_image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "overlap"},
      {raw_image(R"({"x":{"dtype":"F32","shape":[2]}})", 8), "data_offsets must be [begin, end]"},
      {raw_image(R"({"x":[[[[[[[[[[1]]]]]]]]]]})", 0), "nests deeper"},
  };
  for (const auto& c : cases) {
    const std::string err = error_of(c.image);
    EXPECT_NE(err.find("bad.safetensors"), std::string::npos) << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << err;
  }
}

TEST(Safetensors, EveryTruncationIsAnError) {
  const auto good = safetensors_image(sample());
  for (size_t n = 0; n < good.size(); ++n) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + long(n));
    EXPECT_NE(error_of(cut), "no error") << n;
  }
}

TEST(Safetensors, ShardedCheckpoint) {
  ScratchDir dir;
  write_file(dir.file("s1.safetensors"), safetensors_image({{"a", "F32", {1}, bytes_of({1})}}));
  write_file(dir.file("s2.safetensors"), safetensors_image({{"b", "F32", {1}, bytes_of({2})}}));
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"metadata":{},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})";
  const Checkpoint c = Checkpoint::open(dir.path().string());
  ASSERT_NE(c.find("a"), nullptr);
  ASSERT_NE(c.find("b"), nullptr);
  EXPECT_EQ(c.tensors().size(), 2u);
  EXPECT_EQ(c.total_bytes(), 8u);

  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})";
  try {
    Checkpoint::open(dir.path().string());
    FAIL() << "a tensor listed in the wrong shard was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor b is listed in s1.safetensors but"), std::string::npos) << e.what();
  }
  std::ofstream(dir.file("model.safetensors.index.json")) << R"({"weight_map":{"a":"../s1.safetensors"}})";
  EXPECT_THROW(Checkpoint::open(dir.path().string()), Error);
  write_file(dir.file("s2.safetensors"), safetensors_image({{"a", "F32", {1}, bytes_of({2})}}));
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"weight_map":{"a":"s1.safetensors","x":"s2.safetensors"}})";
  try {
    Checkpoint::open(dir.path().string());
    FAIL() << "a tensor in two shards was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is in both"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, MissingCheckpointIsClear) {
  ScratchDir dir;
  try {
    Checkpoint::open(dir.path().string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no model.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::convert
