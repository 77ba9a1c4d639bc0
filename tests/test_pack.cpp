// The .experts pack: writing from a GGUF, reading back, validation of every field, verify,
// atomic writes, matching a pack to its model, and the strata pack command.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "experts/pack.h"
#include "pack_test_util.h"
#include "synth/synth.h"

namespace strata::experts {
namespace {

using namespace testing;
using namespace format;

class PackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_path_ = dir_.file("m.gguf");
    write_expert_gguf(model_path_, spec_);
    model_ = gguf::Reader::open(model_path_);
    pack_path_ = dir_.file("m.gguf.experts");
    write_pack(*model_, pack_path_);
  }

  const uint8_t* slice(int layer, int part, int expert) const {
    const auto& t = model_->tensor(expert_stack_name(layer, part));
    return t.data + uint64_t(expert) * (t.nbytes / uint64_t(t.shape[2]));
  }

  std::string verify_error(const gguf::Reader* model) const {
    return error_of([&] { verify_pack(*Pack::open(pack_path_), model); });
  }

  TempDir dir_;
  TinyExperts spec_ = tiny_experts(3, 5, quant::Type::Q4_K);
  std::string model_path_, pack_path_;
  std::unique_ptr<gguf::Reader> model_;
};

TEST_F(PackTest, RecordsHoldTheGgufSlices) {
  const auto pack = Pack::open(pack_path_);
  ASSERT_EQ(pack->n_layers(), 3);
  ASSERT_EQ(pack->n_experts(), 5);
  EXPECT_EQ(pack->source_id(), model_source_id(*model_));
  const Layout& l = pack->layout(1);
  EXPECT_EQ(l.gate.type, quant::Type::Q4_K);
  EXPECT_EQ(l.down.type, quant::Type::Q8_0);
  EXPECT_EQ(l.gate.rows, 64);
  EXPECT_EQ(l.gate.cols, 256);
  EXPECT_EQ(l.down.rows, 256);
  EXPECT_EQ(l.down.cols, 64);
  EXPECT_EQ(l.gate.row_stride, quant::row_bytes(quant::Type::Q4_K, 256));
  EXPECT_EQ(l.record_bytes % kPackAlignment, 0u);
  std::vector<uint8_t> file = read_bytes(pack_path_);
  EXPECT_EQ(file.size(), pack->file_size());
  for (int layer = 0; layer < 3; ++layer)
    for (int e = 0; e < 5; ++e) {
      const Record& r = pack->record(layer, e);
      EXPECT_EQ(r.offset % kPackAlignment, 0u);
      EXPECT_EQ(r.length, l.record_bytes);
      const uint8_t* rec = file.data() + r.offset;
      EXPECT_TRUE(pack->checksum_ok(layer, e, rec));
      for (int p = 0; p < 3; ++p) {
        const Part& part = pack->layout(layer).part(p);
        EXPECT_EQ(part.offset % kPartAlignment, 0u);
        EXPECT_EQ(std::memcmp(rec + part.offset, slice(layer, p, e), part.bytes()), 0)
            << "layer " << layer << " expert " << e << " " << part_name(p);
      }
      const auto w = l.weights(rec);
      EXPECT_EQ(w.up.data, rec + l.up.offset);
      EXPECT_EQ(w.down.rows, 256);
    }
  std::vector<uint8_t> copy(file.begin() + long(pack->record(2, 4).offset),
                            file.begin() + long(pack->record(2, 4).offset + l.record_bytes));
  copy[100] ^= 1;
  EXPECT_FALSE(pack->checksum_ok(2, 4, copy.data()));
}

TEST_F(PackTest, MakeLayoutAlignsParts) {
  const auto part = [](quant::Type t, int64_t rows, int64_t cols) {
    Part p;
    p.type = t;
    p.rows = rows;
    p.cols = cols;
    return p;
  };
  const Layout l =
      make_layout(part(quant::Type::IQ2_XS, 640, 2560), part(quant::Type::IQ2_XS, 640, 2560),
                  part(quant::Type::Q4_0, 2560, 640));
  EXPECT_EQ(l.gate.offset, 0u);
  EXPECT_EQ(l.up.offset % kPartAlignment, 0u);
  EXPECT_GE(l.up.offset, l.gate.bytes());
  EXPECT_GE(l.down.offset, l.up.offset + l.up.bytes());
  EXPECT_EQ(l.record_bytes % kPackAlignment, 0u);
  EXPECT_LT(l.record_bytes - (l.down.offset + l.down.bytes()), kPackAlignment);
  EXPECT_THROW(make_layout(part(quant::Type::Q4_K, 64, 100), part(quant::Type::Q4_K, 64, 100),
                           part(quant::Type::Q4_K, 100, 64)),
               Error);
}

TEST_F(PackTest, VerifyPassesAndFindsTheFirstBadRecord) {
  const auto report = verify_pack(*Pack::open(pack_path_), model_.get());
  EXPECT_EQ(report.records, 15u);
  EXPECT_EQ(verify_error(model_.get()), "(no error)");

  const auto pack = Pack::open(pack_path_);
  const Record r = pack->record(1, 3);
  std::vector<uint8_t> file = read_bytes(pack_path_);
  file[r.offset + 17] ^= 0x40;
  write_bytes(pack_path_, file);
  const std::string e = verify_error(nullptr);
  EXPECT_CONTAINS(e, "record (layer 1, expert 3)");
  EXPECT_CONTAINS(e, "offset " + std::to_string(r.offset));
  EXPECT_CONTAINS(e, "checksum mismatch");
}

TEST_F(PackTest, VerifyComparesWithTheGguf) {
  // Same shapes, other bytes: the pack's own checksums hold, the GGUF comparison does not.
  TinyExperts other = spec_;
  other.seed = 99;
  write_expert_gguf(dir_.file("other.gguf"), other);
  const auto other_model = gguf::Reader::open(dir_.file("other.gguf"));
  const std::string e = verify_error(other_model.get());
  EXPECT_CONTAINS(e, "record (layer 0, expert 0)");
  EXPECT_CONTAINS(e, "gate differs from");
}

TEST_F(PackTest, InterruptedWriteLeavesNothing) {
  const std::string out = dir_.file("partial.experts");
  {
    const ExpertShape shape = expert_shape(*model_);
    PackWriter w(out, shape.layers, shape.n_experts);
    AlignedBuffer rec(shape.layers[0].record_bytes);
    w.append(rec.data());
    EXPECT_TRUE(std::filesystem::exists(out + ".tmp"));
    EXPECT_THROW(w.finish(), Error);  // 14 records missing
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
}

TEST_F(PackTest, WriterRefusesStrayPadding) {
  const ExpertShape shape = expert_shape(*model_);
  PackWriter w(dir_.file("p.experts"), shape.layers, shape.n_experts);
  AlignedBuffer rec(shape.layers[0].record_bytes);
  rec.data()[shape.layers[0].record_bytes - 1] = 7;
  EXPECT_CONTAINS(error_of([&] { w.append(rec.data()); }), "non-zero padding byte");
}

TEST_F(PackTest, ModelCheck) {
  const auto pack = Pack::open(pack_path_);
  model::ModelConfig c = tiny_config(spec_);
  EXPECT_NO_THROW(pack->check_model(*model_, c));
  EXPECT_NO_THROW(open_model_pack(*model_, c));

  c.n_expert = 8;
  EXPECT_CONTAINS(error_of([&] { pack->check_model(*model_, c); }), "strata pack " + model_path_);

  // Same shapes, other weights: a stale pack.
  TinyExperts other = spec_;
  other.seed = 5;
  write_expert_gguf(dir_.file("other.gguf"), other);
  const auto other_model = gguf::Reader::open(dir_.file("other.gguf"));
  EXPECT_CONTAINS(error_of([&] { pack->check_model(*other_model, tiny_config(spec_)); }),
                  "made from other expert weights");

  // No pack next to the model: the error says how to make one.
  EXPECT_CONTAINS(error_of([&] { open_model_pack(*other_model, tiny_config(spec_)); }),
                  "not found; make it with `strata pack " + dir_.file("other.gguf"));
}

TEST_F(PackTest, TrunkOnlyModelNamesItsPack) {
  const auto pack = Pack::open(pack_path_);
  const std::string trunk = dir_.file("trunk.gguf");
  const auto write_trunk = [&](uint64_t id) {
    gguf::Writer w(trunk);
    w.set("general.architecture", gguf::Value::string("qwen3moe"));
    w.set(kPackKey, gguf::Value::string("m.gguf.experts"));
    w.set(kSourceIdKey, gguf::Value::u64(id));
    w.finish();
  };
  write_trunk(pack->source_id());
  auto model = gguf::Reader::open(trunk);
  EXPECT_FALSE(has_expert_stacks(*model));
  EXPECT_EQ(pack_path_for(*model), pack_path_);
  EXPECT_NO_THROW(open_model_pack(*model, tiny_config(spec_)));

  write_trunk(pack->source_id() + 1);
  model = gguf::Reader::open(trunk);
  {
    const std::string e = error_of([&] { open_model_pack(*model, tiny_config(spec_)); });
    EXPECT_CONTAINS(e, kSourceIdKey);
    EXPECT_CONTAINS(e, "write model and pack again");
  }
}

// Every field of a damaged pack gives an error naming the file and the field.
class PackValidation : public PackTest {
 protected:
  void SetUp() override {
    PackTest::SetUp();
    bytes_ = read_bytes(pack_path_);
    ASSERT_EQ(pack_error(bytes_), "(no error)");
  }

  // Edits a copy, reseals its checksums, returns the open error.
  template <typename Edit>
  std::string error_after(Edit edit, bool seal = true) {
    std::vector<uint8_t> b = bytes_;
    edit(b);
    if (seal) reseal(b);
    return pack_error(b);
  }

  template <typename T>
  static auto set(uint64_t at, T v) {
    return [=](std::vector<uint8_t>& b) { store<T>(b.data() + at, v); };
  }

  std::vector<uint8_t> bytes_;
};

TEST_F(PackValidation, Header) {
  EXPECT_CONTAINS(pack_error({bytes_.begin(), bytes_.begin() + 100}),
                  "too small for a pack header");
  EXPECT_CONTAINS(error_after(set<uint8_t>(0, 'X')), "t.experts: not a strata expert pack");
  EXPECT_CONTAINS(error_after(set<uint32_t>(kAtVersion, 2)), "pack version 2");
  EXPECT_CONTAINS(error_after(set<uint8_t>(kAtSourceId, 1), false), "header checksum mismatch");
  EXPECT_CONTAINS(error_after(set<uint32_t>(kAtHeaderBytes, 64)), "header size 64");
  EXPECT_CONTAINS(error_after(set<uint8_t>(kAtReserved + 3, 1)), "reserved header byte 67");
  EXPECT_CONTAINS(error_after(set<uint32_t>(kAtLayers, 0)), "layer count 0 out of range");
  EXPECT_CONTAINS(error_after(set<uint32_t>(kAtExperts, 70000)), "expert count 70000 out of range");
  EXPECT_CONTAINS(error_after([](std::vector<uint8_t>& b) {
                    store<uint32_t>(b.data() + kAtLayers, 4096);
                    store<uint32_t>(b.data() + kAtExperts, 4096);
                  }),
                  "4096 layers x 4096 experts is more than 4194304 records");
  // Counts that the file cannot hold are refused before any table is allocated.
  EXPECT_CONTAINS(error_after(set<uint32_t>(kAtExperts, 60000)),
                  "cannot hold 3 layers x 60000 experts");
  EXPECT_CONTAINS(error_after(set<uint64_t>(kAtIndexOffset, 1)), "index offset 1, expected");
  EXPECT_CONTAINS(error_after(set<uint64_t>(kAtDataOffset, 8192)),
                  "data offset 8192, expected 4096");
  EXPECT_CONTAINS(pack_error({bytes_.begin(), bytes_.end() - 4096}), "truncated");
}

TEST_F(PackValidation, Tables) {
  EXPECT_CONTAINS(error_after(set<uint8_t>(index_entry(bytes_, 2) + 16, 1), false),
                  "layer table / index checksum mismatch");
  EXPECT_CONTAINS(error_after(set<uint64_t>(layer_entry(1), 5000)), "layer 1: record size 5000");
  EXPECT_CONTAINS(error_after(set<uint32_t>(part_entry(0, 1), 77)),
                  "layer 0 up: unknown quant type id 77");
  EXPECT_CONTAINS(error_after(set<uint32_t>(part_entry(0, 1), uint32_t(quant::Type::Q8_K))),
                  "not a weight format");
  EXPECT_CONTAINS(error_after(set<uint32_t>(part_entry(0, 1) + 4, 1)), "reserved field");
  EXPECT_CONTAINS(error_after(set<int64_t>(part_entry(2, 0) + 8, 0)), "layer 2 gate: shape");
  EXPECT_CONTAINS(error_after(set<int64_t>(part_entry(2, 0) + 8, int64_t(1) << 40)),
                  "out of range");
  EXPECT_CONTAINS(error_after(set<int64_t>(part_entry(0, 2) + 16, 100)),
                  "not a multiple of q8_0's block");
  EXPECT_CONTAINS(error_after(set<uint64_t>(part_entry(0, 0) + 24, 1)), "row stride 1 bytes");
  EXPECT_CONTAINS(error_after(set<uint64_t>(part_entry(0, 0) + 32, 3)),
                  "offset 3 is not a multiple of 64");
  EXPECT_CONTAINS(error_after(set<uint64_t>(part_entry(0, 2) + 32, 1u << 20)),
                  "run past the record");
  EXPECT_CONTAINS(error_after(set<uint64_t>(part_entry(0, 1) + 32, 64)), "gate and up overlap");
  EXPECT_CONTAINS(error_after(set<int64_t>(part_entry(1, 1) + 8, 32)), "layer 1: up is [32 x 256]");
}

TEST_F(PackValidation, Index) {
  const uint64_t e7 = index_entry(bytes_, 7);  // layer 1, expert 2
  const uint64_t off7 = load<uint64_t>(bytes_.data() + e7);
  const uint64_t off8 = load<uint64_t>(bytes_.data() + e7 + kIndexEntryBytes);
  EXPECT_CONTAINS(error_after(set<uint64_t>(e7, off7 + 512)),
                  "record (layer 1, expert 2): offset " + std::to_string(off7 + 512) +
                      " is not a multiple of 4096");
  EXPECT_CONTAINS(error_after(set<uint64_t>(e7, 0)), "lies inside the tables");
  EXPECT_CONTAINS(error_after(set<uint64_t>(e7, bytes_.size())), "run past the end of the file");
  EXPECT_CONTAINS(error_after(set<uint64_t>(e7, uint64_t(-4096))), "run past the end of the file");
  EXPECT_CONTAINS(error_after(set<uint64_t>(e7 + 8, 4096)), "length 4096");
  EXPECT_CONTAINS(error_after(set<uint64_t>(e7, off8)),
                  "overlap at offset " + std::to_string(off8));
}

TEST(PackOpen, NamesTheFile) {
  TempDir dir;
  write_bytes(dir.file("empty.experts"), {});
  EXPECT_CONTAINS(error_of([&] { Pack::open(dir.file("empty.experts")); }),
                  dir.file("empty.experts") + ": 0 bytes is too small");
  EXPECT_THROW(Pack::open(dir.file("missing.experts")), Error);
  EXPECT_THROW(Pack::open(dir.path().string()), Error);
}

// strata pack and strata pack --verify, end to end.
struct CliRun {
  int rc = -1;
  std::string err, out;
};
CliRun strata(const std::string& args, const TempDir& dir) {
  const std::string err = dir.file("stderr.txt"), out = dir.file("stdout.txt");
  const int status =
      std::system((std::string(STRATA_BINARY) + " " + args + " > " + out + " 2> " + err).c_str());
  std::stringstream e, o;
  e << std::ifstream(err).rdbuf();
  o << std::ifstream(out).rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, e.str(), o.str()};
}

TEST(PackCommand, WritesAndVerifies) {
  TempDir dir;
  const std::string model = dir.file("m.gguf");
  write_expert_gguf(model, {});
  CliRun r = strata("pack --no-progress " + model, dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_CONTAINS(r.err, "2 layers x 4 experts");
  EXPECT_TRUE(std::filesystem::exists(model + ".experts"));
  EXPECT_FALSE(std::filesystem::exists(model + ".experts.tmp"));

  r = strata("pack --verify --no-progress " + model, dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_CONTAINS(r.err, "all 8 records OK, equal to the GGUF's expert slices");
  r = strata("pack --verify --no-progress " + model + ".experts", dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  r = strata("pack --bench-reads 0.1 --threads 2 --depth 3 " + model, dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_CONTAINS(r.out, "\"gb_per_s\": ");
  EXPECT_CONTAINS(r.out, "\"retries\": 0}");

  std::vector<uint8_t> b = read_bytes(model + ".experts");
  const auto pack = Pack::open(model + ".experts");
  b[pack->record(1, 0).offset + 5] ^= 1;
  write_bytes(model + ".experts", b);
  r = strata("pack --verify --no-progress " + model, dir);
  EXPECT_EQ(r.rc, 1);
  EXPECT_CONTAINS(
      r.err, "record (layer 1, expert 0) at offset " + std::to_string(pack->record(1, 0).offset));

  r = strata("pack --no-progress " + model + " -o " + dir.file("x.experts"), dir);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir.file("x.experts")));
}

}  // namespace
}  // namespace strata::experts

namespace strata::experts {
namespace {

// synth --pack writes the pack a plain synth plus `strata pack` gives, and a GGUF without the
// expert stacks that names it.
TEST(SynthPack, EqualsPackingThePlainModel) {
  TempDir dir;
  synth::SynthOptions o;
  o.arch = "qwen3moe";
  o.preset = "tiny";
  o.expert_type = "q4_k";
  o.seed = 3;
  o.progress = false;
  o.output = dir.file("plain.gguf");
  synth::run_synth(o);
  const auto plain = gguf::Reader::open(o.output);
  write_pack(*plain, dir.file("plain.experts"));

  o.output = dir.file("split.gguf");
  o.pack = true;
  const auto report = synth::run_synth(o);
  EXPECT_EQ(read_bytes(dir.file("split.gguf.experts")), read_bytes(dir.file("plain.experts")));
  EXPECT_EQ(report.pack_bytes, std::filesystem::file_size(dir.file("split.gguf.experts")));

  const auto split = gguf::Reader::open(dir.file("split.gguf"));
  EXPECT_FALSE(has_expert_stacks(*split));
  EXPECT_EQ(split->get_string(kPackKey), "split.gguf.experts");
  EXPECT_EQ(split->tensors().size() + 3 * size_t(Pack::open(dir.file("plain.experts"))->n_layers()),
            plain->tensors().size());
  const auto pack = open_model_pack(*split, model::ModelConfig::read(*split));
  EXPECT_EQ(pack->source_id(), model_source_id(*plain));
  EXPECT_EQ(verify_pack(*pack, plain.get()).records,
            uint64_t(pack->n_layers() * pack->n_experts()));
}

}  // namespace
}  // namespace strata::experts
