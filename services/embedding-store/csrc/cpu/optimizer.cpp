// The fused push: statistics, sparse optimizer rules (seed 002) and embedx expansion.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops.h"

namespace streamrec {
namespace {

constexpr int64_t kGrain = 512;

inline float clip(float w, const RuleParams& rp) {
  return std::min(std::max(w, static_cast<float>(rp.lower_bound)),
                  static_cast<float>(rp.upper_bound));
}

// One rule step on d weights w with state st and gradient g (PaddleRec's SparseXxxSGDRule,
// gradients taken as they are, not divided by the show count).
inline void apply_rule(float* w, float* st, const float* g, int64_t d, const RuleParams& rp) {
  const float lr = static_cast<float>(rp.learning_rate);
  switch (rp.kind) {
    case kNaive:
      for (int64_t i = 0; i < d; ++i) w[i] = clip(w[i] - lr * g[i], rp);
      break;
    case kAdaGrad: {
      const double ig2 = rp.initial_g2sum;
      const float ratio = static_cast<float>(rp.learning_rate * std::sqrt(ig2 / (ig2 + st[0])));
      double add = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        w[i] = clip(w[i] - ratio * g[i], rp);
        add += static_cast<double>(g[i]) * g[i];
      }
      st[0] += static_cast<float>(add / d);
      break;
    }
    case kStdAdaGrad: {
      const double ig2 = rp.initial_g2sum;
      for (int64_t i = 0; i < d; ++i) {
        const float ratio = static_cast<float>(rp.learning_rate * std::sqrt(ig2 / (ig2 + st[i])));
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
      const float alr = lr * std::sqrt(1.0f - b2p) / (1.0f - b1p);
      for (int64_t i = 0; i < d; ++i) {
        gsum[i] = b1 * gsum[i] + (1.0f - b1) * g[i];
        g2sum[i] = b2 * g2sum[i] + (1.0f - b2) * g[i] * g[i];
        w[i] = clip(w[i] - alr * (gsum[i] / (std::sqrt(g2sum[i]) + eps)), rp);
      }
      b1p *= b1;
      b2p *= b2;
      break;
    }
    default: break;
  }
}

}  // namespace

// One row's step: statistics, the embed rule, the embedx rule or the expansion.
// Returns 1 when the row expanded.
inline int64_t update_row(float* row, int64_t key, const float* g, float show, float click,
                          const TableParams& p) {
  row[kShow] += show;
  row[kClick] += click;
  row[kUnseen] = 0.0f;
  int flags = static_cast<int>(row[kFlags]) | kFlagDirty;
  int64_t expanded = 0;
  apply_rule(row + kEmbedW, row + p.embed_state, g, 1, p.embed_rule);
  if (flags & kFlagExpanded) {
    apply_rule(row + kEmbedW + 1, row + p.embedx_state, g + 1, p.dim - 1, p.embedx_rule);
  } else if (p.score(row[kShow], row[kClick]) >= p.embedx_threshold) {
    init_embedx(row, key, p);
    flags |= kFlagExpanded;
    expanded = 1;
  }
  row[kFlags] = static_cast<float>(flags);
  return expanded;
}

int64_t update(torch::Tensor data, const torch::Tensor& row_keys, const torch::Tensor& rows,
               const torch::Tensor& grads, const torch::Tensor& shows,
               const torch::Tensor& clicks, const TableParams& p, torch::Tensor marks) {
  TORCH_CHECK(data.dtype() == torch::kFloat32 && data.is_contiguous() &&
                  data.size(1) == p.width, "data must be contiguous (R, width) float32");
  const int64_t n = rows.numel();
  TORCH_CHECK(rows.dtype() == torch::kInt64 && rows.is_contiguous(), "rows must be int64");
  TORCH_CHECK(grads.dtype() == torch::kFloat32 && grads.is_contiguous() && grads.dim() == 2 &&
                  grads.size(0) == n && grads.size(1) == p.dim,
              "grads must be contiguous (n, dim) float32");
  TORCH_CHECK(shows.dtype() == torch::kFloat32 && shows.numel() == n && shows.is_contiguous() &&
                  clicks.dtype() == torch::kFloat32 && clicks.numel() == n &&
                  clicks.is_contiguous(), "shows and clicks must be contiguous (n,) float32");
  const int64_t R = data.size(0);
  TORCH_CHECK(marks.dtype() == torch::kInt32 && marks.is_contiguous() && marks.numel() >= R,
              "marks must be a contiguous (R,) int32 tensor of zeros");
  float* d = data.data_ptr<float>();
  const int64_t* k = row_keys.data_ptr<int64_t>();
  const int64_t* r = rows.data_ptr<int64_t>();
  const float* g = grads.data_ptr<float>();
  const float* sh = shows.data_ptr<float>();
  const float* cl = clicks.data_ptr<float>();
  int32_t* mk = marks.data_ptr<int32_t>();
  auto valid = [&](int64_t i) { return r[i] >= 0 && r[i] < R; };

  // Parallel updates of one row would race, so each thread owns the rows that hash to it:
  // it scans every position, counts its rows' occurrences in mk (no atomics, no shared
  // cache lines between threads on hot rows), updates the rows seen once at once, and sums
  // the repeated rows' gradients in index order (deterministic) before updating them.
  const int64_t threads = n < 4096 ? 1 : std::max<int64_t>(at::get_num_threads(), 1);
  const uint64_t parts = static_cast<uint64_t>(threads);
  auto owner = [&](int64_t row) {  // Lemire's multiply-shift range reduction of a row hash
    const uint64_t h = (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ULL) >> 32;
    return static_cast<int64_t>((h * parts) >> 32);
  };
  std::atomic<int64_t> expanded{0};
  at::parallel_for(0, threads, 1, [&](int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) {
      auto mine = [&](int64_t i) { return valid(i) && owner(r[i]) == t; };
      for (int64_t i = 0; i < n; ++i)
        if (mine(i)) ++mk[r[i]];
      int64_t ex = 0;
      thread_local std::vector<int64_t> rep;  // positions of repeated rows, in index order
      rep.clear();
      for (int64_t i = 0; i < n; ++i) {
        if (i + 8 < n && mine(i + 8)) {
          const float* ahead = d + r[i + 8] * p.width;
          __builtin_prefetch(ahead, 1);
          __builtin_prefetch(ahead + p.width - 1, 1);
        }
        if (!mine(i)) continue;
        if (mk[r[i]] == 1) {
          ex += update_row(d + r[i] * p.width, k[r[i]], g + i * p.dim, sh[i], cl[i], p);
          mk[r[i]] = 0;
        } else {
          rep.push_back(i);
        }
      }
      // Repeated rows: numbered in order of first occurrence (mk, the count, becomes
      // -(group + 1)), their positions laid out group by group (a counting sort), summed.
      std::vector<int64_t> group_row, group_start{0}, fill, order(rep.size());
      for (const int64_t i : rep) {
        int32_t& m = mk[r[i]];
        if (m > 0) {
          group_row.push_back(r[i]);
          fill.push_back(group_start.back());
          group_start.push_back(group_start.back() + m);
          m = -static_cast<int32_t>(group_row.size());
        }
      }
      for (const int64_t i : rep) order[fill[-mk[r[i]] - 1]++] = i;
      std::vector<float> sum(static_cast<size_t>(p.dim));
      for (size_t j = 0; j < group_row.size(); ++j) {
        std::fill(sum.begin(), sum.end(), 0.0f);
        float show = 0.0f, click = 0.0f;
        for (int64_t q = group_start[j]; q < group_start[j + 1]; ++q) {
          const int64_t i = order[q];
          for (int64_t c = 0; c < p.dim; ++c) sum[c] += g[i * p.dim + c];
          show += sh[i];
          click += cl[i];
        }
        ex += update_row(d + group_row[j] * p.width, k[group_row[j]], sum.data(), show, click, p);
        mk[group_row[j]] = 0;
      }
      expanded += ex;
    }
  });
  return expanded.load();
}

}  // namespace streamrec

namespace streamrec {

std::tuple<int64_t, int64_t> check_push(const torch::Tensor& grads, const torch::Tensor& shows,
                                        const torch::Tensor& clicks) {
  TORCH_CHECK(grads.dtype() == torch::kFloat32 && grads.is_contiguous() && grads.dim() == 2,
              "grads must be contiguous (n, dim) float32");
  const int64_t n = grads.size(0), dim = grads.size(1);
  TORCH_CHECK(shows.dtype() == torch::kFloat32 && shows.numel() == n && shows.is_contiguous() &&
                  clicks.dtype() == torch::kFloat32 && clicks.numel() == n &&
                  clicks.is_contiguous(), "shows and clicks must be contiguous (n,) float32");
  // NaN and Inf are the floats whose exponent bits are all ones; testing the bits
  // vectorises where std::isfinite does not.
  const uint32_t* g = reinterpret_cast<const uint32_t*>(grads.data_ptr<float>());
  const float* sh = shows.data_ptr<float>();
  const float* cl = clicks.data_ptr<float>();
  std::atomic<int64_t> bad_rows{0}, bad_counts{0};
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    int64_t rows = 0, counts = 0;
    for (int64_t i = b; i < e; ++i) {
      uint32_t bad = 0;
      for (int64_t j = 0; j < dim; ++j) bad |= (g[i * dim + j] & 0x7f800000u) == 0x7f800000u;
      rows += bad != 0;
      counts += !(std::isfinite(sh[i]) && sh[i] >= 0.0f && std::isfinite(cl[i]) && cl[i] >= 0.0f);
    }
    bad_rows += rows;
    bad_counts += counts;
  });
  return {bad_rows.load(), bad_counts.load()};
}

}  // namespace streamrec
