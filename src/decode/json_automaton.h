// The byte-level pushdown automaton that runs a JsonGrammar: fed one byte at a time, it says
// whether the bytes so far can still be completed into a document the grammar admits. A Stack
// is one parse (a frame per open value); an anyOf whose alternatives share a first byte forks
// it into several stacks, which JsonConstraint tracks as a set.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "decode/json_schema.h"

namespace strata::decode {

struct Frame {
  enum class Kind : uint8_t { Root, Object, Array, String, Number, Literal };
  Kind kind = Kind::Root;
  uint8_t phase = 0;
  uint8_t sub = 0;          // String: UTF-8 state or \u hex digits read; Number: sign, fraction flags
  uint8_t ws = 0;           // length of the current whitespace run
  uint32_t node = 0;        // schema node; for Literal the literal set
  uint32_t count = 0;       // Root: values done; Object: current property; Array: items; String: code
                            // points; Number: digits of the current part; Literal: bytes matched
  uint32_t lo = 0, hi = 0;  // Literal: candidate range; Root: envelope text position; String: \u value
  uint64_t mask = 0;        // Object: properties used; Literal: candidates excluded; Number: integer part
  bool operator==(const Frame&) const = default;
};

using Stack = std::vector<Frame>;

// UTF-8 validation (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF) as a DFA over
// states 0..7; 0 is a character boundary, the others say which continuation bytes remain.
// Returns the next state, or -1 when c cannot come next.
int utf8_step(uint8_t state, uint8_t c);

class JsonAutomaton {
 public:
  // The grammar must outlive the automaton.
  explicit JsonAutomaton(const JsonGrammar& grammar) : g_(grammar) {}

  Stack start() const;

  // Feeds one byte. Returns false when no document continues this way (then `s` is garbage).
  // When an anyOf lets the byte start several alternatives, `s` takes the first and the others
  // are appended to `forks`.
  bool step(Stack& s, uint8_t c, std::vector<Stack>& forks) const;

  // Feeds an added token's text (Qwen's <tool_call>): only envelope text may hold it.
  bool step_text(Stack& s, std::string_view text) const;

  // Could the document end here?
  bool can_end(const Stack& s) const;

  // When the top frame is inside a string with no escape pending: the UTF-8 decoder state
  // (0: at a character boundary) and how many more code points the string may take.
  bool string_body(const Stack& s, uint8_t& utf8, uint32_t& room) const;

  const JsonGrammar& grammar() const { return g_; }

 private:
  enum class Result { Rejected, Consumed, Closed, Ended };

  Result root_step(Stack& s, uint8_t c, std::vector<Stack>& forks) const;
  Result object_step(Stack& s, uint8_t c, std::vector<Stack>& forks) const;
  Result array_step(Stack& s, uint8_t c, std::vector<Stack>& forks) const;
  Result string_step(Frame& f, uint8_t c) const;
  Result number_step(Frame& f, uint8_t c) const;
  Result literal_step(Frame& f, uint8_t c) const;

  bool dispatch(Stack& s, uint32_t node, uint8_t c, std::vector<Stack>& forks) const;
  bool starts(uint32_t node, uint8_t c) const;
  void open(Stack& s, uint32_t node, uint8_t c) const;
  void pop_done(Stack& s) const;
  bool fits(const Stack& s, uint32_t node) const;
  bool key_possible(const Stack& s) const;
  uint64_t unfit_keys(const Stack& s) const;
  bool complete(const Frame& f) const;
  bool whitespace(Frame& f, uint8_t c) const;
  void advance_text(Frame& root) const;

  const JsonGrammar& g_;
};

}  // namespace strata::decode
