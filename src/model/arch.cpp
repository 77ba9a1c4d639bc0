#include "model/arch.h"

#include <unordered_map>

#include "gguf/gguf.h"
#include "util/error.h"

namespace strata::model {

void SpecList::add(std::string name, std::vector<int64_t> shape, Role role, TypeClass cls,
                   Init init, bool required) {
  specs_.push_back({std::move(name), std::move(shape), role, cls, init, required, layer_});
}

void SpecList::blk(const std::string& name, std::vector<int64_t> shape, Role role,
                   TypeClass cls, Init init, bool required) {
  add(cat("blk.", layer_, ".", name), std::move(shape), role, cls, init, required);
}

int64_t stored_ne0(const TensorSpec& s, quant::Type t) {
  const int64_t block = quant::type_info(t).block_elems;
  if (!s.pad_rows_to_block || s.shape[0] % block == 0) return s.shape[0];
  return (s.shape[0] + block - 1) / block * block;
}

std::vector<int64_t> stored_shape(const TensorSpec& s, quant::Type t) {
  std::vector<int64_t> shape = s.shape;
  shape[0] = stored_ne0(s, t);
  return shape;
}

std::vector<TensorSpec> tensor_specs(const ModelConfig& c) {
  switch (c.arch) {
    case Arch::Qwen4Exp: return qwen4exp_tensors(c);
    case Arch::Qwen3Next:
    case Arch::Qwen35Moe: return qwen3next_tensors(c);
    case Arch::Qwen3Moe: return qwen3moe_tensors(c);
  }
  fail("internal error: unknown architecture");
}

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
}  // namespace

void validate_tensors(const gguf::Reader& reader, const ModelConfig& c, bool experts_in_file) {
  std::unordered_map<std::string, const TensorSpec*> by_name;
  const auto specs = tensor_specs(c);
  for (const auto& s : specs) by_name[s.name] = &s;
  for (const auto& s : specs) {
    const gguf::TensorInfo* t = reader.find_tensor(s.name);
    if (!experts_in_file && s.role == Role::RoutedExpert) {
      if (t)
        fail(reader.path(), ": has expert stack ", s.name,
             " but not all of them; the file is neither a full model nor a trunk-only one");
      continue;
    }
    if (!t) {
      if (s.required) fail(reader.path(), ": missing tensor ", s.name, " ", shape_str(s.shape));
      continue;
    }
    if (t->shape != s.shape) {
      const std::vector<int64_t> padded = stored_shape(s, t->type);
      if (padded != s.shape && t->shape != padded)
        fail(reader.path(), ": tensor ", s.name, " has shape ", shape_str(t->shape), ", ",
             arch_name(c.arch), " expects ", shape_str(s.shape), " or, rows zero-padded to ",
             quant::type_name(t->type), "'s ", quant::type_info(t->type).block_elems,
             "-element blocks, ", shape_str(padded));
      if (padded == s.shape)
        fail(reader.path(), ": tensor ", s.name, " has shape ", shape_str(t->shape), ", ",
             arch_name(c.arch), " expects ", shape_str(s.shape),
             s.pad_rows_to_block ? cat(" (", quant::type_name(t->type), "'s block divides ne0: no padding)")
                                 : std::string(" (only qwen4exp's ffn_down_exps may have padded rows)"));
    }
    if (s.cls == TypeClass::Vector && t->type != quant::Type::F32 && t->type != quant::Type::F16 &&
        t->type != quant::Type::BF16)
      fail(reader.path(), ": tensor ", s.name, " is ", quant::type_name(t->type),
           "; a norm/vector tensor must be f32, f16 or bf16");
  }
  for (const auto& t : reader.tensors())
    if (!by_name.count(t.name))
      fail(reader.path(), ": unexpected tensor ", t.name, " for ", arch_name(c.arch),
           " (llama.cpp rejects files with tensors its loader does not create)");
}

}  // namespace strata::model
