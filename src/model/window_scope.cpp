#include "model/window_scope.h"

#include <bit>
#include <cmath>

#include "model/journal.h"
#include "util/error.h"

namespace strata::model {

namespace {

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull; }
uint64_t address(const void* p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); }

}  // namespace

uint64_t window_key(std::span<const KeyPart> parts, bool dumps, bool host_steps, const KeyExtras& extras) {
  if (dumps) return 0;
  uint64_t h = mix(mix(0xcbf29ce484222325ull, uint64_t(parts.size())), host_steps ? 1 : 0);
  h = mix(mix(mix(h, extras.mtp ? 1 : 0), extras.hidden ? 1 : 0), extras.greedy ? 1 : 0);
  h = mix(mix(h, uint64_t(extras.top_k)), uint64_t(std::bit_cast<uint32_t>(extras.sum_temperature)));
  h = mix(h, uint64_t(std::bit_cast<uint32_t>(extras.draw_temperature)));
  h = mix(mix(h, uint64_t(extras.draft_head)), uint64_t(extras.draft_tail_first));
  // The journal's copies have fixed addresses in a recording: a new layout is a new key.
  if (extras.journal) h = mix(h, extras.journal->layout());
  for (const KeyPart& p : parts) {
    h = mix(mix(h, uint64_t(p.rows)), uint64_t(p.mode));
    h = mix(mix(mix(h, p.greedy ? 1 : 0), uint64_t(p.top_k)), uint64_t(std::bit_cast<uint32_t>(p.sum_temperature)));
    h = mix(mix(h, uint64_t(std::bit_cast<uint32_t>(p.draw_temperature))), p.hidden ? 1 : 0);
    for (const LayerState& l : p.state->layers)
      for (const Tensor* t : {&l.k_cache, &l.v_cache, &l.conv, &l.ssm, &l.ple_conv, &l.idx_k, &l.idx_blocks})
        h = mix(h, address(t->data));
  }
  return h == 0 ? 1 : h;
}

bool host_steps(bool routed, const experts::ExpertSource& source) {
  return routed || source.all_resident(0).empty() || source.wants_read_ahead();
}

WindowLogits::WindowLogits(backend::Backend& be, Scratch& keep, int64_t rows, std::vector<int32_t>* greedy,
                           std::vector<float>* probs, TopLogits* top)
    : be_(be), greedy_(greedy), probs_(probs), top_(top), rows_(rows) {
  if (greedy && top) fail("forward: a window gives back greedy choices or top-k candidates, not both");
  if (probs && !greedy) fail("forward: probabilities come only with greedy choices");
  if (greedy) {
    index_ = keep.ids(rows, 1);
    if (probs) values_ = keep(rows, 1);
  } else if (top && top->draw_temperature != 0.0f) {
    if (!(top->draw_temperature > 0.0f && std::isfinite(top->draw_temperature)))
      fail("forward: a draw needs a temperature > 0, got ", top->draw_temperature);
    if (top->k != 0 || top->sum_temperature != 0.0f)
      fail("forward: a window draws the rows' tokens or gives back top-k candidates, not both");
    if (int64_t(top->uniforms.size()) != rows)
      fail("forward: a draw needs one uniform number per logits row, got ", top->uniforms.size(), " for ",
           rows, " rows");
    index_ = keep.ids(rows, 1);
    uniforms_ = keep(rows, 1);
    be_.upload(top->uniforms.data(), uniforms_);
  } else if (top) {
    if (top->k < 1 || top->k > backend::Backend::kMaxTopK)
      fail("forward: top-k candidates per row must be 1..", backend::Backend::kMaxTopK, ", got ", top->k);
    if (!(top->sum_temperature >= 0.0f && std::isfinite(top->sum_temperature)))
      fail("forward: the rows' softmax sums need a temperature > 0, got ", top->sum_temperature);
    index_ = keep.ids(rows, top->k);
    values_ = keep(rows, top->k);
    if (top->sum_temperature > 0.0f) sums_ = keep(rows, 1);
  }
}

void WindowLogits::choose(const backend::Tensor& logits) {
  if (logits.rows != rows_)
    fail("internal error: the window's choice was made for ", rows_, " logits rows, not ", logits.rows);
  if (greedy_) {
    be_.argmax(logits, index_, values_);
  } else if (top_ && top_->draw_temperature > 0.0f) {
    be_.draw(logits, top_->draw_temperature, uniforms_, index_);
  } else if (top_) {
    be_.top_k(logits, index_, values_);
    if (top_->sum_temperature > 0.0f) be_.sampling_sums(logits, top_->sum_temperature, sums_);
  }
}

std::vector<float> WindowLogits::read(const backend::Tensor& logits) {
  if (!greedy_ && !top_) {
    std::vector<float> rows(size_t(logits.rows * logits.cols));
    be_.download(logits, rows.data());
    return rows;
  }
  std::vector<int32_t>& index = greedy_ ? *greedy_ : top_->columns;
  index.resize(size_t(index_.size()));
  be_.download_ids(index_, index.data());
  std::vector<float>* values = greedy_ ? probs_ : top_->draw_temperature > 0.0f ? nullptr : &top_->logits;
  if (values) {
    values->resize(size_t(values_.rows * values_.cols));
    be_.download(values_, values->data());
  }
  if (top_ && top_->sum_temperature > 0.0f) {
    top_->sums.resize(size_t(sums_.rows));
    be_.download(sums_, top_->sums.data());
  }
  return {};
}

}  // namespace strata::model
