#include "model/model.h"

#include "experts/pack.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/forward_common.h"
#include "model/qwen4exp.h"
#include "model/route_control.h"
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

std::vector<float> Model::forward(std::span<const int32_t> tokens, State& state, LogitsMode mode) {
  const SequenceRows one{tokens, &state, mode};
  return std::move(forward_batch(std::span(&one, 1)).front());
}

std::vector<std::vector<float>> Model::forward_batch(std::span<const SequenceRows> sequences) {
  const ModelConfig& c = config_;
  if (sequences.empty()) fail("forward: the window has no sequences");
  std::vector<int32_t> tokens;
  std::vector<WindowSequence> parts;
  std::vector<int32_t> pos;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const SequenceRows& sq = sequences[i];
    // Errors name the sequence only when there are several.
    const std::string who = sequences.size() > 1 ? cat("sequence ", i, ": ") : "";
    const int64_t T = int64_t(sq.tokens.size());
    if (T == 0) fail("forward: ", who, "the window has no tokens");
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

  // The expert cache's window boundary, also when the window throws (a record that cannot be
  // read): limbo retires and no expert stays held.
  struct WindowScope {
    experts::ExpertSource& source;
    explicit WindowScope(experts::ExpertSource& s) : source(s) { source.begin_window(); }
    ~WindowScope() { source.end_window(); }
  } window_scope(*experts_);
  Window w{backend_, c, weights_, *experts_, *sequences[0].state, std::move(pos), tokens, T, renormalize_topk_, dump_,
           Scratch(backend_)};
  w.route = route_.get();
  if (parts.size() > 1) w.sequences = parts;
  Scratch keep(backend_);
  // qwen4exp: the residual is hc_count streams, each starting as the embedding
  // (hidden_states.repeat(1, 1, hc_count)).
  const bool hc = c.arch == Arch::Qwen4Exp;
  Tensor x = keep(T, hc ? c.hc_dim() : c.n_embd);
  backend_.get_rows(weights_.token_embd, tokens, x.cols_view(0, c.n_embd));  // embed_tokens(input_ids)
  w.dump("embd", -1, x.cols_view(0, c.n_embd));
  for (int64_t s = 1; hc && s < c.hc_count; ++s) backend_.copy(x.cols_view(0, c.n_embd), x.cols_view(s * c.n_embd, c.n_embd));
  const LayerFn layer = layer_function(c.arch);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    layer(w, il, x);
    w.dump("layer_out", il, x);
    w.tmp.clear();
  }
  if (route_) route_->end_window(T);
  // The rows whose logits are wanted, gathered so the head runs once for every sequence.
  Tensor rows;
  std::vector<int64_t> wanted;  // per sequence: how many rows of `rows` are its
  if (parts.size() == 1) {
    rows = sequences[0].mode == LogitsMode::All ? x : x.rows_view(T - 1, 1);
    wanted.push_back(rows.rows);
  } else {
    int64_t n = 0;
    for (size_t i = 0; i < parts.size(); ++i)
      n += wanted.emplace_back(sequences[i].mode == LogitsMode::All ? parts[i].rows : 1);
    rows = keep(n, x.cols);
    int64_t at = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t first = parts[i].first + parts[i].rows - wanted[i];
      backend_.copy(x.rows_view(first, wanted[i]), rows.rows_view(at, wanted[i]));
      at += wanted[i];
    }
  }
  Tensor h;
  if (hc) {
    h = qwen4exp_output(w, rows);  // hyper_connection_mixer(hidden_states)
  } else {
    h = keep(rows.rows, c.n_embd);
    backend_.rms_norm(rows, &weights_.output_norm, c.n_embd, float(c.rms_eps), h);  // norm(hidden_states)
  }
  w.dump("final_norm", -1, h);
  Tensor logits = keep(rows.rows, c.n_vocab);
  backend_.matmul(weights_.output, h, logits);  // lm_head(hidden_states)
  std::vector<float> all(size_t(rows.rows * c.n_vocab));
  backend_.download(logits, all.data());
  std::vector<std::vector<float>> out;
  int64_t at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto first = all.begin() + at * c.n_vocab;
    out.emplace_back(first, first + wanted[i] * c.n_vocab);
    at += wanted[i];
    State& state = *parts[i].state;
    if (c.has_ple()) ple_advance_history(state.ple_history, sequences[i].tokens);
    state.n_past += parts[i].rows;
  }
  return out;
}

}  // namespace strata::model
