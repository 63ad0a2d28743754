// The ssd tier's ops (ssd_rows.cpp: its compact index, CLOCK cache and file records) on
// torch tensors: each checks its tensors, allocates its outputs and calls the op of ops.h.
#include <tuple>
#include <vector>

#include "bind.h"

namespace py = pybind11;
using namespace streamrec;
using namespace streamrec::bind;

namespace {

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

}  // namespace

namespace streamrec::bind {

void bind_ssd(py::module_& m) {
  const auto nogil = release_gil();
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
}

}  // namespace streamrec::bind
