// The tensor checks, step buffers and block layout the binding files share (bind.h), and
// the ops' parallel loops (parallel.h) over at::parallel_for.
#include "bind.h"

#include <cstring>

#include "parallel.h"

namespace streamrec {

// The ops' loops on torch's intra-op threads (OpenMP), as they ran when they called
// at::parallel_for themselves; one indirect call per chunk.
void parallel_chunks(int64_t begin, int64_t end, int64_t grain, ChunkFn fn, const void* body) {
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { fn(body, b, e); });
}

int num_threads() { return at::get_num_threads(); }

namespace bind {

bool is_aligned(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % t.element_size() == 0;
}
at::Tensor aligned(const at::Tensor& t) { return is_aligned(t) ? t : t.clone(); }
void check_aligned(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(is_aligned(t), op, ": ", name, " must be aligned to its ", t.element_size(),
              "-byte elements (it is written in place)");
}

// The ops read and write host memory: a tensor on another device is refused by name (its
// pointer is not one the CPU may follow).
void check_cpu(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(!t.defined() || t.device().is_cpu(), op, ": ", name,
              " must be a CPU tensor, got one on ", t.device());
}

// A (n,) int64 contiguous tensor (keys, rows, row ids).
void check_ids(const at::Tensor& t, const char* op, const char* name) {
  check_cpu(t, op, name);
  TORCH_CHECK(t.defined() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(),
              op, ": ", name, " must be a contiguous (n,) int64 tensor");
}
// check_ids of an input the op only reads, which it then reads aligned.
at::Tensor input_ids(const at::Tensor& t, const char* op, const char* name) {
  check_ids(t, op, name);
  return aligned(t);
}
// check_ids of a tensor the op writes.
void check_output_ids(const at::Tensor& t, const char* op, const char* name) {
  check_ids(t, op, name);
  check_aligned(t, op, name);
}

// A table's rows: a contiguous (R, width) float32 tensor, width that of finalized params.
void check_data(const at::Tensor& data, const TableParams& p, const char* op) {
  check_params(p, op);
  check_cpu(data, op, "data");
  TORCH_CHECK(data.defined() && data.scalar_type() == at::kFloat && data.is_contiguous() &&
                  data.dim() == 2 && data.size(1) == p.width,
              op, ": data must be a contiguous (R, ", p.width, ") float32 tensor");
  check_aligned(data, op, "data");
}

// The index: a contiguous (capacity, 2) int64 tensor, capacity a power of two, aligned.
void check_index(const at::Tensor& slots, const char* op) {
  check_cpu(slots, op, "the index");
  TORCH_CHECK(slots.defined() && slots.scalar_type() == at::kLong && slots.is_contiguous() &&
                  slots.dim() == 2 && slots.size(1) == 2,
              op, ": the index must be a contiguous (capacity, 2) int64 tensor");
  const int64_t cap = slots.size(0);
  TORCH_CHECK(cap > 0 && (cap & (cap - 1)) == 0, op,
              ": index capacity must be a power of two, got ", cap);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(slots.data_ptr()) % sizeof(int64_t) == 0, op,
              ": the index must be aligned to its 8-byte elements");
}

// data: (R, w) contiguous float32 with w >= kFlags + 1 (the day ops read the stats columns;
// shrink and select_rows step by the params' width, checked there); 0 <= size <= R.
void check_rows_in_use(const at::Tensor& data, int64_t size, const char* op) {
  check_cpu(data, op, "data");
  TORCH_CHECK(data.defined() && data.scalar_type() == at::kFloat && data.is_contiguous() &&
                  data.dim() == 2 && data.size(1) > kFlags,
              op, ": data must be a contiguous (R, width) float32 tensor");
  TORCH_CHECK(size >= 0 && size <= data.size(0), op, ": size ", size, " outside [0, ",
              data.size(0), "]");
  check_aligned(data, op, "data");
}

// (rows, d) float32 contiguous: a request's rows (take_rows, sum_rows).
void check_row_block(const at::Tensor& t, const char* op, const char* name) {
  check_cpu(t, op, name);
  TORCH_CHECK(t.dtype() == at::kFloat && t.is_contiguous() && t.dim() == 2, name,
              " must be a contiguous (rows, d) float32 tensor");
}

// (n,) int64 contiguous positions (take_rows' idx, sum_rows' inverse), returned aligned.
at::Tensor input_positions(const at::Tensor& t, const char* op, const char* name) {
  check_cpu(t, op, name);
  TORCH_CHECK(t.dtype() == at::kLong && t.is_contiguous() && t.dim() == 1, name,
              " must be a contiguous (n,) int64 tensor");
  return aligned(t);
}

// A push's shows and clicks: contiguous (n,) float32 CPU tensors.
void check_counts(const at::Tensor& shows, const at::Tensor& clicks, int64_t n, const char* op) {
  check_cpu(shows, op, "shows");
  check_cpu(clicks, op, "clicks");
  TORCH_CHECK(shows.scalar_type() == at::kFloat && shows.numel() == n && shows.is_contiguous() &&
                  clicks.scalar_type() == at::kFloat && clicks.numel() == n &&
                  clicks.is_contiguous(),
              op, ": shows and clicks must be contiguous (", n, ",) float32 tensors");
}

at::Tensor step_buffer(at::IntArrayRef sizes, const at::TensorOptions& options) {
  // checked: a wrapped product would map a small buffer under a tensor that claims more
  int64_t count = 1;
  for (const int64_t s : sizes) count = checked_mul(count, s, "step_buffer");
  const size_t bytes = static_cast<size_t>(
      checked_mul(count, static_cast<int64_t>(options.dtype().itemsize()), "step_buffer"));
  const StepBlock b = step_block_take(bytes);
  if (b.ptr == nullptr) return at::empty(sizes, options);
  return at::from_blob(
      b.ptr, sizes, [b](void*) { step_block_give(b); }, options);
}

// A copy of a CPU tensor in a step buffer. For a copy kept across a few steps (host_tier's
// recent pulls): from the heap, such copies split its free space between the step's

TableBlock table_block(const std::vector<int64_t>& counts, int64_t n,
                       const std::vector<const TableParams*>& params, const char* op) {
  TableBlock b;
  b.offsets.assign(1, 0);
  TORCH_CHECK(params.size() == counts.size(), op, ": ", counts.size(), " counts for ",
              params.size(), " tables");
  for (size_t t = 0; t < counts.size(); ++t) {
    TORCH_CHECK(params[t] != nullptr, op, ": params of table ", t, " is None");
    TORCH_CHECK(counts[t] >= 0, op, ": counts[", t, "] = ", counts[t], " < 0");
    b.offsets.push_back(b.offsets.back() + counts[t]);
    if (t == 0) b.dim = params[t]->dim;
    TORCH_CHECK(params[t]->dim == b.dim, op, ": table ", t, " has dim ", params[t]->dim,
                ", table 0 has ", b.dim, " (one block of rows has one dim)");
  }
  TORCH_CHECK(b.offsets.back() == n, op, ": counts sum to ", b.offsets.back(), ", not the ",
              n, " keys");
  return b;
}


}  // namespace bind
}  // namespace streamrec
