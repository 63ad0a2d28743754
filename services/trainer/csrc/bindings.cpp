// The one binding file of streamrec.trainer._C, and the only one that sees torch: it
// allocates the parser's outputs and runs the parse (ops.h) without the GIL, reading the
// caller's buffer in place (no copy of the chunk).

// torch's Tensor, its pybind11 casters and at::empty, not <torch/extension.h> (its C++
// frontend doubles the compile time; see csrc/cpu/bindings.cpp of the store).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

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

Parsed parse(const uint8_t* data, int64_t nbytes, bool generated, int64_t num_slots) {
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
  r.counts = parse_lines(data, nbytes, generated, num_slots, out);
  const int64_t n = r.counts.rows;
  r.dense = r.dense.narrow(0, 0, n);
  r.labels = r.labels.narrow(0, 0, n);
  r.keys = r.keys.narrow(0, 0, n);
  r.present = r.present.narrow(0, 0, n);
  r.ptrue = r.ptrue.narrow(0, 0, generated ? n : 0);
  return r;
}

py::tuple parse_lines_py(const py::object& data, bool generated, int64_t num_slots) {
  const ByteView bytes(data);
  Parsed r;
  {
    const py::gil_scoped_release nogil;
    r = parse(bytes.data(), bytes.size(), generated, num_slots);
  }
  const LineCounts& c = r.counts;
  // present is None when every key is present, ptrue None for Criteo
  const py::object present = c.all_present ? py::none() : py::cast(r.present);
  const py::object ptrue = generated ? py::cast(r.ptrue) : py::none();
  return py::make_tuple(r.dense, r.labels, r.keys, present, ptrue, c.lines, c.malformed,
                        c.first_bad_fields, c.first_bad_value);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "StreamRec trainer CPU ops (the Criteo / generated text line parser)";
  m.def("parse_lines", &parse_lines_py,
        "whole tab-separated lines -> (dense (n, 13) float32 max(int, 0) before log1p, "
        "labels (n,) float32, keys (n, S) int64, present (n, S) bool or None, "
        "ptrue (n,) float32 or None, lines, malformed, first_bad_fields, first_bad_value); "
        "line indices 0-based, blank lines counted, -1: none",
        py::arg("data"), py::arg("generated"), py::arg("num_slots"));
}
