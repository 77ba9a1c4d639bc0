// Routing trace files: round trip through TraceWriter/TraceReader, window replay with wrap-around,
// the writer's argument checks, and clear errors for truncated, corrupt and inconsistent files.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "gguf_test_util.h"
#include "route_test_util.h"
#include "route/binio.h"
#include "route/trace.h"
#include "util/error.h"

namespace strata::route {
namespace {

using gguf::testing::TempDir;
using gguf::testing::read_bytes;
using testing::error_of;

TraceHeader small_header(int top_m) {
  TraceHeader h;
  h.n_layers = 2;
  h.n_experts = 8;
  h.top_k = 2;
  h.top_m = top_m;
  h.model = "test model";
  return h;
}

// Row r, layer l routes experts (r + l) % 8 and (r + l + 3) % 8; candidates add (r + l + 5) % 8.
backend::Routing window_routing(int first_row, int rows, int layer) {
  backend::Routing r;
  r.top_k = 2;
  for (int i = 0; i < rows; ++i) {
    const int b = first_row + i + layer;
    for (int e : {b % 8, (b + 3) % 8}) r.experts.push_back(e);
    for (float w : {0.75f, 0.25f}) r.weights.push_back(w);
  }
  return r;
}

RouterTopM window_top_m(int first_row, int rows, int layer) {
  RouterTopM t;
  t.m = 3;
  for (int i = 0; i < rows; ++i) {
    const int b = first_row + i + layer;
    for (int e : {b % 8, (b + 3) % 8, (b + 5) % 8}) t.ids.push_back(e);
    for (float z : {2.0f, 0.9f, 0.5f - 0.01f * float(i)}) t.logits.push_back(z);
    t.lse.push_back(3.0f);
  }
  return t;
}

void write_windows(const std::string& path, int top_m, std::initializer_list<int> windows) {
  TraceWriter w(path, small_header(top_m));
  int row = 0;
  for (int rows : windows) {
    for (int l = 0; l < 2; ++l) {
      const RouterTopM t = window_top_m(row, rows, l);
      w.append(l, window_routing(row, rows, l), top_m ? &t : nullptr);
    }
    row += rows;
  }
  w.close();
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

TEST(RouteTrace, RoundTripWithCandidates) {
  TempDir dir;
  const auto path = dir.file("a.trace");
  write_windows(path, 3, {3, 1});
  const auto t = TraceReader::open(path);
  EXPECT_EQ(t.header().n_layers, 2);
  EXPECT_EQ(t.header().n_experts, 8);
  EXPECT_EQ(t.header().top_k, 2);
  EXPECT_EQ(t.header().top_m, 3);
  EXPECT_TRUE(t.header().renormalized);
  EXPECT_EQ(t.header().model, "test model");
  ASSERT_EQ(t.rows(), 4);
  for (int r = 0; r < 4; ++r)
    for (int l = 0; l < 2; ++l) {
      const int b = r + l;
      EXPECT_EQ(t.experts(r, l)[0], b % 8);
      EXPECT_EQ(t.experts(r, l)[1], (b + 3) % 8);
      EXPECT_EQ(t.weights(r, l)[0], 0.75f);
      EXPECT_EQ(t.candidates(r, l)[2], (b + 5) % 8);
      EXPECT_EQ(t.logits(r, l)[1], 0.9f);
      EXPECT_EQ(t.lse(r, l), 3.0f);
    }
  // Row 3 was the second window's only row: its candidate logit used i = 0.
  EXPECT_EQ(t.logits(3, 0)[2], 0.5f);
  EXPECT_EQ(t.logits(2, 0)[2], 0.5f - 0.02f);
}

TEST(RouteTrace, ReplayWindowsWrapAround) {
  TempDir dir;
  const auto path = dir.file("b.trace");
  write_windows(path, 0, {2, 2});
  const auto t = TraceReader::open(path);
  EXPECT_EQ(t.header().top_m, 0);
  const auto r = t.routing(3, 3, 1);  // rows 3, 0, 1 of layer 1
  EXPECT_EQ(r.top_k, 2);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{4, 7, 1, 4, 2, 5}));
  EXPECT_EQ(r.weights.size(), 6u);
  EXPECT_NE(error_of([&] { t.routing(0, 1, 2); }).find("layer 2"), std::string::npos);
}

TEST(RouteTrace, RouterTopMSortsAndSums) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f,   // row 0
                                     3.0f, 0.0f, 0.0f, 1.0f, -2.0f};  // row 1
  const auto t = router_top_m(logits.data(), 2, 5, 5, 3);
  EXPECT_EQ(t.ids, (std::vector<int32_t>{1, 3, 4, 0, 3, 1}));
  EXPECT_EQ(t.logits[0], 2.0f);
  EXPECT_EQ(t.logits[5], 0.0f);
  double s = 0.0;
  for (int i = 0; i < 5; ++i) s += std::exp(double(logits[size_t(i)]));
  EXPECT_NEAR(t.lse[0], std::log(s), 1e-5);
}

TEST(RouteTrace, WriterRejectsBadAppends) {
  TempDir dir;
  const auto path = dir.file("c.trace");
  TraceWriter w(path, small_header(3));
  const RouterTopM t = window_top_m(0, 1, 0);
  EXPECT_NE(error_of([&] { w.append(1, window_routing(0, 1, 1), &t); }).find("layer 1 appended where layer 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.append(0, window_routing(0, 1, 0)); }).find("none were given"), std::string::npos);
  auto bad = window_routing(0, 1, 0);
  bad.experts[1] = 8;
  EXPECT_NE(error_of([&] { w.append(0, bad, &t); }).find("expert id 8"), std::string::npos);
  bad.experts[1] = bad.experts[0];
  EXPECT_NE(error_of([&] { w.append(0, bad, &t); }).find("routed twice"), std::string::npos);
  bad = window_routing(0, 1, 0);
  bad.experts[1] = 6;  // not among candidates 0, 3, 5
  EXPECT_NE(error_of([&] { w.append(0, bad, &t); }).find("not among the top-3"), std::string::npos);
  w.append(0, window_routing(0, 1, 0), &t);
  const RouterTopM t2 = window_top_m(0, 2, 1);
  EXPECT_NE(error_of([&] { w.append(1, window_routing(0, 2, 1), &t2); }).find("layer 0 of this window had 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.close(); }).find("middle of a window"), std::string::npos);
  TraceHeader h = small_header(1);  // top_m below top_k
  EXPECT_NE(error_of([&] { TraceWriter(dir.file("d.trace"), h); }).find("top_m 1"), std::string::npos);
}

TEST(RouteTrace, TruncatedAndCorruptFilesFailClearly) {
  TempDir dir;
  const auto path = dir.file("e.trace");
  write_windows(path, 3, {2, 2});
  const auto good = read_bytes(path);
  const auto parse = [&](const std::vector<uint8_t>& b) {
    return error_of([&] { TraceReader::parse(b, "routing trace x.trace"); });
  };
  auto cut = good;
  cut.resize(good.size() - 5);
  EXPECT_NE(parse(cut).find("x.trace: truncated: window 1"), std::string::npos) << parse(cut);
  cut.resize(30);
  EXPECT_NE(parse(cut).find("truncated"), std::string::npos);
  auto stray = good;
  stray.insert(stray.end(), {1, 2, 3});
  EXPECT_NE(parse(stray).find("stray bytes"), std::string::npos);
  auto flipped = good;
  flipped[good.size() - 3] ^= 0x40;
  EXPECT_NE(parse(flipped).find("window 1 checksum mismatch"), std::string::npos);
  auto header = good;
  header[13] ^= 1;  // n_layers
  EXPECT_NE(parse(header).find("header checksum"), std::string::npos);
  auto magic = good;
  magic[0] = 'X';
  EXPECT_NE(parse(magic).find("bad magic"), std::string::npos);
  auto version = good;
  version[8] = 9;
  EXPECT_NE(parse(version).find("version 9"), std::string::npos);
  EXPECT_NE(error_of([&] { TraceReader::open(dir.file("missing.trace")); }).find("missing.trace: cannot open"),
            std::string::npos);
  write_bytes(dir.file("empty.trace"), {});
  EXPECT_NE(error_of([&] { TraceReader::open(dir.file("empty.trace")); }).find("truncated"), std::string::npos);
}

// A structurally sound file (right checksums) whose contents are wrong is still refused.
TEST(RouteTrace, ValidatesRowContents) {
  const auto make = [](uint16_t id1, float weight) {
    ByteWriter w;
    for (char c : std::string("STRTRACE")) w.put(c);
    for (uint32_t v : {1u, 1u, 8u, 2u, 0u, 1u}) w.put(v);  // version, layers, experts, k, m, flags
    w.put_string("m");
    w.put(checksum(w.bytes()));
    ByteWriter row;
    row.put(uint16_t(1));
    row.put(id1);
    row.put(0.5f);
    row.put(weight);
    w.put(uint32_t(0x57444E57));
    w.put(uint32_t(1));
    w.put(checksum(row.bytes()));
    w.put_all(std::span<const uint8_t>(row.bytes()));
    return w.bytes();
  };
  EXPECT_EQ(TraceReader::parse(make(2, 0.5f), "t").rows(), 1);
  EXPECT_NE(error_of([&] { TraceReader::parse(make(9, 0.5f), "t"); }).find("row 0, layer 0: expert id 9"),
            std::string::npos);
  EXPECT_NE(error_of([&] { TraceReader::parse(make(1, 0.5f), "t"); }).find("routed twice"), std::string::npos);
  EXPECT_NE(error_of([&] { TraceReader::parse(make(2, NAN), "t"); }).find("weight"), std::string::npos);
}

}  // namespace
}  // namespace strata::route
