#include "experts/expert_source.h"

#include "gguf/gguf.h"
#include "model/config.h"
#include "util/error.h"

namespace strata::experts {

namespace {

class MappedSource : public ExpertSource {
 public:
  MappedSource(const gguf::Reader& reader, const model::ModelConfig& c, backend::Backend& be) {
    layers_.resize(size_t(c.n_blocks()));
    for (int64_t il = 0; il < c.n_blocks(); ++il) {
      const auto& gate = reader.tensor(cat("blk.", il, ".ffn_gate_exps.weight"));
      const auto& up = reader.tensor(cat("blk.", il, ".ffn_up_exps.weight"));
      const auto& down = reader.tensor(cat("blk.", il, ".ffn_down_exps.weight"));
      auto& experts = layers_[size_t(il)];
      experts.resize(size_t(c.n_expert));
      for (int64_t e = 0; e < c.n_expert; ++e)
        experts[size_t(e)] = {be.weight(gate, e), be.weight(up, e), be.weight(down, e)};
    }
  }

  std::span<const backend::ExpertWeights> layer(int il, const backend::Routing&) override {
    return layers_.at(size_t(il));
  }

 private:
  std::vector<std::vector<backend::ExpertWeights>> layers_;
};

}  // namespace

std::unique_ptr<ExpertSource> make_mapped_source(const gguf::Reader& reader,
                                                 const model::ModelConfig& config,
                                                 backend::Backend& backend) {
  return std::make_unique<MappedSource>(reader, config, backend);
}

}  // namespace strata::experts
