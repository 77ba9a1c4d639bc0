// Reasoning blocks: where a reply starts (from the rendered prompt), the split of streamed text
// into reasoning and answer for any cut of the text, and the thinking budget forcing </think>.
#include <gtest/gtest.h>

#include <cmath>

#include "decode/reasoning.h"
#include "test_json_constraint_util.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::decode {
namespace {

TEST(Reasoning, WhereTheReplyStarts) {
  EXPECT_EQ(thinking_start("<|im_start|>assistant\n", false), ThinkingStart::None);
  EXPECT_EQ(thinking_start("<|im_start|>assistant\n", true), ThinkingStart::MayOpen);
  EXPECT_EQ(thinking_start("<|im_start|>assistant\n<think>\n", true), ThinkingStart::Inside);
  EXPECT_EQ(thinking_start("<|im_start|>assistant\n<think>\n\n</think>\n\n", true), ThinkingStart::Closed);
  // A closed block of an earlier turn says nothing about this one.
  EXPECT_EQ(thinking_start("<think>\nx\n</think>\n\nhi<|im_end|>\n<|im_start|>assistant\n", true),
            ThinkingStart::MayOpen);
}

struct Split {
  ThinkingStart start;
  std::string text, reasoning, content;
};

const Split kSplits[] = {
    {ThinkingStart::Inside, "\nLet me see.\n</think>\n\nThe answer.", "Let me see.", "The answer."},
    {ThinkingStart::Inside, "a < b and </thin k> stays\n\n", "a < b and </thin k> stays", ""},
    {ThinkingStart::Inside, "</think>Just this", "", "Just this"},
    {ThinkingStart::MayOpen, "<think>\nhmm\n</think>\n\n  ok <think> later", "hmm", "ok <think> later"},
    {ThinkingStart::MayOpen, " \n<think>x</think>y", "x", "y"},
    {ThinkingStart::MayOpen, "  plain reply, <think>not thinking</think>", "", "  plain reply, <think>not thinking</think>"},
    {ThinkingStart::MayOpen, "<thi", "", "<thi"},
    {ThinkingStart::MayOpen, "\n\n", "", "\n\n"},
    {ThinkingStart::Closed, "<think>x</think>y", "", "<think>x</think>y"},
    {ThinkingStart::None, "\n<think>x</think>y", "", "\n<think>x</think>y"},
};

TEST(Reasoning, SplitsTheSameHoweverTheTextIsCut) {
  Rng rng(7);
  for (const Split& c : kSplits) {
    for (int cut = 0; cut < 200; ++cut) {
      ReasoningSplitter splitter(c.start);
      std::string reasoning, content;
      for (size_t at = 0; at < c.text.size();) {
        const size_t n = cut == 0 ? c.text.size() : 1 + rng.below(4);
        const auto ev = splitter.feed(c.text.substr(at, n));
        reasoning += ev.reasoning;
        content += ev.content;
        at += n;
      }
      const auto ev = splitter.finish();
      reasoning += ev.reasoning;
      content += ev.content;
      ASSERT_EQ(reasoning, c.reasoning) << c.text;
      ASSERT_EQ(content, c.content) << c.text;
      EXPECT_EQ(splitter.reasoning(), c.reasoning);
      EXPECT_EQ(splitter.content(), c.content);
    }
  }
}

TEST(Reasoning, ThinkingBudgetForcesTheCloseTag) {
  const tokenizer::Tokenizer& tok = testing::toy_tokenizer();
  const int32_t open = int32_t(*tok.vocab().find("<think>"));
  const int32_t close = int32_t(*tok.vocab().find("</think>"));
  const int32_t word = int32_t(tok.encode("x")[0]);
  const int32_t newline = int32_t(tok.encode("\n")[0]);
  std::vector<float> logits(tok.size() + 3);
  const auto only_close = [&](const ThinkingBudget& b) {
    std::fill(logits.begin(), logits.end(), 1.0f);
    b.filter(logits);
    size_t finite = 0;
    for (float l : logits) finite += std::isfinite(l);
    return finite == 1 && std::isfinite(logits[size_t(close)]);
  };

  ThinkingBudget inside(tok, ThinkingStart::Inside, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(only_close(inside));
    inside.accept(word);
  }
  EXPECT_TRUE(only_close(inside));
  inside.accept(close);
  EXPECT_TRUE(inside.forced());
  EXPECT_FALSE(only_close(inside)) << "the answer is free";

  // The model may open the block after whitespace; a budget of 0 closes it at once.
  ThinkingBudget may_open(tok, ThinkingStart::MayOpen, 0);
  may_open.accept(newline);
  EXPECT_FALSE(only_close(may_open));
  may_open.accept(open);
  EXPECT_TRUE(only_close(may_open));

  // A reply that does not open with <think> is never cut; one that closes in time is not forced.
  ThinkingBudget answer(tok, ThinkingStart::MayOpen, 0);
  answer.accept(word);
  answer.accept(open);
  EXPECT_FALSE(only_close(answer));
  ThinkingBudget early(tok, ThinkingStart::Inside, 5);
  early.accept(word);
  early.accept(close);
  EXPECT_FALSE(early.forced());
  EXPECT_FALSE(only_close(early));
}

}  // namespace
}  // namespace strata::decode
