// Gather and bag pooling: the weights of given rows (a pull), and their sum or mean over CSR
// bags (DLRM's EmbeddingBag). One thread per output float: consecutive threads read
// consecutive columns of a row (coalesced).
#include "common.cuh"

namespace streamrec_cuda {
namespace {

struct Gather {
  const float* data;
  int64_t R;
  const int64_t* rows;
  float* out;
  int32_t* flag;
  int64_t dim, width;
  STREAMREC_HD void operator()(int64_t t) const {
    const int64_t i = t / dim, c = t - i * dim;
    const int64_t r = rows[i];
    if (r >= R && c == 0) raise_flag(flag, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
    out[t] = (r >= 0 && r < R) ? data[r * width + kEmbedW + c] : 0.0f;
  }
};

// Bag b's column c: summed in position order (as torch's embedding_bag on the CPU).
struct Pooled {
  const float* data;
  int64_t R;
  const int64_t* rows;
  const int64_t* offsets;
  bool mean;
  float* out;
  int32_t* flag;
  int64_t dim, width;
  STREAMREC_HD void operator()(int64_t t) const {
    const int64_t b = t / dim, c = t - b * dim;
    const int64_t begin = offsets[b], end = offsets[b + 1];
    float sum = 0.0f;
    for (int64_t j = begin; j < end; ++j) {
      const int64_t r = rows[j];
      if (r >= 0 && r < R)
        sum += data[r * width + kEmbedW + c];
      else if (r >= R && c == 0)
        raise_flag(flag, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
    }
    if (mean && end > begin) sum /= static_cast<float>(end - begin);
    out[t] = sum;
  }
};

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" int streamrec_cuda_gather(const float* data, int64_t R, const int64_t* rows,
                                     int64_t n, float* out, int32_t* flag,
                                     const StreamrecTableParams* params, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "gather"));
  STREAMREC_CUDA_REQUIRE(n >= 0 && R >= 0, "gather: n and R must be >= 0");
  if (n == 0) return ok();
  STREAMREC_CUDA_REQUIRE(rows != nullptr && out != nullptr && flag != nullptr &&
                             (R == 0 || data != nullptr),
                         "gather: data, rows, out and flag must be set");
  STREAMREC_CUDA_TRY(launch(n * params->dim,
                            Gather{data, R, rows, out, flag, params->dim, params->width}, stream,
                            "gather"));
  return ok();
}

extern "C" int streamrec_cuda_gather_pooled(const float* data, int64_t R, const int64_t* rows,
                                            const int64_t* offsets, int64_t bags, int mode,
                                            float* out, int32_t* flag,
                                            const StreamrecTableParams* params,
                                            cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "gather_pooled"));
  STREAMREC_CUDA_REQUIRE(mode == 0 || mode == 1, "gather_pooled: mode must be 0 (sum) or 1 "
                                                 "(mean), got %d", mode);
  STREAMREC_CUDA_REQUIRE(bags >= 0 && R >= 0, "gather_pooled: bags and R must be >= 0");
  if (bags == 0) return ok();
  STREAMREC_CUDA_REQUIRE(offsets != nullptr && out != nullptr && flag != nullptr,
                         "gather_pooled: offsets, out and flag must be set");
  STREAMREC_CUDA_TRY(launch(
      bags * params->dim,
      Pooled{data, R, rows, offsets, mode == 1, out, flag, params->dim, params->width}, stream,
      "gather_pooled"));
  return ok();
}
