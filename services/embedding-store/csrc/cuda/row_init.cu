// Row creation kernels: init_rows (rows [start, start + count) from their keys) and
// initial_weights (the draws of given keys), one thread per row (row_init.cuh has the draws).
#include "row_init.cuh"

namespace streamrec_cuda {
namespace {

__global__ void init_rows_kernel(float* data, const int64_t* row_keys, int64_t start,
                                 int64_t count, StreamrecTableParams p, bool expand) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = start + i;
    init_row(data + r * p.width, row_keys[r], p, expand);
  }
}

// One thread per (key, column): out is (n, dim), written column-contiguous per key.
__global__ void initial_weights_kernel(const int64_t* keys, int64_t n, bool expand, float* out,
                                       StreamrecTableParams p) {
  const int64_t total = n * p.dim;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = t / p.dim, c = t % p.dim;
    out[t] = initial_weight(p, row_stream(p.seed, keys[i]), c, expand);
  }
}

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" int streamrec_cuda_init_rows(float* data, const int64_t* row_keys, int64_t start,
                                        int64_t count, const StreamrecTableParams* params,
                                        cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "init_rows"));
  STREAMREC_CUDA_REQUIRE(start >= 0 && count >= 0, "init_rows: start and count must be >= 0");
  if (count == 0) return ok();
  STREAMREC_CUDA_REQUIRE(data != nullptr && row_keys != nullptr,
                         "init_rows: data and row_keys must be set");
  const StreamrecTableParams p = *params;
  const bool expand = p.nonclk_coeff * 0.0 + p.click_coeff * 0.0 >= p.embedx_threshold;
  init_rows_kernel<<<blocks_for(count), kThreads, 0, stream>>>(data, row_keys, start, count, p,
                                                               expand);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_initial_weights(const int64_t* keys, int64_t n, int with_embedx,
                                              float* out, const StreamrecTableParams* params,
                                              cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "initial_weights"));
  STREAMREC_CUDA_REQUIRE(n >= 0, "initial_weights: n must be >= 0");
  if (n == 0) return ok();
  STREAMREC_CUDA_REQUIRE(keys != nullptr && out != nullptr,
                         "initial_weights: keys and out must be set");
  initial_weights_kernel<<<blocks_for(n * params->dim), kThreads, 0, stream>>>(
      keys, n, with_embedx != 0, out, *params);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}
