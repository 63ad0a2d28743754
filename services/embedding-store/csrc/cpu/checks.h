// Value checks shared by the ops (internal to the extension): params finalized, row ids inside
// the table, sizes whose arithmetic cannot overflow. Each raises OpError (RuntimeError in
// Python) naming the op and the offending value, before the op writes anything; none costs
// more than one pass over the ids. The checks of the tensors themselves (dtype, shape,
// contiguity, alignment) are made where they are unwrapped, in the binding files (bind.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "errors.h"
#include "table_params.h"
#include "views.h"

namespace streamrec {

// a * b for sizes (>= 0), raising when the product overflows int64.
inline int64_t checked_mul(int64_t a, int64_t b, const char* op) {
  int64_t out = 0;
  STREAMREC_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &out), op, ": size ", a,
                  " x ", b, " is negative or overflows int64");
  return out;
}

// Params finalized for the dim and rules they hold now (a dim changed after finalize() would
// make the ops misread the rows).
inline void check_params(const TableParams& p, const char* op) {
  STREAMREC_CHECK(p.finalized(), op, ": table params are not finalized for dim ", p.dim,
                  " and their rules (call finalize() after setting them)");
}

// Every rows[i] < R, rows < 0 being absent keys the ops skip: one pass (parallel when long),
// then a raise naming the first offending position, its row and R.
void check_rows_below(Span<const int64_t> rows, int64_t R, const char* op);

// Whether a row id lies in [0, R): one unsigned compare covers both ends.
inline bool row_in(int64_t row, int64_t R) {
  return static_cast<uint64_t>(row) < static_cast<uint64_t>(R);
}

// Lowers `target` to `v` (the first of several positions found by parallel threads).
inline void atomic_min(std::atomic<int64_t>& target, int64_t v) {
  int64_t cur = target.load(std::memory_order_relaxed);
  while (v < cur && !target.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace streamrec
