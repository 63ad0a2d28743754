// Shared by every .cu file of the CUDA extension (internal): the error state behind
// streamrec_cuda_last_error, the one CUDA check macro, the row layout and the key mix.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "streamrec_cuda.h"

namespace streamrec_cuda {

// Row layout (csrc/cpu/table_params.h).
constexpr int64_t kShow = 0;
constexpr int64_t kClick = 1;
constexpr int64_t kUnseen = 2;
constexpr int64_t kFlags = 3;
constexpr int64_t kEmbedW = 4;
constexpr int kFlagExpanded = 1;
constexpr int kFlagDirty = 2;
enum RuleKind : int64_t { kNaive = 0, kAdaGrad = 1, kStdAdaGrad = 2, kAdam = 3 };
enum InitKind : int64_t { kZeros = 0, kUniform = 1, kNormal = 2 };

constexpr int kThreads = 256;  // threads per block of every 1-D launch

// Records the calling thread's last error (printf-style) and returns code.
int set_error(int code, const char* fmt, ...);
// Clears the calling thread's last error; returns STREAMREC_CUDA_OK.
int ok();

// Blocks for n items, capped (grid-stride loops cover the rest).
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

// SplitMix64 finalizer (csrc/cpu/table_params.h mix64, streamrec.keyhash.mix64).
// Functions shared by kernels and the host-side test build (tests/embedding_store/
// test_cuda_build.py runs the row and rule math on the CPU against the CPU core).
#define STREAMREC_HD __host__ __device__

STREAMREC_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

STREAMREC_HD inline double score(const StreamrecTableParams& p, double show, double click) {
  return p.nonclk_coeff * (show - click) + p.click_coeff * click;
}

// Sets a kernel error flag once (the first code wins).
__device__ inline void raise_flag(int32_t* flag, int32_t code) {
  if (flag != nullptr) atomicCAS(reinterpret_cast<int*>(flag), 0, code);
}

// Checks the params a host call was given (pointer, finalized columns).
int check_params(const StreamrecTableParams* p, const char* op);

}  // namespace streamrec_cuda

// Every CUDA runtime call goes through this: on failure it records the call, the CUDA error
// and the place, and returns STREAMREC_CUDA_ERR_CUDA from the enclosing function.
#define STREAMREC_CUDA_CHECK(call)                                                          \
  do {                                                                                       \
    const cudaError_t streamrec_err_ = (call);                                               \
    if (streamrec_err_ != cudaSuccess)                                                       \
      return ::streamrec_cuda::set_error(STREAMREC_CUDA_ERR_CUDA, "%s failed: %s (%s:%d)",   \
                                         #call, cudaGetErrorString(streamrec_err_), __FILE__, \
                                         __LINE__);                                          \
  } while (0)

// The launch check after a <<<...>>>: a bad configuration is reported at once.
#define STREAMREC_CUDA_LAUNCHED() STREAMREC_CUDA_CHECK(cudaGetLastError())

// Argument checks of the host entry points: records the message, returns ERR_ARGUMENT.
#define STREAMREC_CUDA_REQUIRE(cond, ...)                                        \
  do {                                                                           \
    if (!(cond)) return ::streamrec_cuda::set_error(STREAMREC_CUDA_ERR_ARGUMENT, \
                                                    __VA_ARGS__);                \
  } while (0)

// Returns at once the error code of a host helper that failed.
#define STREAMREC_CUDA_TRY(expr)                  \
  do {                                            \
    const int streamrec_rc_ = (expr);             \
    if (streamrec_rc_ != 0) return streamrec_rc_; \
  } while (0)
