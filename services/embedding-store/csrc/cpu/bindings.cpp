// The one binding file of streamrec.embedding_store._C (the CPU extension; the ops are
// declared in ops.h), and the only one that sees torch. For each op it checks every tensor
// argument (dtype, shape, contiguity, device, alignment: the messages name the op and the
// argument), reads a misaligned input from an aligned copy, allocates the outputs (at::empty,
// or a pooled per-step buffer) and calls the op on plain views, without the GIL. Each op keeps
// its Python signature; an OpError it raises is a RuntimeError with the same message. It also
// gives the ops their parallel loops (parallel.h) over at::parallel_for.

// torch's Tensor, its pybind11 casters and the few ATen ops used, not <torch/extension.h>:
// the whole C++ frontend there doubled this file's compile time (measured 42 s -> 23 s).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <tuple>
#include <vector>

#include "checks.h"
#include "ops.h"
#include "parallel.h"

namespace py = pybind11;
using namespace streamrec;

namespace streamrec {

// The ops' loops on torch's intra-op threads (OpenMP), as they ran when they called
// at::parallel_for themselves; one indirect call per chunk.
void parallel_chunks(int64_t begin, int64_t end, int64_t grain, ChunkFn fn, const void* body) {
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) { fn(body, b, e); });
}

int num_threads() { return at::get_num_threads(); }

}  // namespace streamrec

namespace {

// --- tensor checks ---

// Alignment. Arrays decoded from a message may start at any byte (a ZeroMQ frame can sit
// inside its receive buffer); a load through a misaligned int64_t* or float* is undefined
// behaviour, and vectorised code may rely on the alignment. So an input an op only reads is
// taken as it is when aligned to its element size, else as an aligned copy (small arrays:
// large frames get buffers of their own); a tensor an op writes must be aligned.
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

// --- views and outputs ---

template <class T>
Span<T> span(const at::Tensor& t) {
  return {t.data_ptr<std::remove_const_t<T>>(), t.numel()};
}
template <class T>
Matrix<T> matrix(const at::Tensor& t) {
  return {t.data_ptr<std::remove_const_t<T>>(), t.size(0), t.size(1)};
}

// An empty tensor for a per-step result (a pull's rows, a push's sums): 256 KiB or more comes
// from the pool of mappings that keep their pages between steps (buffer_pool.cpp), given back
// when the tensor dies; smaller, or with STREAMREC_KEEP_FREED_MEMORY=0, it is at::empty.
// Raises when the byte size of `sizes` overflows int64.
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
// short-lived buffers, and the heap top then grows by one now and then, a fault per 4 KiB.
at::Tensor step_copy_py(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "step_copy: a CPU tensor, got one on ", t.device());
  auto out = step_buffer(t.sizes(), t.options());
  out.copy_(t);
  return out;
}

// --- the ops (shapes in ops.h) ---

at::Tensor find_py(const at::Tensor& slots, const at::Tensor& keys_in) {
  check_index(slots, "find");
  const at::Tensor keys = input_ids(keys_in, "find", "keys");
  auto rows = at::empty({keys.numel()}, keys.options());
  find(matrix<const int64_t>(slots), span<const int64_t>(keys), rows.data_ptr<int64_t>());
  return rows;
}

std::tuple<at::Tensor, int64_t> find_count_py(const at::Tensor& slots,
                                                 const at::Tensor& keys_in) {
  check_index(slots, "find_count");
  const at::Tensor keys = input_ids(keys_in, "find_count", "keys");
  auto rows = at::empty({keys.numel()}, keys.options());
  const int64_t misses =
      find_count(matrix<const int64_t>(slots), span<const int64_t>(keys), rows.data_ptr<int64_t>());
  return {rows, misses};
}

std::tuple<at::Tensor, at::Tensor, int64_t> find_gather_py(const at::Tensor& slots,
                                                                 const at::Tensor& keys_in,
                                                                 const at::Tensor& data,
                                                                 const TableParams& p,
                                                                 bool zero_misses) {
  constexpr const char* kOp = "find_gather";
  check_index(slots, kOp);
  const at::Tensor keys = input_ids(keys_in, kOp, "keys");
  check_data(data, p, kOp);
  const int64_t n = keys.numel();
  auto rows = step_buffer({n}, keys.options());  // kept for the push (host_tier's recent pulls)
  auto out = step_buffer({n, p.dim}, data.options());
  const int64_t misses =
      find_gather(matrix<const int64_t>(slots), span<const int64_t>(keys),
                  matrix<const float>(data), p, zero_misses, rows.data_ptr<int64_t>(),
                  out.data_ptr<float>());
  return {out, rows, misses};
}

// Several tables' parts laid end to end in one block (counts[t] keys of table t): the
// in-process store's pull_rows and push_rows, one call for all tables, not one per table
// (the Python and binding work of a call, ~50 us, was a trainer step's 26 tables x 2).
struct TableBlock {
  std::vector<int64_t> offsets;  // T + 1: table t's part is [offsets[t], offsets[t + 1])
  int64_t dim = 0;
};
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

// find_gather of each table's part: (out (n, dim), rows (n,), misses per table).
std::tuple<at::Tensor, at::Tensor, std::vector<int64_t>> find_gather_tables_py(
    const std::vector<at::Tensor>& slots, const at::Tensor& keys_in,
    const std::vector<int64_t>& counts, const std::vector<at::Tensor>& data,
    const std::vector<const TableParams*>& params, bool zero_misses) {
  constexpr const char* kOp = "find_gather_tables";
  const at::Tensor keys = input_ids(keys_in, kOp, "keys");
  const int64_t n = keys.numel();
  const TableBlock b = table_block(counts, n, params, kOp);
  const size_t tables = counts.size();
  TORCH_CHECK(slots.size() == tables && data.size() == tables, kOp, ": ", slots.size(),
              " indexes and ", data.size(), " tables' rows for ", tables, " tables");
  for (size_t t = 0; t < tables; ++t) {
    check_index(slots[t], kOp);
    check_data(data[t], *params[t], kOp);
  }
  auto rows = step_buffer({n}, keys.options());  // kept for the push (host_tier's recent pulls)
  auto out = step_buffer({n, b.dim}, at::TensorOptions().dtype(at::kFloat));
  const int64_t* k = keys.data_ptr<int64_t>();
  std::vector<int64_t> misses(tables, 0);
  for (size_t t = 0; t < tables; ++t) {
    const int64_t at = b.offsets[t];
    misses[t] = find_gather(matrix<const int64_t>(slots[t]), {k + at, counts[t]},
                            matrix<const float>(data[t]), *params[t], zero_misses,
                            rows.data_ptr<int64_t>() + at, out.data_ptr<float>() + at * b.dim);
  }
  return {out, rows, misses};
}

std::tuple<at::Tensor, at::Tensor> find_or_insert_py(const at::Tensor& slots,
                                                           const at::Tensor& keys_in,
                                                           int64_t next_row) {
  constexpr const char* kOp = "find_or_insert";
  check_index(slots, kOp);
  const at::Tensor keys = input_ids(keys_in, kOp, "keys");
  auto rows = at::empty({keys.numel()}, keys.options());
  std::vector<int64_t> added;
  find_or_insert(matrix<int64_t>(slots), span<const int64_t>(keys), next_row,
                 rows.data_ptr<int64_t>(), added);
  auto new_keys = at::empty({static_cast<int64_t>(added.size())}, keys.options());
  if (!added.empty())
    std::memcpy(new_keys.data_ptr<int64_t>(), added.data(), added.size() * sizeof(int64_t));
  return {rows, new_keys};
}

void insert_or_assign_py(const at::Tensor& slots, const at::Tensor& keys_in,
                         const at::Tensor& vals_in) {
  constexpr const char* kOp = "insert_or_assign";
  check_index(slots, kOp);
  const at::Tensor keys = input_ids(keys_in, kOp, "keys");
  const at::Tensor vals = input_ids(vals_in, kOp, "vals");
  insert_or_assign(matrix<int64_t>(slots), span<const int64_t>(keys), span<const int64_t>(vals));
}

at::Tensor index_build_py(int64_t capacity, const at::Tensor& keys_in) {
  const at::Tensor keys = input_ids(keys_in, "index_build", "keys");
  check_build(capacity, keys.numel());
  auto slots = at::empty({capacity, 2}, keys.options());
  index_build(span<const int64_t>(keys), matrix<int64_t>(slots));
  return slots;
}

int64_t insert_init_py(const at::Tensor& slots, const at::Tensor& data,
                       const at::Tensor& row_keys, const at::Tensor& keys_in,
                       const at::Tensor& rows, const at::Tensor& out, int64_t start,
                       const TableParams& p, bool hinted) {
  constexpr const char* kOp = "insert_init";
  check_index(slots, kOp);
  const at::Tensor keys = input_ids(keys_in, kOp, "keys");
  check_output_ids(rows, kOp, "rows");
  check_output_ids(row_keys, kOp, "row_keys");
  check_data(data, p, kOp);
  const int64_t n = keys.numel();
  TORCH_CHECK(rows.numel() == n, kOp, ": rows and keys differ in length (", rows.numel(),
              " and ", n, ")");
  const bool with_out = out.defined() && out.numel() > 0;
  if (with_out) {
    check_cpu(out, kOp, "out");
    TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 &&
                    out.size(0) == n && out.size(1) == p.dim,
                kOp, ": out must be a contiguous (", n, ", ", p.dim, ") float32 tensor");
    check_aligned(out, kOp, "out");
  }
  InsertInitArgs a;
  a.slots = matrix<int64_t>(slots);
  a.data = matrix<float>(data);
  a.row_keys = span<int64_t>(row_keys);
  a.keys = span<const int64_t>(keys);
  a.rows = rows.data_ptr<int64_t>();
  a.out = with_out ? out.data_ptr<float>() : nullptr;
  a.start = start;
  a.hinted = hinted;
  return insert_init(a, p);
}

std::tuple<at::Tensor, at::Tensor> unique_py(const at::Tensor& keys_in) {
  const at::Tensor keys = input_ids(keys_in, "unique", "keys");
  auto inverse = at::empty({keys.numel()}, keys.options());
  const std::vector<int64_t>& uniq = unique(span<const int64_t>(keys), inverse.data_ptr<int64_t>());
  auto out = at::empty({static_cast<int64_t>(uniq.size())}, keys.options());
  if (!uniq.empty())
    std::memcpy(out.data_ptr<int64_t>(), uniq.data(), uniq.size() * sizeof(int64_t));
  return {out, inverse};
}

// unique of each group of keys laid end to end (counts[t] keys of group t): the distinct keys
// of all groups end to end (group t's first occurrences in order), each key's position among
// them (inverse, shifted by the distinct keys of the groups before) and the distinct count
// per group. A trainer's dedup of every table's keys in one call.
std::tuple<at::Tensor, at::Tensor, std::vector<int64_t>> unique_groups_py(
    const at::Tensor& keys_in, const std::vector<int64_t>& counts) {
  constexpr const char* kOp = "unique_groups";
  const at::Tensor keys = input_ids(keys_in, kOp, "keys");
  const int64_t n = keys.numel();
  int64_t total = 0;
  for (size_t t = 0; t < counts.size(); ++t) {
    TORCH_CHECK(counts[t] >= 0, kOp, ": counts[", t, "] = ", counts[t], " < 0");
    total += counts[t];
  }
  TORCH_CHECK(total == n, kOp, ": counts sum to ", total, ", not the ", n, " keys");
  auto inverse = at::empty({n}, keys.options());
  auto out = at::empty({n}, keys.options());  // narrowed to the distinct keys below
  const int64_t* k = keys.data_ptr<int64_t>();
  int64_t* inv = inverse.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  std::vector<int64_t> distinct(counts.size(), 0);
  int64_t at = 0, u = 0;
  for (size_t t = 0; t < counts.size(); ++t) {
    const std::vector<int64_t>& uniq = unique({k + at, counts[t]}, inv + at);
    if (u > 0)
      for (int64_t i = at; i < at + counts[t]; ++i) inv[i] += u;
    if (!uniq.empty()) std::memcpy(o + u, uniq.data(), uniq.size() * sizeof(int64_t));
    distinct[t] = static_cast<int64_t>(uniq.size());
    u += distinct[t];
    at += counts[t];
  }
  return {out.narrow(0, 0, u), inverse, distinct};
}

at::Tensor take_rows_py(const std::vector<at::Tensor>& parts, const at::Tensor& idx_in) {
  TORCH_CHECK(!parts.empty(), "take_rows needs at least one part");
  const int64_t d = parts[0].size(1);
  std::vector<Matrix<const float>> views;
  for (const auto& part : parts) {
    check_row_block(part, "take_rows", "parts");
    TORCH_CHECK(part.size(1) == d, "parts differ in width");
    views.push_back(matrix<const float>(part));  // copied with memcpy: any alignment
  }
  const at::Tensor idx = input_positions(idx_in, "take_rows", "idx");
  auto out = step_buffer({idx.numel(), d}, parts[0].options());
  take_rows(views, span<const int64_t>(idx), out.data_ptr<float>());
  return out;
}

std::tuple<at::Tensor, bool> sum_rows_py(const at::Tensor& src_in,
                                            const at::Tensor& inverse_in, int64_t u) {
  check_row_block(src_in, "sum_rows", "src");
  const at::Tensor src = aligned(src_in);  // summed as floats
  TORCH_CHECK(inverse_in.numel() == src.size(0), "inverse and src differ in length");
  // every row of [0, u) has a position: u <= n (and the op's scratch is sized by u)
  TORCH_CHECK(u >= 0 && u <= src.size(0), "u = ", u, " outside [0, ", src.size(0), "]");
  const at::Tensor inverse = input_positions(inverse_in, "sum_rows", "inverse");
  auto out = step_buffer({u, src.size(1)}, src.options());
  const bool finite =
      sum_rows(matrix<const float>(src), span<const int64_t>(inverse), u, out.data_ptr<float>());
  return {out, finite};
}

bool all_finite_py(const at::Tensor& t) {
  check_cpu(t, "all_finite", "t");
  TORCH_CHECK(t.dtype() == at::kFloat && t.is_contiguous(), "t must be contiguous float32");
  return all_finite_parallel(t.data_ptr<float>(), t.numel());
}

void init_rows_py(const at::Tensor& data, const at::Tensor& row_keys_in, int64_t start,
                  int64_t count, const TableParams& p) {
  check_data(data, p, "init_rows");
  const at::Tensor row_keys = input_ids(row_keys_in, "init_rows", "row_keys");
  init_rows(matrix<float>(data), span<const int64_t>(row_keys), start, count, p);
}

at::Tensor initial_weights_py(const at::Tensor& keys_in, const TableParams& p,
                                 bool with_embedx) {
  check_params(p, "initial_weights");
  const at::Tensor keys = input_ids(keys_in, "initial_weights", "keys");
  auto out = at::empty({keys.numel(), p.dim}, at::kFloat);
  initial_weights(span<const int64_t>(keys), p, with_embedx, out.data_ptr<float>());
  return out;
}

at::Tensor gather_py(const at::Tensor& data, const at::Tensor& rows_in,
                        const TableParams& p) {
  check_data(data, p, "gather");
  const at::Tensor rows = input_ids(rows_in, "gather", "rows");
  auto out = step_buffer({rows.numel(), p.dim}, data.options());
  gather(matrix<const float>(data), span<const int64_t>(rows), p, out.data_ptr<float>());
  return out;
}

bool prefault_py(const at::Tensor& t, int64_t start, int64_t end) {
  check_cpu(t, "prefault", "tensor");
  TORCH_CHECK(t.is_contiguous() && t.dim() >= 1, "prefault needs a contiguous tensor");
  const int64_t rows = t.size(0);
  const int64_t row_bytes = t.numel() / std::max<int64_t>(rows, 1) * t.element_size();
  return prefault(t.data_ptr(), rows, row_bytes, start, end);
}

bool advise_huge_py(const at::Tensor& t) {
  check_cpu(t, "advise_huge", "tensor");
  TORCH_CHECK(t.is_contiguous(), "advise_huge needs a contiguous tensor");
  return advise_huge(t.data_ptr(), t.numel() * t.element_size());
}

int64_t update_py(const at::Tensor& data, const at::Tensor& row_keys_in,
                  const at::Tensor& rows_in, const at::Tensor& grads_in,
                  const at::Tensor& shows_in, const at::Tensor& clicks_in,
                  const TableParams& p) {
  constexpr const char* kOp = "update";
  check_data(data, p, kOp);
  const at::Tensor rows = input_ids(rows_in, kOp, "rows");
  const int64_t n = rows.numel();
  check_cpu(grads_in, kOp, "grads");
  TORCH_CHECK(grads_in.scalar_type() == at::kFloat && grads_in.is_contiguous() &&
                  grads_in.dim() == 2 && grads_in.size(0) == n && grads_in.size(1) == p.dim,
              kOp, ": grads must be a contiguous (", n, ", ", p.dim, ") float32 tensor");
  check_counts(shows_in, clicks_in, n, kOp);
  const at::Tensor row_keys = input_ids(row_keys_in, kOp, "row_keys");
  TORCH_CHECK(row_keys.numel() >= data.size(0), kOp, ": row_keys must be (R,) int64, R = ",
              data.size(0));
  const at::Tensor grads = aligned(grads_in), shows = aligned(shows_in),
                      clicks = aligned(clicks_in);
  PushArgs a;
  a.data = matrix<float>(data);
  a.row_keys = span<const int64_t>(row_keys);
  a.rows = span<const int64_t>(rows);
  a.grads = grads.data_ptr<float>();
  a.shows = shows.data_ptr<float>();
  a.clicks = clicks.data_ptr<float>();
  return update(a, p);
}

// update of each table's part: rows[t] (n_t,) of table t, its gradients, shows and clicks
// the next n_t of the block's. Every table's arguments are checked before any is written
// (update's own check of the rows, against an internal fault, runs per table). Returns the
// rows expanded per table.
std::vector<int64_t> update_tables_py(const std::vector<at::Tensor>& data,
                                      const std::vector<at::Tensor>& row_keys_in,
                                      const std::vector<at::Tensor>& rows_in,
                                      const at::Tensor& grads_in, const at::Tensor& shows_in,
                                      const at::Tensor& clicks_in,
                                      const std::vector<const TableParams*>& params) {
  constexpr const char* kOp = "update_tables";
  const size_t tables = rows_in.size();
  TORCH_CHECK(data.size() == tables && row_keys_in.size() == tables, kOp, ": ", data.size(),
              " tables' rows and ", row_keys_in.size(), " row keys for ", tables, " tables");
  std::vector<at::Tensor> rows(tables), row_keys(tables);
  std::vector<int64_t> counts(tables);
  for (size_t t = 0; t < tables; ++t) {
    rows[t] = input_ids(rows_in[t], kOp, "rows");
    counts[t] = rows[t].numel();
  }
  check_cpu(grads_in, kOp, "grads");
  TORCH_CHECK(grads_in.dim() == 2, kOp, ": grads must be (n, dim), got ", grads_in.dim(),
              " dimensions");
  const int64_t n = grads_in.size(0);
  const TableBlock b = table_block(counts, n, params, kOp);
  TORCH_CHECK(grads_in.scalar_type() == at::kFloat && grads_in.is_contiguous() &&
                  grads_in.size(1) == b.dim,
              kOp, ": grads must be a contiguous (", n, ", ", b.dim, ") float32 tensor");
  check_counts(shows_in, clicks_in, n, kOp);
  for (size_t t = 0; t < tables; ++t) {
    check_data(data[t], *params[t], kOp);
    row_keys[t] = input_ids(row_keys_in[t], kOp, "row_keys");
    TORCH_CHECK(row_keys[t].numel() >= data[t].size(0), kOp,
                ": row_keys must be (R,) int64, R = ", data[t].size(0));
  }
  const at::Tensor grads = aligned(grads_in), shows = aligned(shows_in),
                   clicks = aligned(clicks_in);
  std::vector<int64_t> expanded(tables, 0);
  for (size_t t = 0; t < tables; ++t) {
    const int64_t at = b.offsets[t];
    PushArgs a;
    a.data = matrix<float>(data[t]);
    a.row_keys = span<const int64_t>(row_keys[t]);
    a.rows = span<const int64_t>(rows[t]);
    a.grads = grads.data_ptr<float>() + at * b.dim;
    a.shows = shows.data_ptr<float>() + at;
    a.clicks = clicks.data_ptr<float>() + at;
    expanded[t] = update(a, *params[t]);
  }
  return expanded;
}

std::tuple<int64_t, int64_t> check_push_py(const at::Tensor& grads,
                                           const at::Tensor& shows_in,
                                           const at::Tensor& clicks_in) {
  check_cpu(grads, "check_push", "grads");
  check_cpu(shows_in, "check_push", "shows");
  check_cpu(clicks_in, "check_push", "clicks");
  TORCH_CHECK(grads.dtype() == at::kFloat && grads.is_contiguous() && grads.dim() == 2,
              "grads must be contiguous (n, dim) float32");
  const int64_t n = grads.size(0);
  TORCH_CHECK(shows_in.dtype() == at::kFloat && shows_in.numel() == n &&
                  shows_in.is_contiguous() && clicks_in.dtype() == at::kFloat &&
                  clicks_in.numel() == n && clicks_in.is_contiguous(),
              "shows and clicks must be contiguous (n,) float32");
  // grads are read by all_finite (any alignment); shows and clicks as floats
  const at::Tensor shows = aligned(shows_in), clicks = aligned(clicks_in);
  const PushFaults f = check_push(grads.data_ptr<float>(), n, grads.size(1),
                                  shows.data_ptr<float>(), clicks.data_ptr<float>());
  return {f.bad_rows, f.bad_counts};
}

void advance_day_py(const at::Tensor& data, int64_t size) {
  check_rows_in_use(data, size, "advance_day");
  advance_day(matrix<float>(data), size);
}

at::Tensor shrink_py(const at::Tensor& data, int64_t size, const TableParams& p) {
  check_rows_in_use(data, size, "shrink");
  check_data(data, p, "shrink");
  auto keep = at::empty({size}, at::kBool);
  shrink(matrix<float>(data), size, p, keep.data_ptr<bool>());
  return keep;
}

at::Tensor select_rows_py(const at::Tensor& data, int64_t size, int64_t mode,
                             const TableParams& p) {
  check_rows_in_use(data, size, "select_rows");
  check_data(data, p, "select_rows");
  auto sel = at::empty({size}, at::kBool);
  select_rows(matrix<const float>(data), size, mode, p, sel.data_ptr<bool>());
  return sel;
}

void clear_dirty_py(const at::Tensor& data, int64_t size) {
  check_rows_in_use(data, size, "clear_dirty");
  clear_dirty(matrix<float>(data), size);
}

}  // namespace

// --- the ssd tier (ssd_rows.cpp) ---
// keys (cap,) int64 and vals (cap,) int32, contiguous and aligned (the compact index).
CompactIndex compact(const at::Tensor& keys, const at::Tensor& vals, const char* op) {
  check_output_ids(keys, op, "index keys");
  check_cpu(vals, op, "index vals");
  TORCH_CHECK(vals.scalar_type() == at::kInt && vals.dim() == 1 && vals.is_contiguous() &&
                  vals.numel() == keys.numel() && keys.numel() > 0,
              op, ": index vals must be a contiguous (cap,) int32 tensor, cap = keys' >= 1");
  check_aligned(vals, op, "index vals");
  return {keys.data_ptr<int64_t>(), vals.data_ptr<int32_t>(), keys.numel()};
}
std::tuple<at::Tensor, int64_t> compact_find_py(const at::Tensor& ik, const at::Tensor& iv,
                                                const at::Tensor& keys_in) {
  const at::Tensor keys = input_ids(keys_in, "compact_find", "keys");
  auto out = at::empty({keys.numel()}, at::kLong);
  const int64_t misses = compact_find(compact(ik, iv, "compact_find"), span<const int64_t>(keys),
                                      out.data_ptr<int64_t>());
  return {out, misses};
}
int64_t compact_assign_py(const at::Tensor& ik, const at::Tensor& iv, const at::Tensor& keys_in,
                          const at::Tensor& vals_in) {
  const at::Tensor keys = input_ids(keys_in, "compact_assign", "keys");
  const at::Tensor vals = input_ids(vals_in, "compact_assign", "vals");
  return compact_assign(compact(ik, iv, "compact_assign"), span<const int64_t>(keys),
                        span<const int64_t>(vals));
}
std::tuple<at::Tensor, at::Tensor, int64_t> compact_find_or_add_py(const at::Tensor& ik,
                                                                   const at::Tensor& iv,
                                                                   const at::Tensor& keys_in,
                                                                   int64_t first) {
  const at::Tensor keys = input_ids(keys_in, "compact_find_or_add", "keys");
  auto out = at::empty({keys.numel()}, at::kLong);
  auto added = at::empty({keys.numel()}, at::kBool);
  const int64_t n = compact_find_or_add(compact(ik, iv, "compact_find_or_add"),
                                        span<const int64_t>(keys), first, out.data_ptr<int64_t>(),
                                        added.data_ptr<bool>());
  return {out, added, n};
}
int64_t compact_erase_py(const at::Tensor& ik, const at::Tensor& iv, const at::Tensor& keys_in) {
  const at::Tensor keys = input_ids(keys_in, "compact_erase", "keys");
  return compact_erase(compact(ik, iv, "compact_erase"), span<const int64_t>(keys));
}
std::tuple<at::Tensor, int64_t> clock_victims_py(const at::Tensor& ref, int64_t hand,
                                                 int64_t count) {
  check_cpu(ref, "clock_victims", "ref");
  TORCH_CHECK(ref.scalar_type() == at::kByte && ref.dim() == 1 && ref.is_contiguous(),
              "clock_victims: ref must be a contiguous (R,) uint8 tensor");
  TORCH_CHECK(hand >= 0 && hand < std::max<int64_t>(ref.numel(), 1) && count >= 0,
              "clock_victims: hand ", hand, " outside the ", ref.numel(), " rows, or count < 0");
  auto out = at::empty({std::min(count, ref.numel())}, at::kLong);
  const int64_t found = ref.numel() == 0 ? 0
      : clock_victims(ref.data_ptr<uint8_t>(), ref.numel(), &hand, out.numel(),
                      out.data_ptr<int64_t>());
  return {out.narrow(0, 0, found), hand};
}
void mark_rows_py(const at::Tensor& ref, const at::Tensor& dirty, const at::Tensor& rows_in,
                  int64_t value, bool set_dirty) {
  TORCH_CHECK(ref.device().is_cpu() && dirty.device().is_cpu() && ref.scalar_type() == at::kByte &&
                  dirty.scalar_type() == at::kBool && ref.dim() == 1 && ref.is_contiguous() &&
                  dirty.is_contiguous() && dirty.numel() == ref.numel() && value >= -1 &&
                  value < 256,
              "mark_rows: ref (R,) uint8 and dirty (R,) bool contiguous CPU tensors, value a "
              "byte or -1 (unchanged)");
  const at::Tensor rows = input_ids(rows_in, "mark_rows", "rows");
  mark_rows(ref.data_ptr<uint8_t>(), dirty.data_ptr<bool>(), ref.numel(), span<const int64_t>(rows),
            static_cast<int>(value), set_dirty);
}
void init_rows_at_py(const at::Tensor& data, const at::Tensor& row_keys_in,
                     const at::Tensor& rows_in, const TableParams& p) {
  check_data(data, p, "init_rows_at");
  const at::Tensor row_keys = input_ids(row_keys_in, "init_rows_at", "row_keys");
  const at::Tensor rows = input_ids(rows_in, "init_rows_at", "rows");
  init_rows_at(matrix<float>(data), span<const int64_t>(row_keys), span<const int64_t>(rows), p);
}
at::Tensor init_records_py(const at::Tensor& records, const at::Tensor& keys_in,
                           const TableParams& p) {
  constexpr const char* kOp = "init_records";
  check_params(p, kOp);
  check_cpu(records, kOp, "records");
  TORCH_CHECK(records.scalar_type() == at::kFloat && records.dim() == 2 &&
                  records.is_contiguous(),
              kOp, ": records must be a contiguous (n, width + 2) float32 tensor");
  check_aligned(records, kOp, "records");
  const at::Tensor keys = input_ids(keys_in, kOp, "keys");
  auto out = at::empty({keys.numel(), p.dim}, at::kFloat);
  init_records(matrix<float>(records), span<const int64_t>(keys), p, out.data_ptr<float>());
  return out;
}
void check_records(const at::Tensor& file, const at::Tensor& data, const char* op) {
  check_cpu(file, op, "file");
  check_cpu(data, op, "data");
  TORCH_CHECK(file.scalar_type() == at::kFloat && file.dim() == 2 && file.is_contiguous() &&
                  data.scalar_type() == at::kFloat && data.dim() == 2 && data.is_contiguous() &&
                  file.size(1) == data.size(1) + 2,
              op, ": file (F, w + 2) and data (R, w) must be contiguous float32 tensors");
  check_aligned(data, op, "data");
  check_aligned(file, op, "file");
}
void records_to_rows_py(const at::Tensor& file, const at::Tensor& slots_in, const at::Tensor& data,
                        const at::Tensor& rows_in) {
  check_records(file, data, "records_to_rows");
  const at::Tensor slots = input_ids(slots_in, "records_to_rows", "slots");
  const at::Tensor rows = input_ids(rows_in, "records_to_rows", "rows");
  records_to_rows(matrix<const float>(file), span<const int64_t>(slots), matrix<float>(data),
                  span<const int64_t>(rows));
}
void pread_records_py(int64_t fd, int64_t file_rows, const at::Tensor& slots_in,
                      const at::Tensor& data, const at::Tensor& rows_in) {
  constexpr const char* kOp = "pread_records";
  check_cpu(data, kOp, "data");
  TORCH_CHECK(data.scalar_type() == at::kFloat && data.dim() == 2 && data.is_contiguous(), kOp,
              ": data must be a contiguous (R, w) float32 tensor");
  check_aligned(data, kOp, "data");
  const at::Tensor slots = input_ids(slots_in, kOp, "slots");
  const at::Tensor rows = input_ids(rows_in, kOp, "rows");
  pread_records(static_cast<int>(fd), file_rows, span<const int64_t>(slots), matrix<float>(data),
                span<const int64_t>(rows));
}
void rows_to_records_py(const at::Tensor& data, const at::Tensor& row_keys_in,
                        const at::Tensor& rows_in, const at::Tensor& file,
                        const at::Tensor& slots_in) {
  check_records(file, data, "rows_to_records");
  const at::Tensor row_keys = input_ids(row_keys_in, "rows_to_records", "row_keys");
  const at::Tensor rows = input_ids(rows_in, "rows_to_records", "rows");
  const at::Tensor slots = input_ids(slots_in, "rows_to_records", "slots");
  rows_to_records(matrix<const float>(data), span<const int64_t>(row_keys),
                  span<const int64_t>(rows), matrix<float>(file), span<const int64_t>(slots));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "StreamRec embedding store CPU ops (hash index, gather, fused optimizer, shrink)";

  py::class_<RuleParams>(m, "RuleParams")
      .def(py::init<>())
      .def_readwrite("kind", &RuleParams::kind)
      .def_readwrite("learning_rate", &RuleParams::learning_rate)
      .def_readwrite("initial_g2sum", &RuleParams::initial_g2sum)
      .def_readwrite("lower_bound", &RuleParams::lower_bound)
      .def_readwrite("upper_bound", &RuleParams::upper_bound)
      .def_readwrite("beta1", &RuleParams::beta1)
      .def_readwrite("beta2", &RuleParams::beta2)
      .def_readwrite("epsilon", &RuleParams::epsilon);

  py::class_<InitParams>(m, "InitParams")
      .def(py::init<>())
      .def_readwrite("kind", &InitParams::kind)
      .def_readwrite("a", &InitParams::a)
      .def_readwrite("b", &InitParams::b);

  py::class_<TableParams>(m, "TableParams")
      .def(py::init<>())
      .def_readwrite("dim", &TableParams::dim)
      .def_readwrite("embed_rule", &TableParams::embed_rule)
      .def_readwrite("embedx_rule", &TableParams::embedx_rule)
      .def_readwrite("embed_init", &TableParams::embed_init)
      .def_readwrite("embedx_init", &TableParams::embedx_init)
      .def_readwrite("nonclk_coeff", &TableParams::nonclk_coeff)
      .def_readwrite("click_coeff", &TableParams::click_coeff)
      .def_readwrite("embedx_threshold", &TableParams::embedx_threshold)
      .def_readwrite("show_click_decay_rate", &TableParams::show_click_decay_rate)
      .def_readwrite("delete_threshold", &TableParams::delete_threshold)
      .def_readwrite("delete_after_unseen_days", &TableParams::delete_after_unseen_days)
      .def_readwrite("base_threshold", &TableParams::base_threshold)
      .def_readwrite("delta_threshold", &TableParams::delta_threshold)
      .def_readwrite("delta_keep_days", &TableParams::delta_keep_days)
      .def_readwrite("seed", &TableParams::seed)
      .def_readonly("embed_state", &TableParams::embed_state)
      .def_readonly("embedx_state", &TableParams::embedx_state)
      .def_readonly("width", &TableParams::width)
      .def("finalize", &TableParams::finalize);

  m.attr("SHOW") = kShow;
  m.attr("CLICK") = kClick;
  m.attr("UNSEEN") = kUnseen;
  m.attr("FLAGS") = kFlags;
  m.attr("EMBED_W") = kEmbedW;
  m.attr("FLAG_EXPANDED") = kFlagExpanded;
  m.attr("FLAG_DIRTY") = kFlagDirty;

  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("find", &find_py, "row id per key, -1 if absent", py::arg("slots"), py::arg("keys"),
        nogil);
  m.def("find_or_insert", &find_or_insert_py, "row id per key, inserting absent keys",
        py::arg("slots"), py::arg("keys"), py::arg("next_row"), nogil);
  m.def("find_count", &find_count_py, "(row id per key, < 0 if absent; number absent)",
        py::arg("slots"), py::arg("keys"), nogil);
  m.def("find_gather", &find_gather_py, "(weights, rows, misses) in one pass", py::arg("slots"),
        py::arg("keys"), py::arg("data"), py::arg("params"), py::arg("zero_misses") = true,
        nogil);
  m.def("insert_init", &insert_init_py, "creates rows of the keys with rows < 0; returns count",
        py::arg("slots"), py::arg("data"), py::arg("row_keys"), py::arg("keys"),
        py::arg("rows"), py::arg("out"), py::arg("start"), py::arg("params"),
        py::arg("hinted") = false, nogil);
  m.def("advise_huge", &advise_huge_py, "asks for transparent huge pages over a tensor",
        py::arg("tensor"), nogil);
  m.def("prefault", &prefault_py, "maps rows [start, end) of a tensor's memory (no change)",
        py::arg("tensor"), py::arg("start"), py::arg("end"), nogil);
  m.def("insert_or_assign", &insert_or_assign_py, "sets key -> val", py::arg("slots"),
        py::arg("keys"), py::arg("vals"), nogil);
  m.def("unique", &unique_py, "distinct keys (first-occurrence order) and inverse",
        py::arg("keys"), nogil);
  m.def("unique_groups", &unique_groups_py,
        "unique of each group of keys laid end to end; (distinct, inverse, distinct per group)",
        py::arg("keys"), py::arg("counts"), nogil);
  m.def("index_build", &index_build_py, "fresh index holding keys[i] -> i", py::arg("capacity"),
        py::arg("keys"), nogil);
  m.def("check_push", &check_push_py, "(bad grad rows, bad shows/clicks)", py::arg("grads"),
        py::arg("shows"), py::arg("clicks"), nogil);
  m.def("init_rows", &init_rows_py, "initialises rows [start, start+count)", py::arg("data"),
        py::arg("row_keys"), py::arg("start"), py::arg("count"), py::arg("params"), nogil);
  m.def("step_copy", &step_copy_py, "a copy in a pooled step buffer", py::arg("tensor"),
        nogil);
  m.def("gather", &gather_py, "weights of rows, zeros for -1", py::arg("data"), py::arg("rows"),
        py::arg("params"), nogil);
  m.def("initial_weights", &initial_weights_py, "deterministic initial weights per key",
        py::arg("keys"), py::arg("params"), py::arg("with_embedx"), nogil);
  m.def("update", &update_py, "fused push update (repeated rows summed); returns rows expanded",
        py::arg("data"), py::arg("row_keys"), py::arg("rows"), py::arg("grads"),
        py::arg("shows"), py::arg("clicks"), py::arg("params"), nogil);
  m.def("find_gather_tables", &find_gather_tables_py,
        "find_gather of several tables' keys laid end to end; (out, rows, misses per table)",
        py::arg("slots"), py::arg("keys"), py::arg("counts"), py::arg("data"),
        py::arg("params"), py::arg("zero_misses") = true, nogil);
  m.def("update_tables", &update_tables_py,
        "update of several tables' parts laid end to end; rows expanded per table",
        py::arg("data"), py::arg("row_keys"), py::arg("rows"), py::arg("grads"),
        py::arg("shows"), py::arg("clicks"), py::arg("params"), nogil);
  m.def("take_rows", &take_rows_py, "rows idx of the parts laid end to end, over every core",
        py::arg("parts"), py::arg("idx"), nogil);
  m.def("sum_rows", &sum_rows_py, "rows summed by a dedup's inverse; (sums, all finite)",
        py::arg("src"), py::arg("inverse"), py::arg("u"), nogil);
  m.def("all_finite", &all_finite_py, "no NaN or Inf in a float32 tensor", py::arg("t"), nogil);
  m.def("simd_path", &simd_path, "the build of the row draws in use: avx512 or portable");
  m.def("advance_day", &advance_day_py, "unseen_days += 1", py::arg("data"), py::arg("size"),
        nogil);
  m.def("shrink", &shrink_py, "decay show/click, keep mask", py::arg("data"), py::arg("size"),
        py::arg("params"), nogil);
  m.def("select_rows", &select_rows_py, "rows a save mode takes", py::arg("data"),
        py::arg("size"), py::arg("mode"), py::arg("params"), nogil);
  m.def("compact_find", &compact_find_py, "(value per key, -1 if absent; absent count)", py::arg("index_keys"),
        py::arg("index_vals"), py::arg("keys"), nogil);
  m.def("compact_assign", &compact_assign_py, "sets key -> val; returns keys added",
        py::arg("index_keys"), py::arg("index_vals"), py::arg("keys"), py::arg("vals"), nogil);
  m.def("compact_find_or_add", &compact_find_or_add_py,
        "(value per key, added per key, keys added): absent keys get first, first + 1, ...",
        py::arg("index_keys"), py::arg("index_vals"), py::arg("keys"), py::arg("first"), nogil);
  m.def("compact_erase", &compact_erase_py, "removes keys; returns keys removed",
        py::arg("index_keys"), py::arg("index_vals"), py::arg("keys"), nogil);
  m.def("clock_victims", &clock_victims_py, "(victim rows, new hand)", py::arg("ref"),
        py::arg("hand"), py::arg("count"), nogil);
  m.def("mark_rows", &mark_rows_py, "ref[r] = value (and dirty[r]) for rows >= 0", py::arg("ref"),
        py::arg("dirty"), py::arg("rows"), py::arg("value"), py::arg("set_dirty"), nogil);
  m.def("init_rows_at", &init_rows_at_py, "initialises the rows given", py::arg("data"),
        py::arg("row_keys"), py::arg("rows"), py::arg("params"), nogil);
  m.def("init_records", &init_records_py, "new file records: keys and initial rows; their weights (n, dim)",
        py::arg("records"), py::arg("keys"), py::arg("params"), nogil);
  m.def("records_to_rows", &records_to_rows_py, "file records' rows into data rows",
        py::arg("file"), py::arg("slots"), py::arg("data"), py::arg("rows"), nogil);
  m.def("pread_records", &pread_records_py, "file records' rows into data rows, by pread",
        py::arg("fd"), py::arg("file_rows"), py::arg("slots"), py::arg("data"), py::arg("rows"),
        nogil);
  m.def("rows_to_records", &rows_to_records_py, "data rows with their keys into file records",
        py::arg("data"), py::arg("row_keys"), py::arg("rows"), py::arg("file"), py::arg("slots"),
        nogil);
  m.attr("REF_IDLE") = static_cast<int>(kRefIdle);
  m.attr("REF_USED") = static_cast<int>(kRefUsed);
  m.attr("REF_FREE") = static_cast<int>(kRefFree);
  m.attr("REF_PINNED") = static_cast<int>(kRefPinned);
  m.def("clear_dirty", &clear_dirty_py, "clears the changed-since-save flag", py::arg("data"),
        py::arg("size"), nogil);
}
