#include "quant/types.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "util/error.h"

namespace strata::quant {

namespace {
constexpr std::array kTypes = {
    TypeInfo{Type::F32, "f32", 1, 4, true},
    TypeInfo{Type::F16, "f16", 1, 2, true},
    TypeInfo{Type::Q4_0, "q4_0", 32, 18, true},
    TypeInfo{Type::Q8_0, "q8_0", 32, 34, true},
    TypeInfo{Type::Q2_K, "q2_K", 256, 84, true},
    TypeInfo{Type::Q3_K, "q3_K", 256, 110, true},
    TypeInfo{Type::Q4_K, "q4_K", 256, 144, true},
    TypeInfo{Type::Q5_K, "q5_K", 256, 176, true},
    TypeInfo{Type::Q6_K, "q6_K", 256, 210, true},
    TypeInfo{Type::Q8_K, "q8_K", 256, 292, false},
    TypeInfo{Type::IQ2_XXS, "iq2_xxs", 256, 66, true},
    TypeInfo{Type::IQ2_XS, "iq2_xs", 256, 74, true},
    TypeInfo{Type::IQ3_XXS, "iq3_xxs", 256, 98, true},
    TypeInfo{Type::IQ4_XS, "iq4_xs", 256, 136, true},
    TypeInfo{Type::I32, "i32", 1, 4, false},
    TypeInfo{Type::BF16, "bf16", 1, 2, true},
    TypeInfo{Type::FP8_E4M3, "fp8_e4m3", 32, 36, true},
};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return out;
}
}  // namespace

std::optional<TypeInfo> find_type(uint32_t id) {
  for (const auto& t : kTypes)
    if (uint32_t(t.type) == id) return t;
  return std::nullopt;
}

const TypeInfo& type_info(Type t) {
  for (const auto& info : kTypes)
    if (info.type == t) return info;
  fail("internal error: unknown quant type id ", uint32_t(t));
}

std::optional<Type> parse_type(std::string_view name) {
  const std::string want = lower(name);
  if (want == "fp8") return Type::FP8_E4M3;
  for (const auto& t : kTypes)
    if (lower(t.name) == want) return t.type;
  return std::nullopt;
}

const char* type_name(Type t) { return type_info(t).name; }

size_t row_bytes(Type t, int64_t n) { return row_bytes(type_info(t), n); }

}  // namespace strata::quant
