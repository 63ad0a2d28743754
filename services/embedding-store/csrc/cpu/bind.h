// What the binding files of streamrec.embedding_store._C share (the CPU extension's only
// sources that see torch; the ops are declared in ops.h): the checks of tensor arguments
// (dtype, shape, contiguity, device, alignment: the messages name the op and the argument),
// the plain views the ops take, the pooled per-step outputs, a block's table layout, and the
// registration of each op family on the one module (bindings.cpp).
#pragma once

// torch's Tensor, its pybind11 casters and the few ATen ops used, not <torch/extension.h>:
// the whole C++ frontend there doubled a binding file's compile time (measured 42 s -> 23 s).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "ops.h"

namespace streamrec::bind {

namespace py = pybind11;

// Each op family registers its ops on the module (bind_index.cpp, bind_rows.cpp,
// bind_ssd.cpp); bindings.cpp's PYBIND11_MODULE calls each once.
void bind_index(py::module_& m);
void bind_rows(py::module_& m);
void bind_ssd(py::module_& m);

// The ops release the GIL: they read and write only the tensors they are given.
inline auto release_gil() { return py::call_guard<py::gil_scoped_release>(); }

// --- tensor checks (bind_checks.cpp) ---

// Alignment. Arrays decoded from a message may start at any byte (a ZeroMQ frame can sit
// inside its receive buffer); a load through a misaligned int64_t* or float* is undefined
// behaviour, and vectorised code may rely on the alignment. So an input an op only reads is
// taken as it is when aligned to its element size, else as an aligned copy (small arrays:
// large frames get buffers of their own); a tensor an op writes must be aligned.
bool is_aligned(const at::Tensor& t);
at::Tensor aligned(const at::Tensor& t);
void check_aligned(const at::Tensor& t, const char* op, const char* name);
// A tensor on another device than the CPU is refused by name.
void check_cpu(const at::Tensor& t, const char* op, const char* name);
// A (n,) int64 contiguous tensor (keys, rows, row ids); input_ids: one the op only reads,
// returned aligned; check_output_ids: one the op writes.
void check_ids(const at::Tensor& t, const char* op, const char* name);
at::Tensor input_ids(const at::Tensor& t, const char* op, const char* name);
void check_output_ids(const at::Tensor& t, const char* op, const char* name);
// A table's rows: a contiguous (R, width) float32 tensor, width that of finalized params.
void check_data(const at::Tensor& data, const TableParams& p, const char* op);
// The index: a contiguous (capacity, 2) int64 tensor, capacity a power of two, aligned.
void check_index(const at::Tensor& slots, const char* op);
// data: (R, w) contiguous float32 with w >= kFlags + 1; 0 <= size <= R.
void check_rows_in_use(const at::Tensor& data, int64_t size, const char* op);
// (rows, d) float32 contiguous: a request's rows (take_rows, sum_rows).
void check_row_block(const at::Tensor& t, const char* op, const char* name);
// (n,) int64 contiguous positions (take_rows' idx, sum_rows' inverse), returned aligned.
at::Tensor input_positions(const at::Tensor& t, const char* op, const char* name);
// A push's shows and clicks: contiguous (n,) float32 CPU tensors.
void check_counts(const at::Tensor& shows, const at::Tensor& clicks, int64_t n, const char* op);

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
at::Tensor step_buffer(at::IntArrayRef sizes, const at::TensorOptions& options);

// Several tables' parts laid end to end in one block (counts[t] keys of table t): the
// in-process store's pull_rows and push_rows, one call for all tables, not one per table
// (the Python and binding work of a call, ~50 us, was a trainer step's 26 tables x 2).
struct TableBlock {
  std::vector<int64_t> offsets;  // T + 1: table t's part is [offsets[t], offsets[t + 1])
  int64_t dim = 0;
};
// The block of `counts` over n keys; raises unless every table shares one dim.
TableBlock table_block(const std::vector<int64_t>& counts, int64_t n,
                       const std::vector<const TableParams*>& params, const char* op);

}  // namespace streamrec::bind
