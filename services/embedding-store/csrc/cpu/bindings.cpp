// The one binding file of streamrec.embedding_store._C (the CPU extension; the ops are
// declared in ops.h). Every op releases the GIL; the kernels parallelise with
// at::parallel_for (OpenMP). Ops whose C++ form takes an argument struct keep their Python
// signature: the struct is filled here.
#include <torch/extension.h>

#include "ops.h"

namespace py = pybind11;
using namespace streamrec;

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
  m.def("find", &find, "row id per key, -1 if absent", py::arg("slots"), py::arg("keys"),
        nogil);
  m.def("find_or_insert", &find_or_insert, "row id per key, inserting absent keys",
        py::arg("slots"), py::arg("keys"), py::arg("next_row"), nogil);
  m.def("find_count", &find_count, "(row id per key, < 0 if absent; number absent)",
        py::arg("slots"), py::arg("keys"), nogil);
  m.def("find_gather", &find_gather, "(weights, rows, misses) in one pass", py::arg("slots"),
        py::arg("keys"), py::arg("data"), py::arg("params"), py::arg("zero_misses") = true,
        nogil);
  m.def(
      "insert_init",
      [](torch::Tensor slots, torch::Tensor data, torch::Tensor row_keys, torch::Tensor keys,
         torch::Tensor rows, torch::Tensor out, int64_t start, const TableParams& params,
         bool hinted) {
        return insert_init({slots, data, row_keys, keys, rows, out, start, hinted}, params);
      },
      "creates rows of the keys with rows < 0; returns count", py::arg("slots"), py::arg("data"),
      py::arg("row_keys"), py::arg("keys"), py::arg("rows"), py::arg("out"), py::arg("start"),
      py::arg("params"), py::arg("hinted") = false, nogil);
  m.def("advise_huge", &advise_huge, "asks for transparent huge pages over a tensor",
        py::arg("tensor"), nogil);
  m.def("prefault", &prefault, "maps rows [start, end) of a tensor's memory (no change)",
        py::arg("tensor"), py::arg("start"), py::arg("end"), nogil);
  m.def("insert_or_assign", &insert_or_assign, "sets key -> val", py::arg("slots"),
        py::arg("keys"), py::arg("vals"), nogil);
  m.def("unique", &unique, "distinct keys (first-occurrence order) and inverse", py::arg("keys"),
        nogil);
  m.def("index_build", &index_build, "fresh index holding keys[i] -> i", py::arg("capacity"),
        py::arg("keys"), nogil);
  m.def("check_push", &check_push, "(bad grad rows, bad shows/clicks)", py::arg("grads"),
        py::arg("shows"), py::arg("clicks"), nogil);
  m.def("init_rows", &init_rows, "initialises rows [start, start+count)", py::arg("data"),
        py::arg("row_keys"), py::arg("start"), py::arg("count"), py::arg("params"), nogil);
  m.def("gather", &gather, "weights of rows, zeros for -1", py::arg("data"), py::arg("rows"),
        py::arg("params"), nogil);
  m.def("initial_weights", &initial_weights, "deterministic initial weights per key",
        py::arg("keys"), py::arg("params"), py::arg("with_embedx"), nogil);
  m.def(
      "update",
      [](torch::Tensor data, torch::Tensor row_keys, torch::Tensor rows, torch::Tensor grads,
         torch::Tensor shows, torch::Tensor clicks, const TableParams& params) {
        return update({data, row_keys, rows, grads, shows, clicks}, params);
      },
      "fused push update (repeated rows summed); returns rows expanded", py::arg("data"),
      py::arg("row_keys"), py::arg("rows"), py::arg("grads"), py::arg("shows"),
      py::arg("clicks"), py::arg("params"), nogil);
  m.def("take_rows", &take_rows, "rows idx of the parts laid end to end, over every core",
        py::arg("parts"), py::arg("idx"), nogil);
  m.def("sum_rows", &sum_rows, "rows summed by a dedup's inverse; (sums, all finite)",
        py::arg("src"), py::arg("inverse"), py::arg("u"), nogil);
  m.def("all_finite", py::overload_cast<const torch::Tensor&>(&all_finite),
        "no NaN or Inf in a float32 tensor", py::arg("t"), nogil);
  m.def("simd_path", &simd_path, "the build of the row draws in use: avx512 or portable");
  m.def("advance_day", &advance_day, "unseen_days += 1", py::arg("data"), py::arg("size"), nogil);
  m.def("shrink", &shrink, "decay show/click, keep mask", py::arg("data"), py::arg("size"),
        py::arg("params"), nogil);
  m.def("select_rows", &select_rows, "rows a save mode takes", py::arg("data"), py::arg("size"),
        py::arg("mode"), py::arg("params"), nogil);
  m.def("clear_dirty", &clear_dirty, "clears the changed-since-save flag", py::arg("data"),
        py::arg("size"), nogil);
}
