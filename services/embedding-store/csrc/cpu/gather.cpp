// gather: the weights of given rows (a pull whose keys were created through admission, the
// ssd tier's cache).
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "checks.h"
#include "ops.h"

namespace streamrec {

torch::Tensor gather(const torch::Tensor& data, const torch::Tensor& rows_in,
                     const TableParams& p) {
  constexpr const char* kOp = "gather";
  check_data(data, p, kOp);
  const torch::Tensor rows = input_ids(rows_in, kOp, "rows");
  const int64_t n = rows.numel(), dim = p.dim, width = p.width, R = data.size(0);
  auto out = step_buffer({n, dim}, data.options());
  const float* d = data.data_ptr<float>();
  const int64_t* r = rows.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  // only `out` is written, so a row >= R is found in the copy loop (no pass of its own) and
  // raised after it
  std::atomic<int64_t> outside{n};
  at::parallel_for(0, n, 1024, [&](int64_t b, int64_t e) {
    int64_t bad = n;
    for (int64_t i = b; i < e; ++i) {
      if (i + 8 < e && row_in(r[i + 8], R)) prefetch_lines(d + r[i + 8] * width + kEmbedW, 4 * dim);
      if (row_in(r[i], R)) {
        std::memcpy(o + i * dim, d + r[i] * width + kEmbedW, sizeof(float) * dim);
      } else {
        if (r[i] >= 0) bad = std::min(bad, i);
        std::memset(o + i * dim, 0, sizeof(float) * dim);
      }
    }
    if (bad < n) atomic_min(outside, bad);
  });
  const int64_t at = outside.load();
  TORCH_CHECK(at == n, kOp, ": row ", r[at], " at position ", at, " is outside the table's ", R,
              " rows");
  return out;
}

}  // namespace streamrec
