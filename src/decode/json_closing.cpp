#include "decode/json_closing.h"

#include <algorithm>

#include "decode/json_phases.h"

namespace strata::decode {

namespace {

using Kind = Frame::Kind;
using namespace json_phase;

uint32_t add(uint32_t a, uint32_t b) { return a == kUnbounded || b == kUnbounded ? kUnbounded : a + b; }
uint32_t less_one(uint32_t a) { return a == kUnbounded ? a : a - 1; }

uint32_t times(uint32_t n, uint32_t a) {
  if (n == 0) return 0;
  if (a == kUnbounded || uint64_t(n) * a >= kUnbounded) return kUnbounded;
  return n * a;
}

// UTF-8 continuation bytes still due in each state of utf8_step.
constexpr uint8_t kContinuationsLeft[8] = {0, 1, 2, 2, 2, 3, 3, 3};

bool excluded(const Frame& f, uint32_t i) { return i < 64 && (f.mask >> i & 1); }

uint64_t power10(uint32_t e) {
  uint64_t p = 1;
  while (e-- > 0) p *= 10;
  return p;
}

// Fewest bytes to append to a bounded number whose integer part so far is the k digits of v
// (k = 0: no digit yet) so that it is complete: more digits, or a fraction ".d".
uint32_t digits_to_bounds(const Magnitude& y, uint64_t v, uint32_t k, bool fractions) {
  uint32_t best = kUnbounded;
  if (k > 0 && fractions && y.fraction(v)) best = 2;
  for (uint32_t e = 1; k + e <= kMaxMantissaDigits && e < best; ++e) {
    if (k > 0 && v == 0) break;  // no digit follows a leading zero
    const uint64_t scale = power10(e);
    const uint64_t first = k == 0 ? (e == 1 ? 0 : scale / 10) : v * scale;
    const uint64_t last = k == 0 ? scale - 1 : first + scale - 1;
    if (y.range(first, last, false)) return std::min(best, e);
    if (fractions && y.range(first, last, true)) best = std::min(best, e + 2);
  }
  return best;
}

}  // namespace

JsonClosing::JsonClosing(const JsonGrammar& grammar) : g_(grammar), depth_(grammar.limits.max_depth) {
  const size_t n = g_.nodes.size();
  table_.assign((size_t(depth_) + 1) * n, kUnbounded);
  // A value opening `frames` frames nests its children in frames - 1; union alternatives (never
  // unions themselves) take the same frames, so they are filled first at each level.
  for (uint32_t frames = 1; frames <= depth_; ++frames) {
    uint32_t* row = &table_[size_t(frames) * n];
    const uint32_t* below = &table_[size_t(frames - 1) * n];
    for (size_t i = 0; i < n; ++i) {
      const SchemaNode& node = g_.nodes[i];
      switch (node.kind) {
        case SchemaNode::Kind::String:
          row[i] = 2 + node.min_length;
          break;
        case SchemaNode::Kind::Number:
          row[i] = shortest_number(node);
          break;
        case SchemaNode::Kind::Literal:
          for (const auto& text : g_.literals[node.literal]) row[i] = std::min(row[i], uint32_t(text.size()));
          break;
        case SchemaNode::Kind::Array: {
          const uint32_t m = node.min_items;
          row[i] = m == 0 ? 2 : add(add(2, times(m, below[node.items])), m - 1);
          break;
        }
        case SchemaNode::Kind::Object: {
          uint32_t sum = 2, count = 0;
          for (size_t k = 0; k < node.values.size(); ++k) {
            if (!(node.required >> k & 1)) continue;
            sum = add(sum, add(uint32_t(g_.literals[node.keys][k].size()) + 1, below[node.values[k]]));
            ++count;
          }
          row[i] = count == 0 ? sum : add(sum, count - 1);
          break;
        }
        case SchemaNode::Kind::Union:
          break;
      }
    }
    for (size_t i = 0; i < n; ++i)
      if (g_.nodes[i].kind == SchemaNode::Kind::Union)
        for (uint32_t a : g_.nodes[i].alternatives) row[i] = std::min(row[i], row[a]);
  }
}

uint32_t JsonClosing::value(uint32_t node, uint32_t frames) const {
  if (frames > depth_) frames = depth_;
  return table_[size_t(frames) * g_.nodes.size() + node];
}

uint32_t JsonClosing::shortest_number(const SchemaNode& n) const {
  if (!n.minimum && !n.maximum) return 1;
  uint32_t best = kUnbounded;
  for (bool negative : {false, true})
    best = std::min(best, add(negative ? 1 : 0, digits_to_bounds(Magnitude(n, negative), 0, 0, !n.integer)));
  return best;
}

uint32_t JsonClosing::object_tail(const SchemaNode& n, uint64_t mask, uint32_t frames) const {
  const uint64_t missing = n.required & ~mask;
  uint32_t sum = 1;
  for (size_t k = 0; k < n.values.size(); ++k)
    if (missing >> k & 1)
      sum = add(sum, add(uint32_t(g_.literals[n.keys][k].size()) + 2, value(n.values[k], frames)));
  return sum;
}

uint32_t JsonClosing::root_rest(const Frame& f, bool child_done) const {
  const Envelope& e = g_.envelope;
  const uint32_t close = uint32_t(e.close.size());
  const uint32_t root_value = value(g_.root, depth_ - 1);
  if (child_done) return close;
  switch (f.phase) {
    case kRootOpen:
      return add(uint32_t(e.open.size()) - f.lo, add(root_value, close));
    case kRootBefore:
      return add(root_value, close);
    case kRootClose:
      return close - f.lo;
    case kRootAfter:
      return 0;
    case kRootSep:
      return add(uint32_t(e.separator.size() + e.open.size()) - f.lo, add(root_value, close));
    default:
      return close;
  }
}

// An object frame's own remainder (it has no child, or its value child is done); `frames` is
// what a property value may open.
uint32_t JsonClosing::object_rest(const Frame& f, uint32_t frames) const {
  const SchemaNode& n = g_.nodes[f.node];
  const uint32_t tail = object_tail(n, f.mask, frames);
  const uint32_t current = n.free_keys ? n.free_value : f.count < n.values.size() ? n.values[f.count] : 0;
  switch (f.phase) {
    case kObjOpen:
    case kObjComma: {
      if ((n.required & ~f.mask) != 0) return less_one(tail);  // one comma fewer: a property comes first
      if (f.phase == kObjOpen) return 1;
      // After a comma some property must follow: the cheapest one still allowed.
      if (n.free_keys) return add(4, value(n.free_value, frames));
      uint32_t best = kUnbounded;
      for (size_t k = 0; k < n.values.size(); ++k)
        if (!(f.mask >> k & 1))
          best = std::min(best, add(uint32_t(g_.literals[n.keys][k].size()) + 2, value(n.values[k], frames)));
      return best;
    }
    case kObjColon:
      return add(1, add(value(current, frames), tail));
    case kObjValue:
      return add(value(current, frames), tail);
    default:  // kObjInValue with the value done, kObjAfter
      return tail;
  }
}

// A key frame on top of an object in kObjInKey: the rest of the key, its colon and value, and
// the object's tail, for the cheapest key the literal set still allows.
uint32_t JsonClosing::key_rest(const Frame& key, const Frame& object, uint32_t frames) const {
  const SchemaNode& n = g_.nodes[object.node];
  if (key.kind == Kind::String) return add(string_rest(key), add(1, add(value(n.free_value, frames), 1)));
  const auto& texts = g_.literals[key.node];
  uint32_t best = kUnbounded;
  for (uint32_t i = key.lo; i < key.hi; ++i) {
    if (excluded(key, i)) continue;
    const uint32_t rest = add(uint32_t(texts[i].size()) - key.count + 1, value(n.values[i], frames));
    best = std::min(best, add(rest, object_tail(n, object.mask | uint64_t(1) << i, frames)));
  }
  return best;
}

uint32_t JsonClosing::array_rest(const Frame& f, bool child_done, uint32_t frames) const {
  const SchemaNode& n = g_.nodes[f.node];
  const uint32_t item = value(n.items, frames);
  const auto tail = [&](uint32_t done) { return add(times(n.min_items > done ? n.min_items - done : 0, add(1, item)), 1); };
  if (child_done) return tail(f.count + 1);
  switch (f.phase) {
    case kArrOpen:
      return n.min_items == 0 ? 1 : less_one(tail(0));
    case kArrComma:
      return add(item, tail(f.count + 1));
    default:  // kArrAfter
      return tail(f.count);
  }
}

uint32_t JsonClosing::string_rest(const Frame& f) const {
  const SchemaNode& n = g_.nodes[f.node];
  const uint32_t deficit = n.min_length > f.count ? n.min_length - f.count : 0;
  uint32_t escape = 0;
  switch (f.phase) {
    case kStrBody:
      escape = kContinuationsLeft[f.sub & 7];
      break;
    case kStrEscape:
      escape = 1;
      break;
    case kStrHex: {
      // Two digits fix whether this is a high surrogate, which a \uXXXX low one must follow.
      const uint32_t top = f.sub >= 2 ? f.lo >> (4 * (f.sub - 2)) : 0;
      escape = 4 - f.sub + (top >= 0xD8 && top <= 0xDB ? 6 : 0);
      break;
    }
    case kStrLowSlash:
      escape = 6;
      break;
    case kStrLowU:
      escape = 5;
      break;
    case kStrLowHex:
      escape = 4 - f.sub;
      break;
    default:
      break;
  }
  return escape + deficit + 1;
}

uint32_t JsonClosing::number_rest(const Frame& f) const {
  const SchemaNode& n = g_.nodes[f.node];
  const bool bounded = n.minimum || n.maximum;
  const Magnitude y(n, f.sub & kNegative);
  switch (f.phase) {
    case kNumZero:
    case kNumInt:
    case kNumFrac:
    case kNumExp: {
      if (!bounded) return 0;
      if (f.sub & kFractionNonzero ? y.fraction(f.mask) : y.point(f.mask)) return 0;
      if (f.phase == kNumFrac) return 1;  // a fraction of zeros needs a nonzero digit
      return digits_to_bounds(y, f.mask, f.count, !n.integer);
    }
    case kNumMinus:
      return bounded ? digits_to_bounds(y, 0, 0, !n.integer) : 1;
    default:  // a digit must follow the point, the exponent mark or its sign
      return 1;
  }
}

uint32_t JsonClosing::literal_rest(const Frame& f) const {
  const auto& texts = g_.literals[f.node];
  uint32_t best = kUnbounded;
  for (uint32_t i = f.lo; i < f.hi; ++i)
    if (!excluded(f, i)) best = std::min(best, uint32_t(texts[i].size()) - f.count);
  return best;
}

uint32_t JsonClosing::rest(const Stack& s) const {
  if (s.empty()) return kUnbounded;
  size_t i = s.size() - 1;
  // What a value inside the frame at index j may open.
  const auto frames_in = [&](size_t j) { return depth_ > j + 1 ? depth_ - uint32_t(j) - 1 : 0; };
  uint32_t total = 0;
  const Frame& top = s[i];
  const bool is_key = i > 0 && s[i - 1].kind == Kind::Object && s[i - 1].phase == kObjInKey;
  if (is_key) {
    total = key_rest(top, s[i - 1], frames_in(i - 1));
    --i;
  } else {
    switch (top.kind) {
      case Kind::Root: return root_rest(top, false);
      case Kind::Object: total = object_rest(top, frames_in(i)); break;
      case Kind::Array: total = array_rest(top, false, frames_in(i)); break;
      case Kind::String: total = string_rest(top); break;
      case Kind::Number: total = number_rest(top); break;
      case Kind::Literal: total = literal_rest(top); break;
    }
  }
  // Every frame below waits for the one above it: add what follows that child.
  while (i-- > 0) {
    const Frame& f = s[i];
    switch (f.kind) {
      case Kind::Root: total = add(total, root_rest(f, true)); break;
      case Kind::Object: total = add(total, object_rest(f, frames_in(i))); break;
      case Kind::Array: total = add(total, array_rest(f, true, frames_in(i))); break;
      default: return kUnbounded;
    }
  }
  return total;
}

}  // namespace strata::decode
