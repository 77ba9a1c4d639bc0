// The kernel table of one weight format: scalar reference kernels (the definition of what the
// format means) and the fast kernels picked at run time, which the tests check against them.
//
// A dot product multiplies one weight row by an activation vector prepared once per mat-vec in
// the format's activation layout (fp32, Q8_0 or Q8_K blocks, as ggml pairs them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"
#include "util/rng.h"

namespace strata::quant {

enum class ActFormat { F32, Q8_0, Q8_K };

struct FormatKernels {
  Type type;
  ActFormat act;

  // Scalar reference: n elements (a multiple of the block size) from blocks to fp32.
  void (*dequantize)(const void* blocks, float* out, int64_t n);
  // Round-trip quantizer (fp32 -> blocks), null where strata has none for the format.
  void (*quantize)(const float* in, void* blocks, int64_t n);
  // Fills nblocks with valid blocks: finite, sane scales, every code path of the format used.
  // Values dequantize to roughly unit scale (|x| <~ 2), callers scale tensors themselves.
  void (*random_blocks)(Rng& rng, void* blocks, int64_t nblocks);

  // Scalar reference dot product of n weights with an activation in layout `act`.
  float (*dot_ref)(const void* weights, const void* act, int64_t n);
  // AVX2+FMA+F16C kernel, null if the format has none; equals dot_ref within dot_tolerance.
  float (*dot_avx2)(const void* weights, const void* act, int64_t n);
  // Relative bound |fast - ref| <= dot_tolerance * sum_i |w_i * a_i|; 0 means bitwise equal.
  float dot_tolerance;
  // AVX2 multi-activation dot (see DotRowsFn), null if the format has none. Each of its results
  // equals dot_avx2 on that activation bit for bit.
  void (*dot_rows_avx2)(const void* weights, const void* const* acts, int count, int64_t n,
                        float* out) = nullptr;
  // AVX-512 (F, BW, VL, DQ, VNNI; util/cpu.h) kernels, null where the format has none (the AVX2
  // ones run then). Bitwise equal to dot_ref, as the AVX2 ones are when dot_tolerance is 0; the
  // multi-activation one is bitwise dot_avx512 on each activation.
  float (*dot_avx512)(const void* weights, const void* act, int64_t n) = nullptr;
  void (*dot_rows_avx512)(const void* weights, const void* const* acts, int count, int64_t n,
                          float* out) = nullptr;
};

// The table for a weight format; throws strata::Error for a type without kernels.
const FormatKernels& kernels(Type t);
bool has_kernels(Type t);

// Activation layouts ----------------------------------------------------------------------------

// Bytes an activation of n elements takes in the given layout (n a multiple of its block).
size_t act_bytes(ActFormat f, int64_t n);
int64_t act_block_elems(ActFormat f);
// Prepares an activation: copies (F32) or quantizes x into out by ggml's x86 rule (act_rule.h).
// The scalar reference and the AVX2 and AVX-512 paths produce identical bytes.
void quantize_act(ActFormat f, const float* x, void* out, int64_t n);
void quantize_act_ref(ActFormat f, const float* x, void* out, int64_t n);

// Dispatch ----------------------------------------------------------------------------------------

// The dot kernel this process uses for t: the fastest the CPU (or STRATA_ISA) allows that the
// format has, else the reference.
using DotFn = float (*)(const void* weights, const void* act, int64_t n);
DotFn dot_kernel(Type t);

// One weight row dotted with several activations: out[j] = dot(weights, acts[j], n) for j in
// [0, count), count <= kMaxDotRows. Decoding the weight once for all of them is what makes a
// prefill window cheaper per row than decode; every result is bitwise what the DotFn of the same
// dispatch gives, so a T-row window still equals T one-row windows.
constexpr int kMaxDotRows = 8;
using DotRowsFn = void (*)(const void* weights, const void* const* acts, int count, int64_t n,
                           float* out);

// The multi-activation kernel this process uses for t: the format's own where it has one and the
// single-row dot is the fast one, else a loop over that dot.
struct DotRows {
  DotFn dot;
  DotRowsFn rows;  // null: loop over dot
  void operator()(const void* weights, const void* const* acts, int count, int64_t n,
                  float* out) const {
    if (rows) {
      rows(weights, acts, count, n, out);
    } else {
      for (int j = 0; j < count; ++j) out[j] = dot(weights, acts[j], n);
    }
  }
};
DotRows dot_rows_kernel(Type t);

// y[r] = W[r,:] . x for rows [0, rows); W rows are row_stride bytes apart; cols a multiple of the
// format's block and of the activation block. `act_scratch` must hold act_bytes(kernels(t).act,
// cols). Single-threaded; callers split rows over threads.
void matvec(Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols, const float* x,
            float* y, void* act_scratch);

// Dequantizes n elements of any weight format (FP32/F16/BF16 included) with the reference kernel.
void dequantize(Type t, const void* blocks, float* out, int64_t n);

}  // namespace strata::quant
