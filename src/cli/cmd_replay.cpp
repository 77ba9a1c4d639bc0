// strata replay: closed-loop cache simulation over a routing trace (see route/replay.h and
// docs/ROUTING.md): hit rate, misses and bytes per token for LRU, profile-pinned, history-blended
// and cache-conditional variants at several budgets, plus the routed relative MSE of the latter.
#include <cctype>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "gguf/gguf.h"
#include "route/profile.h"
#include "route/replay.h"
#include "route/trace.h"
#include "route/usage_history.h"
#include "util/error.h"

namespace strata::cli {

namespace {

// "8G", "512M", "1.5GiB", "1234": bytes (K/M/G/T are powers of 1024).
uint64_t parse_size(const std::string& text, const char* flag) {
  size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    fail(flag, " ", text, ": not a size (e.g. 8G, 512M, 1434112)");
  }
  std::string unit = text.substr(used);
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1.0;
  if (unit == "" || unit == "B") scale = 1.0;
  else if (unit == "K" || unit == "KB" || unit == "KIB") scale = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  else fail(flag, " ", text, ": unknown unit '", unit, "' (use K, M, G or T)");
  if (!(value > 0.0) || value * scale > 1e18) fail(flag, " ", text, ": must be a positive size");
  return uint64_t(value * scale);
}

// One expert's gate + up + down bytes of layer 0, rounded up to the pack's 4 KiB record alignment.
uint64_t expert_bytes_of(const std::string& model_path) {
  const auto reader = gguf::Reader::open(model_path);
  uint64_t total = 0;
  for (const char* part : {"gate", "up", "down"}) {
    const auto& t = reader->tensor(cat("blk.0.ffn_", part, "_exps.weight"));
    if (t.shape.size() != 3 || t.shape[2] < 1) fail(model_path, ": ", t.name, " is not an expert stack");
    total += t.nbytes / uint64_t(t.shape[2]);
  }
  return (total + 4095) / 4096 * 4096;
}

struct ReplayArgs {
  std::string trace;
  route::ReplayOptions o;
  std::vector<std::string> budgets;
  std::string expert_bytes, model, profile, history;
  bool json = false;
};

}  // namespace

void add_replay_command(CLI::App& app) {
  auto a = std::make_shared<ReplayArgs>();
  a->o.slots.clear();
  CLI::App* cmd = app.add_subcommand("replay", "Simulate expert caching policies over a routing trace");
  cmd->add_option("trace", a->trace, "Routing trace (from strata trace synth or recorded by the engine)")->required();
  cmd->add_option("--slots", a->o.slots, "Budgets as expert slots per layer (default 32,64,128)")->delimiter(',');
  cmd->add_option("--budget", a->budgets, "Budgets in bytes over all layers, e.g. 4G,8G (needs expert bytes)")
      ->delimiter(',');
  cmd->add_option("--expert-bytes", a->expert_bytes, "Bytes of one expert record (e.g. 1.4M)");
  cmd->add_option("--model", a->model, "GGUF model whose expert size gives the record bytes");
  cmd->add_option("--profile", a->profile, "Expert profile file (default: built from the warm-up rows)");
  cmd->add_option("--history", a->history, "Usage history file (default: built from the warm-up rows)");
  cmd->add_option("--warmup-rows", a->o.warmup_rows, "Rows that build history/profile (-1 = min(1024, rows/4))")
      ->capture_default_str();
  cmd->add_option("--half-life", a->o.half_life, "Half-life in tokens of the history built from the warm-up rows")
      ->capture_default_str();
  cmd->add_option("--pin-fraction", a->o.pin_fraction, "Share of the slots the pinned policy pins")->capture_default_str();
  cmd->add_option("--route-m", a->o.ccr_m, "ROUTE_M values for the ccr rows")->delimiter(',')->capture_default_str();
  cmd->add_option("--r-prot", a->o.r_prot, "Ranks cache-conditional routing never replaces")->capture_default_str();
  cmd->add_option("--lambda", a->o.lambda, "Logit bonus of resident experts")->capture_default_str();
  cmd->add_option("--head", a->o.head_tokens, "Also report the hit rate of the first N measured tokens")
      ->capture_default_str();
  cmd->add_option("--mse-dim", a->o.mse_dim, "Dimension of the random expert outputs behind relMSE")
      ->capture_default_str();
  cmd->add_option("--mse-seed", a->o.mse_seed, "Seed of the random expert outputs")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] {
    if (!a->expert_bytes.empty() && !a->model.empty()) fail("replay: give --expert-bytes or --model, not both");
    if (!a->expert_bytes.empty()) a->o.expert_bytes = parse_size(a->expert_bytes, "--expert-bytes");
    if (!a->model.empty()) a->o.expert_bytes = expert_bytes_of(a->model);
    const auto trace = route::TraceReader::open(a->trace);
    const auto& h = trace.header();
    for (const auto& b : a->budgets) {
      if (a->o.expert_bytes == 0) fail("replay: --budget ", b, " needs --expert-bytes or --model");
      const uint64_t slots = parse_size(b, "--budget") / (a->o.expert_bytes * uint64_t(h.n_layers));
      if (slots < uint64_t(h.top_k))
        fail("replay: --budget ", b, " holds ", slots, " experts per layer, fewer than top_k ", h.top_k);
      a->o.slots.push_back(int(std::min<uint64_t>(slots, uint64_t(h.n_experts))));
    }
    if (a->o.slots.empty()) a->o.slots = {32, 64, 128};
    std::optional<route::ExpertProfile> profile;
    std::optional<route::UsageHistory> history;
    if (!a->profile.empty()) profile = route::ExpertProfile::load(a->profile);
    if (!a->history.empty()) history = route::UsageHistory::load(a->history);
    const auto report = route::replay(trace, a->o, profile ? &*profile : nullptr, history ? &*history : nullptr);
    if (a->json)
      std::printf("%s\n", route::to_json(report).dump(2).c_str());
    else
      std::fputs(route::format_table(report).c_str(), stdout);
  });
}

}  // namespace strata::cli
