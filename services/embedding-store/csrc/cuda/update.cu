// The fused push (csrc/cpu/update.cpp on the GPU): repeated rows are grouped by a stable radix
// sort of (row, position) (CUB), their gradients, shows and clicks summed in position order in
// float64 (the CPU's order, so the sums agree), then one thread per distinct row applies
// show/click, unseen_days, dirty, the embed rule, the embedx rule or the expansion.
#include <cub/device/device_radix_sort.cuh>

#include "update_rule.cuh"

namespace streamrec_cuda {
namespace {

#define STREAMREC_EACH(i, count)                                                      \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (count); \
       i += int64_t{gridDim.x} * blockDim.x)

// Flags a row >= R (before anything is written) and numbers the positions for the sort.
__global__ void check_kernel(const int64_t* rows, int64_t n, int64_t R, int64_t* positions,
                             int32_t* flag) {
  STREAMREC_EACH(i, n) {
    if (rows[i] >= R) raise_flag(flag, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
    positions[i] = i;
  }
}

// Whether sorted position j starts a group of a present row.
__device__ inline bool group_head(const int64_t* sorted, int64_t j) {
  return sorted[j] >= 0 && (j == 0 || sorted[j - 1] != sorted[j]);
}

// Sums of each group's gradients (column c), shows and clicks (c == 0), into the group
// head's place: sums (n, dim), show_sums, click_sums (n,).
__global__ void sum_kernel(const int64_t* sorted, const int64_t* order, int64_t n,
                           const float* grads, const float* shows, const float* clicks,
                           int64_t dim, float* sums, float* show_sums, float* click_sums,
                           const int32_t* flag) {
  if (*flag != 0) return;
  STREAMREC_EACH(t, n * dim) {
    const int64_t j = t / dim, c = t % dim;
    if (!group_head(sorted, j)) continue;
    double g = 0.0, show = 0.0, click = 0.0;
    for (int64_t q = j; q < n && sorted[q] == sorted[j]; ++q) {
      const int64_t i = order[q];
      g += grads[i * dim + c];
      if (c == 0) {
        show += shows[i];
        click += clicks[i];
      }
    }
    sums[j * dim + c] = static_cast<float>(g);
    if (c == 0) {
      show_sums[j] = static_cast<float>(show);
      click_sums[j] = static_cast<float>(click);
    }
  }
}

__global__ void apply_kernel(float* data, const int64_t* row_keys, const int64_t* sorted,
                             int64_t n, const float* sums, const float* show_sums,
                             const float* click_sums, StreamrecTableParams p,
                             unsigned long long* expanded, const int32_t* flag) {
  if (*flag != 0) return;
  STREAMREC_EACH(j, n) {
    if (!group_head(sorted, j)) continue;
    const int e = update_row(data, row_keys, sorted[j], sums + j * p.dim, show_sums[j],
                             click_sums[j], p);
    if (e != 0 && expanded != nullptr) atomicAdd(expanded, 1ULL);
  }
}

#undef STREAMREC_EACH

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" int streamrec_cuda_update(StreamrecPush a, const StreamrecTableParams* params,
                                     cudaStream_t stream) {
  constexpr const char* kOp = "update";
  STREAMREC_CUDA_TRY(check_params(params, kOp));
  STREAMREC_CUDA_REQUIRE(a.n >= 0 && a.R >= 0, "%s: n and R must be >= 0", kOp);
  if (a.n == 0) return ok();
  STREAMREC_CUDA_REQUIRE(a.data != nullptr && a.row_keys != nullptr && a.rows != nullptr &&
                             a.grads != nullptr && a.shows != nullptr && a.clicks != nullptr &&
                             a.flag != nullptr,
                         "%s: data, row_keys, rows, grads, shows, clicks and flag must be set",
                         kOp);
  const StreamrecTableParams p = *params;
  const int64_t n = a.n, dim = p.dim;
  STREAMREC_CUDA_REQUIRE(n <= (int64_t{1} << 31) - 1, "%s: at most 2^31 - 1 positions per call "
                                                      "(CUB's sort), got %lld",
                         kOp, static_cast<long long>(n));
  // one scratch allocation: positions, sorted rows, their positions, sums, shows, clicks, CUB
  size_t sort_bytes = 0;
  STREAMREC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), static_cast<int>(n),
      0, 64, stream));
  const size_t ids = sizeof(int64_t) * static_cast<size_t>(n);
  const size_t floats = sizeof(float) * static_cast<size_t>(n);
  const size_t total = 3 * ids + floats * static_cast<size_t>(dim) + 2 * floats + sort_bytes +
                       6 * 256;
  char* scratch = nullptr;
  STREAMREC_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch), total, stream));
  size_t at = 0;
  auto take = [&](size_t bytes) {
    char* p0 = scratch + at;
    at += (bytes + 255) / 256 * 256;
    return p0;
  };
  auto* positions = reinterpret_cast<int64_t*>(take(ids));
  auto* sorted = reinterpret_cast<int64_t*>(take(ids));
  auto* order = reinterpret_cast<int64_t*>(take(ids));
  auto* sums = reinterpret_cast<float*>(take(floats * static_cast<size_t>(dim)));
  auto* show_sums = reinterpret_cast<float*>(take(floats));
  auto* click_sums = reinterpret_cast<float*>(take(floats));
  void* sort_temp = take(sort_bytes);
  int rc = STREAMREC_CUDA_OK;
  // the scratch is freed on every path below: the work is in a lambda that returns a code
  auto work = [&]() -> int {
    check_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a.rows, n, a.R, positions, a.flag);
    STREAMREC_CUDA_LAUNCHED();
    STREAMREC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, a.rows, sorted,
                                                         positions, order, static_cast<int>(n),
                                                         0, 64, stream));
    sum_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(sorted, order, n, a.grads, a.shows,
                                                              a.clicks, dim, sums, show_sums,
                                                              click_sums, a.flag);
    STREAMREC_CUDA_LAUNCHED();
    apply_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        a.data, a.row_keys, sorted, n, sums, show_sums, click_sums, p,
        reinterpret_cast<unsigned long long*>(a.expanded), a.flag);
    STREAMREC_CUDA_LAUNCHED();
    return STREAMREC_CUDA_OK;
  };
  rc = work();
  const cudaError_t freed = cudaFreeAsync(scratch, stream);
  if (rc != STREAMREC_CUDA_OK) return rc;
  STREAMREC_CUDA_CHECK(freed);
  return ok();
}
