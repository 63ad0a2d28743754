// The row ops (init, gather, the fused update, the push check, day and shrink, save
// selection, a request's rows) on torch tensors: each checks its tensors, allocates its
// outputs and calls the op of ops.h on plain views.
#include <tuple>
#include <vector>

#include "bind.h"

namespace py = pybind11;
using namespace streamrec;
using namespace streamrec::bind;

namespace {

// A copy of a CPU tensor in a step buffer. For a copy kept across a few steps (host_tier's
// recent pulls): from the heap, such copies split its free space between the step's
// short-lived buffers, and the heap top then grows by one now and then, a fault per 4 KiB.
at::Tensor step_copy_py(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "step_copy: a CPU tensor, got one on ", t.device());
  auto out = step_buffer(t.sizes(), t.options());
  out.copy_(t);
  return out;
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

namespace streamrec::bind {

void bind_rows(py::module_& m) {
  const auto nogil = release_gil();
  m.def("advise_huge", &advise_huge_py, "asks for transparent huge pages over a tensor",
        py::arg("tensor"), nogil);
  m.def("prefault", &prefault_py, "maps rows [start, end) of a tensor's memory (no change)",
        py::arg("tensor"), py::arg("start"), py::arg("end"), nogil);
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
  m.def("clear_dirty", &clear_dirty_py, "clears the changed-since-save flag", py::arg("data"),
        py::arg("size"), nogil);
}

}  // namespace streamrec::bind
