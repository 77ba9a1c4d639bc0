// A pack and the model it belongs to: the GGUF's expert stacks as layouts, the source id, where
// the engine looks for a model's pack and whether the pack it finds still matches.
#include <cstdlib>
#include <filesystem>

#include "experts/pack.h"
#include "experts/pack_format.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "util/error.h"

namespace strata::experts {

namespace {

constexpr const char* kStackNames[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                        "ffn_down_exps.weight"};

bool is_expert_stack(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return false;
  for (const char* s : kStackNames)
    if (name.size() > std::string_view(s).size() && name.ends_with(std::string(".") + s))
      return true;
  return false;
}

// How to get a fresh pack for this model.
std::string remake_hint(const gguf::Reader& model) {
  if (has_expert_stacks(model)) return cat("make it with `strata pack ", model.path(), "`");
  return cat(model.path(),
             " holds no expert tensors (it was written with its experts in a pack, "
             "`strata synth --pack`); write model and pack again");
}

}  // namespace

const char* part_name(int part) {
  static constexpr const char* kNames[3] = {"gate", "up", "down"};
  return kNames[part];
}

std::string expert_stack_name(int layer, int part) {
  return cat("blk.", layer, ".", kStackNames[part]);
}

bool has_expert_stacks(const gguf::Reader& model) {
  for (const auto& t : model.tensors())
    if (is_expert_stack(t.name)) return true;
  return false;
}

ExpertShape expert_shape(const gguf::Reader& model) {
  ExpertShape shape;
  for (int layer = 0; model.find_tensor(expert_stack_name(layer, 0)); ++layer) {
    Part parts[3];
    for (int i = 0; i < 3; ++i) {
      const std::string name = expert_stack_name(layer, i);
      const gguf::TensorInfo* t = model.find_tensor(name);
      if (!t)
        fail(model.path(), ": layer ", layer, " has ", expert_stack_name(layer, 0), " but no ",
             name);
      if (t->shape.size() != 3)
        fail(model.path(), ": ", name, " has shape ", t->shape_string(),
             "; an expert stack is 3-D [cols, rows, experts]");
      if (t->shape[2] > int64_t(format::kMaxExperts))
        fail(model.path(), ": ", name, " has ", t->shape[2], " experts, more than a pack holds (",
             format::kMaxExperts, ")");
      if (shape.n_experts == 0) shape.n_experts = int(t->shape[2]);
      if (t->shape[2] != shape.n_experts)
        fail(model.path(), ": ", name, " has ", t->shape[2], " experts, ", expert_stack_name(0, 0),
             " has ", shape.n_experts);
      parts[i] = Part{t->type, t->shape[1], t->shape[0], 0, 0};
    }
    shape.layers.push_back(make_layout(parts[0], parts[1], parts[2]));
  }
  for (const auto& t : model.tensors()) {
    if (!is_expert_stack(t.name)) continue;
    const int layer = std::atoi(t.name.c_str() + 4);
    if (layer >= int(shape.layers.size()))
      fail(model.path(), ": expert stack ", t.name, " belongs to no complete layer 0..",
           int(shape.layers.size()) - 1, " (a pack needs every layer's gate, up and down stacks)");
  }
  if (shape.layers.empty())
    fail(model.path(), ": no expert stacks (blk.N.ffn_{gate,up,down}_exps.weight)");
  return shape;
}

uint64_t model_source_id(const gguf::Reader& model) {
  const ExpertShape shape = expert_shape(model);
  format::SourceIdHasher hasher;
  for (int layer = 0; layer < int(shape.layers.size()); ++layer) {
    const uint8_t* parts[3];
    for (int i = 0; i < 3; ++i) parts[i] = model.tensor(expert_stack_name(layer, i)).data;
    hasher.add_layer(shape.layers[size_t(layer)], shape.n_experts, parts);
  }
  return hasher.digest();
}

std::string pack_path_for(const gguf::Reader& model, const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  if (const gguf::Value* v = model.find(kPackKey)) {
    if (v->type() != gguf::ValueType::STRING)
      fail(model.path(), ": metadata ", kPackKey, " is not a string");
    const std::filesystem::path name = v->as_string();
    if (name.empty() || name.has_parent_path() || name.is_absolute())
      fail(model.path(), ": metadata ", kPackKey, " = '", name.string(),
           "' is not a plain file name");
    return (std::filesystem::path(model.path()).parent_path() / name).string();
  }
  return model.path() + ".experts";
}

void Pack::check_model(const gguf::Reader& model, const model::ModelConfig& c) const {
  const std::string stale = cat(path_, " does not belong to ", model.path(), ": ");
  const std::string hint = cat("; ", remake_hint(model));
  if (n_layers() != c.n_blocks() || n_experts_ != c.n_expert)
    fail(stale, "it holds ", n_layers(), " layers x ", n_experts_, " experts, the model has ",
         c.n_blocks(), " x ", c.n_expert, hint);
  for (int layer = 0; layer < n_layers(); ++layer) {
    const Layout& l = layouts_[size_t(layer)];
    if (l.gate.rows != c.n_ff_exp || l.gate.cols != c.n_embd)
      fail(stale, "layer ", layer, " gate is [", l.gate.rows, " x ", l.gate.cols,
           "], the model's experts are [", c.n_ff_exp, " x ", c.n_embd, "]", hint);
  }
  if (has_expert_stacks(model)) {
    const ExpertShape shape = expert_shape(model);
    for (int layer = 0; layer < n_layers(); ++layer)
      for (int i = 0; i < 3; ++i) {
        const Part& mine = layouts_[size_t(layer)].part(i);
        const Part& theirs = shape.layers[size_t(layer)].part(i);
        if (mine.type != theirs.type)
          fail(stale, "layer ", layer, " ", part_name(i), " is ", quant::type_name(mine.type), ", ",
               expert_stack_name(layer, i), " is ", quant::type_name(theirs.type), hint);
      }
    const uint64_t id = model_source_id(model);
    if (id != source_id_)
      fail(stale, "it was made from other expert weights (source id ", std::hex, source_id_,
           ", the model's is ", id, ")", std::dec, hint);
    return;
  }
  const gguf::Value* v = model.find(kSourceIdKey);
  if (!v || !v->is_integer())
    fail(model.path(), ": no expert stacks and no ", kSourceIdKey, " to check ", path_, " against",
         hint);
  if (v->as_u64() != source_id_)
    fail(stale, "it was made from other expert weights (source id ", std::hex, source_id_, ", ",
         kSourceIdKey, " is ", v->as_u64(), ")", std::dec, hint);
}

std::unique_ptr<Pack> open_model_pack(const gguf::Reader& model, const model::ModelConfig& c,
                                      const std::string& explicit_path) {
  const std::string path = pack_path_for(model, explicit_path);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    fail(model.path(), ": expert pack ", path, " not found; ", remake_hint(model));
  auto pack = Pack::open(path);
  pack->check_model(model, c);
  return pack;
}

}  // namespace strata::experts
