// The binding of streamrec.embedding_store._C (the CPU extension; the ops are declared in
// ops.h): the one PYBIND11_MODULE, with the params structs and the row layout's constants;
// each op family's functions are registered by its binding file (bind_index.cpp,
// bind_rows.cpp, bind_ssd.cpp), which checks every tensor argument (bind.h: dtype, shape,
// contiguity, device, alignment; the messages name the op and the argument), reads a
// misaligned input from an aligned copy, allocates the outputs (at::empty, or a pooled
// per-step buffer) and calls the op on plain views, without the GIL. Each op keeps its Python
// signature; an OpError it raises is a RuntimeError with the same message.
#include "bind.h"

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
      .def_readwrite("dtype", &TableParams::dtype)
      .def_readwrite("round_step", &TableParams::round_step)
      .def_readonly("embed_state", &TableParams::embed_state)
      .def_readonly("embedx_state", &TableParams::embedx_state)
      .def_readonly("payload", &TableParams::payload)
      .def_readonly("width", &TableParams::width)
      .def("finalize", &TableParams::finalize);

  m.attr("SHOW") = kShow;
  m.attr("CLICK") = kClick;
  m.attr("UNSEEN") = kUnseen;
  m.attr("FLAGS") = kFlags;
  m.attr("EMBED_W") = kEmbedW;
  m.attr("FLAG_EXPANDED") = kFlagExpanded;
  m.attr("FLAG_DIRTY") = kFlagDirty;
  m.attr("DTYPE_FP32") = static_cast<int64_t>(kFp32);
  m.attr("DTYPE_FP16") = static_cast<int64_t>(kFp16);
  m.attr("DTYPE_BF16") = static_cast<int64_t>(kBf16);

  bind::bind_index(m);
  bind::bind_rows(m);
  bind::bind_ssd(m);
}
