// Reasoning blocks. Qwen3-family models think in a <think> ... </think> block before they
// answer; some templates open the block in the prompt (the reply starts inside it), others let
// the model open it, and enable_thinking=false makes the template write an empty, closed block.
// ReasoningSplitter separates the streamed reply into reasoning and answer text (however the
// pieces are cut); ThinkingBudget caps the reasoning at a number of tokens by forcing </think>.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace strata::decode {

// Where a reply starts relative to the thinking block.
enum class ThinkingStart {
  None,     // no thinking block in this template: the whole reply is the answer
  MayOpen,  // the model may open <think> first (after whitespace at most)
  Inside,   // the prompt ends inside an open <think>: the reply starts with reasoning
  Closed,   // the prompt ends right after a closed block (thinking off): all answer
};

// Judged from the rendered prompt; `template_thinks`: the chat template mentions <think>.
ThinkingStart thinking_start(std::string_view prompt, bool template_thinks);

struct ReasoningEvents {
  std::string reasoning;  // thinking text safe to show now
  std::string content;    // answer text safe to show now
};

class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(ThinkingStart start);

  // The next piece of generated text. The tags never reach either side; the whitespace right
  // inside the block and right after it is dropped (Qwen writes "<think>\n...\n</think>\n\n").
  ReasoningEvents feed(std::string_view text);
  // The generation ended: flushes held-back text (a block left open is all reasoning).
  ReasoningEvents finish();

  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }

 private:
  enum class Phase { Start, Reasoning, Answer };
  void emit_reasoning(ReasoningEvents& out, std::string_view text);
  void emit_content(ReasoningEvents& out, std::string_view text);

  Phase phase_;
  std::string pending_;     // text not yet classified
  bool trim_lead_ = false;  // drop whitespace before the next text of the current side
  std::string reasoning_, content_;
};

// Forces the end of the reasoning once it has taken `budget` tokens: the next token is then
// </think>. Plugs into GenerateParams' logits_filter and on_token like a constraint.
class ThinkingBudget {
 public:
  // Throws strata::Error when the vocabulary has no single <think> and </think> tokens.
  ThinkingBudget(const tokenizer::Tokenizer& tokenizer, ThinkingStart start, int64_t budget);

  void filter(std::span<float> logits) const;
  void accept(int32_t id);
  // Whether the budget made the model stop thinking.
  bool forced() const { return forced_; }

 private:
  const tokenizer::Tokenizer& tokenizer_;
  int32_t open_ = -1, close_ = -1;
  int64_t budget_;
  enum class Phase { Start, Reasoning, Answer } phase_;
  int64_t used_ = 0;
  bool forced_ = false;
};

}  // namespace strata::decode
