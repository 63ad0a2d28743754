// Day advance, shrink (decay + keep mask), save selection and dirty marks: one thread per row,
// the CPU core's shrink.cpp rules.
#include "common.cuh"

namespace streamrec_cuda {
namespace {

#define STREAMREC_ROWS(i, count)                                                      \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (count); \
       i += int64_t{gridDim.x} * blockDim.x)

__global__ void advance_day_kernel(float* d, int64_t size, int64_t w) {
  STREAMREC_ROWS(r, size) d[r * w + kUnseen] += 1.0f;
}

__global__ void shrink_kernel(float* d, int64_t size, uint8_t* keep, StreamrecTableParams p) {
  const float decay = static_cast<float>(p.show_click_decay_rate);
  STREAMREC_ROWS(r, size) {
    float* row = d + r * p.width;
    row[kShow] *= decay;
    row[kClick] *= decay;
    const double s = score(p, row[kShow], row[kClick]);
    keep[r] = !(s < p.delete_threshold || row[kUnseen] > p.delete_after_unseen_days);
  }
}

__global__ void select_kernel(const float* d, int64_t size, int mode, uint8_t* sel,
                              StreamrecTableParams p) {
  STREAMREC_ROWS(r, size) {
    const float* row = d + r * p.width;
    const double s = score(p, row[kShow], row[kClick]);
    if (mode == 0)
      sel[r] = 1;
    else if (mode == 1)
      sel[r] = s >= p.base_threshold;
    else
      sel[r] = (static_cast<int>(row[kFlags]) & kFlagDirty) && s >= p.delta_threshold &&
               row[kUnseen] <= p.delta_keep_days;
  }
}

__global__ void clear_dirty_kernel(float* d, int64_t size, int64_t w) {
  STREAMREC_ROWS(r, size) {
    d[r * w + kFlags] = static_cast<float>(static_cast<int>(d[r * w + kFlags]) & ~kFlagDirty);
  }
}

__global__ void mark_dirty_kernel(float* d, int64_t R, const int64_t* rows, int64_t n,
                                  int64_t w) {
  STREAMREC_ROWS(i, n) {
    const int64_t r = rows[i];
    // duplicates write the same value: no race on the result
    if (r >= 0 && r < R)
      d[r * w + kFlags] = static_cast<float>(static_cast<int>(d[r * w + kFlags]) | kFlagDirty);
  }
}

#undef STREAMREC_ROWS

int check_rows(const void* data, int64_t size, const char* op) {
  STREAMREC_CUDA_REQUIRE(size >= 0, "%s: size must be >= 0, got %lld", op,
                         static_cast<long long>(size));
  STREAMREC_CUDA_REQUIRE(size == 0 || data != nullptr, "%s: data is NULL", op);
  return STREAMREC_CUDA_OK;
}

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" int streamrec_cuda_advance_day(float* data, int64_t size,
                                          const StreamrecTableParams* params,
                                          cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "advance_day"));
  STREAMREC_CUDA_TRY(check_rows(data, size, "advance_day"));
  if (size == 0) return ok();
  advance_day_kernel<<<blocks_for(size), kThreads, 0, stream>>>(data, size, params->width);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_shrink(float* data, int64_t size, uint8_t* keep,
                                     const StreamrecTableParams* params, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "shrink"));
  STREAMREC_CUDA_TRY(check_rows(data, size, "shrink"));
  if (size == 0) return ok();
  STREAMREC_CUDA_REQUIRE(keep != nullptr, "shrink: keep is NULL");
  shrink_kernel<<<blocks_for(size), kThreads, 0, stream>>>(data, size, keep, *params);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_select_rows(const float* data, int64_t size, int mode,
                                          uint8_t* sel, const StreamrecTableParams* params,
                                          cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "select_rows"));
  STREAMREC_CUDA_TRY(check_rows(data, size, "select_rows"));
  STREAMREC_CUDA_REQUIRE(mode >= 0 && mode <= 2, "select_rows: unknown select mode %d", mode);
  if (size == 0) return ok();
  STREAMREC_CUDA_REQUIRE(sel != nullptr, "select_rows: sel is NULL");
  select_kernel<<<blocks_for(size), kThreads, 0, stream>>>(data, size, mode, sel, *params);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_clear_dirty(float* data, int64_t size,
                                          const StreamrecTableParams* params,
                                          cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "clear_dirty"));
  STREAMREC_CUDA_TRY(check_rows(data, size, "clear_dirty"));
  if (size == 0) return ok();
  clear_dirty_kernel<<<blocks_for(size), kThreads, 0, stream>>>(data, size, params->width);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}

extern "C" int streamrec_cuda_mark_dirty(float* data, int64_t R, const int64_t* rows, int64_t n,
                                         const StreamrecTableParams* params,
                                         cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "mark_dirty"));
  STREAMREC_CUDA_REQUIRE(n >= 0 && R >= 0, "mark_dirty: n and R must be >= 0");
  if (n == 0 || R == 0) return ok();
  STREAMREC_CUDA_REQUIRE(data != nullptr && rows != nullptr, "mark_dirty: data and rows must be "
                                                              "set");
  mark_dirty_kernel<<<blocks_for(n), kThreads, 0, stream>>>(data, R, rows, n, params->width);
  STREAMREC_CUDA_LAUNCHED();
  return ok();
}
