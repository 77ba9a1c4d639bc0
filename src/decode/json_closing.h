// The fewest bytes that still complete a document from a parse state of the JSON automaton:
// what JsonConstraint needs to steer a reply to its shortest valid ending when the token budget
// (max_tokens, the context) runs short. The shortest completion is counted in bytes, written
// without whitespace in ASCII (the empty string, the smallest number the bounds allow, only the
// required properties, the fewest items); in a byte-level vocabulary every byte is a token, so
// that many tokens always suffice.
#pragma once

#include <cstdint>
#include <vector>

#include "decode/json_automaton.h"
#include "decode/json_schema.h"

namespace strata::decode {

class JsonClosing {
 public:
  // The grammar must outlive this.
  explicit JsonClosing(const JsonGrammar& grammar);

  // Fewest bytes of a value of `node` that opens at most `frames` automaton frames (the depth
  // left below the limit); kUnbounded when no such value exists.
  uint32_t value(uint32_t node, uint32_t frames) const;

  // Fewest bytes that complete the document from `s`: 0 when it may end now; kUnbounded only
  // for a state no document continues (which the automaton never reaches).
  uint32_t rest(const Stack& s) const;

 private:
  uint32_t root_rest(const Frame& f, bool child_done) const;
  uint32_t object_rest(const Frame& f, uint32_t frames) const;
  uint32_t key_rest(const Frame& key, const Frame& object, uint32_t frames) const;
  uint32_t array_rest(const Frame& f, bool child_done, uint32_t frames) const;
  uint32_t string_rest(const Frame& f) const;
  uint32_t number_rest(const Frame& f) const;
  uint32_t literal_rest(const Frame& f) const;
  // The properties still required after `mask`, each as ",key:value", then "}".
  uint32_t object_tail(const SchemaNode& n, uint64_t mask, uint32_t frames) const;
  uint32_t shortest_number(const SchemaNode& n) const;

  const JsonGrammar& g_;
  uint32_t depth_;
  std::vector<uint32_t> table_;  // value(node, frames) at [frames * nodes + node]
};

}  // namespace strata::decode
