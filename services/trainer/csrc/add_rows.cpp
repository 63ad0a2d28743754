// add_rows: the backward of the sparse features' row gather, out[index[s, b]] += src[b, s].
//
// torch's index_add_ on the CPU goes through its generic scatter kernel (about 0.7 ms of a
// setup b step's 26 x 2,048 rows of 16 floats, plus a copy of a strided gradient first). Here
// the loop runs feature by feature: a feature's rows lie in its own table's block of out (the
// batch's keys are deduplicated per table), so the writes stay within a few hundred KiB at a
// time. Serial on purpose, like the parsers: it runs on the training thread between torch's
// parallel ops.
#include "ops.h"

namespace streamrec::trainer {

int64_t add_rows(const AddRowsArgs& a) {
  const int64_t n = a.features * a.batch;
  for (int64_t i = 0; i < n; ++i)
    if (a.index[i] < 0 || a.index[i] >= a.rows) return i;
  constexpr int64_t kAhead = 8;  // prefetch distance, in rows
  for (int64_t s = 0; s < a.features; ++s) {
    const int64_t* idx = a.index + s * a.batch;
    const float* col = a.src + s * a.stride_s;
    for (int64_t b = 0; b < a.batch; ++b) {
      if (b + kAhead < a.batch) __builtin_prefetch(a.out + idx[b + kAhead] * a.dim, 1);
      float* o = a.out + idx[b] * a.dim;
      const float* g = col + b * a.stride_b;
      for (int64_t c = 0; c < a.dim; ++c) o[c] += g[c];
    }
  }
  return -1;
}

}  // namespace streamrec::trainer
