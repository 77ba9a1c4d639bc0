#include "model/model.h"

#include <algorithm>

#include "experts/pack.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/forward_common.h"
#include "model/journal.h"
#include "model/qwen4exp.h"
#include "model/route_control.h"
#include "model/window_scope.h"
#include "util/error.h"

namespace strata::model {

Model::Model(std::unique_ptr<gguf::Reader> reader, backend::Backend& backend)
    : reader_(std::move(reader)), backend_(backend) {}

Model::~Model() = default;

void Model::set_route_control(std::unique_ptr<RouteControl> control) { route_ = std::move(control); }

std::unique_ptr<Model> Model::load(const std::string& path, backend::Backend& backend,
                                   const experts::SourceOptions& experts) {
  std::unique_ptr<Model> m(new Model(gguf::Reader::open(path), backend));
  const gguf::Reader& r = *m->reader_;
  m->config_ = ModelConfig::read(r);
  const ModelConfig& c = m->config_;
  validate_tensors(r, c, experts::has_expert_stacks(r));
  m->weights_ = load_weights(r, c, backend);
  auto opened = experts::open_expert_source(r, c, backend, experts);
  m->experts_ = std::move(opened.source);
  m->experts_description_ = std::move(opened.description);
  // llama.cpp's key; absent in Qwen3 files, whose routers all renormalise (norm_topk_prob).
  if (const gguf::Value* v = r.find(cat(arch_name(c.arch), ".expert_weights_norm")))
    m->renormalize_topk_ = v->as_bool();
  return m;
}

int64_t Model::hidden_cols() const {
  return config_.arch == Arch::Qwen4Exp ? config_.hc_dim() : config_.n_embd;
}

void Model::rollback(State& state, Journal& journal, int64_t keep) {
  const int64_t undone = journal.window_rows() - keep;
  journal.rollback(state, keep);
  if (route_) route_->rewind(undone);
}

std::vector<float> Model::forward(std::span<const int32_t> tokens, State& state, LogitsMode mode,
                                  const ForwardExtras& extras) {
  const ModelConfig& c = config_;
  const int64_t T = int64_t(tokens.size());
  if (T == 0) fail("forward: the window has no tokens");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab)
      fail("token ", tokens[i], " at window row ", i, " is outside the vocabulary (0..",
           c.n_vocab - 1, ")");
  if (state.n_past + T > state.n_ctx())
    fail("context overflow: ", state.n_past, " positions done + ", T,
         " new exceed the state's context of ", state.n_ctx());
  if (int64_t(state.layers.size()) != c.n_layer)
    fail("forward: the state belongs to another model");

  ExpertWindow expert_window(*experts_);
  const KeyPart part{T, mode, &state};
  BackendWindow backend_window(backend_, window_key(std::span(&part, 1), dump_ != nullptr,
                                                    host_steps(route_ != nullptr, *experts_),
                                                    {.hidden = extras.hidden != nullptr,
                                                     .greedy = extras.greedy != nullptr,
                                                     .top_k = extras.top_k ? extras.top_k->k : 0,
                                                     .sum_temperature = extras.top_k ? extras.top_k->sum_temperature : 0.0f,
                                                     .draw_temperature = extras.top_k ? extras.top_k->draw_temperature : 0.0f,
                                                     .journal = extras.journal}));
  // The window's scratch lives inside the recording: its allocations repeat with its ops.
  Window w{backend_, c, weights_, *experts_, state, {}, tokens, T, renormalize_topk_, dump_, Scratch(backend_)};
  w.route = route_.get();
  w.journal = extras.journal;
  w.ple_counters = &ple_counters_;
  if (w.journal) w.journal->begin(state, tokens);
  for (int64_t t = 0; t < T; ++t) w.pos.push_back(int32_t(state.n_past + t));
  // Every upload of the window before layer 0 (a replay launches its graph at the last one); the
  // PLE ids first, so that their rows' reads overlap the most.
  Scratch keep(backend_);
  if (c.has_ple()) ple_start_window(w, keep, ple_prefetch_);
  w.positions = keep.ids(w.pos, T, 1);
  if (c.has_qsa()) qsa_start_window(w, keep);
  const backend::Ids token_ids = keep.ids(tokens, T, 1);
  WindowLogits out(backend_, keep, mode == LogitsMode::All ? T : 1, extras.greedy, nullptr, extras.top_k);
  // qwen4exp: the residual is hc_count streams, each starting as the embedding
  // (hidden_states.repeat(1, 1, hc_count)).
  const bool hc = c.arch == Arch::Qwen4Exp;
  Tensor x = keep(T, hc ? c.hc_dim() : c.n_embd);
  backend_.get_rows(weights_.token_embd, token_ids, x.cols_view(0, c.n_embd));  // embed_tokens(input_ids)
  w.dump("embd", -1, x.cols_view(0, c.n_embd));
  for (int64_t s = 1; hc && s < c.hc_count; ++s) backend_.copy(x.cols_view(0, c.n_embd), x.cols_view(s * c.n_embd, c.n_embd));
  if (!hc) w.input_norm = keep(T, c.n_embd);
  const LayerFn layer = layer_function(c.arch);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    layer(w, il, x);
    w.dump("layer_out", il, x);
    w.tmp.clear();
  }
  if (route_) route_->end_window(T);
  if (c.has_ple()) ple_advance_history(state.ple_history, tokens);
  // Every row's normed state when the MTP head wants them (qwen4exp's head reads the streams
  // instead), else only the rows with logits.
  const bool all = mode == LogitsMode::All || (extras.hidden && !hc);
  const Tensor rows = all ? x : x.rows_view(T - 1, 1);
  Tensor h;
  if (hc) {
    h = qwen4exp_output(w, rows);  // hyper_connection_mixer(hidden_states)
  } else {
    h = keep(rows.rows, c.n_embd);
    backend_.rms_norm(rows, &weights_.output_norm, c.n_embd, float(c.rms_eps), h);  // norm(hidden_states)
  }
  const Tensor hidden = hc ? x : h;  // read back after the window, with the logits
  if (mode == LogitsMode::Last && all) h = h.rows_view(T - 1, 1);
  w.dump("final_norm", -1, h);
  Tensor logits = keep(h.rows, c.n_vocab);
  backend_.matmul(weights_.output, h, logits);  // lm_head(hidden_states)
  out.choose(logits);
  backend_window.end();
  if (extras.hidden) {
    extras.hidden->resize(size_t(hidden.rows * hidden.cols));
    backend_.download(hidden, extras.hidden->data());
  }
  state.n_past += T;
  return out.read(logits);
}

std::vector<std::vector<float>> Model::forward_batch(std::span<const SequenceRows> sequences) {
  const ModelConfig& c = config_;
  if (sequences.empty()) fail("forward: the window has no sequences");
  // One sequence is a plain window (which a backend may record as a graph).
  if (sequences.size() == 1) {
    const SequenceRows& one = sequences[0];
    return {forward(one.tokens, *one.state, one.mode,
                    {.journal = one.journal, .hidden = one.hidden, .greedy = one.greedy, .top_k = one.top})};
  }
  std::vector<int32_t> tokens;
  std::vector<WindowSequence> parts;
  std::vector<int32_t> pos;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const SequenceRows& sq = sequences[i];
    const std::string who = cat("sequence ", i, ": ");
    const int64_t T = int64_t(sq.tokens.size());
    if (T == 0) fail("forward: ", who, "the window has no tokens");
    if (sq.journal)
      fail("forward: ", who, "a journal needs a window of the sequence alone, not one of ", sequences.size());
    for (size_t k = 0; k < sq.tokens.size(); ++k)
      if (sq.tokens[k] < 0 || sq.tokens[k] >= c.n_vocab)
        fail(who, "token ", sq.tokens[k], " at window row ", k, " is outside the vocabulary (0..",
             c.n_vocab - 1, ")");
    State& state = *sq.state;
    if (state.n_past + T > state.n_ctx())
      fail(who, "context overflow: ", state.n_past, " positions done + ", T,
           " new exceed the state's context of ", state.n_ctx());
    if (int64_t(state.layers.size()) != c.n_layer) fail("forward: ", who, "the state belongs to another model");
    for (size_t j = 0; j < i; ++j)
      if (sequences[j].state == sq.state) fail("forward: sequences ", j, " and ", i, " share one state");
    parts.push_back({int64_t(tokens.size()), T, sq.state});
    tokens.insert(tokens.end(), sq.tokens.begin(), sq.tokens.end());
    for (int64_t t = 0; t < T; ++t) pos.push_back(int32_t(state.n_past + t));
  }
  const int64_t T = int64_t(tokens.size());

  ExpertWindow expert_window(*experts_);
  // Recorded under the sequences' layout: while the same streams decode together, each step
  // replays one graph.
  std::vector<KeyPart> key_parts;
  for (const SequenceRows& sq : sequences)
    key_parts.push_back({int64_t(sq.tokens.size()), sq.mode, sq.state, sq.greedy != nullptr, sq.top ? sq.top->k : 0,
                         sq.top ? sq.top->sum_temperature : 0.0f, sq.top ? sq.top->draw_temperature : 0.0f,
                         sq.hidden != nullptr});
  BackendWindow backend_window(backend_, window_key(key_parts, dump_ != nullptr,
                                                    host_steps(route_ != nullptr, *experts_), {}));
  Window w{backend_, c, weights_, *experts_, *sequences[0].state, std::move(pos), tokens, T, renormalize_topk_, dump_,
           Scratch(backend_)};
  w.route = route_.get();
  w.sequences = parts;
  w.ple_counters = &ple_counters_;
  // Every upload before layer 0, as in forward().
  Scratch keep(backend_);
  if (c.has_ple()) ple_start_window(w, keep, ple_prefetch_);
  w.positions = keep.ids(w.pos, T, 1);
  if (c.has_qsa()) qsa_start_window(w, keep);
  const backend::Ids token_ids = keep.ids(tokens, T, 1);
  // Each sequence's logits rows (the last, or all of them), chosen from in the window where it asks.
  std::vector<int64_t> wanted;
  std::vector<WindowLogits> chosen;
  chosen.reserve(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    wanted.push_back(sequences[i].mode == LogitsMode::All ? parts[i].rows : 1);
    chosen.emplace_back(backend_, keep, wanted.back(), sequences[i].greedy, nullptr, sequences[i].top);
  }
  const bool hc = c.arch == Arch::Qwen4Exp;
  Tensor x = keep(T, hc ? c.hc_dim() : c.n_embd);
  backend_.get_rows(weights_.token_embd, token_ids, x.cols_view(0, c.n_embd));  // embed_tokens(input_ids)
  w.dump("embd", -1, x.cols_view(0, c.n_embd));
  for (int64_t s = 1; hc && s < c.hc_count; ++s) backend_.copy(x.cols_view(0, c.n_embd), x.cols_view(s * c.n_embd, c.n_embd));
  if (!hc) w.input_norm = keep(T, c.n_embd);
  const LayerFn layer = layer_function(c.arch);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    layer(w, il, x);
    w.dump("layer_out", il, x);
    w.tmp.clear();
  }
  if (route_) route_->end_window(T);
  // The rows whose logits are wanted, gathered so the head runs once for every sequence.
  int64_t n = 0;
  for (const int64_t rows : wanted) n += rows;
  Tensor rows = keep(n, x.cols);
  for (size_t i = 0, at = 0; i < parts.size(); at += size_t(wanted[i]), ++i)
    backend_.copy(x.rows_view(parts[i].first + parts[i].rows - wanted[i], wanted[i]), rows.rows_view(int64_t(at), wanted[i]));
  Tensor h;
  if (hc) {
    h = qwen4exp_output(w, rows);  // hyper_connection_mixer(hidden_states)
  } else {
    h = keep(rows.rows, c.n_embd);
    backend_.rms_norm(rows, &weights_.output_norm, c.n_embd, float(c.rms_eps), h);  // norm(hidden_states)
  }
  w.dump("final_norm", -1, h);
  // Every row's hidden state for the sequences whose MTP head reads them, as forward() gives
  // them: the normed state, or qwen4exp's streams.
  Tensor hidden;
  if (std::any_of(sequences.begin(), sequences.end(), [](const SequenceRows& sq) { return sq.hidden != nullptr; })) {
    if (hc) {
      hidden = x;
    } else {
      hidden = keep(T, c.n_embd);
      backend_.rms_norm(x, &weights_.output_norm, c.n_embd, float(c.rms_eps), hidden);  // norm(hidden_states)
    }
  }
  Tensor logits = keep(h.rows, c.n_vocab);
  backend_.matmul(weights_.output, h, logits);  // lm_head(hidden_states)
  std::vector<Tensor> own;
  for (size_t i = 0, at = 0; i < parts.size(); at += size_t(wanted[i]), ++i) {
    own.push_back(logits.rows_view(int64_t(at), wanted[i]));
    chosen[i].choose(own.back());
  }
  backend_window.end();
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < parts.size(); ++i) {
    out.push_back(chosen[i].read(own[i]));
    if (std::vector<float>* rows_hidden = sequences[i].hidden) {
      const Tensor mine = hidden.rows_view(parts[i].first, parts[i].rows);
      rows_hidden->resize(size_t(mine.rows * mine.cols));
      backend_.download(mine, rows_hidden->data());
    }
    State& state = *parts[i].state;
    if (c.has_ple()) ple_advance_history(state.ple_history, sequences[i].tokens);
    state.n_past += parts[i].rows;
  }
  return out;
}

}  // namespace strata::model
