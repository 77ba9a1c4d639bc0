#include "backend/cpu/ops_matmul.h"

#include <algorithm>

#include "backend/cpu/matvec.h"
#include "quant/kernels.h"

namespace strata::cpu {

namespace {

// Output rows per task: 16 rows of a 2560-wide Q4_K weight are ~23 KiB, which stay in L1/L2
// while each activation of the tile is dotted with them.
constexpr int64_t kRowTile = 16;
// Activation rows per pass over the weight: 64 Q8_K activations of 2560 are ~190 KiB, about
// an L2; larger windows make several passes, each streaming the weight once.
constexpr int64_t kActTile = 64;

}  // namespace

void check_weight(const char* op, const char* name, const Weight& w) {
  require(w.data != nullptr, op, name, " has no data");
  require(w.rows > 0 && w.cols > 0, op, name, " has an empty shape [", w.rows, " x ", w.cols, "]");
  require(quant::has_kernels(w.type), op, name, ": no kernels for type ",
          quant::type_info(w.type).name);
  const quant::FormatKernels& k = quant::kernels(w.type);
  const int64_t block =
      std::max(quant::type_info(w.type).block_elems, quant::act_block_elems(k.act));
  require(w.cols % block == 0, op, name, " has ", w.cols, " columns, not a multiple of ", block,
          " (the ", quant::type_info(w.type).name, " block)");
  require(w.row_stride >= quant::row_bytes(w.type, w.cols), op, name, " row stride ", w.row_stride,
          " is shorter than a row");
}

void matmul(ThreadPool& pool, Workspace& ws, const Weight& w, const Tensor& x, Tensor y) {
  constexpr const char* op = "matmul";
  check_weight(op, "weight", w);
  check_tensor(op, "x", x);
  check_tensor(op, "y", y);
  require(x.cols == w.cols, op, "x ", shape(x), " has ", x.cols, " columns but the weight has ",
          w.cols, " [", w.rows, " x ", w.cols, "]");
  require(y.rows == x.rows && y.cols == w.rows, op, "y ", shape(y), " should be [", x.rows, " x ",
          w.rows, "]");
  check_no_overlap(op, "x", x, "y", y);
  const int64_t T = x.rows;
  if (T == 0) return;

  const quant::ActFormat fmt = quant::kernels(w.type).act;
  const size_t act_bytes = quant::act_bytes(fmt, x.cols);
  ws.act.resize(size_t(T) * act_bytes);
  uint8_t* act = ws.act.data();
  for_tasks(pool, T, T * x.cols, [&](int64_t r) {
    quant::quantize_act(fmt, x.data + r * x.stride, act + size_t(r) * act_bytes, x.cols);
  });

  // Each task is a tile of weight rows against a group of activation rows (dot_tile: a weight
  // block is decoded once for several activations; the results are those of one dot each).
  const int64_t n_tiles = (w.rows + kRowTile - 1) / kRowTile;
  for (int64_t t0 = 0; t0 < T; t0 += kActTile) {
    const int64_t t1 = std::min(T, t0 + kActTile);
    const void* acts[kActTile];
    float* outs[kActTile];
    for (int64_t r = t0; r < t1; ++r) {
      acts[r - t0] = act + size_t(r) * act_bytes;
      outs[r - t0] = y.data + r * y.stride;
    }
    const size_t n = size_t(t1 - t0);
    pool.parallel_for(n_tiles, [&](int64_t tile) {
      const int64_t o0 = tile * kRowTile;
      dot_tile(w, o0, std::min(w.rows, o0 + kRowTile), {acts, n}, {outs, n});
    });
  }
}

void get_rows(const Weight& table, std::span<const int32_t> ids, Tensor y) {
  constexpr const char* op = "get_rows";
  require(table.data != nullptr, op, "table has no data");
  check_tensor(op, "y", y);
  require(y.rows == int64_t(ids.size()) && y.cols == table.cols, op, "y ", shape(y), " should be [",
          ids.size(), " x ", table.cols, "]");
  const auto* base = static_cast<const uint8_t*>(table.data);
  for (size_t r = 0; r < ids.size(); ++r) {
    require(ids[r] >= 0 && ids[r] < table.rows, op, "id ", ids[r], " (row ", r,
            ") is outside the table's ", table.rows, " rows");
    quant::dequantize(table.type, base + size_t(ids[r]) * table.row_stride,
                      y.data + int64_t(r) * y.stride, table.cols);
  }
}

}  // namespace strata::cpu
