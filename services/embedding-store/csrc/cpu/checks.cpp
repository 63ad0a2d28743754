// The one check of checks.h that is a loop: row ids below the table's row count.
#include <algorithm>

#include "checks.h"
#include "parallel.h"

namespace streamrec {

void check_rows_below(Span<const int64_t> rows, int64_t R, const char* op) {
  const int64_t n = rows.n;
  const int64_t* r = rows.data;
  std::atomic<int64_t> most{-1};
  parallel_for(0, n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    int64_t hi = -1;
    for (int64_t i = b; i < e; ++i) hi = std::max(hi, r[i]);  // vectorises
    int64_t cur = most.load(std::memory_order_relaxed);
    while (hi > cur && !most.compare_exchange_weak(cur, hi, std::memory_order_relaxed)) {
    }
  });
  if (most.load() < R) return;
  const int64_t at = std::find_if(r, r + n, [R](int64_t v) { return v >= R; }) - r;
  fail(op, ": row ", r[at], " at position ", at, " is outside the table's ", R, " rows");
}

}  // namespace streamrec
