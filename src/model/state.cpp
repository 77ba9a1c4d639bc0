#include "model/state.h"

#include <algorithm>

#include "util/error.h"

namespace strata::model {

namespace {
bool has(const Tensor& t) { return t.data != nullptr; }
}  // namespace

// KV rows past n_past are never read before a window writes them, so a snapshot copies only the
// used rows; conv and recurrent states are copied whole.
void State::copy_state(const LayerState& src, LayerState& dst, int64_t n_past, bool allocate) {
  for (auto [s, d] : {std::pair{&src.k_cache, &dst.k_cache}, std::pair{&src.v_cache, &dst.v_cache},
                      std::pair{&src.conv, &dst.conv}, std::pair{&src.ssm, &dst.ssm},
                      std::pair{&src.ple_conv, &dst.ple_conv}, std::pair{&src.idx_k, &dst.idx_k},
                      std::pair{&src.idx_blocks, &dst.idx_blocks}}) {
    if (!has(*s)) continue;
    if (allocate) *d = backend_->alloc(s->rows, s->cols);
    const bool kv = s == &src.k_cache || s == &src.v_cache || s == &src.idx_k;
    if (kv)
      backend_->copy(s->rows_view(0, n_past), d->rows_view(0, n_past));
    else
      backend_->copy(*s, *d);
  }
}

State::State(backend::Backend& backend, const ModelConfig& c, int64_t n_ctx, Kind kind)
    : backend_(&backend), n_ctx_(n_ctx) {
  if (n_ctx < 1 || n_ctx > c.n_ctx)
    fail("context of ", n_ctx, " positions is outside 1..", c.n_ctx,
         " (the model's context_length)");
  const bool mtp = kind == Kind::Mtp;
  layers.resize(size_t(mtp ? c.n_blocks() : c.n_layer));
  for (int64_t il = mtp ? c.n_layer : 0; il < int64_t(layers.size()); ++il) {
    LayerState& l = layers[size_t(il)];
    if (c.is_linear(il)) {
      l.conv = backend.alloc(c.ssm_conv - 1, c.ssm_conv_dim());
      l.ssm = backend.alloc(c.ssm_v_heads * c.ssm_state, c.ssm_state);
    } else {
      l.k_cache = backend.alloc(n_ctx, c.n_head_kv * c.head_dim);
      l.v_cache = backend.alloc(n_ctx, c.n_head_kv * c.head_dim);
    }
    if (c.has_ple() && c.ple_index(il) >= 0) l.ple_conv = backend.alloc((c.ple_conv - 1) * c.ple_ngram, c.hc_dim());
    if (c.arch == Arch::Qwen4Exp && !c.is_linear(il)) {
      l.idx_k = backend.alloc(n_ctx, c.idx_head_dim);
      l.idx_blocks = backend.alloc(std::max<int64_t>(1, n_ctx / c.idx_block), c.idx_head_dim);
    }
  }
  if (c.has_ple()) ple_history.assign(size_t(c.ple_ngram - 1), int32_t(c.ple_eos));
  ple_eos_ = int32_t(c.ple_eos);
}

State::~State() { release_all(); }

void State::release_all() {
  for (LayerState& l : layers)
    for (Tensor* t : {&l.k_cache, &l.v_cache, &l.conv, &l.ssm, &l.ple_conv, &l.idx_k, &l.idx_blocks})
      if (has(*t)) backend_->release(*t);
  layers.clear();
}

State::State(const State& other)
    : n_past(other.n_past), ple_history(other.ple_history), backend_(other.backend_),
      n_ctx_(other.n_ctx_), ple_eos_(other.ple_eos_) {
  layers.resize(other.layers.size());
  for (size_t i = 0; i < layers.size(); ++i) copy_state(other.layers[i], layers[i], n_past, true);
}

State& State::operator=(const State& other) {
  if (this == &other) return *this;
  if (other.backend_ != backend_ || other.n_ctx_ != n_ctx_ || other.layers.size() != layers.size())
    fail("state: cannot assign a state of another model, backend or context size");
  for (size_t i = 0; i < layers.size(); ++i)
    copy_state(other.layers[i], layers[i], other.n_past, false);
  n_past = other.n_past;
  ple_history = other.ple_history;
  return *this;
}

void State::reset() {
  for (LayerState& l : layers)
    for (Tensor* t : {&l.k_cache, &l.v_cache, &l.conv, &l.ssm, &l.ple_conv, &l.idx_k, &l.idx_blocks})
      if (has(*t)) backend_->fill(*t, 0.0f);
  n_past = 0;
  std::fill(ple_history.begin(), ple_history.end(), ple_eos_);
}

}  // namespace strata::model
