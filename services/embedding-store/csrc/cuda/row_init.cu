// Row creation: init_rows (rows [start, start + count) from their keys) and initial_weights
// (the draws of given keys), one warp per row (lanes take consecutive columns: coalesced);
// the draws are ../shared/row_init.h's column functions.
#include "common.cuh"

namespace streamrec_cuda {
namespace {

struct InitRows {
  StreamrecRows t;
  int64_t start;
  StreamrecTableParams p;
  bool expand;
  template <class Lanes>
  STREAMREC_HD void operator()(int64_t i, const Lanes& lanes) const {
    const int64_t r = start + i;
    init_row_lanes(row_at(t, r, p.stride), *key_at(t, r), p, expand, lanes);
  }
};

// out is (n, dim): key i's weights.
struct InitialWeights {
  const int64_t* keys;
  float* out;
  StreamrecTableParams p;
  bool expand;
  template <class Lanes>
  STREAMREC_HD void operator()(int64_t i, const Lanes& lanes) const {
    draw_weights_lanes(out + i * p.dim, row_stream(p.seed, keys[i]), p, expand, lanes);
  }
};

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" int streamrec_cuda_init_rows(StreamrecRows table, int64_t start, int64_t count,
                                        const StreamrecTableParams* params,
                                        cudaStream_t stream) {
  constexpr const char* kOp = "init_rows";
  STREAMREC_CUDA_TRY(check_params(params, kOp));
  STREAMREC_CUDA_TRY(check_table(table, true, true, kOp));
  STREAMREC_CUDA_REQUIRE(start >= 0 && count >= 0 && start + count <= table.R,
                         "init_rows: rows [%lld, %lld + %lld) outside [0, %lld)",
                         static_cast<long long>(start), static_cast<long long>(start),
                         static_cast<long long>(count), static_cast<long long>(table.R));
  if (count == 0) return ok();
  const StreamrecTableParams p = *params;
  STREAMREC_CUDA_TRY(
      launch_rows(count, InitRows{table, start, p, expand_at_creation(p)}, stream, kOp));
  return ok();
}

extern "C" int streamrec_cuda_initial_weights(const int64_t* keys, int64_t n, int with_embedx,
                                              float* out, const StreamrecTableParams* params,
                                              cudaStream_t stream) {
  constexpr const char* kOp = "initial_weights";
  STREAMREC_CUDA_TRY(check_params(params, kOp));
  STREAMREC_CUDA_REQUIRE(n >= 0, "initial_weights: n must be >= 0");
  if (n == 0) return ok();
  STREAMREC_CUDA_REQUIRE(keys != nullptr && out != nullptr,
                         "initial_weights: keys and out must be set");
  STREAMREC_CUDA_TRY(
      launch_rows(n, InitialWeights{keys, out, *params, with_embedx != 0}, stream, kOp));
  return ok();
}
