#include "backend/cpu/ops_top_k.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace strata::cpu {

void top_k(const Tensor& x, std::span<int32_t> index, Tensor values) {
  constexpr const char* op = "top_k";
  check_tensor(op, "x", x);
  check_tensor(op, "values", values);
  const int64_t k = values.cols;
  require(values.rows == x.rows && k >= 1 && k <= backend::Backend::kMaxTopK && int64_t(index.size()) == x.rows * k, op,
          "x ", shape(x), " needs index and values [", x.rows, " x k] with 1 <= k <= ", backend::Backend::kMaxTopK,
          ", got ", index.size(), " indices and values ", shape(values));
  std::vector<int32_t> columns;
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* row = x.data + r * x.stride;
    columns.clear();
    for (int64_t c = 0; c < x.cols; ++c)
      if (!std::isnan(row[c])) columns.push_back(int32_t(c));
    // -0 == +0 under >, so equal zeros of either sign fall to the column order.
    const auto before = [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
    const size_t n = std::min(columns.size(), size_t(k));
    std::partial_sort(columns.begin(), columns.begin() + std::ptrdiff_t(n), columns.end(), before);
    for (int64_t j = 0; j < k; ++j) {
      const bool found = size_t(j) < n;
      index[size_t(r * k + j)] = found ? columns[size_t(j)] : -1;
      values.data[r * values.stride + j] = found ? row[columns[size_t(j)]] : -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace strata::cpu
