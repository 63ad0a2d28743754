// The one binding file of streamrec.trainer._C. The parse runs without the GIL, reading the
// caller's buffer in place (no copy of the chunk).
#include <torch/extension.h>

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

py::tuple parse_lines_py(const py::object& data, bool generated, int64_t num_slots) {
  const ByteView bytes(data);
  ParsedLines r;
  {
    const py::gil_scoped_release nogil;
    r = parse_lines(bytes.data(), bytes.size(), generated, num_slots);
  }
  return py::make_tuple(r.dense, r.labels, r.keys, r.present, r.ptrue, r.lines, r.malformed,
                        r.first_bad_fields, r.first_bad_value);
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
