// strata replay: closed-loop cache simulation over a routing trace (see route/replay.h and
// docs/ROUTING.md): hit rate, misses and bytes per token for LRU, profile-pinned, history-blended
// and cache-conditional variants at several budgets, plus the routed relative MSE of the latter.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "experts/pack.h"
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

// One expert record's bytes: from the pack when there is one (PATH itself when it is a .experts
// pack, the pack a trunk-only GGUF names, or PATH.experts), else the pack layout of the GGUF's
// layer-0 expert stacks, which is what `strata pack` would write.
uint64_t expert_bytes_of(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.ends_with(".experts")) return experts::Pack::open(path)->max_record_bytes();
  const auto reader = gguf::Reader::open(path);
  if (reader->find(experts::kPackKey)) {
    const fs::path pack = fs::path(path).parent_path() / reader->get_string(experts::kPackKey);
    return experts::Pack::open(pack.string())->max_record_bytes();
  }
  if (fs::exists(path + ".experts")) return experts::Pack::open(path + ".experts")->max_record_bytes();
  experts::Part parts[3];
  for (int i = 0; i < 3; ++i) {
    const auto& t = reader->tensor(experts::expert_stack_name(0, i));
    if (t.shape.size() != 3) fail(path, ": ", t.name, " is not an expert stack");
    parts[i].type = t.type;
    parts[i].rows = t.shape[1];
    parts[i].cols = t.shape[0];
  }
  return experts::make_layout(parts[0], parts[1], parts[2]).record_bytes;
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
  cmd->add_option("--model", a->model, "Model (GGUF, or its .experts pack) whose expert record size gives the bytes");
  cmd->add_option("--profile", a->profile, "Expert profile file (default: built from the warm-up rows)");
  cmd->add_option("--history", a->history, "Usage history file (default: built from the warm-up rows)");
  cmd->add_option("--warmup-rows", a->o.warmup_rows, "Rows that build history/profile (-1 = min(1024, rows/4))")
      ->capture_default_str();
  cmd->add_option("--half-life", a->o.half_life, "Half-life in tokens of the history built from the warm-up rows")
      ->capture_default_str();
  cmd->add_option("--pin-fraction", a->o.pin_fraction, "Share of the slots the pinned policy pins")->capture_default_str();
  CLI::Option* route_m =
      cmd->add_option("--route-m", a->o.ccr_m, "ROUTE_M values for the ccr rows (default: those of 16,24,32 the trace's candidates allow)")
          ->delimiter(',');
  cmd->add_option("--r-prot", a->o.r_prot, "Ranks cache-conditional routing never replaces")->capture_default_str();
  cmd->add_option("--lambda", a->o.lambda, "Logit bonus of resident experts")->capture_default_str();
  cmd->add_option("--head", a->o.head_tokens, "Also report the hit rate of the first N measured tokens")
      ->capture_default_str();
  cmd->add_option("--mse-dim", a->o.mse_dim, "Dimension of the random expert outputs behind relMSE")
      ->capture_default_str();
  cmd->add_option("--mse-seed", a->o.mse_seed, "Seed of the random expert outputs")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a, route_m] {
    if (!a->expert_bytes.empty() && !a->model.empty()) fail("replay: give --expert-bytes or --model, not both");
    if (!a->expert_bytes.empty()) a->o.expert_bytes = parse_size(a->expert_bytes, "--expert-bytes");
    if (!a->model.empty()) a->o.expert_bytes = expert_bytes_of(a->model);
    if (!a->budgets.empty() && a->o.expert_bytes == 0)
      fail("replay: --budget ", a->budgets.front(), " needs --expert-bytes or --model");
    const auto trace = route::TraceReader::open(a->trace);
    const auto& h = trace.header();
    if (route_m->count() == 0 && h.top_m > 0)
      std::erase_if(a->o.ccr_m, [&](int m) { return m > h.top_m; });
    for (const auto& b : a->budgets) {
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
