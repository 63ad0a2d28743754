// gather: the weights of given rows (a pull whose keys were created through admission, the
// ssd tier's cache).
#include <algorithm>
#include <atomic>
#include <cstring>

#include "checks.h"
#include "ops.h"
#include "parallel.h"

namespace streamrec {

void gather(Matrix<const float> data, Span<const int64_t> rows, const TableParams& p,
            float* out) {
  constexpr const char* kOp = "gather";
  const int64_t n = rows.n, dim = p.dim, width = p.width, R = data.rows;
  const float* d = data.data;
  const int64_t* r = rows.data;
  float* o = out;
  // only `out` is written, so a row >= R is found in the copy loop (no pass of its own) and
  // raised after it
  std::atomic<int64_t> outside{n};
  parallel_for(0, n, 1024, [&](int64_t b, int64_t e) {
    int64_t bad = n;
    for (int64_t i = b; i < e; ++i) {
      if (i + 8 < e && row_in(r[i + 8], R)) prefetch_lines(d + r[i + 8] * width + kEmbedW, 4 * dim);
      if (row_in(r[i], R)) {
        read_weights(o + i * dim, d + r[i] * width, p);
      } else {
        if (r[i] >= 0) bad = std::min(bad, i);
        std::memset(o + i * dim, 0, sizeof(float) * dim);
      }
    }
    if (bad < n) atomic_min(outside, bad);
  });
  const int64_t at = outside.load();
  STREAMREC_CHECK(at == n, kOp, ": row ", r[at], " at position ", at, " is outside the table's ",
                  R, " rows");
}

}  // namespace streamrec
