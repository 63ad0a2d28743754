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

// The 8 lanes of sum_of_squares added up (a fixed tree).
STREAMREC_HD inline double combine8(const double* lane) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
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
  return combine8(lane);
}

// Lane l (0..7) of sum_of_squares alone, its adds in the same order (the tail in lane 0):
// threads that share a row each sum one lane, then combine8 gives the same double.
STREAMREC_HD inline double squares_lane(const float* g, int64_t d, int64_t l) {
  const int64_t full = d / 8 * 8;
  double s = 0.0;
  for (int64_t i = l; i < full; i += 8) s += static_cast<double>(g[i]) * g[i];
  if (l == 0)
    for (int64_t i = full; i < d; ++i) s += static_cast<double>(g[i]) * g[i];
  return s;
}

// How a row's columns are split over the threads that share it. One thread (here: the CPU
// core) does every column; csrc/cuda/common.cuh has the GPU's warp (32 lanes, lane-strided
// columns, the leader writing the row's scalars after a sync) and the CPU build's stand-in.
struct SerialLanes {
  STREAMREC_HD int64_t first() const { return 0; }  // this thread's first column
  STREAMREC_HD int64_t step() const { return 1; }   // columns from one of its columns to the next
  STREAMREC_HD bool leader() const { return true; }  // the one that writes shared words
  STREAMREC_HD void sync() const {}  // every lane's reads done before the leader writes
  STREAMREC_HD double sum_of_squares(const float* g, int64_t d) const {
    return ::streamrec::sum_of_squares(g, d);
  }
};

// One rule step on d weights w with state st and gradient g, columns split by lanes (every
// lane of a row calls it; column i's math does not depend on the split). w and st are column
// views (row_codec.h): each value is read as float32, stepped in float32 and written once, so
// an fp32 row and a compact one run the same math. g never overlaps the row (__restrict__).
template <class Rule, class Cols, class Lanes = SerialLanes>
STREAMREC_HD inline void apply_rule(const Cols& w, const Cols& st, const float* __restrict__ g,
                                    int64_t d, const Rule& rp, const Lanes& lanes = Lanes{}) {
  // no weights, no state columns (a dim-1 table's embedx part): writing st would land
  // outside the row (the next row's show)
  if (d <= 0) return;
  const float lr = static_cast<float>(rp.learning_rate);
  const int64_t i0 = lanes.first(), di = lanes.step();
  switch (rp.kind) {
    case kNaive:
      for (int64_t i = i0; i < d; i += di) w.set(i, clip(w.get(i) - lr * g[i], rp));
      break;
    case kAdaGrad: {
      const double ig2 = rp.initial_g2sum;
      const float g2sum = st.get(0);
      const float ratio = static_cast<float>(rp.learning_rate * sqrt(ig2 / (ig2 + g2sum)));
      for (int64_t i = i0; i < d; i += di) w.set(i, clip(w.get(i) - ratio * g[i], rp));
      const double squares = lanes.sum_of_squares(g, d);
      lanes.sync();  // every lane read st[0]
      if (lanes.leader()) st.set(0, g2sum + static_cast<float>(squares / d));
      break;
    }
    case kStdAdaGrad: {
      const double ig2 = rp.initial_g2sum;
      for (int64_t i = i0; i < d; i += di) {
        const float g2sum = st.get(i);
        const float ratio = static_cast<float>(rp.learning_rate * sqrt(ig2 / (ig2 + g2sum)));
        w.set(i, clip(w.get(i) - ratio * g[i], rp));
        st.set(i, g2sum + g[i] * g[i]);
      }
      break;
    }
    case kTorchAdaGrad: {  // torch.optim.Adagrad: the accumulator takes g before the step
      const float eps = static_cast<float>(rp.epsilon);
      for (int64_t i = i0; i < d; i += di) {
        const float g2sum = st.get(i) + g[i] * g[i];
        st.set(i, g2sum);
        w.set(i, clip(w.get(i) - lr * g[i] / (sqrtf(g2sum) + eps), rp));
      }
      break;
    }
    case kAdam: {
      const Cols gsum = st;
      const Cols g2sum = st.at(d);
      const float b1p = st.get(2 * d), b2p = st.get(2 * d + 1);
      const float b1 = static_cast<float>(rp.beta1), b2 = static_cast<float>(rp.beta2);
      const float eps = static_cast<float>(rp.epsilon);
      const float alr = lr * sqrtf(1.0f - b2p) / (1.0f - b1p);
      for (int64_t i = i0; i < d; i += di) {
        const float m = b1 * gsum.get(i) + (1.0f - b1) * g[i];
        const float v = b2 * g2sum.get(i) + (1.0f - b2) * g[i] * g[i];
        gsum.set(i, m);
        g2sum.set(i, v);
        w.set(i, clip(w.get(i) - alr * (m / (sqrtf(v) + eps)), rp));
      }
      lanes.sync();  // every lane read b1p and b2p
      if (lanes.leader()) {
        st.set(2 * d, b1p * b1);
        st.set(2 * d + 1, b2p * b2);
      }
      break;
    }
    default: break;
  }
}

// update_row on the payload view cols of row w (row_codec.h).
template <class Cols, class Pairs, class P, class Lanes>
STREAMREC_HD inline int update_row_cols(float* w, const Cols& cols, const int64_t* key,
                                        const float* g, float show, float click, const P& p,
                                        const Pairs& pairs, const Lanes& lanes) {
  const float new_show = w[kShow] + show, new_click = w[kClick] + click;
  int flags = static_cast<int>(w[kFlags]) | kFlagDirty;
  int expanded = 0;
  apply_rule(cols.at(kEmbedW), cols.at(p.embed_state), g, 1, p.embed_rule, lanes);
  if (flags & kFlagExpanded) {
    apply_rule(cols.at(kEmbedW + 1), cols.at(p.embedx_state), g + 1, p.dim - 1, p.embedx_rule,
               lanes);
  } else if (score(p, new_show, new_click) >= p.embedx_threshold) {
    if (lanes.leader()) init_embedx_cols(w, cols, *key, p, pairs);  // once in a row's life
    flags |= kFlagExpanded;
    expanded = 1;
  }
  lanes.sync();  // every lane read show, click and flags
  if (lanes.leader()) {
    w[kShow] = new_show;
    w[kClick] = new_click;
    w[kUnseen] = 0.0f;
    w[kFlags] = static_cast<float>(flags);
  }
  return expanded;
}

// One row's step on row w: statistics, the embed rule, the embedx rule or the expansion.
// The row's key (*key) is read only when the row expands or the row is compact (its
// stochastic rounding's salt, with the table's push counter p.round_step). Returns 1 when
// the row expanded (to every lane). Every lane reads the row's scalars; the leader alone
// writes them, after a sync.
template <class Pairs, class P, class Lanes = SerialLanes>
STREAMREC_HD inline int update_row(float* w, const int64_t* key, const float* g, float show,
                                   float click, const P& p, const Pairs& pairs,
                                   const Lanes& lanes = Lanes{}) {
  if (p.dtype == kFp32)
    return update_row_cols(w, f32_cols(w), key, g, show, click, p, pairs, lanes);
  const uint64_t salt = round_salt(*key, p.round_step);
  if (p.dtype == kFp16)
    return update_row_cols(w, half_cols<kFp16>(w, salt), key, g, show, click, p, pairs, lanes);
  return update_row_cols(w, half_cols<kBf16>(w, salt), key, g, show, click, p, pairs, lanes);
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
