// Internal to the JSON automaton (json_automaton.cpp) and its closing-cost table
// (json_closing.cpp): what a Frame's phase and counters mean, and the whole-bound arithmetic of
// bounded numbers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "decode/json_schema.h"

namespace strata::decode::json_phase {

// Phases of each frame kind. "In*" phases wait for a child frame above them to finish.
enum RootPhase : uint8_t { kRootOpen, kRootBefore, kRootInValue, kRootClose, kRootAfter, kRootSep };
enum ObjectPhase : uint8_t { kObjOpen, kObjInKey, kObjColon, kObjValue, kObjInValue, kObjAfter, kObjComma };
enum ArrayPhase : uint8_t { kArrOpen, kArrInValue, kArrAfter, kArrComma };
enum StringPhase : uint8_t { kStrBody, kStrEscape, kStrHex, kStrLowSlash, kStrLowU, kStrLowHex };
enum NumberPhase : uint8_t {
  kNumMinus,
  kNumZero,
  kNumInt,
  kNumDot,
  kNumFrac,
  kNumExpMark,
  kNumExpSign,
  kNumExp
};

// Digits per number part: 15 fit a double (an integer part exactly), an exponent of two digits
// never overflows (nlohmann::json rejects 1e999), and a model cannot run on digits forever.
constexpr uint32_t kMaxMantissaDigits = 15;
constexpr uint32_t kMaxExponentDigits = 2;

// Number frames keep the integer part's value in `mask` and these flags in `sub`.
constexpr uint8_t kNegative = 1, kFractionNonzero = 2;
constexpr uint64_t kMaxMagnitude = 999'999'999'999'999;  // 15 digits

// Frame::ws between two tokens: nothing yet, the one space taken, or a newline followed by
// (ws - kWsNewline) indent bytes.
constexpr uint8_t kWsNone = 0, kWsSpace = 1, kWsNewline = 2;

// A bounded number's magnitude y = |x| = I + f against the node's whole bounds, mirrored for a
// negative x. Whole bounds put every y in (I, I+1) on the same side of each bound, so a value's
// fate depends only on I and whether its fraction is nonzero.
struct Magnitude {
  std::optional<int64_t> lo, hi;
  bool lo_open = false, hi_open = false;

  Magnitude(const SchemaNode& n, bool negative) {
    if (!negative) {
      lo = n.minimum;
      hi = n.maximum;
      lo_open = n.exclusive_minimum;
      hi_open = n.exclusive_maximum;
    } else {
      if (n.maximum) lo = -*n.maximum;
      if (n.minimum) hi = -*n.minimum;
      lo_open = n.exclusive_maximum;
      hi_open = n.exclusive_minimum;
    }
  }
  // y == i.
  bool point(uint64_t i) const {
    const int64_t v = int64_t(i);
    return !(lo && (v < *lo || (v == *lo && lo_open))) && !(hi && (v > *hi || (v == *hi && hi_open)));
  }
  // y in (i, i+1).
  bool fraction(uint64_t i) const { return (!lo || *lo <= int64_t(i)) && (!hi || *hi >= int64_t(i) + 1); }
  // Some y with integer part in [a, b].
  bool range(uint64_t a, uint64_t b, bool fractions) const {
    int64_t first = int64_t(a), last = int64_t(b);
    if (lo) first = std::max(first, *lo + (lo_open ? 1 : 0));
    if (hi) last = std::min(last, *hi - (hi_open ? 1 : 0));
    if (first <= last) return true;
    if (!fractions) return false;
    first = lo ? std::max(int64_t(a), *lo) : int64_t(a);
    last = hi ? std::min(int64_t(b), *hi - 1) : int64_t(b);
    return first <= last;
  }
  // Some y whose integer part starts with the k digits of v.
  bool prefix(uint64_t v, uint32_t k, bool fractions) const {
    if (range(v, v, fractions)) return true;
    if (v == 0) return false;
    for (uint64_t scale = 10; k < 15; scale *= 10, ++k)
      if (range(v * scale, v * scale + scale - 1, fractions)) return true;
    return false;
  }
};

}  // namespace strata::decode::json_phase
