// strata logits: runs a token list through a model and writes the fp32 logits of every position
// as .npy, optionally window by window and with per-layer activation dumps, for comparison with
// the reference implementation (docs/MODELS.md).
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/device_flag.h"
#include "decode/device.h"
#include "model/model.h"
#include "util/error.h"
#include "util/npy.h"

namespace strata::cli {

namespace {

struct LogitsOptions {
  std::string model;
  std::string tokens;
  std::string tokens_file;
  std::string output;
  std::string dump_dir;
  int64_t window = 0;
  std::string device = "auto";
  int threads = 0;
};

std::vector<int32_t> parse_tokens(const std::string& list) {
  std::vector<int32_t> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t end = std::min(list.find(',', pos), list.size());
    int32_t v = 0;
    const auto [p, ec] = std::from_chars(list.data() + pos, list.data() + end, v);
    if (ec != std::errc() || p != list.data() + end)
      fail("--tokens: '", list.substr(pos, end - pos), "' is not a token id");
    out.push_back(v);
    pos = end + 1;
  }
  return out;
}

void run_logits(const LogitsOptions& o) {
  std::vector<int32_t> tokens;
  if (!o.tokens.empty())
    tokens = parse_tokens(o.tokens);
  else if (!o.tokens_file.empty())
    tokens = npy::read(o.tokens_file).int32s();
  else
    fail("logits: give --tokens 1,2,3 or --tokens-file FILE.npy");
  if (tokens.empty()) fail("logits: the token list is empty");
  if (o.window < 0) fail("--window: ", o.window, " is negative");

  const decode::OpenedBackend backend =
      decode::open_backend(decode::parse_device(o.device), o.threads, o.model, {});
  std::fprintf(stderr, "strata logits: device %s\n", backend.description.c_str());
  auto model = model::Model::load(o.model, *backend.backend);
  const int64_t n = int64_t(tokens.size());
  if (n > model->config().n_ctx)
    fail("logits: ", n, " tokens exceed the model's context of ", model->config().n_ctx);

  // Dumps: rows of every window appended per name, written once at the end.
  std::map<std::string, std::pair<std::vector<float>, int64_t>> dumps;
  if (!o.dump_dir.empty()) {
    std::filesystem::create_directories(o.dump_dir);
    model->set_dump(
        [&dumps](const std::string& name, const std::vector<float>& rows, int64_t cols) {
          auto& [values, width] = dumps[name];
          values.insert(values.end(), rows.begin(), rows.end());
          width = cols;
        });
  }

  model::State state = model->new_state(n);
  const int64_t window = o.window > 0 ? o.window : n;
  std::vector<float> logits;
  for (int64_t first = 0; first < n; first += window) {
    const int64_t count = std::min(window, n - first);
    const auto rows = model->forward(std::span(tokens).subspan(size_t(first), size_t(count)), state,
                                     model::LogitsMode::All);
    logits.insert(logits.end(), rows.begin(), rows.end());
  }
  const int64_t shape[] = {n, model->config().n_vocab};
  npy::write(o.output, logits, shape);
  for (const auto& [name, entry] : dumps) {
    const int64_t dshape[] = {int64_t(entry.first.size()) / entry.second, entry.second};
    npy::write((std::filesystem::path(o.dump_dir) / (name + ".npy")).string(), entry.first, dshape);
  }
  std::fprintf(stderr, "strata logits: %lld positions x %lld vocab -> %s\n", (long long)n,
               (long long)model->config().n_vocab, o.output.c_str());
}

}  // namespace

void add_logits_command(CLI::App& app) {
  auto opts = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "logits", "Write the fp32 logits of every position of a token list as .npy");
  cmd->add_option("-m,--model", opts->model, "GGUF model")->required();
  auto* tokens = cmd->add_option("--tokens", opts->tokens, "Comma-separated token ids");
  cmd->add_option("--tokens-file", opts->tokens_file, "Token ids as an integer .npy")
      ->excludes(tokens);
  cmd->add_option("-o,--output", opts->output, "Output .npy: float32 [positions, vocab]")
      ->required();
  cmd->add_option("--window", opts->window, "Rows per forward window (default: all at once)");
  cmd->add_option("-t,--threads", opts->threads, "CPU threads (default: one per hardware thread)");
  add_device_flag(cmd, opts->device);
  cmd->add_option("--dump", opts->dump_dir, "Write named per-layer activations as DIR/NAME.npy");
  cmd->callback([opts] { run_logits(*opts); });
}

}  // namespace strata::cli
