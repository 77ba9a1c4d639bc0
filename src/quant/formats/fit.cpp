#include "quant/formats/fit.h"

#include <algorithm>
#include <cmath>

#include "util/half.h"

namespace strata::quant {

namespace {

constexpr int kSuperBlock = 256;

int round_clamp(float v, int lo, int hi) { return std::clamp(int(std::nearbyint(v)), lo, hi); }

// Weighted least-squares fit of x ~ a * q - m with q in [0, nmax] and m >= 0 (the format cannot
// shift values up). Tries codes from a few stretches of the [min(x, 0), max(x)] range and keeps
// the (a, m) of smallest weighted error.
void fit_group_affine(const float* x, const float* w, int n, int nmax, float* a_out, float* m_out) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  *a_out = 0.0f;
  *m_out = -lo;
  if (hi <= lo) return;
  float best = INFINITY;
  for (int t = -4; t <= 8; ++t) {
    const float iscale = (float(nmax) + 0.1f * float(t)) / (hi - lo);
    float sw = 0, sq = 0, sqq = 0, sx = 0, sqx = 0;
    for (int i = 0; i < n; ++i) {
      const float q = float(round_clamp(iscale * (x[i] - lo), 0, nmax));
      sw += w[i];
      sq += w[i] * q;
      sqq += w[i] * q * q;
      sx += w[i] * x[i];
      sqx += w[i] * q * x[i];
    }
    const float det = sw * sqq - sq * sq;
    if (det <= 0.0f) continue;
    float a = (sw * sqx - sq * sx) / det;
    float c = (sqq * sx - sq * sqx) / det;
    if (c > 0.0f) {
      c = 0.0f;
      a = sqx / sqq;
    }
    a = std::max(a, 0.0f);
    float err = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float q = a > 0.0f ? float(round_clamp((x[i] - c) / a, 0, nmax)) : 0.0f;
      const float e = a * q + c - x[i];
      err += w[i] * e * e;
    }
    if (err < best) {
      best = err;
      *a_out = a;
      *m_out = -c;
    }
  }
}

// Weighted fit of x ~ a * q with q in [-nmax, nmax - 1]: the element of largest magnitude is
// mapped near -nmax (the wider side) by a few trial scales, each refined by least squares.
float fit_group_symmetric(const float* x, const float* w, int n, int nmax) {
  float max = 0.0f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(max)) max = x[i];
  if (max == 0.0f) return 0.0f;
  float best_a = 0.0f, best_gain = -1.0f;
  for (int t = -9; t <= 9; ++t) {
    const float iscale = -(float(nmax) + 0.1f * float(t)) / max;
    float sxq = 0, sqq = 0;
    for (int i = 0; i < n; ++i) {
      const float q = float(round_clamp(iscale * x[i], -nmax, nmax - 1));
      sxq += w[i] * x[i] * q;
      sqq += w[i] * q * q;
    }
    // Error at the least-squares a = sxq / sqq is sum w x^2 - sxq^2 / sqq: maximise the gain.
    if (sqq > 0.0f && sxq * sxq / sqq > best_gain) {
      best_gain = sxq * sxq / sqq;
      best_a = sxq / sqq;
    }
  }
  return best_a;
}

}  // namespace

void fit_affine(const float* x, int groups, int nmax, int smax, uint8_t* q, uint16_t* d,
                uint16_t* dmin, uint8_t* sc, uint8_t* m) {
  const int n = kSuperBlock / groups;
  float a[16], mn[16];
  for (int s = 0; s < groups; ++s) {
    const float* g = x + n * s;
    float sum2 = 0.0f;
    for (int i = 0; i < n; ++i) sum2 += g[i] * g[i];
    const float rms = std::sqrt(sum2 / float(n));
    float w[32];
    for (int i = 0; i < n; ++i) w[i] = rms + std::fabs(g[i]);
    fit_group_affine(g, w, n, nmax, &a[s], &mn[s]);
  }
  const float amax = *std::max_element(a, a + groups), mmax = *std::max_element(mn, mn + groups);
  *d = fp32_to_fp16(amax / float(smax));
  *dmin = fp32_to_fp16(mmax / float(smax));
  const float df = fp16_to_fp32(*d), dminf = fp16_to_fp32(*dmin);
  for (int s = 0; s < groups; ++s) {
    sc[s] = uint8_t(df > 0.0f ? round_clamp(a[s] / df, 0, smax) : 0);
    m[s] = uint8_t(dminf > 0.0f ? round_clamp(mn[s] / dminf, 0, smax) : 0);
    const float step = df * sc[s], off = dminf * m[s];
    for (int i = 0; i < n; ++i)
      q[n * s + i] = uint8_t(step > 0.0f ? round_clamp((x[n * s + i] + off) / step, 0, nmax) : 0);
  }
}

void pack_scale_min_k4(const uint8_t* sc, const uint8_t* m, uint8_t* packed) {
  for (int j = 0; j < 4; ++j) {
    packed[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    packed[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

void fit_symmetric(const float* x, int nmax, int smax, int8_t* q, uint16_t* d, int8_t* sc) {
  float a[16];
  float amax = 0.0f;
  for (int s = 0; s < 16; ++s) {
    float w[16];
    for (int i = 0; i < 16; ++i) w[i] = x[16 * s + i] * x[16 * s + i];
    a[s] = fit_group_symmetric(x + 16 * s, w, 16, nmax);
    if (std::fabs(a[s]) > std::fabs(amax)) amax = a[s];
  }
  // The largest scale maps to -smax (the wider side); d carries the sign.
  const float iscale = amax != 0.0f ? -float(smax) / amax : 0.0f;
  *d = fp32_to_fp16(iscale != 0.0f ? 1.0f / iscale : 0.0f);
  const float df = fp16_to_fp32(*d);
  for (int s = 0; s < 16; ++s) {
    sc[s] = int8_t(round_clamp(iscale * a[s], -smax, smax - 1));
    const float step = df * sc[s];
    for (int i = 0; i < 16; ++i)
      q[16 * s + i] = int8_t(step != 0.0f ? round_clamp(x[16 * s + i] / step, -nmax, nmax - 1) : 0);
  }
}

}  // namespace strata::quant
