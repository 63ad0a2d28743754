// The one binding file of streamrec.sampler._C, and the only one that sees torch: it checks
// each tensor (dtype, shape, contiguity), reads a misaligned input from an aligned copy,
// allocates the outputs and calls the core (ops.h) without the GIL. The core parallelises
// over positives with OpenMP, at most torch's intra-op thread count by default.

// torch's Tensor, its pybind11 casters and the ATen ops used, not <torch/extension.h> (its
// C++ frontend doubles the compile time; see csrc/cpu/bindings.cpp of the store).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <tuple>

#include "ops.h"

namespace py = pybind11;
using namespace streamrec::sampler;

namespace {

void check_1d(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t n) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n && t.scalar_type() == dtype && t.is_contiguous(),
              name, " must be a contiguous (", n, ",) ", c10::toString(dtype), " tensor, got ",
              t.scalar_type(), " of shape ", t.sizes());
}

// Arrays decoded from a message may start at any byte (a ZeroMQ frame can sit inside its
// receive buffer), and a load through a misaligned int64_t* is undefined behaviour: such an
// input is read from an aligned copy (these are small; large frames get buffers of their own).
at::Tensor aligned(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % t.element_size() == 0 ? t : t.clone();
}

//   slots:    (m, 4) int64 packed AliasSlot records
//   start:    (g,) int64 first slot of each group; count: (g,) int64 its number of slots
//   group:    (b,) int64 group of each positive, -1 to draw nothing
//   offsets:  (b + 1,) int64 output range of each positive (cumulative counts)
//   own_ids:  (b,) int64 dedup id each positive must not get, or None
//   banned:   (m,) bool slots no positive may get, or None (not both)
// Returns (ids (offsets[b],) int64, left (b,) int64, rounds = most tries any slot used).
std::tuple<at::Tensor, at::Tensor, int64_t> sample_put_back_py(
    const at::Tensor& slots_in, const at::Tensor& start_in, const at::Tensor& count_in,
    const at::Tensor& group_in, const at::Tensor& offsets_in,
    const std::optional<at::Tensor>& own_ids_in, const std::optional<at::Tensor>& banned,
    int64_t seed, int64_t max_rounds, int64_t missing_id, int64_t threads) {
  TORCH_CHECK(slots_in.dim() == 2 && slots_in.size(1) == 4 &&
                  slots_in.scalar_type() == at::kLong && slots_in.is_contiguous(),
              "slots must be a contiguous (m, 4) int64 tensor, got ", slots_in.scalar_type(),
              " of shape ", slots_in.sizes());
  TORCH_CHECK(max_rounds >= 1, "max_rounds must be >= 1, got ", max_rounds);
  TORCH_CHECK(!(own_ids_in.has_value() && banned.has_value()),
              "give own_ids or banned, not both (the mask covers the own ids)");
  const int64_t m = slots_in.size(0);
  const int64_t g = start_in.numel();
  const int64_t b = group_in.numel();
  check_1d(start_in, "start", at::kLong, g);
  check_1d(count_in, "count", at::kLong, g);
  check_1d(group_in, "group", at::kLong, b);
  check_1d(offsets_in, "offsets", at::kLong, b + 1);
  if (own_ids_in.has_value()) check_1d(*own_ids_in, "own_ids", at::kLong, b);
  if (banned.has_value()) check_1d(*banned, "banned", at::kBool, m);
  const at::Tensor slots = aligned(slots_in), start = aligned(start_in),
                      count = aligned(count_in), group = aligned(group_in),
                      offsets = aligned(offsets_in);
  const std::optional<at::Tensor> own_ids =
      own_ids_in.has_value() ? std::optional<at::Tensor>(aligned(*own_ids_in)) : std::nullopt;

  DrawArgs a;
  a.slots = reinterpret_cast<const AliasSlot*>(slots.data_ptr<int64_t>());
  a.m = m;
  a.start = start.data_ptr<int64_t>();
  a.count = count.data_ptr<int64_t>();
  a.g = g;
  a.group = group.data_ptr<int64_t>();
  a.offsets = offsets.data_ptr<int64_t>();
  a.b = b;
  a.own_ids = own_ids.has_value() ? own_ids->data_ptr<int64_t>() : nullptr;
  a.banned = banned.has_value() ? banned->data_ptr<bool>() : nullptr;
  a.seed = seed;
  a.max_rounds = max_rounds;
  a.missing_id = missing_id;
  a.threads = threads;
  a.default_threads = at::get_num_threads();
  const int64_t total = draw_total(a);
  auto ids = at::empty({total}, at::kLong);
  auto left = at::zeros({b}, at::kLong);
  const int64_t rounds = sample_put_back(a, ids.data_ptr<int64_t>(), left.data_ptr<int64_t>());
  return {ids, left, rounds};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "StreamRec sampler CPU ops (weighted negative draws from flat alias tables)";
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("sample_put_back", &sample_put_back_py,
        "weighted draws with replacement, conflicts redrawn; -> (ids, left, rounds)",
        py::arg("slots"), py::arg("start"), py::arg("count"), py::arg("group"),
        py::arg("offsets"), py::arg("own_ids"), py::arg("banned"), py::arg("seed"),
        py::arg("max_rounds"), py::arg("missing_id"), py::arg("threads") = 0, nogil);
}
