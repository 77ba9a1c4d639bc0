// The `strata inspect` report, built once as JSON and rendered as text from the same data.
#include "gguf/inspect.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>

#include "quant/kernels.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::gguf {

namespace {

using ojson = nlohmann::ordered_json;

constexpr size_t kArraySummaryItems = 16;
constexpr TensorGroup kGroups[] = {TensorGroup::Trunk, TensorGroup::Expert, TensorGroup::Ngram};

ojson value_json(const Value& v) {
  switch (v.type()) {
    case ValueType::STRING: return v.as_string();
    case ValueType::BOOL: return v.as_bool();
    case ValueType::F32:
    case ValueType::F64: return v.as_f64();
    case ValueType::ARRAY: {
      const auto& items = v.as_array();
      if (items.size() > kArraySummaryItems) return v.to_string(kArraySummaryItems);
      ojson out = ojson::array();
      for (const Value& item : items) out.push_back(value_json(item));
      return out;
    }
    case ValueType::I8:
    case ValueType::I16:
    case ValueType::I32:
    case ValueType::I64: return v.as_i64();
    default: return v.as_u64();
  }
}

std::string human_count(uint64_t n) {
  char buf[32];
  if (n >= 1'000'000'000) std::snprintf(buf, sizeof buf, "%.2fB", double(n) / 1e9);
  else if (n >= 1'000'000) std::snprintf(buf, sizeof buf, "%.2fM", double(n) / 1e6);
  else if (n >= 1'000) std::snprintf(buf, sizeof buf, "%.2fK", double(n) / 1e3);
  else std::snprintf(buf, sizeof buf, "%" PRIu64, n);
  return buf;
}

// A scalar or short array shown on one line; strings of several lines (chat templates) are
// shown by their size only.
std::string one_line(const Value& v) {
  if (v.type() == ValueType::STRING && v.as_string().find('\n') != std::string::npos)
    return cat("(", v.as_string().size(), " bytes of text, ",
               std::count(v.as_string().begin(), v.as_string().end(), '\n') + 1, " lines)");
  return v.to_string(kArraySummaryItems);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const char* tensor_group_name(TensorGroup g) {
  switch (g) {
    case TensorGroup::Expert: return "experts";
    case TensorGroup::Ngram: return "ngram";
    default: return "trunk";
  }
}

TensorGroup tensor_group(std::string_view arch, std::string_view name) {
  if (name.find("_exps") != std::string_view::npos) return TensorGroup::Expert;
  if (name.find("ngram") != std::string_view::npos ||
      (arch == "qwen4exp" && name.find("per_layer_token_embd.") != std::string_view::npos))
    return TensorGroup::Ngram;
  return TensorGroup::Trunk;
}

ojson inspect_json(const Reader& r) {
  ojson out;
  out["file"] = r.path();
  out["version"] = r.version();
  out["alignment"] = r.alignment();
  out["file_size"] = r.file_size();
  out["data_offset"] = r.data_offset();
  const std::string arch = r.get_string("general.architecture", "");
  out["architecture"] = arch;

  ojson hparams = ojson::object(), metadata = ojson::object();
  const std::string prefix = arch + ".";
  for (const auto& [key, value] : r.metadata()) {
    metadata[key] = value_json(value);
    if (!arch.empty() && key.starts_with(prefix)) hparams[key.substr(prefix.size())] = value_json(value);
  }
  if (const Value* tokens = r.find("tokenizer.ggml.tokens"); tokens && tokens->type() == ValueType::ARRAY)
    hparams["vocab (tokenizer.ggml.tokens)"] = tokens->as_array().size();
  out["hyperparameters"] = std::move(hparams);
  out["metadata"] = std::move(metadata);

  ojson tensors = ojson::array();
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // name -> tensors, bytes
  struct Sum { uint64_t tensors = 0, bytes = 0, params = 0; } sums[3], total;
  for (const TensorInfo& t : r.tensors()) {
    const TensorGroup g = tensor_group(arch, t.name);
    const char* type = quant::type_name(t.type);
    tensors.push_back({{"name", t.name}, {"type", type}, {"shape", t.shape},
                       {"n_elements", t.n_elements()}, {"bytes", t.nbytes}, {"offset", t.offset},
                       {"group", tensor_group_name(g)}});
    auto& [count, bytes] = by_type[type];
    ++count;
    bytes += t.nbytes;
    for (Sum* s : {&sums[int(g)], &total}) {
      ++s->tensors;
      s->bytes += t.nbytes;
      s->params += uint64_t(t.n_elements());
    }
  }
  out["tensors"] = std::move(tensors);
  ojson types = ojson::object();
  for (const auto& [type, cb] : by_type) types[type] = {{"tensors", cb.first}, {"bytes", cb.second}};
  out["bytes_by_type"] = std::move(types);
  ojson groups = ojson::object();
  for (TensorGroup g : kGroups) {
    const Sum& s = sums[int(g)];
    groups[tensor_group_name(g)] = {{"tensors", s.tensors}, {"bytes", s.bytes}, {"params", s.params}};
  }
  out["groups"] = std::move(groups);
  out["total"] = {{"tensors", total.tensors}, {"bytes", total.bytes}, {"params", total.params}};
  return out;
}

std::string inspect_text(const Reader& r) {
  const ojson j = inspect_json(r);
  std::string out;
  const auto line = [&](auto&&... parts) { out += cat(parts...) + "\n"; };
  line("file          ", r.path());
  line("gguf          v", r.version(), ", alignment ", r.alignment(), ", ", r.file_size(), " bytes (",
       format_bytes(r.file_size()), "), tensor data at offset ", r.data_offset());
  const std::string arch = j["architecture"];
  line("architecture  ", arch.empty() ? "(none: no general.architecture)" : arch);
  const std::string prefix = arch + ".";
  for (const auto& [key, value] : r.metadata())
    if (!arch.empty() && key.starts_with(prefix)) line("  ", key.substr(prefix.size()), " = ", one_line(value));
  if (const Value* tokens = r.find("tokenizer.ggml.tokens"); tokens && tokens->type() == ValueType::ARRAY)
    line("  vocab = ", tokens->as_array().size(), " tokens");

  line("\nmetadata (", r.metadata().size(), " keys)");
  size_t key_width = 0;
  for (const auto& [key, value] : r.metadata()) key_width = std::max(key_width, key.size());
  for (const auto& [key, value] : r.metadata()) {
    const std::string type = value.type() == ValueType::ARRAY
                                 ? cat("array of ", value_type_name(value.elem_type()))
                                 : value_type_name(value.type());
    line("  ", key, std::string(key_width - key.size() + 2, ' '), type,
         std::string(type.size() < 16 ? 16 - type.size() : 1, ' '), one_line(value));
  }

  line("\ntensors (", r.tensors().size(), ")");
  size_t name_width = 4, type_width = 4;
  for (const TensorInfo& t : r.tensors()) {
    name_width = std::max(name_width, t.name.size());
    type_width = std::max(type_width, std::string_view(quant::type_name(t.type)).size());
  }
  const int tw = int(type_width);
  char row[256];
  std::snprintf(row, sizeof row, "  %-*s  %-*s  %-24s  %14s  %14s  %s", int(name_width), "name", tw,
                "type", "shape", "bytes", "offset", "group");
  line(row);
  for (const TensorInfo& t : r.tensors()) {
    std::snprintf(row, sizeof row, "  %-*s  %-*s  %-24s  %14" PRIu64 "  %14" PRIu64 "  %s",
                  int(name_width), t.name.c_str(), tw, quant::type_name(t.type),
                  t.shape_string().c_str(), t.nbytes, t.offset,
                  tensor_group_name(tensor_group(arch, t.name)));
    line(row);
  }

  line("\nbytes by type");
  for (const auto& [type, s] : j["bytes_by_type"].items()) {
    std::snprintf(row, sizeof row, "  %-*s  %6" PRIu64 " tensors  %16" PRIu64 " bytes  %12s",
                  tw, type.c_str(), s["tensors"].get<uint64_t>(), s["bytes"].get<uint64_t>(),
                  format_bytes(s["bytes"].get<uint64_t>()).c_str());
    line(row);
  }

  line("\nsplit");
  const uint64_t total_bytes = j["total"]["bytes"];
  for (const auto& [name, s] : j["groups"].items()) {
    if (name == "ngram" && s["tensors"].get<uint64_t>() == 0) continue;
    const uint64_t bytes = s["bytes"], params = s["params"];
    std::snprintf(row, sizeof row, "  %-8s  %6" PRIu64 " tensors  %16" PRIu64 " bytes  %12s  %5.1f%%  %10s params",
                  name.c_str(), s["tensors"].get<uint64_t>(), bytes, format_bytes(bytes).c_str(),
                  total_bytes ? 100.0 * double(bytes) / double(total_bytes) : 0.0,
                  human_count(params).c_str());
    line(row);
  }
  std::snprintf(row, sizeof row, "  %-8s  %6" PRIu64 " tensors  %16" PRIu64 " bytes  %12s  %6s  %10s params",
                "total", j["total"]["tensors"].get<uint64_t>(), total_bytes,
                format_bytes(total_bytes).c_str(), "", human_count(j["total"]["params"]).c_str());
  line(row);
  return out;
}

std::vector<float> tensor_values(const Reader& r, std::string_view name, int64_t n) {
  const TensorInfo* t = r.find_tensor(name);
  if (!t) {
    std::vector<std::pair<size_t, std::string>> ranked;
    for (const TensorInfo& other : r.tensors()) {
      const bool contains = other.name.find(name) != std::string::npos;
      ranked.emplace_back(contains ? 0 : edit_distance(name, other.name), other.name);
    }
    std::sort(ranked.begin(), ranked.end());
    std::string similar;
    for (size_t i = 0; i < ranked.size() && i < 8; ++i) similar += (i ? ", " : "") + ranked[i].second;
    fail(r.path(), ": no tensor named \"", name, "\"",
         ranked.empty() ? std::string(" (the file has no tensors)") : "; similar: " + similar);
  }
  if (n < 0) fail("--values must not be negative");
  const quant::TypeInfo& info = quant::type_info(t->type);
  const int64_t count = std::min(n, t->n_elements());
  const int64_t blocks = (count + info.block_elems - 1) / info.block_elems;
  std::vector<float> values(size_t(blocks * info.block_elems));
  try {
    quant::dequantize(t->type, t->data, values.data(), blocks * info.block_elems);
  } catch (const Error& e) {
    fail(r.path(), ": tensor ", t->name, " (", info.name, "): ", e.what());
  }
  values.resize(size_t(count));
  return values;
}

std::string format_values(const std::vector<float>& values) {
  std::string out;
  char buf[32];
  for (float v : values) {
    std::snprintf(buf, sizeof buf, "%.9g\n", double(v));
    out += buf;
  }
  return out;
}

}  // namespace strata::gguf
