// `strata serve` as a child process, the way it runs in production: it prints its port, serves,
// and on SIGTERM ends the running stream with a proper last chunk and [DONE], runs its shutdown
// hook and exits 0. SIGINT does the same; a port already taken is a clear error, exit 1. Its
// --help lists the flags grouped by topic; the start-up names --parallel (default by device).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <regex>
#include <string>

#include "gguf_test_util.h"
#include "server/server.h"
#include "test_server_util.h"

namespace strata::server {
namespace {

using gguf::testing::TempDir;

class ServeProcess : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    testing::synth_tiny(*dir_);
  }
  static void TearDownTestSuite() { delete dir_; }

  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (err_) std::fclose(err_);
  }

  // Starts `strata serve` on a free port; returns false if it did not report one.
  bool spawn(const std::string& extra = "") {
    if (err_) std::fclose(err_);
    err_ = nullptr;
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) return false;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(pipe_fds[1], STDERR_FILENO);
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
      const std::string cmd = std::string("exec ") + STRATA_BINARY + " serve -m " +
                              dir_->file("tiny.gguf") + " --threads 1 --port 0 " + extra;
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(pipe_fds[1]);
    err_ = ::fdopen(pipe_fds[0], "r");
    static const std::regex serving(R"(serving .* on http://[^ ]*:(\d+) )");
    char line[4096];
    while (std::fgets(line, sizeof line, err_)) {
      log_ += line;
      std::cmatch m;
      if (std::regex_search(line, m, serving)) {
        port_ = std::stoi(m[1]);
        return true;
      }
    }
    return false;
  }

  // Waits for the child; returns its exit code (-1 if a signal ended it). Keeps stderr.
  int wait_exit() {
    char line[4096];
    while (std::fgets(line, sizeof line, err_)) log_ += line;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  static inline TempDir* dir_ = nullptr;
  pid_t pid_ = -1;
  FILE* err_ = nullptr;
  int port_ = 0;
  std::string log_;
};

TEST_F(ServeProcess, SigtermEndsTheStreamAndExitsZero) {
  ASSERT_TRUE(spawn()) << log_;
  httplib::Client c("127.0.0.1", port_);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);

  testing::RawClient stream(
      port_, "POST", "/v1/completions",
      R"({"model":"tiny","prompt":"hi","max_tokens":4000,"stream":true,"temperature":1,)"
      R"("logit_bias":{"0":5}})");
  ASSERT_TRUE(stream.read_until("data: ", 2)) << stream.received();
  ASSERT_EQ(::kill(pid_, SIGTERM), 0);
  const std::string& all = stream.read_all();
  EXPECT_NE(all.find("data: [DONE]"), std::string::npos) << all.substr(all.size() - 300);
  EXPECT_EQ(wait_exit(), 0) << log_;
  EXPECT_NE(log_.find("SIGTERM"), std::string::npos) << log_;
  EXPECT_NE(log_.find("server stopped"), std::string::npos) << log_;
}

TEST_F(ServeProcess, SigintExitsZero) {
  ASSERT_TRUE(spawn("--queue 2 --timeout 30")) << log_;
  ASSERT_EQ(::kill(pid_, SIGINT), 0);
  EXPECT_EQ(wait_exit(), 0) << log_;
}

// Listening beyond loopback without an API key is allowed, with a warning at start-up; on
// loopback, or with a key, there is none.
TEST_F(ServeProcess, ExposedWithoutAKeyWarnsAtStartup) {
  ASSERT_TRUE(spawn("--host 0.0.0.0")) << log_;
  EXPECT_NE(log_.find("strata: warning: listening on 0.0.0.0 without --api-key"), std::string::npos)
      << log_;
  httplib::Client c("127.0.0.1", port_);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  ASSERT_EQ(::kill(pid_, SIGTERM), 0);
  EXPECT_EQ(wait_exit(), 0) << log_;

  log_.clear();
  ASSERT_TRUE(spawn()) << log_;
  EXPECT_EQ(log_.find("warning"), std::string::npos) << log_;
}

TEST(ServeStartup, LoopbackHostsAndTheWarning) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "::1", "localhost"})
    EXPECT_TRUE(is_loopback_host(host)) << host;
  for (const char* host : {"0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "example.com", "128.0.0.1"})
    EXPECT_FALSE(is_loopback_host(host)) << host;
  ServerOptions o;
  EXPECT_EQ(startup_warning(o), "");
  o.host = "0.0.0.0";
  EXPECT_NE(startup_warning(o).find("without --api-key"), std::string::npos);
  o.api_key = "k";
  EXPECT_EQ(startup_warning(o), "");
}

// --parallel and --warmup-after default by device (4 and never on CUDA, 1 and 30 s on the CPU),
// and the start-up says what they are.
TEST_F(ServeProcess, PrintsTheSequencesPerWindowAndTheWarmUpAtStartup) {
  EXPECT_EQ(default_parallel("cuda"), 4u);
  EXPECT_EQ(default_parallel("cpu"), 1u);
  EXPECT_EQ(default_warmup_after("cuda"), 0.0);
  EXPECT_EQ(default_warmup_after("cpu"), 30.0);
  ASSERT_TRUE(spawn()) << log_;
  EXPECT_NE(log_.find("strata: 1 sequence per window (--parallel, the default on this device)"), std::string::npos)
      << log_;
  EXPECT_NE(log_.find("strata: a warm-up window after 30 s idle (--warmup-after, the default on this device)"),
            std::string::npos)
      << log_;
  ASSERT_EQ(::kill(pid_, SIGTERM), 0);
  EXPECT_EQ(wait_exit(), 0) << log_;
  log_.clear();
  ASSERT_TRUE(spawn("--parallel 3 --warmup-after 0")) << log_;
  EXPECT_NE(log_.find("strata: 3 sequences per window (--parallel)\n"), std::string::npos) << log_;
  EXPECT_NE(log_.find("strata: no warm-up window after idle (--warmup-after 0)\n"), std::string::npos) << log_;
}

TEST_F(ServeProcess, ATakenPortIsAClearError) {
  ASSERT_TRUE(spawn()) << log_;
  const int taken = port_;
  const std::string cmd = std::string(STRATA_BINARY) + " serve -m " + dir_->file("tiny.gguf") +
                          " --threads 1 --port " + std::to_string(taken) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[1024];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;
  EXPECT_NE(out.find("cannot listen on 127.0.0.1:" + std::to_string(taken)), std::string::npos)
      << out;
}

// Run a shell command, returning what it printed (stdout and stderr) and its exit code.
std::pair<std::string, int> run(const std::string& command) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  std::string out;
  if (!p) return {out, -1};
  char buf[1024];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

TEST(ServeHelp, FlagsAreGroupedByTopic) {
  const auto [out, code] = run(std::string(STRATA_BINARY) + " serve --help");
  EXPECT_EQ(code, 0) << out;
  size_t at = 0;
  // Each topic heading, in this order, with one of its flags after it.
  for (const auto& [topic, flag] : {std::pair{"Model:", "--chat-template-file"}, {"Network and access:", "--api-key"},
                                    {"Requests and queue:", "--queue"}, {"Compute:", "--threads"},
                                    {"Expert cache:", "--expert-budget"}}) {
    const size_t heading = out.find(topic, at);
    ASSERT_NE(heading, std::string::npos) << topic << " missing or out of order:\n" << out;
    at = out.find(flag, heading);
    ASSERT_NE(at, std::string::npos) << flag << " is not under " << topic << ":\n" << out;
  }
}

TEST(ServeHelp, AMissingChatTemplateFileIsAClearError) {
  const auto [out, code] = run(std::string(STRATA_BINARY) + " serve -m x.gguf --chat-template-file /nonexistent/t.jinja");
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("/nonexistent/t.jinja"), std::string::npos) << out;
}

}  // namespace
}  // namespace strata::server
