// check_push: the bad inputs of a push counted before anything is written.
#include <atomic>
#include <cmath>

#include "ops.h"
#include "parallel.h"

namespace streamrec {

PushFaults check_push(const float* g, int64_t n, int64_t dim, const float* sh, const float* cl) {
  std::atomic<int64_t> bad_rows{0}, bad_counts{0};
  parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    int64_t rows = 0, counts = 0;
    for (int64_t i = b; i < e; ++i) {
      rows += !all_finite(g + i * dim, dim);
      counts += !(std::isfinite(sh[i]) && sh[i] >= 0.0f && std::isfinite(cl[i]) && cl[i] >= 0.0f);
    }
    bad_rows += rows;
    bad_counts += counts;
  });
  return {bad_rows.load(), bad_counts.load()};
}

}  // namespace streamrec
