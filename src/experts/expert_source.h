// Where a layer's routed experts come from. The forward pass reaches expert weights only through
// this interface, so the streaming expert cache (arena slots filled from the .experts pack) can
// replace today's file-mapped stacks without touching model code (DESIGN.md, "Expert arena").
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace strata::gguf {
class Reader;
}

namespace strata::model {
struct ModelConfig;
}

namespace strata::experts {

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // The weights of layer `layer`'s experts, indexed by expert id, for a window whose routing is
  // `routing`: every expert it names is usable until the next call (a cache waits for misses
  // here: the handshake). Other entries may be empty.
  virtual std::span<const backend::ExpertWeights> layer(int layer,
                                                        const backend::Routing& routing) = 0;
};

// Every expert as a slice of the file's [ne0, ne1, n_expert] stacks (ffn_{gate,up,down}_exps),
// prepared once through Backend::weight. Throws strata::Error naming a missing stack.
std::unique_ptr<ExpertSource> make_mapped_source(const gguf::Reader& reader,
                                                 const model::ModelConfig& config,
                                                 backend::Backend& backend);

}  // namespace strata::experts
