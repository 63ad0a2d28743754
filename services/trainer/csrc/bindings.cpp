// The one binding file of streamrec.trainer._C, and the only one that sees torch: it
// allocates the parsers' outputs and runs each parse (ops.h) without the GIL, reading the
// caller's buffer in place (no copy of the chunk).

// torch's Tensor, its pybind11 casters, at::empty and at::from_blob, not <torch/extension.h>
// (its C++ frontend doubles the compile time; see csrc/cpu/bindings.cpp of the store).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "ops.h"

namespace py = pybind11;
using namespace streamrec::trainer;

namespace {

// A read-only view of any contiguous buffer (bytes, bytearray, memoryview, numpy array),
// released with the GIL held.
class ByteView {
 public:
  explicit ByteView(const py::object& obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) throw py::error_already_set();
  }
  ~ByteView() { PyBuffer_Release(&view_); }
  ByteView(const ByteView&) = delete;
  ByteView& operator=(const ByteView&) = delete;
  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  int64_t size() const { return static_cast<int64_t>(view_.len); }

 private:
  Py_buffer view_{};
};

// The parse's columns, allocated to the line count and narrowed to the good lines.
struct Parsed {
  at::Tensor dense, labels, keys, present, ptrue;
  LineCounts counts;
};

Parsed parse(const uint8_t* data, int64_t nbytes, bool generated, int64_t num_slots,
             int64_t max_line_bytes) {
  const int64_t capacity = parse_capacity(data, nbytes, num_slots);
  const auto f32 = at::dtype(at::kFloat);
  Parsed r;
  r.dense = at::empty({capacity, kNumDense}, f32);
  r.labels = at::empty({capacity}, f32);
  r.keys = at::empty({capacity, num_slots}, at::dtype(at::kLong));
  r.present = at::empty({capacity, num_slots}, at::dtype(at::kBool));
  r.ptrue = at::empty({generated ? capacity : 0}, f32);
  const LineOutputs out{r.dense.data_ptr<float>(), r.labels.data_ptr<float>(),
                        r.keys.data_ptr<int64_t>(), r.present.data_ptr<bool>(),
                        generated ? r.ptrue.data_ptr<float>() : nullptr};
  r.counts = parse_lines(data, nbytes, generated, num_slots, max_line_bytes, out);
  const int64_t n = r.counts.rows;
  r.dense = r.dense.narrow(0, 0, n);
  r.labels = r.labels.narrow(0, 0, n);
  r.keys = r.keys.narrow(0, 0, n);
  r.present = r.present.narrow(0, 0, n);
  r.ptrue = r.ptrue.narrow(0, 0, generated ? n : 0);
  return r;
}

py::tuple parse_lines_py(const py::object& data, bool generated, int64_t num_slots,
                         int64_t max_line_bytes) {
  const ByteView bytes(data);
  Parsed r;
  {
    const py::gil_scoped_release nogil;
    r = parse(bytes.data(), bytes.size(), generated, num_slots, max_line_bytes);
  }
  const LineCounts& c = r.counts;
  // present is None when every key is present, ptrue None for Criteo
  const py::object present = c.all_present ? py::none() : py::cast(r.present);
  const py::object ptrue = generated ? py::cast(r.ptrue) : py::none();
  return py::make_tuple(r.dense, r.labels, r.keys, present, ptrue, c.lines, c.malformed,
                        c.first_bad_fields, c.first_bad_value, c.first_overlong);
}

// A (n,) int64 tensor owning v's buffer (no copy).
at::Tensor long_tensor(std::vector<int64_t>&& v) {
  const auto n = static_cast<int64_t>(v.size());
  if (n == 0) return at::empty({0}, at::dtype(at::kLong));
  auto* owner = new std::vector<int64_t>(std::move(v));
  return at::from_blob(
      owner->data(), {n}, [owner](void*) { delete owner; }, at::dtype(at::kLong));
}

py::tuple parse_slot_py(const py::object& data, const std::vector<std::string>& names,
                        int64_t num_dense, int64_t max_line_bytes) {
  const ByteView bytes(data);
  at::Tensor labels, dense, offsets;
  SlotColumns out{};
  SlotCounts c;
  std::vector<at::Tensor> keys;
  {
    const py::gil_scoped_release nogil;
    const int64_t capacity = parse_capacity(bytes.data(), bytes.size(), 0);
    // parse_slot refuses a bad num_dense; sized to at least 0 until then
    const int64_t nd = std::max<int64_t>(num_dense, 0);
    const int64_t ns = std::max<int64_t>(static_cast<int64_t>(names.size()) - 1 - nd, 0);
    labels = at::empty({capacity}, at::dtype(at::kFloat));
    dense = at::empty({capacity, nd}, at::dtype(at::kFloat));
    offsets = at::empty({ns, capacity + 1}, at::dtype(at::kLong));
    out.capacity = capacity;
    out.labels = labels.data_ptr<float>();
    out.dense = dense.data_ptr<float>();
    out.offsets = offsets.data_ptr<int64_t>();
    c = parse_slot(bytes.data(), bytes.size(), names, num_dense, max_line_bytes, out);
    for (auto& k : out.keys) keys.push_back(long_tensor(std::move(k)));
  }
  py::list key_list, offset_list;
  for (size_t k = 0; k < keys.size(); ++k) {
    key_list.append(keys[k]);
    offset_list.append(offsets[static_cast<int64_t>(k)].narrow(0, 0, c.rows + 1));
  }
  const py::tuple why = py::make_tuple(c.first_bad_why, c.first_bad_fid, c.first_bad_begin,
                                       c.first_bad_end);
  return py::make_tuple(labels.narrow(0, 0, c.rows), dense.narrow(0, 0, c.rows), key_list,
                        offset_list, c.lines, c.malformed, c.first_bad, why);
}

// out (rows, dim) float32 += src (B, S, dim) float32 at index (S, B) int64 (ops.h); src's last
// dim contiguous, its other two strided (the gradient of a slice of the interaction's input).
void add_rows_py(at::Tensor& out, const at::Tensor& index, const at::Tensor& src) {
  TORCH_CHECK(out.device().is_cpu() && index.device().is_cpu() && src.device().is_cpu(),
              "add_rows: out, index and src must be CPU tensors");
  TORCH_CHECK(out.dtype() == at::kFloat && out.dim() == 2 && out.is_contiguous(),
              "add_rows: out must be a contiguous (rows, dim) float32 tensor");
  TORCH_CHECK(index.dtype() == at::kLong && index.dim() == 2 && index.is_contiguous(),
              "add_rows: index must be a contiguous (S, B) int64 tensor");
  TORCH_CHECK(src.dtype() == at::kFloat && src.dim() == 3 && src.stride(2) == 1 &&
                  src.size(0) == index.size(1) && src.size(1) == index.size(0) &&
                  src.size(2) == out.size(1),
              "add_rows: src must be a (B, S, dim) float32 tensor, its last dim contiguous, "
              "with (S, B) = index's ", index.sizes(), " and dim = out's ", out.size(1),
              ", got ", src.sizes(), " strides ", src.strides());
  const AddRowsArgs a{out.data_ptr<float>(), out.size(0), index.data_ptr<int64_t>(),
                      src.data_ptr<float>(), src.stride(0), src.stride(1),
                      index.size(0), index.size(1), out.size(1)};
  int64_t bad;
  {
    const py::gil_scoped_release nogil;
    bad = add_rows(a);
  }
  TORCH_CHECK_INDEX(bad < 0, "add_rows: index ", a.index[bad < 0 ? 0 : bad], " at position ",
                    bad, " is outside out's ", out.size(0), " rows");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "StreamRec trainer CPU ops (the Criteo / generated line parser, the slot parser)";
  m.def("parse_lines", &parse_lines_py,
        "whole tab-separated lines -> (dense (n, 13) float32 max(int, 0) before log1p, "
        "labels (n,) float32, keys (n, S) int64, present (n, S) bool or None, "
        "ptrue (n,) float32 or None, lines, malformed, first_bad_fields, first_bad_value, "
        "first_overlong); line indices 0-based, blank lines counted, -1: none; a line of more "
        "than max_line_bytes bytes before its newline is malformed",
        py::arg("data"), py::arg("generated"), py::arg("num_slots"),
        py::arg("max_line_bytes") = int64_t{1} << 20);
  m.def("parse_slot", &parse_slot_py,
        "whole slot text lines -> (labels (n,) float32 0/1, dense (n, D) float32, "
        "keys: S tensors (nnz_k,) int64, offsets: S tensors (n + 1,) int64, lines, malformed, "
        "first_bad, (why, fid, begin, end) of the first bad line); names: the label's, the D "
        "dense, the S sparse features' names; first_bad 0-based, blank lines counted, -1: "
        "none; why: ops.h's SlotBad, fid the feature it names, [begin, end) the bytes of data "
        "(-1: none); a line of more than max_line_bytes bytes before its newline is malformed",
        py::arg("data"), py::arg("names"), py::arg("num_dense"),
        py::arg("max_line_bytes") = int64_t{1} << 20);
  m.def("add_rows", &add_rows_py,
        "out (rows, dim) float32 += src (B, S, dim) float32 at index (S, B) int64: src[b, s] "
        "to row index[s, b], repeats summed in order of b (a row gather's backward); an index "
        "outside out's rows raises IndexError, nothing written",
        py::arg("out"), py::arg("index"), py::arg("src"));
}
