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

// Alignment. Arrays decoded from a message may start at any byte (a ZeroMQ frame can sit
// inside its receive buffer); a load through a misaligned int64_t* or float* is undefined
// behaviour, and vectorised code may rely on the alignment. So an input an op only reads is
// taken as it is when aligned to its element size, else as an aligned copy (small arrays:
// large frames get buffers of their own); a tensor an op writes must be aligned.
inline bool is_aligned(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % t.element_size() == 0;
}
inline torch::Tensor aligned(const torch::Tensor& t) { return is_aligned(t) ? t : t.clone(); }
inline void check_aligned(const torch::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(is_aligned(t), op, ": ", name, " must be aligned to its ", t.element_size(),
              "-byte elements (it is written in place)");
}

// A (n,) int64 contiguous tensor (keys, rows, row ids).
inline void check_ids(const torch::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.defined() && t.scalar_type() == torch::kInt64 && t.dim() == 1 && t.is_contiguous(),
              op, ": ", name, " must be a contiguous (n,) int64 tensor");
}
// check_ids of an input the op only reads, which it then reads aligned.
inline torch::Tensor input_ids(const torch::Tensor& t, const char* op, const char* name) {
  check_ids(t, op, name);
  return aligned(t);
}
// check_ids of a tensor the op writes.
inline void check_output_ids(const torch::Tensor& t, const char* op, const char* name) {
  check_ids(t, op, name);
  check_aligned(t, op, name);
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
  check_aligned(data, op, "data");
}

// Every rows[i] < R, rows < 0 being absent keys the ops skip: one pass (parallel when long),
// then a raise naming the first offending position, its row and R. rows: checked, aligned.
void check_rows_below(const torch::Tensor& rows, int64_t R, const char* op);

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
