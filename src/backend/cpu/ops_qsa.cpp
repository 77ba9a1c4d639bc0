#include "backend/cpu/ops_qsa.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/cpu/ops_vec.h"

namespace strata::cpu {

void block_mean(const Tensor& x, std::span<const int32_t> firsts, int64_t block, Tensor y) {
  constexpr const char* op = "block_mean";
  check_tensor(op, "x", x);
  check_tensor(op, "y", y);
  require(block > 0 && x.cols == y.cols && int64_t(firsts.size()) == y.rows, op, "x ", shape(x),
          ", ", firsts.size(), " block starts and y ", shape(y), " do not fit blocks of ", block);
  for (int32_t f : firsts)
    require(f < 0 || f + block <= x.rows, op, "the block at row ", f, " runs past the ", x.rows,
            " rows of x");
  check_no_overlap(op, "x", x, "y", y);
  for (int64_t b = 0; b < y.rows; ++b) {
    const int64_t first = firsts[size_t(b)];
    for (int64_t c = 0; c < y.cols; ++c) {
      float sum = 0.0f;
      for (int64_t r = 0; first >= 0 && r < block; ++r) sum += row_at(x, first + r, c);
      y.data[b * y.stride + c] = first >= 0 ? sum / float(block) : 0.0f;
    }
  }
}

void block_scores(ThreadPool& pool, const Tensor& q, const Tensor& keys,
                  std::span<const int32_t> positions, int64_t block, int64_t n_head,
                  int64_t head_dim, float scale, Tensor y) {
  constexpr const char* op = "block_scores";
  check_tensor(op, "q", q);
  check_tensor(op, "keys", keys);
  check_tensor(op, "y", y);
  require(n_head > 0 && head_dim > 0 && q.cols == n_head * head_dim && keys.cols == head_dim, op,
          "q ", shape(q), " and keys ", shape(keys), " do not fit ", n_head, " heads of ",
          head_dim);
  require(block > 0, op, "block size ", block);
  require(int64_t(positions.size()) == q.rows && y.rows == q.rows, op, positions.size(),
          " positions and y ", shape(y), " for ", q.rows, " rows");
  for (int32_t p : positions) {
    const int64_t n = (int64_t(p) + 1) / block;
    require(p >= 0 && n <= keys.rows && n <= y.cols, op, "position ", p, " sees ", n,
            " blocks: more than the ", keys.rows, " keys or the ", y.cols, " columns of y");
  }
  check_no_overlap(op, "q", q, "y", y);
  check_no_overlap(op, "keys", keys, "y", y);
  const VecKernels& v = vec();
  for_tasks(pool, q.rows, q.rows * keys.rows * q.cols, [&](int64_t r) {
    const int64_t count = (int64_t(positions[size_t(r)]) + 1) / block;
    float* yr = y.data + r * y.stride;
    for (int64_t b = 0; b < y.cols; ++b) {
      float sum = 0.0f;
      for (int64_t h = 0; b < count && h < n_head; ++h)
        sum += std::max(0.0f, v.dot(q.data + r * q.stride + h * head_dim,
                                    keys.data + b * keys.stride, head_dim));
      yr[b] = sum * scale;
    }
  });
}

void qsa_select(const Tensor& scores, std::span<const int32_t> positions, int64_t block,
                int64_t top_blocks, int32_t* selected, int64_t selected_cols,
                std::span<int32_t> counts) {
  constexpr const char* op = "qsa_select";
  check_tensor(op, "scores", scores);
  require(block > 0 && top_blocks >= 0, op, "block ", block, ", top_blocks ", top_blocks);
  require(int64_t(positions.size()) == scores.rows && counts.size() == positions.size(), op,
          positions.size(), " positions and ", counts.size(), " counts for ", scores.rows,
          " rows of scores");
  require(selected_cols >= top_blocks * block + block - 1, op, "selected has ", selected_cols,
          " columns; ", top_blocks, " blocks of ", block, " and a tail need ",
          top_blocks * block + block - 1);
  std::vector<int64_t> order;
  for (size_t r = 0; r < positions.size(); ++r) {
    const int64_t p = positions[r], nb = (p + 1) / block;
    require(p >= 0 && nb <= scores.cols, op, "position ", p, " sees ", nb,
            " blocks; scores has ", scores.cols, " columns");
    const float* score = scores.data + int64_t(r) * scores.stride;
    // scores.topk(min(block_topk, blocks)); ties (unspecified in torch) go to the earlier block.
    order.resize(size_t(nb));
    std::iota(order.begin(), order.end(), 0);
    const int64_t keep = std::min(top_blocks, nb);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
      return score[a] != score[b] ? score[a] > score[b] : a < b;
    });
    order.resize(size_t(keep));
    std::sort(order.begin(), order.end());
    int32_t* out = selected + int64_t(r) * selected_cols;
    int32_t n = 0;
    for (int64_t b : order)
      for (int64_t i = 0; i < block; ++i) out[n++] = int32_t(b * block + i);
    for (int64_t q = nb * block; q <= p; ++q) out[n++] = int32_t(q);  // the incomplete tail
    counts[r] = n;
  }
}

}  // namespace strata::cpu
