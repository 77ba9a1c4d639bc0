// Faults on the expert I/O path (issue 14): EIO, short reads and flipped bits injected under the
// real backend (io_uring where the kernel allows it), and a pack that shrinks or changes on disk
// under a running server. Every injected fault is detected: a read either lands the record's
// exact bytes or fails with an error naming the pack, layer and expert; a generation that hits
// one fails cleanly (strata::Error; `strata run` exits 1; the server answers 500 or ends the
// stream with an error event), and the next generation equals a fault-free one.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "decode/generate.h"
#include "decode/loaded_model.h"
#include "experts/expert_reader.h"
#include "experts/io_fault.h"
#include "experts/pack.h"
#include "gguf_test_util.h"
#include "pack_test_util.h"
#include "server/server.h"
#include "synth/synth.h"
#include "test_server_util.h"

namespace strata::experts {
namespace {

using nlohmann::json;
using testing::TempDir;

// Threads of this process but the kernel's io_uring workers (iou-wrk-*), which io_uring starts
// and ends on its own schedule.
size_t threads_running() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string comm;
    std::getline(std::ifstream(e.path() / "comm"), comm);
    n += comm.rfind("iou-", 0) != 0;
  }
  return n;
}

// The open descriptors a fault path could leak: files (the pack's), io_uring rings and other
// anonymous inodes, pipes. Not sockets (client connections open and close on their own
// schedule), nor /proc and /sys files: this scan holds /proc/self/fd open, and glibc reads
// /sys/devices/system/cpu/online once, from whichever thread first needs the CPU count (strace
// shows a server thread doing so mid-test), which can fall inside a scan. Target -> count.
std::map<std::string, int> leakable_fds() {
  std::map<std::string, int> open;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (ec || target.rfind("socket:", 0) == 0 || target.rfind("/proc/", 0) == 0 ||
        target.rfind("/sys/", 0) == 0)
      continue;
    // A pipe's inode number differs between instances: count pipes as one kind.
    ++open[target.rfind("pipe:", 0) == 0 ? "pipe" : target];
  }
  return open;
}

std::string describe(const std::map<std::string, int>& fds) {
  std::string text;
  for (const auto& [target, n] : fds) text += target + " x" + std::to_string(n) + "\n";
  return text;
}

// --- The reader alone -------------------------------------------------------------------------

class FaultReader : public ::testing::Test {
 protected:
  void SetUp() override {
    model_path_ = dir_.file("r.gguf");
    pack_path_ = model_path_ + ".experts";
    testing::write_expert_gguf(model_path_, spec_);
    write_pack(*gguf::Reader::open(model_path_), pack_path_);
    pack_ = Pack::open(pack_path_);
    image_ = testing::read_bytes(pack_path_);
  }

  bool landed_right(int layer, int expert, const uint8_t* dst) const {
    const Record& r = pack_->record(layer, expert);
    return std::memcmp(dst, image_.data() + r.offset, r.length) == 0;
  }

  ReaderOptions options(FaultInjector& faults) const {
    ReaderOptions o;
    o.threads = 3;
    o.urgent_threads = 1;
    o.piece_bytes = 4096;  // records of several pieces: faults hit parts of records
    o.wrap = [&faults](std::unique_ptr<FileIo> io) { return faults.wrap(std::move(io)); };
    return o;
  }

  TempDir dir_;
  testing::TinyExperts spec_ = testing::tiny_experts(3, 6);
  std::string model_path_, pack_path_;
  std::unique_ptr<Pack> pack_;
  std::vector<uint8_t> image_;
};

// Tens of thousands of 4 KiB reads, one in fourteen faulted: none delivers wrong bytes, every
// failure names its record, and the faults went through the real backend (io_uring when
// available). A record is a dozen pieces, so most records meet a fault and many need retries.
TEST_F(FaultReader, EveryInjectedFaultIsDetected) {
  FaultInjector faults({.eio = 0.03, .short_read = 0.03, .flip = 0.01, .seed = 5});
  ExpertReader reader(*pack_, options(faults));
  if (make_uring_io(4)) {
    EXPECT_EQ(reader.backend_name(), "io_uring");
  }
  const size_t stride = pack_->max_record_bytes();
  const int n = pack_->n_layers() * pack_->n_experts();
  AlignedBuffer buf(stride * size_t(n));
  size_t delivered = 0, failed = 0, wrong = 0;
  for (int round = 0; round < 40; ++round) {
    std::memset(buf.data(), 0xA5, buf.size());
    std::vector<Ticket> tickets;
    for (int i = 0; i < n; ++i)
      tickets.push_back(reader.submit(i / pack_->n_experts(), i % pack_->n_experts(),
                                      buf.data() + size_t(i) * stride,
                                      i % 2 ? Priority::Urgent : Priority::ReadAhead));
    for (int i = 0; i < n; ++i) {
      const int layer = i / pack_->n_experts(), expert = i % pack_->n_experts();
      const std::string e = testing::error_of([&] { reader.wait(tickets[size_t(i)]); });
      if (e == "(no error)") {
        ++delivered;
        wrong += !landed_right(layer, expert, buf.data() + size_t(i) * stride);
      } else {
        ++failed;
        EXPECT_CONTAINS(e, pack_path_ + ": layer " + std::to_string(layer) + " expert " +
                               std::to_string(expert) + ": ");
      }
    }
  }
  const auto c = faults.counts();
  EXPECT_EQ(wrong, 0u) << "a faulted read delivered wrong bytes";
  EXPECT_GT(c.eio, 100u);
  EXPECT_GT(c.short_reads, 100u);
  EXPECT_GT(c.flips, 100u);
  EXPECT_GT(delivered, 9 * failed) << "retries absorb most transient faults";
  const ReaderStats s = reader.stats();
  EXPECT_EQ(s.requests, delivered);
  EXPECT_EQ(s.failed, failed);
  // Every EIO and short read costs a piece retry or fails its request; a flip costs a record
  // re-read or fails it (two faults in one attempt of a record are one retry).
  EXPECT_GT(s.retries, c.total() / 2);
  std::printf("[faults] %s: %zu records delivered intact, %zu failed with an error, 0 wrong; "
              "reader retries %llu\n",
              faults.summary().c_str(), delivered, failed, (unsigned long long)s.retries);
}

TEST_F(FaultReader, PersistentFaultsFailTheRequestAndTheReaderRecovers) {
  FaultInjector faults({.eio = 1});
  ExpertReader reader(*pack_, options(faults));
  AlignedBuffer buf(pack_->max_record_bytes());
  for (const FaultRates rates : {FaultRates{.eio = 1}, FaultRates{.short_read = 1},
                                 FaultRates{.flip = 1}}) {
    faults.set_rates(rates);
    const Ticket t = reader.submit(2, 3, buf.data(), Priority::Urgent);
    const std::string e = testing::error_of([&] { reader.wait(t); });
    EXPECT_CONTAINS(e, pack_path_ + ": layer 2 expert 3: ");
    EXPECT_TRUE(e.find("Input/output error") != std::string::npos ||
                e.find("short read") != std::string::npos ||
                e.find("fails its checksum") != std::string::npos)
        << e;
    faults.set_rates({});
    const Ticket ok = reader.submit(2, 3, buf.data(), Priority::Urgent);
    EXPECT_EQ(testing::error_of([&] { reader.wait(ok); }), "(no error)");
    EXPECT_TRUE(landed_right(2, 3, buf.data()));
  }
}

// --- A model whose experts stream from a pack ---------------------------------------------------

class FaultModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    synth::SynthOptions o;
    o.arch = "qwen35moe";
    o.preset = "tiny";
    o.expert_type = "q4_k";
    o.output = dir_->file("tiny.gguf");
    o.progress = false;
    o.seed = 11;
    synth::run_synth(o);
    write_pack(*gguf::Reader::open(o.output), o.output + ".experts");
    const auto pack = Pack::open(o.output + ".experts");
    slot_ = (pack->max_record_bytes() + 4095) / 4096 * 4096;
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string gguf() { return dir_->file("tiny.gguf"); }
  static std::string pack() { return gguf() + ".experts"; }

  // Streams through a cache of 6 experts, so every generation reads records.
  static decode::LoadOptions load(FaultInjector* faults) {
    decode::LoadOptions l;
    l.path = gguf();
    l.threads = 1;
    l.ctx = 512;
    l.experts.budget_bytes = slot_ * 6;
    if (faults)
      l.experts.io_wrapper = [faults](std::unique_ptr<FileIo> io) { return faults->wrap(std::move(io)); };
    return l;
  }

  static std::string generate(decode::LoadedModel& m, decode::Session& s, const std::string& text,
                              int64_t max_tokens) {
    decode::GenerateParams p;
    p.max_tokens = max_tokens;
    return s.generate(m.encode(text), p, {}).text;
  }

  static inline TempDir* dir_ = nullptr;
  static inline uint64_t slot_ = 0;
};

// A generation that hits a persistent fault throws the reader's error; the same session's next
// generation (faults gone) equals a fresh session's, so the failed window left nothing behind.
TEST_F(FaultModel, AFailedGenerationLeavesTheSessionClean) {
  std::string expected;
  {
    decode::LoadedModel clean(load(nullptr));
    decode::Session s(clean.model(), clean.tokenizer(), {.n_ctx = 512, .snapshot_prompt = true});
    generate(clean, s, "The first prompt, to fill the cache.", 6);
    expected = generate(clean, s, "The first prompt, to fill the cache. And then more text.", 12);
  }
  FaultInjector faults({});
  decode::LoadedModel m(load(&faults));
  decode::Session s(m.model(), m.tokenizer(), {.n_ctx = 512, .snapshot_prompt = true});
  generate(m, s, "The first prompt, to fill the cache.", 6);
  faults.set_rates({.eio = 1});
  const std::string e = testing::error_of(
      [&] { generate(m, s, "The first prompt, to fill the cache. And then more text.", 12); });
  EXPECT_CONTAINS(e, pack() + ": layer ");
  EXPECT_CONTAINS(e, "Input/output error");
  faults.set_rates({});
  EXPECT_EQ(generate(m, s, "The first prompt, to fill the cache. And then more text.", 12),
            expected);
}

// `strata run` through the binary: transient faults are absorbed (the reply is the fault-free
// one), a persistent one is a clear error and exit 1.
TEST_F(FaultModel, StrataRunSurvivesOrFailsClearly) {
  const auto run = [](const std::string& env, std::string& err) {
    const std::string err_file = dir_->file("err.txt");
    const std::string cmd = env + " " + STRATA_BINARY + " run -m " + gguf() +
                            " --expert-budget " + std::to_string(slot_ * 6) +
                            " --raw -p 'Faults on every path' --max-tokens 16 --threads 1 --no-history 2> " +
                            err_file;
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    char buf[4096];
    for (size_t n; p && (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = p ? ::pclose(p) : -1;
    std::stringstream e;
    e << std::ifstream(err_file).rdbuf();
    err = e.str();
    return std::pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, out);
  };
  std::string err;
  const auto clean = run("", err);
  ASSERT_EQ(clean.first, 0) << err;
  const auto noisy = run("STRATA_IO_FAULTS=eio=0.1,short=0.1,flip=0.1,seed=3", err);
  ASSERT_EQ(noisy.first, 0) << err;
  EXPECT_EQ(noisy.second, clean.second);
  EXPECT_CONTAINS(err, "[strata] I/O faults injected: ");
  EXPECT_EQ(err.find("injected: 0 EIO, 0 short reads, 0 bit flips"), std::string::npos) << err;
  const auto broken = run("STRATA_IO_FAULTS=eio=1", err);
  EXPECT_EQ(broken.first, 1) << err;
  EXPECT_CONTAINS(err, "strata: error: " + pack() + ": layer ");
  EXPECT_CONTAINS(err, "Input/output error");
  EXPECT_EQ(run("STRATA_IO_FAULTS=eio=2", err).first, 1);
  EXPECT_CONTAINS(err, "STRATA_IO_FAULTS: eio=2 is not a rate between 0 and 1");
}

// --- The server -------------------------------------------------------------------------------

class FaultServer : public FaultModel {
 protected:
  void SetUp() override {
    model_ = std::make_unique<decode::LoadedModel>(load(&faults_));
    server::ServerOptions o;
    o.port = 0;
    server_ = std::make_unique<server::Server>(*model_, o);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->run(); });
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
    server_.reset();
    model_.reset();
  }

  httplib::Result complete(bool stream) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60);
    const json body = {{"model", "tiny"}, {"prompt", "Faults on every path"}, {"max_tokens", 12},
                       {"temperature", 0}, {"stream", stream}};
    return c.Post("/v1/completions", body.dump(), "application/json");
  }
  static std::string text_of(const httplib::Result& r) {
    return json::parse(r->body)["choices"][0]["text"].get<std::string>();
  }

  FaultInjector faults_{{}};
  std::unique_ptr<decode::LoadedModel> model_;
  std::unique_ptr<server::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// Injected faults: the request fails with a 500 naming the record (or, streamed, an error event
// after the 200), the next request succeeds with the fault-free text, and after many failed
// requests the process has the same threads and open files, rings and pipes.
TEST_F(FaultServer, ARequestThatHitsAFaultFailsAndTheNextSucceeds) {
  const auto baseline = complete(false);
  ASSERT_TRUE(baseline);
  ASSERT_EQ(baseline->status, 200) << baseline->body;
  const std::string expected = text_of(baseline);

  faults_.set_rates({.eio = 1});
  const auto failed = complete(false);
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->status, 500) << failed->body;
  const json error = json::parse(failed->body)["error"];
  EXPECT_EQ(error["code"], "internal_error");
  EXPECT_CONTAINS(error["message"].get<std::string>(), pack() + ": layer ");
  const auto streamed = complete(true);
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  EXPECT_CONTAINS(streamed->body, "\"internal_error\"");
  faults_.set_rates({});
  const auto next = complete(false);
  ASSERT_TRUE(next);
  ASSERT_EQ(next->status, 200) << next->body;
  EXPECT_EQ(text_of(next), expected);

  const size_t threads = threads_running();
  const auto fds = leakable_fds();
  for (int i = 0; i < 20; ++i) {
    faults_.set_rates(i % 2 ? FaultRates{.short_read = 1} : FaultRates{.flip = 1});
    EXPECT_EQ(complete(i % 3 == 0)->status, i % 3 == 0 ? 200 : 500);
  }
  faults_.set_rates({});
  EXPECT_EQ(text_of(complete(false)), expected);
  EXPECT_EQ(threads_running(), threads);
  const auto fds_after = leakable_fds();
  EXPECT_EQ(fds_after, fds) << "before:\n" << describe(fds) << "after:\n" << describe(fds_after);
}

// The pack changes under the running server: a flipped byte on disk, then a truncated file.
// Each request meanwhile fails cleanly; with the file restored the next one succeeds unchanged.
TEST_F(FaultServer, APackThatChangesOrShrinksOnDisk) {
  const auto baseline = complete(false);
  ASSERT_EQ(baseline->status, 200) << baseline->body;
  const std::string expected = text_of(baseline);
  const std::vector<uint8_t> original = testing::read_bytes(pack());
  const auto p = Pack::open(pack());

  std::vector<uint8_t> flipped = original;
  for (int l = 0; l < p->n_layers(); ++l)
    for (int e = 0; e < p->n_experts(); ++e) flipped[p->record(l, e).offset + 100] ^= 0x01;
  testing::write_bytes(pack(), flipped);
  auto r = complete(false);
  EXPECT_EQ(r->status, 500) << r->body;
  EXPECT_CONTAINS(r->body, "fails its checksum");

  std::filesystem::resize_file(pack(), p->record(0, 0).offset + 4096);
  r = complete(false);
  EXPECT_EQ(r->status, 500) << r->body;
  EXPECT_CONTAINS(r->body, pack() + ": layer ");

  testing::write_bytes(pack(), original);
  r = complete(false);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(text_of(r), expected);
}

}  // namespace
}  // namespace strata::experts
