// The one binding file of streamrec.sampler._C. Every op releases the GIL; kernels
// parallelise over positives with at::parallel_for (OpenMP in torch's CPU builds).
#include <torch/extension.h>

#include "ops.h"

namespace py = pybind11;
using namespace streamrec::sampler;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "StreamRec sampler CPU ops (weighted negative draws from flat alias tables)";
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("sample_put_back", &sample_put_back,
        "weighted draws with replacement, conflicts redrawn; -> (ids, left, rounds)",
        py::arg("slots"), py::arg("start"), py::arg("count"), py::arg("group"),
        py::arg("offsets"), py::arg("own_ids"), py::arg("banned"), py::arg("seed"),
        py::arg("max_rounds"), py::arg("missing_id"), py::arg("threads") = 0, nogil);
}
