// The hash index's ops (find, insert, build, dedup) on torch tensors: each checks its
// tensors, allocates its outputs and calls the op of ops.h on plain views.
#include <tuple>
#include <vector>

#include "bind.h"

namespace py = pybind11;
using namespace streamrec;
using namespace streamrec::bind;

namespace {

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


}  // namespace

namespace streamrec::bind {

void bind_index(py::module_& m) {
  const auto nogil = release_gil();
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
  m.def("insert_or_assign", &insert_or_assign_py, "sets key -> val", py::arg("slots"),
        py::arg("keys"), py::arg("vals"), nogil);
  m.def("unique", &unique_py, "distinct keys (first-occurrence order) and inverse",
        py::arg("keys"), nogil);
  m.def("unique_groups", &unique_groups_py,
        "unique of each group of keys laid end to end; (distinct, inverse, distinct per group)",
        py::arg("keys"), py::arg("counts"), nogil);
  m.def("index_build", &index_build_py, "fresh index holding keys[i] -> i", py::arg("capacity"),
        py::arg("keys"), nogil);
  m.def("find_gather_tables", &find_gather_tables_py,
        "find_gather of several tables' keys laid end to end; (out, rows, misses per table)",
        py::arg("slots"), py::arg("keys"), py::arg("counts"), py::arg("data"),
        py::arg("params"), py::arg("zero_misses") = true, nogil);
}

}  // namespace streamrec::bind
