// Device::matvec_q: checks the shapes, quantizes the activations once into the device scratch
// (the CPU backend's layout for the format), and runs the format's integer kernel; formats
// without one run the fp32 mat-vec once per activation.
#include <climits>

#include "backend/cuda/check.h"
#include "backend/cuda/launch.h"

namespace strata::cuda {

size_t quantized_act_stride(quant::ActFormat f, int64_t cols) {
  return (quant::act_bytes(f, cols) + 15) / 16 * 16;
}

namespace detail {

namespace mvq {
void launch_matvec_q_q8_0(const MatvecQLaunch& l);
bool launch_matvec_q_q8_0_from_x(const MatvecQLaunch& l);
void launch_matvec_q_q4_k(const MatvecQLaunch& l);
void launch_matvec_q_iq2_xs(const MatvecQLaunch& l);
void launch_matvec_q_fp8(const MatvecQLaunch& l);
void launch_moe_q_q8_0(const MoeQLaunch& l);
void launch_moe_q_q4_k(const MoeQLaunch& l);
void launch_moe_q_iq2_xs(const MoeQLaunch& l);
void launch_moe_q_fp8(const MoeQLaunch& l);
void launch_matmul_q8_0_mma(const MatvecQLaunch& l);
}  // namespace mvq

namespace {

// A weight format's integer kernels (tiles: tensor-core tiles for more than kMaxMatvecTokens
// activations; from_x: a launch whose CTAs quantize the fp32 activations themselves, which
// returns false where the format's kernels would not gain by it; null where the format has none).
struct IntegerKernels {
  void (*matvec)(const MatvecQLaunch&);
  void (*moe)(const MoeQLaunch&);
  void (*tiles)(const MatvecQLaunch&);
  bool (*from_x)(const MatvecQLaunch&);
};

// Null where the format has none.
const IntegerKernels* integer_kernels(quant::Type t) {
  static constexpr IntegerKernels kQ8_0{mvq::launch_matvec_q_q8_0, mvq::launch_moe_q_q8_0,
                                        mvq::launch_matmul_q8_0_mma,
                                        mvq::launch_matvec_q_q8_0_from_x},
      kQ4_K{mvq::launch_matvec_q_q4_k, mvq::launch_moe_q_q4_k, nullptr, nullptr},
      kIQ2_XS{mvq::launch_matvec_q_iq2_xs, mvq::launch_moe_q_iq2_xs, nullptr, nullptr},
      kFP8{mvq::launch_matvec_q_fp8, mvq::launch_moe_q_fp8, nullptr, nullptr};
  switch (t) {
    case quant::Type::Q8_0:
      return &kQ8_0;
    case quant::Type::Q4_K:
      return &kQ4_K;
    case quant::Type::IQ2_XS:
      return &kIQ2_XS;
    case quant::Type::FP8_E4M3:
      return &kFP8;
    default:
      return nullptr;
  }
}

const IntegerKernels& integer_kernels_or_fail(const char* op, quant::Type t) {
  const IntegerKernels* k = integer_kernels(t);
  if (!k) fail("CUDA ", op, ": no integer kernel for ", quant::type_name(t));
  return *k;
}

}  // namespace

void launch_matvec_q(quant::Type t, const MatvecQLaunch& l) {
  integer_kernels_or_fail("matvec_q", t).matvec(l);
}

void launch_moe_q(const MoeQLaunch& l) { integer_kernels_or_fail("moe_q", l.type).moe(l); }

void run_matvec_q(quant::Type t, std::span<const MatvecQMatrix> matrices, int64_t cols,
                  const float* x, int tokens, const MatvecQOptions& options,
                  const MatvecQContext& ctx) {
  const char* name = quant::type_name(t);
  if (tokens < 1 || (tokens > kMaxMatvecTokens && !has_matmul_tiles(t)))
    fail("CUDA matvec_q ", name, ": ", tokens, " activations, expected 1 to ", kMaxMatvecTokens,
         " (more only for formats with tensor-core tiles)");
  if (options.rows_per_warp != 0 && options.rows_per_warp != 4 && options.rows_per_warp != 8)
    fail("CUDA matvec_q ", name, ": rows_per_warp ", options.rows_per_warp, " is not 0, 4 or 8");
  if (options.grid_copies != 0 && options.grid_copies != 1 && options.grid_copies != 8 &&
      options.grid_copies != 32)
    fail("CUDA matvec_q ", name, ": grid_copies ", options.grid_copies, " is not 0, 1, 8 or 32");
  if (matrices.empty() || matrices.size() > size_t(kMaxMatvecQMatrices))
    fail("CUDA matvec_q ", name, ": ", matrices.size(), " matrices, expected 1 to ",
         kMaxMatvecQMatrices);
  if (matrices.size() > 1 && tokens > kMaxMatvecTokens)
    fail("CUDA matvec_q ", name, ": several matrices take 1 to ", kMaxMatvecTokens,
         " activations, not ", tokens);

  if (!has_matvec_q(t)) {
    // launch_matvec checks its own shapes and alignment.
    for (const MatvecQMatrix& m : matrices)
      for (int k = 0; k < tokens; ++k)
        launch_matvec(t, m.w, m.row_stride, m.rows, cols, x + k * cols, m.y + k * m.rows,
                      ctx.tables, ctx.limits, ctx.stream);
    return;
  }

  const quant::TypeInfo& info = quant::type_info(t);
  const quant::ActFormat act = quant::kernels(t).act;
  const int64_t act_block = quant::act_block_elems(act);
  if (cols <= 0 || cols % info.block_elems != 0 || cols % act_block != 0 ||
      cols / info.block_elems > INT_MAX / 2)
    fail("CUDA matvec_q ", name, ": ", cols, " columns is not a positive multiple of the block (",
         info.block_elems, ")");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0)
    fail("CUDA matvec_q ", name, ": the activation needs 16-byte alignment");
  MatvecQMatrix work[kMaxMatvecQMatrices];  // the matrices with rows
  int n = 0;
  for (const MatvecQMatrix& m : matrices) {
    if (m.rows < 0) fail("CUDA matvec_q ", name, ": negative row count ", m.rows);
    if (m.row_stride < quant::row_bytes(info, cols))
      fail("CUDA matvec_q ", name, ": row stride ", m.row_stride, " is shorter than a row (",
           quant::row_bytes(info, cols), " bytes)");
    if (reinterpret_cast<uintptr_t>(m.w) % 2 != 0 || m.row_stride % 2 != 0)
      fail("CUDA matvec_q ", name, ": weights and row stride need 2-byte alignment");
    if (m.rows > 0) work[n++] = m;
  }
  if (n == 0) return;

  MatvecQLaunch l{};
  l.w = work[0].w;
  l.row_stride = work[0].row_stride;
  l.rows = work[0].rows;
  l.blocks = cols / info.block_elems;
  l.tokens = tokens;
  l.y = work[0].y;
  l.tables = ctx.tables;
  l.rows_per_warp = options.rows_per_warp;  // 0: the kernels' default (4)
  l.grid_copies = options.grid_copies;
  l.device = ctx.device;
  l.sm_count = ctx.sm_count;
  l.stream = ctx.stream;
  l.matrices = work;
  l.n_matrices = n;

  if (act == quant::ActFormat::F32) {
    l.act = x;
    l.act_stride = size_t(cols) * sizeof(float);
  } else {
    const size_t stride = quantized_act_stride(act, cols), bytes = stride * size_t(tokens);
    const QuantizedAct key{x, cols, tokens, int(act)};
    const bool quantized = options.x_unchanged && ctx.in_scratch == key;
    const IntegerKernels& kernels = *integer_kernels(t);
    if (!quantized && kernels.from_x && tokens <= kMaxMatvecTokens &&
        options.rows_per_warp == 0) {
      MatvecQLaunch from_x = l;
      from_x.x = x;
      from_x.x_stride = cols;
      if (kernels.from_x(from_x)) {
        // The scratch no longer holds this x's present values (x_unchanged vouches only from here).
        if (ctx.in_scratch == key) ctx.in_scratch = {};
        return;
      }
    }
    if (!quantized) {
      if (ctx.scratch.size() < bytes) {
        // The old scratch may still be read by queued work.
        check(cudaStreamSynchronize(ctx.stream), "matvec_q scratch");
        ctx.scratch = DeviceBuffer(bytes);
      }
      launch_quantize_act(act, x, cols, tokens, ctx.scratch.data(), stride, ctx.limits,
                          ctx.stream);
      ctx.in_scratch = key;
    }
    l.act = ctx.scratch.data();
    l.act_stride = stride;
  }
  if (tokens > kMaxMatvecTokens) return integer_kernels(t)->tiles(l);
  launch_matvec_q(t, l);
}

}  // namespace detail

bool has_matvec_q(quant::Type t) { return detail::integer_kernels(t) != nullptr; }

bool has_matmul_tiles(quant::Type t) {
  const detail::IntegerKernels* k = detail::integer_kernels(t);
  return k && k->tiles;
}

}  // namespace strata::cuda
