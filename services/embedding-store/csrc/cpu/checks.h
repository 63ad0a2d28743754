// Argument checks shared by the ops (internal to the extension): shapes and dtypes, params
// finalized, row ids inside the table, sizes whose arithmetic cannot overflow. Each raises
// c10::Error (RuntimeError in Python) naming the op and the offending value, before the op
// writes anything; none costs more than one pass over the ids.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <cstdint>

#include "table_params.h"

namespace streamrec {

// a * b for sizes (>= 0), raising when the product overflows int64.
inline int64_t checked_mul(int64_t a, int64_t b, const char* op) {
  int64_t out = 0;
  TORCH_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &out), op, ": size ", a, " x ",
              b, " is negative or overflows int64");
  return out;
}

// A (n,) int64 contiguous tensor (keys, rows, row ids).
inline void check_ids(const torch::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.defined() && t.scalar_type() == torch::kInt64 && t.dim() == 1 && t.is_contiguous(),
              op, ": ", name, " must be a contiguous (n,) int64 tensor");
}

// Params finalized for the dim and rules they hold now (a dim changed after finalize() would
// make the ops misread the rows).
inline void check_params(const TableParams& p, const char* op) {
  TORCH_CHECK(p.finalized(), op, ": table params are not finalized for dim ", p.dim,
              " and their rules (call finalize() after setting them)");
}

// A table's rows: a contiguous (R, width) float32 tensor, width that of finalized params.
inline void check_data(const torch::Tensor& data, const TableParams& p, const char* op) {
  check_params(p, op);
  TORCH_CHECK(data.defined() && data.scalar_type() == torch::kFloat32 && data.is_contiguous() &&
                  data.dim() == 2 && data.size(1) == p.width,
              op, ": data must be a contiguous (R, ", p.width, ") float32 tensor");
}

// Every rows[i] < R, rows < 0 being absent keys the ops skip: one pass (parallel when long),
// then a raise naming the first offending position, its row and R.
void check_rows_below(const torch::Tensor& rows, int64_t R, const char* op);

// Lowers `target` to `v` (the first of several positions found by parallel threads).
inline void atomic_min(std::atomic<int64_t>& target, int64_t v) {
  int64_t cur = target.load(std::memory_order_relaxed);
  while (v < cur && !target.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace streamrec
