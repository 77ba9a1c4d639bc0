#include "backend/backend.h"

#include "util/error.h"

namespace strata::backend {

Ids make_ids(Backend& be, std::span<const int32_t> host, int64_t rows, int64_t cols) {
  if (int64_t(host.size()) != rows * cols)
    fail("make_ids: ", host.size(), " values for [", rows, " x ", cols, "]");
  Ids ids = be.alloc_ids(rows, cols);
  be.upload_ids(host.data(), ids);
  return ids;
}

Routing download_routing(Backend& be, const Ids& experts, const Tensor& weights) {
  if (experts.rows != weights.rows || experts.cols != weights.cols)
    fail("download_routing: experts [", experts.rows, " x ", experts.cols, "] and weights [",
         weights.rows, " x ", weights.cols, "] differ in shape");
  Routing r;
  r.top_k = experts.cols;
  r.experts.resize(size_t(experts.size()));
  r.weights.resize(size_t(experts.size()));
  be.download_ids(experts, r.experts.data());
  be.download(weights, r.weights.data());
  return r;
}

void upload_routing(Backend& be, const Routing& routing, Ids experts, Tensor weights) {
  if (routing.top_k != experts.cols || int64_t(routing.experts.size()) != experts.size() ||
      routing.weights.size() != routing.experts.size() || weights.rows != experts.rows ||
      weights.cols != experts.cols)
    fail("upload_routing: a routing of ", routing.experts.size(), " experts (top-", routing.top_k,
         ") does not fit [", experts.rows, " x ", experts.cols, "]");
  be.upload_ids(routing.experts.data(), experts);
  be.upload(routing.weights.data(), weights);
}

}  // namespace strata::backend
