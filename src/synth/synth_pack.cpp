#include "synth/synth_pack.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <unordered_map>

#include "experts/pack.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::synth {

namespace {

// Per block, the spec index of its gate, up and down stacks, and the pack layouts.
struct ExpertPlan {
  std::vector<std::array<size_t, 3>> stacks;
  std::vector<experts::Layout> layouts;
  int n_experts = 0;
};

ExpertPlan expert_plan(const SynthPlan& plan) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < plan.specs.size(); ++i)
    if (plan.specs[i].role == model::Role::RoutedExpert) index[plan.specs[i].name] = i;
  ExpertPlan out;
  out.n_experts = int(plan.config.n_expert);
  for (int layer = 0; layer < plan.config.n_blocks(); ++layer) {
    std::array<size_t, 3> stack{};
    experts::Part parts[3];
    for (int p = 0; p < 3; ++p) {
      const auto it = index.find(experts::expert_stack_name(layer, p));
      if (it == index.end())
        fail("synth --pack: the plan has no ", experts::expert_stack_name(layer, p));
      stack[size_t(p)] = it->second;
      const auto& s = plan.specs[it->second];
      parts[p].type = plan.types[it->second];
      parts[p].cols = s.shape[0];
      parts[p].rows = s.shape[1];
    }
    out.stacks.push_back(stack);
    out.layouts.push_back(experts::make_layout(parts[0], parts[1], parts[2]));
  }
  if (index.size() != out.stacks.size() * 3)
    fail("synth --pack: routed expert tensors outside blocks 0..", plan.config.n_blocks() - 1);
  return out;
}

}  // namespace

uint64_t pack_record_bytes(const SynthPlan& plan) {
  uint64_t total = 0;
  for (const auto& l : expert_plan(plan).layouts)
    total += l.record_bytes * uint64_t(plan.config.n_expert);
  return total;
}

uint64_t write_synth_pack(const SynthPlan& plan, WeightSource& source, const std::string& path,
                          ProgressBar* bar) {
  const ExpertPlan ep = expert_plan(plan);
  experts::PackWriter writer(path, ep.layouts, ep.n_experts);
  uint64_t max_record = 0;
  for (const auto& l : ep.layouts) max_record = std::max(max_record, l.record_bytes);
  experts::AlignedBuffer record{size_t(max_record)};
  for (size_t layer = 0; layer < ep.layouts.size(); ++layer) {
    const experts::Layout& l = ep.layouts[layer];
    for (int e = 0; e < ep.n_experts; ++e) {
      std::memset(record.data(), 0, size_t(l.record_bytes));
      for (int p = 0; p < 3; ++p) {
        const experts::Part& part = l.part(p);
        // Expert e is rows [e * rows, (e + 1) * rows) of the [cols, rows, n_expert] stack.
        source.fill_rows(ep.stacks[layer][size_t(p)], int64_t(e) * part.rows, part.rows,
                         record.data() + part.offset);
        if (bar) bar->advance(part.bytes());
      }
      writer.append(record.data());
    }
  }
  writer.finish();
  return writer.source_id();
}

}  // namespace strata::synth
