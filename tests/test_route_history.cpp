// Usage history and expert profile files: decay, save/load round trips, atomic replacement, clear
// errors on corrupt files, the periodic saver, and the blend that orders the start-up fill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "gguf_test_util.h"
#include "route_test_util.h"
#include "route/profile.h"
#include "route/usage_history.h"
#include "util/error.h"

namespace strata::route {
namespace {

using gguf::testing::TempDir;
using gguf::testing::read_bytes;
using testing::error_of;

std::vector<std::string> files_in(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(RouteHistory, DecaysWithTheHalfLife) {
  UsageHistory h(2, 4, 100.0, "m");
  const std::vector<int32_t> a = {1, 2}, b = {2};
  h.observe(0, a);
  h.observe(1, b);
  EXPECT_EQ(h.count(0, 1), 1.0);
  h.advance(100);
  EXPECT_DOUBLE_EQ(h.count(0, 1), 0.5);
  h.observe(0, b);
  h.advance(50);
  EXPECT_NEAR(h.count(0, 2), 1.5 * std::exp2(-0.5), 1e-12);
  EXPECT_EQ(h.count(0, 0), 0.0);
  EXPECT_EQ(h.tokens(), 150);
  const std::vector<int32_t> bad = {4};
  EXPECT_NE(error_of([&] { h.observe(0, bad); }).find("expert 4"), std::string::npos);
  EXPECT_NE(error_of([&] { UsageHistory(2, 4, 0.0, "m"); }).find("half-life"), std::string::npos);
}

TEST(RouteHistory, SaveLoadRoundTripIsAtomic) {
  TempDir dir;
  const auto path = dir.file("model.gguf.experts.usage");
  UsageHistory h(3, 5, 64.0, "model x");
  for (int t = 0; t < 10; ++t) {
    const std::vector<int32_t> e = {t % 5, (t + 2) % 5};
    h.observe(t % 3, e);
    h.advance(1);
  }
  EXPECT_TRUE(h.dirty());
  h.save(path);
  EXPECT_FALSE(h.dirty());
  const auto g = UsageHistory::load(path);
  EXPECT_EQ(g.n_layers(), 3);
  EXPECT_EQ(g.n_experts(), 5);
  EXPECT_EQ(g.half_life(), 64.0);
  EXPECT_EQ(g.tokens(), 10);
  EXPECT_EQ(g.model(), "model x");
  for (int l = 0; l < 3; ++l)
    for (int e = 0; e < 5; ++e) EXPECT_EQ(g.count(l, e), h.count(l, e));
  // Saving over the old file replaces it whole and leaves no temp file behind.
  h.advance(64);
  h.save(path);
  EXPECT_EQ(UsageHistory::load(path).tokens(), 74);
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"model.gguf.experts.usage"});
  // A rename that fails (the target is a directory) reports the path and cleans up its temp file.
  std::filesystem::create_directory(dir.file("blocked"));
  std::ofstream(dir.file("blocked/inside")) << "x";
  EXPECT_NE(error_of([&] { h.save(dir.file("blocked")); }).find("blocked: renaming"), std::string::npos);
  EXPECT_EQ(files_in(dir.path()), (std::vector<std::string>{"blocked", "model.gguf.experts.usage"}));
  EXPECT_NE(error_of([&] { h.save(dir.file("no/such/dir/u")); }).find("cannot create"), std::string::npos);
}

TEST(RouteHistory, CorruptFilesFailClearly) {
  TempDir dir;
  const auto path = dir.file("u");
  UsageHistory h(2, 3, 10.0, "m");
  h.save(path);
  const auto good = read_bytes(path);
  const auto parse = [](std::vector<uint8_t> b) {
    return error_of([&] { UsageHistory::parse(b, "usage history u"); });
  };
  auto cut = good;
  cut.resize(good.size() - 9);
  EXPECT_NE(parse(cut).find("u: truncated"), std::string::npos);
  auto flipped = good;
  flipped[good.size() - 12] ^= 0x10;
  EXPECT_NE(parse(flipped).find("checksum mismatch"), std::string::npos);
  auto version = good;
  version[8] = 2;
  EXPECT_NE(parse(version).find("version 2"), std::string::npos);
  auto magic = good;
  magic[1] = 'x';
  EXPECT_NE(parse(magic).find("bad magic"), std::string::npos);
  auto longer = good;
  longer.push_back(0);
  EXPECT_NE(parse(longer).find("unexpected bytes"), std::string::npos);
  EXPECT_NE(error_of([&] { UsageHistory::load(dir.file("none")); }).find("none: cannot open"), std::string::npos);
  EXPECT_NE(error_of([&] { UsageHistory::load(path).expect_shape(2, 4, "engine"); }).find("2 layers x 3 experts"),
            std::string::npos);
}

TEST(RouteHistory, PeriodicSaverWritesEveryNChangedWindows) {
  TempDir dir;
  const auto path = dir.file("u");
  UsageHistory h(1, 4, 10.0, "m");
  PeriodicSaver saver(path, 3);
  const std::vector<int32_t> e = {1};
  int saves = 0;
  for (int w = 0; w < 7; ++w) {
    h.observe(0, e);
    h.advance(1);
    saves += saver.tick(h);
  }
  EXPECT_EQ(saves, 2);  // after windows 3 and 6
  EXPECT_EQ(UsageHistory::load(path).tokens(), 6);
  for (int w = 0; w < 5; ++w) saves += saver.tick(h);  // window 7's change, then idle
  EXPECT_EQ(saves, 3);
  EXPECT_EQ(UsageHistory::load(path).tokens(), 7);
  EXPECT_FALSE(saver.tick(h));
}

TEST(RouteProfile, RankingSaveLoadAndErrors) {
  TempDir dir;
  ExpertProfile p(2, 4, "m");
  p.observe(0, std::vector<int32_t>{2, 3});
  p.observe(0, std::vector<int32_t>{3});
  p.observe(1, std::vector<int32_t>{1});
  p.add_tokens(3);
  EXPECT_EQ(p.ranking(0), (std::vector<int32_t>{3, 2, 0, 1}));
  EXPECT_EQ(p.ranking(1), (std::vector<int32_t>{1, 0, 2, 3}));
  const auto path = dir.file("p");
  p.save(path);
  const auto q = ExpertProfile::load(path);
  EXPECT_EQ(q.tokens(), 3);
  EXPECT_EQ(q.model(), "m");
  EXPECT_EQ(q.ranking(0), p.ranking(0));
  auto bytes = read_bytes(path);
  bytes[bytes.size() - 10] ^= 1;
  EXPECT_NE(error_of([&] { ExpertProfile::parse(bytes, "expert profile p"); }).find("p: checksum mismatch"),
            std::string::npos);
  bytes.resize(30);
  EXPECT_NE(error_of([&] { ExpertProfile::parse(bytes, "expert profile p"); }).find("truncated"), std::string::npos);
}

TEST(RouteProfile, BlendRampsTowardTheHistory) {
  EXPECT_EQ(history_weight(0), 0.0);
  EXPECT_DOUBLE_EQ(history_weight(500), 0.35);
  EXPECT_DOUBLE_EQ(history_weight(1000), 0.7);
  EXPECT_DOUBLE_EQ(history_weight(50000), 0.7);
  // Profile shares 0.5, 0, 0.25, 0.25; history shares 0, 0.8, 0.2, 0.
  ExpertProfile p(1, 4, "m");
  for (int i = 0; i < 10; ++i) p.observe(0, std::vector<int32_t>{0});
  for (int i = 0; i < 5; ++i) p.observe(0, std::vector<int32_t>{2, 3});
  UsageHistory h(1, 4, 1e9, "m");
  for (int i = 0; i < 8; ++i) h.observe(0, std::vector<int32_t>{1});
  for (int i = 0; i < 2; ++i) h.observe(0, std::vector<int32_t>{2});
  // w = 0.7: scores 0.15, 0.56, 0.215, 0.075.
  EXPECT_EQ(blend(p, h, 1000)[0], (std::vector<int32_t>{1, 2, 0, 3}));
  // No history yet: the profile alone, ties to the lower id.
  EXPECT_EQ(blend(p, h, 0)[0], (std::vector<int32_t>{0, 2, 3, 1}));
  // w = 0.35: scores 0.325, 0.28, 0.2325, 0.1625.
  EXPECT_EQ(blend(p, h, 500)[0], (std::vector<int32_t>{0, 1, 2, 3}));
  // An empty profile leaves the history alone in charge.
  EXPECT_EQ(blend(ExpertProfile(1, 4, "m"), h, 10)[0], (std::vector<int32_t>{1, 2, 0, 3}));
  EXPECT_NE(error_of([&] { blend(ExpertProfile(2, 4, "m"), h, 10); }).find("1 layers x 4 experts"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::route
