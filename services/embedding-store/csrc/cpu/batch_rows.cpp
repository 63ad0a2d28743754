// Row moves of a request's arrays, for the client side of the service: the rows of the
// distinct keys spread back to the caller's order, and the rows of repeated keys summed.
// A tensor index_add_ sums serially in float32; these run over every core (repeats in float64).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "checks.h"
#include "ops.h"
#include "parallel.h"

namespace streamrec {
namespace {

constexpr int64_t kGrain = 2048;
constexpr int64_t kAhead = 8;  // prefetch distance, in rows

// Raises unless every idx lies in [0, bound) (one pass, before anything is written).
void check_positions(Span<const int64_t> idx, int64_t bound, const char* name) {
  const int64_t* v = idx.data;
  const auto [lo, hi] = std::minmax_element(v, v + idx.n);
  STREAMREC_CHECK(idx.n == 0 || (*lo >= 0 && *hi < bound), name, " holds a value outside [0, ",
                  bound, ")");
}

// sum_rows when few positions repeat a row: the rows copied from their first positions in
// parallel, then each repeated row summed over all its positions in index order in float64.
bool sum_few_repeats(Matrix<const float> src, const int64_t* inv, const std::vector<int64_t>& first,
                     std::vector<int64_t>& repeats, float* o) {
  const int64_t u = static_cast<int64_t>(first.size()), d = src.cols;
  const float* s = src.data;
  std::atomic<bool> finite{true};
  parallel_for(0, u, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      if (j + kAhead < e) prefetch_lines(s + first[j + kAhead] * d, 4 * d);
      std::memcpy(o + j * d, s + first[j] * d, sizeof(float) * d);
    }
    if (!all_finite(o + b * d, (e - b) * d)) finite = false;
  });
  std::stable_sort(repeats.begin(), repeats.end(),
                   [&](int64_t a, int64_t b) { return inv[a] < inv[b]; });
  std::vector<double> acc(static_cast<size_t>(d));
  for (size_t q = 0; q < repeats.size();) {
    const int64_t j = inv[repeats[q]];
    for (int64_t c = 0; c < d; ++c) acc[c] = s[first[j] * d + c];
    for (; q < repeats.size() && inv[repeats[q]] == j; ++q)
      for (int64_t c = 0; c < d; ++c) acc[c] += s[repeats[q] * d + c];
    for (int64_t c = 0; c < d; ++c) o[j * d + c] = static_cast<float>(acc[c]);
    if (!all_finite(o + j * d, d)) finite = false;
  }
  return finite.load();
}

}  // namespace

bool all_finite_parallel(const float* v, int64_t n) {
  std::atomic<bool> finite{true};
  parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
    if (!all_finite(v + b, e - b)) finite = false;
  });
  return finite.load();
}

void take_rows(const std::vector<Matrix<const float>>& parts, Span<const int64_t> idx,
               float* o) {
  const int64_t d = parts[0].cols;
  std::vector<const float*> base;
  std::vector<int64_t> offsets{0};  // part p holds rows [offsets[p], offsets[p + 1])
  for (const auto& part : parts) {
    base.push_back(part.data);
    offsets.push_back(offsets.back() + part.rows);
  }
  // parts are copied with memcpy (any alignment), idx read as int64
  check_positions(idx, offsets.back(), "idx");
  const int64_t n = idx.n;
  const int64_t* x = idx.data;
  auto row = [&](int64_t j) {  // row j of the parts laid end to end
    const int64_t p = std::upper_bound(offsets.begin(), offsets.end(), j) - offsets.begin() - 1;
    return base[p] + (j - offsets[p]) * d;
  };
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i + kAhead < e) prefetch_lines(row(x[i + kAhead]), 4 * d);
      std::memcpy(o + i * d, row(x[i]), sizeof(float) * d);
    }
  });
}

bool sum_rows(Matrix<const float> src, Span<const int64_t> inverse, int64_t u, float* o) {
  check_positions(inverse, u, "inverse");
  const int64_t n = src.rows, d = src.cols;
  const float* s = src.data;
  const int64_t* inv = inverse.data;
  // first[j]: the first position of row j; repeats: the other positions, in index order
  std::vector<int64_t> first(static_cast<size_t>(u), -1), repeats;
  for (int64_t i = 0; i < n; ++i) {
    int64_t& f = first[inv[i]];
    if (f < 0)
      f = i;
    else
      repeats.push_back(i);
  }
  for (int64_t j = 0; j < u; ++j)
    STREAMREC_CHECK(first[j] >= 0, "inverse leaves row ", j, " of [0, ", u,
                    ") without a position");
  if (static_cast<int64_t>(repeats.size()) <= n / 8)
    return sum_few_repeats(src, inv, first, repeats, o);
  // many repeats (a skewed batch): each row's positions in index order, laid out row by
  // row (a counting sort), start[j] .. start[j + 1] in pos
  std::vector<int64_t> start(static_cast<size_t>(u) + 1, 0), pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ++start[inv[i] + 1];
  for (int64_t j = 0; j < u; ++j) start[j + 1] += start[j];
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) pos[fill[inv[i]]++] = i;
  }
  std::atomic<bool> finite{true};
  // the threads split the positions, not the rows: the hot rows come first (first
  // occurrence order) and hold most of the positions
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(num_threads(), n / kGrain));
  parallel_for(0, parts, 1, [&](int64_t tb, int64_t te) {
    std::vector<double> acc(static_cast<size_t>(d));
    for (int64_t t = tb; t < te; ++t) {
      // rows whose first position lies in this part's share of the positions
      const int64_t b = std::lower_bound(start.begin(), start.end() - 1, n * t / parts) -
                        start.begin();
      const int64_t e = std::lower_bound(start.begin(), start.end() - 1, n * (t + 1) / parts) -
                        start.begin();
      for (int64_t j = b; j < e; ++j) {
        const int64_t p0 = start[j], p1 = start[j + 1];
        if (p1 - p0 == 1) {
          if (j + kAhead < e) prefetch_lines(s + pos[start[j + kAhead]] * d, 4 * d);
          std::memcpy(o + j * d, s + pos[p0] * d, sizeof(float) * d);
          continue;
        }
        // a repeated row: summed over its positions in index order, in float64 (as the
        // store's update sums repeats), so a push gives the same rows in-process and remote
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t q = p0; q < p1; ++q) {
          if (q + kAhead < p1) prefetch_lines(s + pos[q + kAhead] * d, 4 * d);
          const float* row = s + pos[q] * d;
          for (int64_t c = 0; c < d; ++c) acc[c] += row[c];
        }
        for (int64_t c = 0; c < d; ++c) o[j * d + c] = static_cast<float>(acc[c]);
      }
      if (e > b && !all_finite(o + b * d, (e - b) * d)) finite = false;
    }
  });
  return finite.load();
}

}  // namespace streamrec
