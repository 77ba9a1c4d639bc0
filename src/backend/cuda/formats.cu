// Which weight formats the backend decodes: exactly those decode.cuh has a Decoder for.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/decode.cuh"

namespace strata::cuda {

bool supports(quant::Type t) {
  return detail::visit_decoder(t, [](auto) {});
}

}  // namespace strata::cuda
