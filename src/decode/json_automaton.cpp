#include "decode/json_automaton.h"

#include <algorithm>
#include <optional>

#include "decode/json_phases.h"

namespace strata::decode {

namespace {

using Kind = Frame::Kind;
using namespace json_phase;

bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Per UTF-8 state of utf8_step: the range the next (continuation) byte must fall in and the state
// after it.
constexpr uint8_t kUtf8Lo[8] = {0, 0x80, 0xA0, 0x80, 0x80, 0x90, 0x80, 0x80};
constexpr uint8_t kUtf8Hi[8] = {0, 0xBF, 0xBF, 0xBF, 0x9F, 0xBF, 0xBF, 0x8F};
constexpr uint8_t kUtf8After[8] = {0, 0, 1, 1, 1, 3, 3, 3};

bool excluded(const Frame& f, uint32_t i) { return i < 64 && (f.mask >> i & 1); }

}  // namespace

int utf8_step(uint8_t state, uint8_t c) {
  if (state != 0) return c >= kUtf8Lo[state] && c <= kUtf8Hi[state] ? kUtf8After[state] : -1;
  if (c < 0x80) return 0;
  if (c >= 0xC2 && c <= 0xDF) return 1;
  if (c == 0xE0) return 2;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return 3;
  if (c == 0xED) return 4;
  if (c == 0xF0) return 5;
  if (c >= 0xF1 && c <= 0xF3) return 6;
  if (c == 0xF4) return 7;
  return -1;
}

Stack JsonAutomaton::start() const {
  Frame root{.kind = Kind::Root, .phase = kRootOpen, .node = g_.root};
  advance_text(root);
  return {root};
}

// Moves the root past envelope text it has matched completely (or that is empty).
void JsonAutomaton::advance_text(Frame& root) const {
  const Envelope& e = g_.envelope;
  for (;;) {
    if (root.phase == kRootSep && root.lo == e.separator.size()) {
      root.phase = kRootOpen;
      root.lo = 0;
    } else if (root.phase == kRootOpen && root.lo == e.open.size()) {
      root.phase = kRootBefore;
    } else if (root.phase == kRootClose && root.lo == e.close.size()) {
      root.phase = kRootAfter;
    } else {
      return;
    }
  }
}

bool JsonAutomaton::fits(const Stack& s, uint32_t node) const {
  const uint32_t h = g_.nodes[node].height;
  return h != kUnbounded && s.size() + h <= g_.limits.max_depth;
}

// Between two tokens, as llama.cpp's JSON grammar allows: nothing, one space, or one newline
// followed by at most max_indent spaces or tabs; in compact mode nothing or one space. A model
// can neither loop on whitespace nor spend its budget on it.
bool JsonAutomaton::whitespace(Frame& f, uint8_t c) const {
  if (f.ws == kWsNone) {
    if (c == ' ') {
      f.ws = kWsSpace;
      return true;
    }
    if (c != '\n' || g_.limits.compact) return false;
    f.ws = kWsNewline;
    return true;
  }
  if (f.ws < kWsNewline || (c != ' ' && c != '\t') || uint32_t(f.ws - kWsNewline) >= g_.limits.max_indent)
    return false;
  ++f.ws;
  return true;
}

bool JsonAutomaton::complete(const Frame& f) const {
  if (f.kind == Kind::Number) {
    if (f.phase != kNumZero && f.phase != kNumInt && f.phase != kNumFrac && f.phase != kNumExp) return false;
    const SchemaNode& n = g_.nodes[f.node];
    if (!n.minimum && !n.maximum) return true;
    const Magnitude y(n, f.sub & kNegative);
    return f.sub & kFractionNonzero ? y.fraction(f.mask) : y.point(f.mask);
  }
  if (f.kind == Kind::Literal) return g_.literals[f.node][f.lo].size() == f.count && !excluded(f, f.lo);
  return false;
}

bool JsonAutomaton::starts(uint32_t node, uint8_t c) const {
  const SchemaNode& n = g_.nodes[node];
  switch (n.kind) {
    case SchemaNode::Kind::Object:
      return c == '{';
    case SchemaNode::Kind::Array:
      return c == '[';
    case SchemaNode::Kind::String:
      return c == '"';
    case SchemaNode::Kind::Number: {
      if (c != '-' && !is_digit(c)) return false;
      if (!n.minimum && !n.maximum) return true;
      const Magnitude y(n, c == '-');
      const bool fractions = !n.integer;
      return c == '-' ? y.range(0, kMaxMagnitude, fractions) : y.prefix(uint64_t(c - '0'), 1, fractions);
    }
    case SchemaNode::Kind::Literal: {
      const auto& texts = g_.literals[n.literal];
      return std::any_of(texts.begin(), texts.end(),
                         [c](const std::string& t) { return uint8_t(t[0]) == c; });
    }
    case SchemaNode::Kind::Union:
      return false;
  }
  return false;
}

// Pushes the frame for a value of `node` (not a union) whose first byte is c.
void JsonAutomaton::open(Stack& s, uint32_t node, uint8_t c) const {
  const SchemaNode& n = g_.nodes[node];
  Frame f{.node = node};
  switch (n.kind) {
    case SchemaNode::Kind::Object:
      f.kind = Kind::Object;
      f.phase = kObjOpen;
      break;
    case SchemaNode::Kind::Array:
      f.kind = Kind::Array;
      f.phase = kArrOpen;
      break;
    case SchemaNode::Kind::String:
      f.kind = Kind::String;
      f.phase = kStrBody;
      break;
    case SchemaNode::Kind::Number:
      f.kind = Kind::Number;
      f.phase = c == '-' ? kNumMinus : c == '0' ? kNumZero : kNumInt;
      f.count = f.phase != kNumMinus;
      f.sub = c == '-' ? kNegative : 0;
      f.mask = f.phase == kNumInt ? uint64_t(c - '0') : 0;
      break;
    case SchemaNode::Kind::Literal:
    case SchemaNode::Kind::Union:
      f.kind = Kind::Literal;
      f.node = n.literal;
      f.hi = uint32_t(g_.literals[n.literal].size());
      s.push_back(f);
      if (literal_step(s.back(), c) == Result::Closed) pop_done(s);
      return;
  }
  s.push_back(f);
}

bool JsonAutomaton::dispatch(Stack& s, uint32_t node, uint8_t c, std::vector<Stack>& forks) const {
  const SchemaNode& n = g_.nodes[node];
  if (n.kind != SchemaNode::Kind::Union) {
    if (!fits(s, node) || !starts(node, c)) return false;
    open(s, node, c);
    return true;
  }
  int first = -1;
  for (uint32_t alt : n.alternatives) {
    if (!fits(s, alt) || !starts(alt, c)) continue;
    if (first < 0) {
      first = int(alt);
      continue;
    }
    forks.push_back(s);
    open(forks.back(), alt, c);
  }
  if (first < 0) return false;
  open(s, uint32_t(first), c);
  return true;
}

void JsonAutomaton::pop_done(Stack& s) const {
  const Frame child = s.back();
  s.pop_back();
  Frame& parent = s.back();
  parent.ws = 0;
  switch (parent.kind) {
    case Kind::Root:
      ++parent.count;
      parent.phase = kRootClose;
      parent.lo = 0;
      advance_text(parent);
      break;
    case Kind::Object:
      if (parent.phase == kObjInKey) {
        if (child.kind == Kind::Literal) {
          parent.count = child.lo;
          parent.mask |= uint64_t(1) << child.lo;
        }
        parent.phase = kObjColon;
      } else {
        parent.phase = kObjAfter;
      }
      break;
    case Kind::Array:
      ++parent.count;
      parent.phase = kArrAfter;
      break;
    default:
      break;
  }
}

uint64_t JsonAutomaton::unfit_keys(const Stack& s) const {
  const SchemaNode& n = g_.nodes[s.back().node];
  uint64_t unfit = 0;
  for (size_t i = 0; i < n.values.size(); ++i)
    if (!fits(s, n.values[i])) unfit |= uint64_t(1) << i;
  return unfit;
}

// Whether another property may follow in the object on top of `s`.
bool JsonAutomaton::key_possible(const Stack& s) const {
  const SchemaNode& n = g_.nodes[s.back().node];
  if (n.free_keys) return fits(s, n.free_value);
  const uint64_t all = n.values.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.values.size()) - 1;
  return (all & ~(s.back().mask | unfit_keys(s))) != 0;
}

JsonAutomaton::Result JsonAutomaton::root_step(Stack& s, uint8_t c, std::vector<Stack>& forks) const {
  Frame& f = s.back();
  const Envelope& e = g_.envelope;
  switch (f.phase) {
    case kRootOpen:
    case kRootClose:
    case kRootSep: {
      const std::string& text = f.phase == kRootOpen ? e.open : f.phase == kRootClose ? e.close : e.separator;
      if (uint8_t(text[f.lo]) != c) return Result::Rejected;
      ++f.lo;
      advance_text(f);
      return Result::Consumed;
    }
    case kRootBefore:
      if (whitespace(f, c)) return Result::Consumed;
      f.phase = kRootInValue;
      f.ws = 0;
      return dispatch(s, f.node, c, forks) ? Result::Consumed : Result::Rejected;
    case kRootAfter:
      if (e.open.empty()) return whitespace(f, c) ? Result::Consumed : Result::Rejected;
      if (f.count >= e.max_values || e.separator.empty() || uint8_t(e.separator[0]) != c)
        return Result::Rejected;
      f.phase = kRootSep;
      f.lo = 1;
      advance_text(f);
      return Result::Consumed;
    default:
      return Result::Rejected;
  }
}

JsonAutomaton::Result JsonAutomaton::object_step(Stack& s, uint8_t c, std::vector<Stack>& forks) const {
  Frame& f = s.back();
  const SchemaNode& n = g_.nodes[f.node];
  if (f.phase != kObjInKey && f.phase != kObjInValue && whitespace(f, c)) return Result::Consumed;
  const bool can_close = (n.required & ~f.mask) == 0;
  switch (f.phase) {
    case kObjOpen:
    case kObjComma: {
      if (c == '}' && f.phase == kObjOpen) return can_close ? Result::Closed : Result::Rejected;
      if (c != '"' || !key_possible(s)) return Result::Rejected;
      f.phase = kObjInKey;
      f.ws = 0;
      Frame key{.kind = Kind::String, .phase = kStrBody, .node = g_.free_string};
      if (!n.free_keys)
        key = Frame{.kind = Kind::Literal,
                    .node = n.keys,
                    .count = 1,
                    .hi = uint32_t(g_.literals[n.keys].size()),
                    .mask = f.mask | unfit_keys(s)};
      s.push_back(key);
      return Result::Consumed;
    }
    case kObjColon:
      if (c != ':') return Result::Rejected;
      f.phase = kObjValue;
      f.ws = 0;
      return Result::Consumed;
    case kObjValue: {
      f.phase = kObjInValue;
      f.ws = 0;
      const uint32_t value = n.free_keys ? n.free_value : n.values[f.count];
      return dispatch(s, value, c, forks) ? Result::Consumed : Result::Rejected;
    }
    case kObjAfter:
      if (c == '}') return can_close ? Result::Closed : Result::Rejected;
      if (c != ',' || !key_possible(s)) return Result::Rejected;
      f.phase = kObjComma;
      f.ws = 0;
      return Result::Consumed;
    default:
      return Result::Rejected;
  }
}

JsonAutomaton::Result JsonAutomaton::array_step(Stack& s, uint8_t c, std::vector<Stack>& forks) const {
  Frame& f = s.back();
  const SchemaNode& n = g_.nodes[f.node];
  if (f.phase != kArrInValue && whitespace(f, c)) return Result::Consumed;
  switch (f.phase) {
    case kArrOpen:
    case kArrComma:
      if (c == ']' && f.phase == kArrOpen) return n.min_items == 0 ? Result::Closed : Result::Rejected;
      if (f.count >= n.max_items) return Result::Rejected;
      f.phase = kArrInValue;
      f.ws = 0;
      return dispatch(s, n.items, c, forks) ? Result::Consumed : Result::Rejected;
    case kArrAfter:
      if (c == ']') return f.count >= n.min_items ? Result::Closed : Result::Rejected;
      if (c != ',' || f.count >= n.max_items || !fits(s, n.items)) return Result::Rejected;
      f.phase = kArrComma;
      f.ws = 0;
      return Result::Consumed;
    default:
      return Result::Rejected;
  }
}

JsonAutomaton::Result JsonAutomaton::number_step(Frame& f, uint8_t c) const {
  const SchemaNode& n = g_.nodes[f.node];
  const bool bounded = n.minimum || n.maximum;
  const bool fractions = !n.integer;
  const Magnitude y(n, f.sub & kNegative);
  const auto viable = [&](bool ok) { return !bounded || ok; };
  if (is_digit(c)) {
    const uint64_t d = uint64_t(c - '0');
    switch (f.phase) {
      case kNumMinus:
        if (!viable(y.prefix(d, 1, fractions))) return Result::Rejected;
        f.phase = d == 0 ? kNumZero : kNumInt;
        f.count = 1;
        f.mask = d;
        return Result::Consumed;
      case kNumInt:
        if (f.count >= kMaxMantissaDigits) break;
        if (!viable(y.prefix(f.mask * 10 + d, f.count + 1, fractions))) return Result::Rejected;
        f.mask = f.mask * 10 + d;
        ++f.count;
        return Result::Consumed;
      case kNumDot:
      case kNumFrac: {
        if (f.phase == kNumFrac && f.count >= kMaxMantissaDigits) break;
        const uint32_t digits = f.phase == kNumDot ? 1 : f.count + 1;
        const bool nonzero = d != 0 || (f.sub & kFractionNonzero);
        // A fraction still all zeros needs room for a nonzero digit if only that fits the bounds.
        if (!viable(nonzero ? y.fraction(f.mask)
                            : y.point(f.mask) || (y.fraction(f.mask) && digits < kMaxMantissaDigits)))
          return Result::Rejected;
        if (nonzero) f.sub |= kFractionNonzero;
        f.phase = kNumFrac;
        f.count = digits;
        return Result::Consumed;
      }
      case kNumExpMark:
      case kNumExpSign:
        f.phase = kNumExp;
        f.count = 1;
        return Result::Consumed;
      case kNumExp:
        if (f.count >= kMaxExponentDigits) break;
        ++f.count;
        return Result::Consumed;
      default:
        break;
    }
  } else if (c == '.' && fractions && (f.phase == kNumZero || f.phase == kNumInt)) {
    if (!viable(y.point(f.mask) || y.fraction(f.mask))) return Result::Rejected;
    f.phase = kNumDot;
    return Result::Consumed;
  } else if ((c == 'e' || c == 'E') && fractions && !bounded &&
             (f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac)) {
    f.phase = kNumExpMark;
    return Result::Consumed;
  } else if ((c == '+' || c == '-') && f.phase == kNumExpMark) {
    f.phase = kNumExpSign;
    return Result::Consumed;
  }
  return complete(f) ? Result::Ended : Result::Rejected;
}

JsonAutomaton::Result JsonAutomaton::string_step(Frame& f, uint8_t c) const {
  const SchemaNode& n = g_.nodes[f.node];
  switch (f.phase) {
    case kStrBody: {
      if (f.sub == 0) {
        if (c == '"') return f.count >= n.min_length ? Result::Closed : Result::Rejected;
        if (c == '\\') {
          if (f.count >= n.max_length) return Result::Rejected;
          ++f.count;
          f.phase = kStrEscape;
          return Result::Consumed;
        }
      }
      if (c < 0x20) return Result::Rejected;
      const int next = utf8_step(f.sub, c);
      if (next < 0) return Result::Rejected;
      if (f.sub == 0) {
        if (f.count >= n.max_length) return Result::Rejected;
        ++f.count;
      }
      f.sub = uint8_t(next);
      return Result::Consumed;
    }
    case kStrEscape:
      if (c == 'u') {
        f.phase = kStrHex;
        f.sub = 0;
        f.lo = 0;
        return Result::Consumed;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't')
        return Result::Rejected;
      f.phase = kStrBody;
      return Result::Consumed;
    case kStrHex:
    case kStrLowHex: {
      const int v = hex_value(c);
      if (v < 0) return Result::Rejected;
      // A lone low surrogate, or a high one not followed by a low one, is not valid text.
      if (f.phase == kStrHex && f.sub == 1 && f.lo == 0xD && v >= 0xC) return Result::Rejected;
      if (f.phase == kStrLowHex && ((f.sub == 0 && v != 0xD) || (f.sub == 1 && v < 0xC)))
        return Result::Rejected;
      f.lo = f.lo * 16 + uint32_t(v);
      if (++f.sub < 4) return Result::Consumed;
      f.sub = 0;
      f.phase = f.phase == kStrHex && f.lo >= 0xD800 && f.lo <= 0xDBFF ? kStrLowSlash : kStrBody;
      return Result::Consumed;
    }
    case kStrLowSlash:
      if (c != '\\') return Result::Rejected;
      f.phase = kStrLowU;
      return Result::Consumed;
    case kStrLowU:
      if (c != 'u') return Result::Rejected;
      f.phase = kStrLowHex;
      f.lo = 0;
      return Result::Consumed;
    default:
      return Result::Rejected;
  }
}

JsonAutomaton::Result JsonAutomaton::literal_step(Frame& f, uint8_t c) const {
  const auto& texts = g_.literals[f.node];
  const size_t pos = f.count;
  // Candidates share their first `pos` bytes; a candidate that ends there sorts first.
  const auto below = [pos](const std::string& t, uint8_t v) {
    return t.size() <= pos || uint8_t(t[pos]) < v;
  };
  const auto above = [pos](uint8_t v, const std::string& t) { return t.size() > pos && v < uint8_t(t[pos]); };
  const auto first = texts.begin() + f.lo, last = texts.begin() + f.hi;
  const uint32_t lo = uint32_t(std::lower_bound(first, last, c, below) - texts.begin());
  const uint32_t hi = uint32_t(std::upper_bound(texts.begin() + lo, last, c, above) - texts.begin());
  bool viable = false;
  for (uint32_t i = lo; i < hi && !viable; ++i) viable = !excluded(f, i);
  if (!viable) return complete(f) ? Result::Ended : Result::Rejected;
  f.lo = lo;
  f.hi = hi;
  ++f.count;
  return hi - lo == 1 && texts[lo].size() == f.count ? Result::Closed : Result::Consumed;
}

bool JsonAutomaton::step(Stack& s, uint8_t c, std::vector<Stack>& forks) const {
  for (;;) {
    Frame& f = s.back();
    Result r = Result::Rejected;
    switch (f.kind) {
      case Kind::Root:
        r = root_step(s, c, forks);
        break;
      case Kind::Object:
        r = object_step(s, c, forks);
        break;
      case Kind::Array:
        r = array_step(s, c, forks);
        break;
      case Kind::String:
        r = string_step(f, c);
        break;
      case Kind::Literal:
        r = literal_step(f, c);
        break;
      case Kind::Number:
        r = number_step(f, c);
        break;
    }
    switch (r) {
      case Result::Rejected:
        return false;
      case Result::Consumed:
        return true;
      case Result::Closed:
        pop_done(s);
        return true;
      case Result::Ended:
        pop_done(s);
        break;
    }
  }
}

bool JsonAutomaton::step_text(Stack& s, std::string_view text) const {
  std::vector<Stack> forks;
  for (char c : text) {
    const Frame& root = s.front();
    if (s.size() != 1 || (root.phase != kRootOpen && root.phase != kRootClose && root.phase != kRootSep))
      return false;
    if (!step(s, uint8_t(c), forks)) return false;
  }
  return true;
}

bool JsonAutomaton::can_end(const Stack& s) const {
  if (s.size() == 1) return s[0].phase == kRootAfter;
  // A number or literal that could go on ends with the document.
  Stack t = s;
  while (t.size() > 1 && complete(t.back())) pop_done(t);
  return t.size() == 1 && t[0].phase == kRootAfter;
}

bool JsonAutomaton::string_body(const Stack& s, uint8_t& utf8, uint32_t& room) const {
  const Frame& f = s.back();
  if (f.kind != Kind::String || f.phase != kStrBody) return false;
  utf8 = f.sub;
  room = g_.nodes[f.node].max_length - f.count;
  return true;
}

}  // namespace strata::decode
