// strata bench: prefill and decode speed of a model with its expert cache, as JSON; --parallel N
// decodes N sequences per window
// (docs/EXPERT_CACHE.md, "strata bench"). The tokens are fixed pseudo-random ids from --seed, so
// a run needs no tokenizer text and two runs feed the same tokens; with --route-trace the experts
// come from the trace, which gives the cache realistic locality on a synthetic model.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/device_flag.h"
#include "cli/sampling_flags.h"
#include "cli/expert_flags.h"
#include "cli/ple_flags.h"
#include "cli/route_flags.h"
#include "cli/spec_flags.h"
#include "decode/generate.h"
#include "decode/loaded_model.h"
#include "experts/arena.h"
#include "experts/streaming_source.h"
#include "model/route_control.h"
#include "util/cpu.h"
#include "util/error.h"
#include "util/run_counters.h"

namespace strata::cli {

namespace {

struct BenchOptions {
  std::string model;
  ExpertFlags experts;
  PleFlags ple;
  int64_t prompt_tokens = 512;
  int64_t gen_tokens = 64;
  int64_t batch = 512;
  std::string device = "auto";
  int threads = 0;
  uint64_t seed = 1;
  RouteFlags route;
  SpecFlags spec;
  std::string continue_from;  // forced-continuation mode: the text whose tokens are the output
  int64_t parallel = 1;       // sequences sharing each decode window
  // How a decode window ends: "device" chooses each sequence's greedy token on the device and
  // reads back its id (as generation does at temperature 0), "logits" reads the rows back.
  std::string choose = "device";
  // Decode windows run after the prefill and before the timed ones (none without decode tokens):
  // on the GPU the first windows of a shape run op by op and record its graph, a one-time cost
  // that llama-bench's warm-up run leaves out of its figures too.
  int64_t warmup = 2;
  decode::SamplingParams sampling;  // forced continuation: how the target chooses (its choice is then replaced)
};

// kB figures of /proc/self/status (or another file of "Key: N kB" lines), in bytes; 0 when absent.
uint64_t proc_status_bytes(const std::string& field, const char* file = "/proc/self/status") {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with(field + ":")) return std::stoull(line.substr(field.size() + 1)) * 1024;
  return 0;
}

// What the backend did in a phase, per token: ops run one by one, windows replayed as graphs and
// the kernels those graphs ran.
nlohmann::ordered_json backend_json(int64_t tokens, const backend::BackendCounters& before,
                                    const backend::BackendCounters& after) {
  const double per_token = tokens > 0 ? 1.0 / double(tokens) : 0.0;
  nlohmann::ordered_json j = {
      {"ops_per_token", double(after.ops - before.ops) * per_token},
      {"graph_replays_per_token", double(after.graph_replays - before.graph_replays) * per_token},
      {"graph_kernels_per_token", double(after.graph_kernels - before.graph_kernels) * per_token},
      {"graph_captures", after.graph_captures - before.graph_captures},
      {"warming_windows", after.warming_windows - before.warming_windows}};
  // Host steps (the expert cache's handshakes, route controls): device time per step, and the
  // part of it spent waiting for the host's answer.
  if (const uint64_t steps = after.host_steps - before.host_steps; steps > 0) {
    j["host_steps_per_token"] = double(steps) * per_token;
    j["host_step_us"] = (after.host_step_seconds - before.host_step_seconds) * 1e6 / double(steps);
    if (const uint64_t answered = after.handshakes - before.handshakes; answered > 0)
      j["handshake_us"] = (after.handshake_seconds - before.handshake_seconds) * 1e6 / double(answered);
  }
  if (after.op_times.empty()) return j;
  // The op profile (STRATA_CUDA_PROFILE=1): device time per op family, slowest first.
  std::vector<std::pair<std::string, backend::OpTime>> ops;
  double total_us = 0;
  for (const auto& [name, t] : after.op_times) {
    backend::OpTime d = t;
    if (const auto it = before.op_times.find(name); it != before.op_times.end()) {
      d.calls -= it->second.calls;
      d.us -= it->second.us;
    }
    if (d.calls == 0) continue;
    total_us += d.us;
    ops.emplace_back(name, d);
  }
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  nlohmann::ordered_json per_op = nlohmann::ordered_json::object();
  for (const auto& [name, t] : ops)
    per_op[name] = {{"calls_per_token", double(t.calls) * per_token},
                    {"us_per_token", t.us * per_token},
                    {"us_per_call", t.us / double(t.calls)}};
  j["profiled_us_per_token"] = total_us * per_token;
  j["profiled_windows_discarded"] = after.profiled_windows_discarded - before.profiled_windows_discarded;
  j["op_profile"] = std::move(per_op);
  return j;
}

// What the cache did from one reading of its counters to a later one (none without a cache).
std::optional<experts::CacheStats> between(const std::optional<experts::CacheStats>& before,
                                           const std::optional<experts::CacheStats>& after) {
  if (!before || !after) return std::nullopt;
  return after->since(*before);
}

// One phase's speed and what the cache did during it.
nlohmann::ordered_json phase_json(int64_t tokens, double seconds, const std::optional<experts::CacheStats>& cache,
                                  uint64_t slot_bytes) {
  nlohmann::ordered_json j;
  j["tokens"] = tokens;
  j["seconds"] = seconds;
  j["tok_per_s"] = seconds > 0 ? double(tokens) / seconds : 0.0;
  if (!cache) return j;
  const experts::CacheStats& c = *cache;
  const double per_token = tokens > 0 ? 1.0 / double(tokens) : 0.0;
  j["hit_rate"] = c.hit_rate();
  j["hits"] = c.hits;
  j["misses"] = c.misses;
  j["bytes_read"] = c.bytes_read;
  j["gb_per_s_read"] = c.read_seconds > 0 ? double(c.bytes_read) / c.read_seconds / 1e9 : 0.0;
  j["bytes_read_per_token"] = double(c.bytes_read) * per_token;
  // Urgent misses only, at the slot size (records are padded to it): what the forward waited for.
  j["bytes_missed_per_token"] = double(c.misses) * double(slot_bytes) * per_token;
  j["stall_ms_per_token"] = c.stall_seconds * 1e3 * per_token;
  // Copies into device expert slots (CUDA), over the copy engine's time.
  j["h2d_bytes"] = c.h2d_bytes;
  j["h2d_gb_per_s"] = c.h2d_seconds > 0 ? double(c.h2d_bytes) / c.h2d_seconds / 1e9 : 0.0;
  // The host tier (--host-budget): device misses it answered, and its reads from the pack.
  j["host_hit_rate"] = c.host_hit_rate();
  j["host_hits"] = c.host_hits;
  j["host_reads"] = c.host_reads;
  // The per-layer handshakes of device windows: the device's wait for the host's answer.
  j["handshakes_per_token"] = double(c.handshakes) * per_token;
  j["handshake_us"] = c.handshake_us();
  j["read_ahead_accuracy"] = c.read_ahead_accuracy();
  j["read_ahead_skipped"] = c.read_ahead_skipped;
  // Bytes read ahead that became hits per byte read ahead, and the guesses its value cap held back.
  j["read_ahead_bytes_per_token"] = double(c.read_ahead_bytes) * per_token;
  j["read_ahead_useful_bytes_per_token"] = double(c.read_ahead_useful_bytes) * per_token;
  j["read_ahead_value"] = c.read_ahead_value();
  j["read_ahead_capped"] = c.read_ahead_capped;
  j["evictions"] = c.evictions;
  return j;
}

// Where a phase's time went, per token (docs/PERFORMANCE.md, "Where a streamed token's time
// goes"): the forward thread's wall time split into the stall for expert records, the wait for
// the pool's helpers and the rest (its own compute), next to what the scheduler says each group
// of threads did (on a CPU, or runnable but waiting for one), plus page faults, context switches
// and how often the pool ran steps alone because its helpers were late.
nlohmann::ordered_json accounting_json(int64_t tokens, double seconds, const util::RunSample& d,
                                       double stall_seconds) {
  const double per_token = tokens > 0 ? 1.0 / double(tokens) : 0.0;
  const auto ms = [&](double s) { return s * 1e3 * per_token; };
  const auto ns_ms = [&](uint64_t ns) { return double(ns) * 1e-6 * per_token; };
  const double pool_wait = double(d.pool_wait_ns) * 1e-9;
  nlohmann::ordered_json time = {{"wall", ms(seconds)},
                                 {"stall", ms(stall_seconds)},
                                 {"pool_wait", ms(pool_wait)},
                                 {"compute", ms(std::max(0.0, seconds - stall_seconds - pool_wait))}};
  if (d.schedstat) {
    const double caller_on = double(d.caller.cpu_ns + d.caller.runqueue_ns) * 1e-9;
    time["forward_cpu"] = ns_ms(d.caller.cpu_ns);
    time["forward_runqueue"] = ns_ms(d.caller.runqueue_ns);
    time["forward_off_cpu"] = ms(std::max(0.0, seconds - caller_on));
    time["pool_helpers_cpu"] = ns_ms(d.pool.cpu_ns);
    time["pool_helpers_runqueue"] = ns_ms(d.pool.runqueue_ns);
    time["readers_cpu"] = ns_ms(d.readers.cpu_ns);
    time["readers_runqueue"] = ns_ms(d.readers.runqueue_ns);
    time["other_threads_cpu"] = ns_ms(d.other.cpu_ns);
  }
  return {{"ms_per_token", time},
          {"minor_faults_per_token", double(d.minor_faults) * per_token},
          {"major_faults_per_token", double(d.major_faults) * per_token},
          {"context_switches_per_token",
           {{"voluntary", double(d.voluntary_switches) * per_token},
            {"involuntary", double(d.involuntary_switches) * per_token}}},
          {"pool",
           {{"steps_per_token", double(d.pool_steps) * per_token},
            {"run_alone_steps_per_token", double(d.pool_inline_steps) * per_token},
            {"run_alone_switches", d.pool_inline_switches},
            {"helper_wakes_per_token", double(d.pool_helper_wakes) * per_token},
            {"caller_sleeps_per_token", double(d.pool_caller_sleeps) * per_token}}}};
}

nlohmann::ordered_json spec_json(const spec::Report& r, int max_depth) {
  nlohmann::ordered_json j;
  j["mode"] = spec::mode_name(r.mode);
  j["exact"] = !r.typical;
  j["windows"] = r.windows;
  j["drafted_windows"] = r.drafted_windows;
  j["mtp_windows"] = r.source_windows[size_t(spec::Source::Mtp)];
  j["suffix_windows"] = r.source_windows[size_t(spec::Source::Suffix)];
  j["drafted"] = r.drafted;
  j["accepted"] = r.accepted;
  j["tokens_per_window"] = r.mean_tokens_per_window();
  j["accepted_per_drafted_window"] = r.mean_accepted_per_window();
  j["t1_ms"] = r.t1 ? nlohmann::ordered_json(*r.t1 * 1e3) : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json ratio = nlohmann::ordered_json::object();
  for (size_t i = 0; i < r.t_ratio.size(); ++i)
    if (r.t_ratio[i] > 0) ratio[std::to_string(i + 2)] = r.t_ratio[i];
  j["t_ratio"] = ratio;  // T(n)/T(1) by row count n
  nlohmann::ordered_json acc = nlohmann::ordered_json::array();
  for (int p = 1; p <= spec::kMaxDepth; ++p) {
    int64_t judged = 0;
    for (const auto& s : r.judged) judged += s[size_t(p)];
    if (judged == 0) break;
    acc.push_back({{"position", p}, {"judged", judged}, {"acceptance", r.acceptance(p)}});
  }
  j["acceptance_by_position"] = acc;
  j["rollbacks"] = r.rollbacks;
  j["snapshot_ms"] = r.snapshot_seconds * 1e3;
  j["rollback_ms"] = r.rollback_seconds * 1e3;
  j["draft_ms"] = r.draft_seconds * 1e3;
  // SpecGate's own estimates at the end of the run, at the positions its depth limit reaches.
  nlohmann::ordered_json gate = {{"probes", r.probes}};
  for (spec::Source s : {spec::Source::Mtp, spec::Source::Suffix}) {
    nlohmann::ordered_json estimate = nlohmann::ordered_json::array();
    for (int p = 1; p <= max_depth; ++p) estimate.push_back(r.estimated[size_t(s)][size_t(p)]);
    gate["acceptance_estimate"][spec::source_name(s)] = estimate;
    gate["best_value"][spec::source_name(s)] = r.best_value[size_t(s)];
  }
  j["gate"] = gate;
  return j;
}

// The counters a phase's figures are differences of, read at one moment.
struct Mark {
  std::optional<experts::CacheStats> cache;
  backend::BackendCounters backend;
  model::PleCounters ple;
  util::RunSample run;
};

Mark mark(model::Model& m) { return {m.expert_stats(), m.backend().counters(), m.ple_counters(), util::sample_run()}; }

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The decode windows: decode(i) for i in [from, first_timed) as warm-up, then timed up to `to`.
struct DecodeRun {
  double warmup_seconds = 0.0;
  Mark before;
  double seconds = 0.0;
  Mark after;
};

template <class Decode>
DecodeRun run_decode_windows(model::Model& m, int64_t from, int64_t first_timed, int64_t to, const Decode& decode) {
  DecodeRun r;
  auto t0 = Clock::now();
  for (int64_t i = from; i < first_timed; ++i) decode(i);
  r.warmup_seconds = seconds_since(t0);
  r.before = mark(m);
  t0 = Clock::now();
  for (int64_t i = first_timed; i < to; ++i) decode(i);
  r.seconds = seconds_since(t0);
  r.after = mark(m);
  return r;
}

// The report's prefill and decode objects, for `sequences` sequences each prefilled
// o.prompt_tokens and decoded o.gen_tokens after `warmup` windows.
void phase_reports(nlohmann::ordered_json& j, const BenchOptions& o, model::Model& m, int64_t sequences,
                   int64_t warmup, uint64_t slot_bytes, const Mark& start, double prefill_s,
                   const Mark& after_prefill, const DecodeRun& d) {
  const int64_t prefilled = o.prompt_tokens * sequences, decoded = o.gen_tokens * sequences;
  // The prefill phase ends where the decode phase starts (not at the end of the run).
  const auto prefill_cache = between(start.cache, after_prefill.cache);
  const auto decode_cache = between(d.before.cache, d.after.cache);
  j["prefill"] = phase_json(prefilled, prefill_s, prefill_cache, slot_bytes);
  j["prefill"]["accounting"] = accounting_json(prefilled, prefill_s, after_prefill.run.since(start.run),
                                               prefill_cache ? prefill_cache->stall_seconds : 0.0);
  j["decode"] = phase_json(decoded, d.seconds, decode_cache, slot_bytes);
  j["decode"]["choose"] = o.choose;
  j["decode"]["warmup"] = {{"windows", warmup}, {"seconds", d.warmup_seconds}};
  j["decode"]["accounting"] = accounting_json(decoded, d.seconds, d.after.run.since(d.before.run),
                                              decode_cache ? decode_cache->stall_seconds : 0.0);
  if (m.config().has_ple()) {  // what its n-gram row reads cost
    j["prefill"]["ple"] = ple_json(o.ple, prefilled, start.ple, after_prefill.ple);
    j["decode"]["ple"] = ple_json(o.ple, decoded, d.before.ple, d.after.ple);
  }
  if (std::string_view(m.backend().name()) != "cpu") {  // the CPU backend runs no graphs
    j["prefill"]["backend"] = backend_json(prefilled, start.backend, after_prefill.backend);
    j["decode"]["backend"] = backend_json(decoded, d.before.backend, d.after.backend);
  }
}

// Forced continuation (docs/SPECULATION.md, "Measuring it honestly"): the text's first
// --prompt-tokens tokens are the prompt and its next --gen-tokens tokens replace the model's
// choices, so drafters meet real text while every window still computes in full.
void run_continue(const BenchOptions& o) {
  std::ifstream in(o.continue_from, std::ios::binary);
  if (!in) fail("--continue-from: cannot read ", o.continue_from);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int64_t ctx = o.prompt_tokens + o.gen_tokens + spec::kMaxDepth + 1;
  decode::LoadedModel lm({.path = o.model, .device = o.device, .threads = o.threads, .ctx = ctx,
                          .ctx_source = "--prompt-tokens + --gen-tokens + the deepest draft",
                          .experts = source_options(o.experts)});
  model::Model& m = lm.model();
  const std::vector<int32_t> tokens = lm.encode(text);
  if (int64_t(tokens.size()) < o.prompt_tokens + o.gen_tokens)
    fail("--continue-from: ", o.continue_from, " has ", tokens.size(), " tokens, fewer than --prompt-tokens + --gen-tokens (",
         o.prompt_tokens + o.gen_tokens, ")");
  RouteFlags route = o.route;
  route.no_history = true;
  install_routing(m, route, o.experts.pack);
  apply_ple_flags(o.ple, m);
  spec::Options so = spec_options(o.spec);
  so.knob_seed = o.seed;
  decode::Session session(m, lm.tokenizer(), {.n_ctx = ctx, .spec = so});
  decode::GenerateParams p;
  p.max_tokens = o.gen_tokens;
  p.batch = o.batch;
  p.sampling = o.sampling;
  p.sampling.seed = o.seed;
  const auto prompt = std::span(tokens).first(size_t(o.prompt_tokens));
  p.forced.assign(tokens.begin() + o.prompt_tokens, tokens.begin() + o.prompt_tokens + o.gen_tokens);
  const auto start = m.expert_stats();
  const decode::GenerateResult r = session.generate(prompt, p, {});
  const decode::Telemetry& t = r.telemetry;

  nlohmann::ordered_json j;
  j["model"] = o.model;
  j["experts"] = m.experts_description();
  j["device"] = lm.device_description();
  j["threads"] = lm.threads();
  j["isa"] = isa_name(cpu_features().level());
  j["expert_budget"] = o.experts.budget.empty() ? "default" : o.experts.budget;
  j["route_trace"] = o.route.trace;
  j["continue_from"] = o.continue_from;
  j["sampling"] = {{"temperature", p.sampling.temperature}, {"top_k", p.sampling.top_k},
                   {"top_p", p.sampling.top_p}, {"min_p", p.sampling.min_p}};
  j["text_tokens"] = tokens.size();
  j["prefill"] = {{"tokens", t.prompt_tokens}, {"seconds", t.prefill_seconds},
                  {"tok_per_s", t.prefill_tok_per_s().value_or(0.0)}};
  j["decode"] = {{"tokens", t.decode_tokens}, {"windows", t.decode_steps}, {"seconds", t.decode_seconds},
                 {"tok_per_s", t.decode_tok_per_s().value_or(0.0)}};
  if (auto c = m.expert_stats(); c && start) j["decode"]["hit_rate"] = c->since(*start).hit_rate();
  if (t.spec) {
    j["spec"] = spec_json(*t.spec, std::max(so.max_depth, so.depth.value_or(0)));
    const int64_t n_vocab = m.config().n_vocab;
    if (m.has_mtp())
      j["spec"]["draft_vocab"] = spec::draft_vocab(m, lm.tokenizer().vocab(), so.draft_vocab).size(n_vocab);
    if (so.mtp_acceptance_knob > 0)
      j["spec"]["mtp_acceptance_knob"] = cat("MTP drafts are the text's next token with probability ", so.mtp_acceptance_knob,
                                             " per position (a knob set to published figures, not this model's head)");
  } else {
    j["spec"] = {{"mode", "off"}};
  }
  finish_routing(m);
  std::printf("%s\n", j.dump(2).c_str());
}

// --parallel N: N sequences, each with its own pseudo-random prompt (prefilled one after the
// other), then --gen-tokens decode windows of N rows each (Model::forward_batch), as a server
// with --parallel N decodes N streams. Reports the aggregate decode speed.
void run_parallel(const BenchOptions& o) {
  const int64_t warmup = o.gen_tokens > 0 ? o.warmup : 0, first_timed = o.prompt_tokens + warmup;
  const int64_t ctx = first_timed + o.gen_tokens;
  decode::LoadedModel lm({.path = o.model, .device = o.device, .threads = o.threads, .ctx = ctx,
                          .ctx_source = "--prompt-tokens + --warmup + --gen-tokens", .experts = source_options(o.experts)});
  model::Model& m = lm.model();
  RouteFlags route = o.route;
  route.no_history = true;
  install_routing(m, route, o.experts.pack);
  apply_ple_flags(o.ple, m);
  const auto* streaming = dynamic_cast<const experts::StreamingSource*>(&m.expert_source());
  const uint64_t slot_bytes = streaming ? streaming->arena().slot_bytes() : 0;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(m.config().n_vocab - 1));
  std::vector<std::vector<int32_t>> tokens(size_t(o.parallel), std::vector<int32_t>(size_t(ctx)));
  for (auto& seq : tokens)
    for (int32_t& t : seq) t = pick(rng);
  std::vector<model::State> states;
  for (int64_t i = 0; i < o.parallel; ++i) states.push_back(m.new_state(ctx));

  const Mark start = mark(m);
  const auto t0 = Clock::now();
  for (size_t s = 0; s < tokens.size(); ++s)
    for (int64_t i = 0; i < o.prompt_tokens; i += o.batch)
      m.forward(std::span(tokens[s]).subspan(size_t(i), size_t(std::min(o.batch, o.prompt_tokens - i))), states[s],
                model::LogitsMode::Last);
  const double prefill_s = seconds_since(t0);
  const Mark after_prefill = mark(m);
  std::vector<model::Model::SequenceRows> rows(tokens.size());
  std::vector<std::vector<int32_t>> chosen(tokens.size());
  const DecodeRun d = run_decode_windows(m, o.prompt_tokens, first_timed, ctx, [&](int64_t i) {
    for (size_t s = 0; s < tokens.size(); ++s)
      rows[s] = {.tokens = std::span(tokens[s]).subspan(size_t(i), 1),
                 .state = &states[s],
                 .greedy = o.choose == "device" ? &chosen[s] : nullptr};
    m.forward_batch(rows);
  });
  nlohmann::ordered_json j;
  j["model"] = o.model;
  j["experts"] = m.experts_description();
  j["device"] = lm.device_description();
  j["threads"] = lm.threads();
  j["isa"] = isa_name(cpu_features().level());
  j["expert_budget"] = o.experts.budget.empty() ? "default" : o.experts.budget;
  j["parallel"] = o.parallel;
  j["seed"] = o.seed;
  phase_reports(j, o, m, o.parallel, warmup, slot_bytes, start, prefill_s, after_prefill, d);
  j["decode"]["windows"] = o.gen_tokens;
  j["decode"]["tok_per_s_per_sequence"] = d.seconds > 0 ? double(o.gen_tokens) / d.seconds : 0.0;
  j["rss"] = {{"vm_hwm_bytes", proc_status_bytes("VmHWM")},
              {"vm_rss_bytes", proc_status_bytes("VmRSS")},
              {"anon_huge_pages_bytes", proc_status_bytes("AnonHugePages", "/proc/self/smaps_rollup")}};
  finish_routing(m);
  std::printf("%s\n", j.dump(2).c_str());
}

void run_bench(const BenchOptions& o) {
  if (o.prompt_tokens < 1 || o.gen_tokens < 0 || o.batch < 1)
    fail("--prompt-tokens and --batch must be at least 1, --gen-tokens at least 0");
  if (o.parallel < 1 || o.parallel > 64) fail("--parallel: ", o.parallel, " is outside 1..64");
  if (o.parallel > 1 && !o.continue_from.empty()) fail("--parallel: not with --continue-from");
  if (!o.continue_from.empty()) return run_continue(o);
  if (!(o.sampling == decode::SamplingParams{}))
    fail("--temp, --top-k, --top-p, --min-p and the penalties need --continue-from (without it no window samples)");
  if (o.parallel > 1) return run_parallel(o);
  const int64_t warmup = o.gen_tokens > 0 ? o.warmup : 0, first_timed = o.prompt_tokens + warmup;
  const int64_t ctx = first_timed + o.gen_tokens;
  decode::LoadedModel lm({.path = o.model, .device = o.device, .threads = o.threads, .ctx = ctx,
                          .ctx_source = "--prompt-tokens + --warmup + --gen-tokens", .experts = source_options(o.experts)});
  model::Model& m = lm.model();
  RouteFlags route = o.route;
  route.no_history = true;  // a benchmark must not depend on, nor change, earlier runs
  install_routing(m, route, o.experts.pack);
  apply_ple_flags(o.ple, m);
  const auto* streaming = dynamic_cast<const experts::StreamingSource*>(&m.expert_source());
  const uint64_t slot_bytes = streaming ? streaming->arena().slot_bytes() : 0;

  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(m.config().n_vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(ctx));
  for (int32_t& t : tokens) t = pick(rng);

  model::State state = m.new_state(ctx);
  const Mark start = mark(m);
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < o.prompt_tokens; i += o.batch) {
    const int64_t n = std::min(o.batch, o.prompt_tokens - i);
    m.forward(std::span(tokens).subspan(size_t(i), size_t(n)), state, model::LogitsMode::Last);
  }
  const double prefill_s = seconds_since(t0);
  const Mark after_prefill = mark(m);
  std::vector<int32_t> chosen;
  const model::ForwardExtras extras{.greedy = o.choose == "device" ? &chosen : nullptr};
  const DecodeRun d = run_decode_windows(m, o.prompt_tokens, first_timed, ctx, [&](int64_t i) {
    m.forward(std::span(tokens).subspan(size_t(i), 1), state, model::LogitsMode::Last, extras);
  });

  nlohmann::ordered_json j;
  j["model"] = o.model;
  j["experts"] = m.experts_description();
  j["device"] = lm.device_description();
  j["threads"] = lm.threads();
  j["isa"] = isa_name(cpu_features().level());
  j["expert_budget"] = o.experts.budget.empty() ? "default" : o.experts.budget;
  j["route_trace"] = o.route.trace;
  j["seed"] = o.seed;
  phase_reports(j, o, m, 1, warmup, slot_bytes, start, prefill_s, after_prefill, d);
  if (streaming) {
    // Over the whole run: a phase's read_ahead_value counts the hits it got from reads of earlier
    // phases too, so it can exceed 1 where a phase reads ahead little.
    j["cache"] = {{"slots", streaming->arena().n_slots()},
                  {"slot_bytes", slot_bytes},
                  {"pinned", streaming->arena().pinned_count()},
                  {"read_ahead_value", m.expert_stats()->read_ahead_value()}};
  }
  if (const model::RouteControl* rc = m.route_control(); rc && o.route.ccr.enabled) {
    const route::CcrStats& s = rc->ccr_stats();
    j["ccr"] = {{"substitution_rate", s.substitution_rate()}, {"agreement", s.agreement()}, {"mean_kl", s.mean_kl()}};
  }
  j["rss"] = {{"vm_hwm_bytes", proc_status_bytes("VmHWM")},
              {"vm_rss_bytes", proc_status_bytes("VmRSS")},
              {"anon_huge_pages_bytes", proc_status_bytes("AnonHugePages", "/proc/self/smaps_rollup")}};
  finish_routing(m);
  std::printf("%s\n", j.dump(2).c_str());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Prefill and decode speed with the expert cache, as JSON");
  cmd->add_option("-m,--model", o->model, "GGUF model")->required();
  add_expert_flags(cmd, o->experts);
  add_ple_flags(cmd, o->ple);
  cmd->add_option("-p,--prompt-tokens", o->prompt_tokens, "Prefill tokens")->capture_default_str();
  cmd->add_option("-n,--gen-tokens", o->gen_tokens, "Decode steps, one token each")->capture_default_str();
  cmd->add_option("--batch", o->batch, "Rows per prefill window")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads (default: one per hardware thread)");
  add_device_flag(cmd, o->device);
  cmd->add_option("--seed", o->seed, "Seed of the pseudo-random token ids")->capture_default_str();
  add_route_flags(cmd, o->route, false);
  cmd->add_option("--continue-from", o->continue_from,
                  "Forced continuation: prompt and output are this text's tokens, drafts are verified "
                  "against them (docs/SPECULATION.md)");
  add_spec_flags(cmd, o->spec, true);
  // Only with --continue-from, where the target still chooses (the choice's cost counts).
  add_sampling_flags(cmd, o->sampling);
  cmd->add_option("--parallel", o->parallel,
                  "Sequences sharing each decode window (continuous batching); decode speed is their sum")
      ->capture_default_str();
  cmd->add_option("--choose", o->choose,
                  "How each decode window ends: device (the greedy token chosen on the device, its id "
                  "read back, as generation at temperature 0) or logits (every logits row read back)")
      ->check(CLI::IsMember({"device", "logits"}))
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup,
                  "Decode windows run before the timed ones and not counted (on the GPU the first ones "
                  "record the decode window's graph; none without --gen-tokens)")
      ->check(CLI::Range(int64_t(0), int64_t(64)))
      ->capture_default_str();
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace strata::cli
