// A row's push step and its per-row day, shrink, save-selection and dirty rules, host and
// device: PaddleRec's sparse rules (gradients taken as they are, not divided by the show
// count). No multiply-add is fused (-ffp-contract=off on the CPU, -fmad=false on the GPU), so
// both give the same floats. P: TableParams or StreamrecTableParams.
#pragma once

#include "row_init.h"

namespace streamrec {

// std::min(std::max(w, lo), hi): a NaN weight stays NaN (fminf/fmaxf would clip it).
template <class Rule>
STREAMREC_HD inline float clip(float w, const Rule& rp) {
  const float lo = static_cast<float>(rp.lower_bound), hi = static_cast<float>(rp.upper_bound);
  const float m = w < lo ? lo : w;
  return hi < m ? hi : m;
}

// Sum of g[i]^2 in double, in 8 lanes (a fixed order, so deterministic): one running sum
// is a chain of dependent adds that cannot be vectorised, about 4 cycles per weight.
STREAMREC_HD inline double sum_of_squares(const float* g, int64_t d) {
  constexpr int64_t kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += static_cast<double>(g[i + l]) * g[i + l];
  for (; i < d; ++i) lane[0] += static_cast<double>(g[i]) * g[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// One rule step on d weights w with state st and gradient g.
template <class Rule>
STREAMREC_HD inline void apply_rule(float* w, float* st, const float* g, int64_t d,
                                    const Rule& rp) {
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

// One row's step on row w: statistics, the embed rule, the embedx rule or the expansion.
// The row's key (*key) is read only when the row expands (a random load per row otherwise).
// Returns 1 when the row expanded.
template <class Pairs, class P>
STREAMREC_HD inline int update_row(float* w, const int64_t* key, const float* g, float show,
                                   float click, const P& p, const Pairs& pairs) {
  w[kShow] += show;
  w[kClick] += click;
  w[kUnseen] = 0.0f;
  int flags = static_cast<int>(w[kFlags]) | kFlagDirty;
  int expanded = 0;
  apply_rule(w + kEmbedW, w + p.embed_state, g, 1, p.embed_rule);
  if (flags & kFlagExpanded) {
    apply_rule(w + kEmbedW + 1, w + p.embedx_state, g + 1, p.dim - 1, p.embedx_rule);
  } else if (score(p, w[kShow], w[kClick]) >= p.embedx_threshold) {
    init_embedx(w, *key, p, pairs);
    flags |= kFlagExpanded;
    expanded = 1;
  }
  w[kFlags] = static_cast<float>(flags);
  return expanded;
}

// ---- whole-table passes, per row ----
STREAMREC_HD inline void advance_day_row(float* row) { row[kUnseen] += 1.0f; }

// Decays show and click; whether the row is kept (score and unseen days within bounds).
template <class P>
STREAMREC_HD inline bool shrink_row(float* row, const P& p) {
  const float decay = static_cast<float>(p.show_click_decay_rate);
  row[kShow] *= decay;
  row[kClick] *= decay;
  const double s = score(p, row[kShow], row[kClick]);
  return !(s < p.delete_threshold || row[kUnseen] > p.delete_after_unseen_days);
}

// Whether a save of mode (0 all, 1 base, 2 delta) takes the row.
template <class P>
STREAMREC_HD inline bool select_row(const float* row, int64_t mode, const P& p) {
  const double s = score(p, row[kShow], row[kClick]);
  if (mode == 0) return true;
  if (mode == 1) return s >= p.base_threshold;
  return (static_cast<int>(row[kFlags]) & kFlagDirty) && s >= p.delta_threshold &&
         row[kUnseen] <= p.delta_keep_days;
}

STREAMREC_HD inline void clear_dirty_row(float* row) {
  row[kFlags] = static_cast<float>(static_cast<int>(row[kFlags]) & ~kFlagDirty);
}

// A flags value with the changed-since-save bit set.
STREAMREC_HD inline float with_dirty(float flags) {
  return static_cast<float>(static_cast<int>(flags) | kFlagDirty);
}

}  // namespace streamrec
