// One row's push step (internal; host and device, so a CPU test can run these very functions
// against the CPU core): csrc/cpu/update.cpp's apply_rule and update_row. No multiply-add is
// fused (the library builds with -fmad=false, the host test with -ffp-contract=off, as the
// CPU core), so both give the CPU's floats.
#pragma once

#include <cmath>

#include "row_init.cuh"

namespace streamrec_cuda {

STREAMREC_HD inline float clip(float w, const StreamrecRule& rp) {
  return fminf(fmaxf(w, static_cast<float>(rp.lower_bound)), static_cast<float>(rp.upper_bound));
}

// Sum of g[i]^2 in float64 in 8 lanes, the CPU's order (update.cpp sum_of_squares).
STREAMREC_HD inline double sum_of_squares(const float* g, int64_t d) {
  double lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int l = 0; l < 8; ++l)
      lane[l] += static_cast<double>(g[i + l]) * g[i + l];
  for (; i < d; ++i) lane[0] += static_cast<double>(g[i]) * g[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// One rule step on d weights (update.cpp apply_rule; the build passes -fmad=false, so no
// multiply-add is fused where the CPU's -ffp-contract=off keeps two roundings).
STREAMREC_HD inline void apply_rule(float* w, float* st, const float* g, int64_t d,
                                  const StreamrecRule& rp) {
  const float lr = static_cast<float>(rp.learning_rate);
  switch (rp.kind) {
    case kNaive:
      for (int64_t i = 0; i < d; ++i) w[i] = clip(w[i] - lr * g[i], rp);
      break;
    case kAdaGrad: {
      const double ig2 = rp.initial_g2sum;
      const float ratio = static_cast<float>(rp.learning_rate * sqrt(ig2 / (ig2 + st[0])));
      for (int64_t i = 0; i < d; ++i) w[i] = clip(w[i] - ratio * g[i], rp);
      st[0] += static_cast<float>(sum_of_squares(g, d) / d);
      break;
    }
    case kStdAdaGrad: {
      const double ig2 = rp.initial_g2sum;
      for (int64_t i = 0; i < d; ++i) {
        const float ratio = static_cast<float>(rp.learning_rate * sqrt(ig2 / (ig2 + st[i])));
        w[i] = clip(w[i] - ratio * g[i], rp);
        st[i] += g[i] * g[i];
      }
      break;
    }
    case kAdam: {
      float* gsum = st;
      float* g2sum = st + d;
      float& b1p = st[2 * d];
      float& b2p = st[2 * d + 1];
      const float b1 = static_cast<float>(rp.beta1), b2 = static_cast<float>(rp.beta2);
      const float eps = static_cast<float>(rp.epsilon);
      const float alr = lr * sqrtf(1.0f - b2p) / (1.0f - b1p);
      for (int64_t i = 0; i < d; ++i) {
        gsum[i] = b1 * gsum[i] + (1.0f - b1) * g[i];
        g2sum[i] = b2 * g2sum[i] + (1.0f - b2) * g[i] * g[i];
        w[i] = clip(w[i] - alr * (gsum[i] / (sqrtf(g2sum[i]) + eps)), rp);
      }
      b1p *= b1;
      b2p *= b2;
      break;
    }
    default: break;
  }
}

// update.cpp update_row. Returns 1 when the row expanded.
STREAMREC_HD inline int update_row(float* data, const int64_t* row_keys, int64_t row,
                                 const float* g, float show, float click,
                                 const StreamrecTableParams& p) {
  float* w = data + row * p.width;
  w[kShow] += show;
  w[kClick] += click;
  w[kUnseen] = 0.0f;
  int flags = static_cast<int>(w[kFlags]) | kFlagDirty;
  int expanded = 0;
  apply_rule(w + kEmbedW, w + p.embed_state, g, 1, p.embed_rule);
  if (flags & kFlagExpanded) {
    apply_rule(w + kEmbedW + 1, w + p.embedx_state, g + 1, p.dim - 1, p.embedx_rule);
  } else if (score(p, w[kShow], w[kClick]) >= p.embedx_threshold) {
    init_embedx(w, row_keys[row], p);
    flags |= kFlagExpanded;
    expanded = 1;
  }
  w[kFlags] = static_cast<float>(flags);
  return expanded;
}

}  // namespace streamrec_cuda
