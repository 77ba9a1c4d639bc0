// Which weight formats the backend decodes: exactly those decode.cuh has a Decoder for.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/decode.cuh"
#include "backend/cuda/ops.h"

namespace strata::cuda {

bool supports(quant::Type t) {
  return detail::visit_decoder(t, [](auto) {});
}

}  // namespace strata::cuda

namespace strata::cuda::detail {

size_t weight_alignment(quant::Type t) {
  size_t align = 0;
  visit_decoder(t, [&](auto decoder) { align = decltype(decoder)::kAlign; });
  return align;
}

}  // namespace strata::cuda::detail
