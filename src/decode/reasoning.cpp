#include "decode/reasoning.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/error.h"

namespace strata::decode {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

bool all_space(std::string_view text) { return std::all_of(text.begin(), text.end(), is_space); }

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

std::string_view trim_back(std::string_view text) {
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

}  // namespace

ThinkingStart thinking_start(std::string_view prompt, bool template_thinks) {
  if (!template_thinks) return ThinkingStart::None;
  const size_t open = prompt.rfind(kOpen);
  if (open == std::string_view::npos) return ThinkingStart::MayOpen;
  const size_t close = prompt.find(kClose, open);
  if (close == std::string_view::npos) return ThinkingStart::Inside;
  // A closed block with nothing after it was written by the template for this reply (thinking
  // off); one followed by text belongs to an earlier turn.
  return all_space(prompt.substr(close + kClose.size())) ? ThinkingStart::Closed : ThinkingStart::MayOpen;
}

ReasoningSplitter::ReasoningSplitter(ThinkingStart start)
    : phase_(start == ThinkingStart::Inside    ? Phase::Reasoning
             : start == ThinkingStart::MayOpen ? Phase::Start
                                               : Phase::Answer),
      trim_lead_(start == ThinkingStart::Inside) {}

void ReasoningSplitter::emit_reasoning(ReasoningEvents& out, std::string_view text) {
  if (trim_lead_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    trim_lead_ = false;
  }
  out.reasoning += text;
  reasoning_ += text;
}

void ReasoningSplitter::emit_content(ReasoningEvents& out, std::string_view text) {
  if (trim_lead_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    trim_lead_ = false;
  }
  out.content += text;
  content_ += text;
}

ReasoningEvents ReasoningSplitter::feed(std::string_view text) {
  ReasoningEvents out;
  pending_ += text;
  for (;;) {
    switch (phase_) {
      case Phase::Start: {
        // Whitespace, then either <think> (reasoning follows) or anything else (all answer).
        const size_t first = pending_.find_first_not_of(" \n\t\r");
        if (first == std::string::npos) return out;
        const std::string_view rest = std::string_view(pending_).substr(first);
        if (rest.substr(0, kOpen.size()) == kOpen) {
          pending_.erase(0, first + kOpen.size());
          phase_ = Phase::Reasoning;
          trim_lead_ = true;
          continue;
        }
        if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return out;
        phase_ = Phase::Answer;
        continue;
      }
      case Phase::Reasoning: {
        const size_t close = pending_.find(kClose);
        if (close == std::string::npos) {
          // Hold back a possible tag start and trailing whitespace, which the tag would drop.
          const std::string_view safe = trim_back(
              std::string_view(pending_).substr(0, pending_.size() - partial_tag(pending_, kClose)));
          emit_reasoning(out, safe);
          pending_.erase(0, safe.size());
          return out;
        }
        emit_reasoning(out, trim_back(std::string_view(pending_).substr(0, close)));
        pending_.erase(0, close + kClose.size());
        phase_ = Phase::Answer;
        trim_lead_ = true;
        continue;
      }
      case Phase::Answer:
        emit_content(out, pending_);
        pending_.clear();
        return out;
    }
  }
}

ReasoningEvents ReasoningSplitter::finish() {
  ReasoningEvents out;
  if (phase_ == Phase::Reasoning)
    emit_reasoning(out, trim_back(pending_));
  else
    emit_content(out, pending_);
  pending_.clear();
  return out;
}

ThinkingBudget::ThinkingBudget(const tokenizer::Tokenizer& tokenizer, ThinkingStart start, int64_t budget)
    : tokenizer_(tokenizer),
      budget_(budget),
      phase_(start == ThinkingStart::Inside    ? Phase::Reasoning
             : start == ThinkingStart::MayOpen ? Phase::Start
                                               : Phase::Answer) {
  const auto open = tokenizer.vocab().find(std::string(kOpen));
  const auto close = tokenizer.vocab().find(std::string(kClose));
  if (!open || !close) fail("thinking budget: the vocabulary has no <think> and </think> tokens");
  open_ = int32_t(*open);
  close_ = int32_t(*close);
}

void ThinkingBudget::filter(std::span<float> logits) const {
  if (phase_ != Phase::Reasoning || used_ < budget_) return;
  const float keep = logits[size_t(close_)];
  std::fill(logits.begin(), logits.end(), -std::numeric_limits<float>::infinity());
  logits[size_t(close_)] = std::isfinite(keep) ? keep : 0.0f;
}

void ThinkingBudget::accept(int32_t id) {
  switch (phase_) {
    case Phase::Start:
      if (id == open_)
        phase_ = Phase::Reasoning;
      else if (!all_space(tokenizer_.piece(uint32_t(id))))
        phase_ = Phase::Answer;
      break;
    case Phase::Reasoning:
      if (id == close_) {
        forced_ = used_ >= budget_;
        phase_ = Phase::Answer;
      } else {
        ++used_;
      }
      break;
    case Phase::Answer:
      break;
  }
}

}  // namespace strata::decode
