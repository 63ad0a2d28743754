// The error state of the C API (streamrec_cuda_last_error), the kernel flag read-back
// (streamrec_cuda_status), the params check every op makes, and the memory and stream calls
// of both builds (the CUDA runtime under nvcc, host memory in the CPU build).
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "common.cuh"

namespace streamrec_cuda {
namespace {

// One message per host thread: two Python threads calling at once keep their own errors.
thread_local char last_message[512] = "";
// What the host thread asked of the device: ops queued, waits (streamrec_cuda_launch_count).
thread_local uint64_t launches = 0;
thread_local uint64_t syncs = 0;

}  // namespace

void count_launch() { ++launches; }

void count_sync() { ++syncs; }

int bits_for(uint64_t top) {
  int b = 1;
  while (b < 64 && (top >> b) != 0) ++b;
  return b;
}

int check_block(const StreamrecBlock& b, const char* op) {
  STREAMREC_CUDA_REQUIRE(b.parts >= 0 && b.n >= 0, "%s: block parts and n must be >= 0", op);
  STREAMREC_CUDA_REQUIRE(b.parts > 0 || b.n == 0, "%s: a block of no part holds no position",
                         op);
  STREAMREC_CUDA_REQUIRE(b.parts == 0 || (b.tables != nullptr && b.offsets != nullptr &&
                                          b.part_table != nullptr),
                         "%s: block tables, offsets and part_table must be set", op);
  STREAMREC_CUDA_REQUIRE(b.dim >= 1, "%s: block dim must be >= 1, got %lld", op,
                         static_cast<long long>(b.dim));
  STREAMREC_CUDA_REQUIRE(b.max_rows >= 0, "%s: block max_rows must be >= 0", op);
  STREAMREC_CUDA_REQUIRE(
      b.part_bits == bits_for(static_cast<uint64_t>(b.parts > 0 ? b.parts - 1 : 0)),
      "%s: block part_bits must be %d for %lld parts, got %lld", op,
      bits_for(static_cast<uint64_t>(b.parts > 0 ? b.parts - 1 : 0)),
      static_cast<long long>(b.parts), static_cast<long long>(b.part_bits));
  return STREAMREC_CUDA_OK;
}

int set_error(int code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(last_message, sizeof last_message, fmt, args);
  va_end(args);
  return code;
}

int ok() {
  last_message[0] = '\0';
  return STREAMREC_CUDA_OK;
}

int check_params(const StreamrecTableParams* p, const char* op) {
  STREAMREC_CUDA_REQUIRE(p != nullptr, "%s: params is NULL", op);
  // the columns TableParams::finalize gives for this dim and these rules (table_params.cpp)
  const bool kinds = p->embed_rule.kind >= kNaive && p->embed_rule.kind <= kTorchAdaGrad &&
                     p->embedx_rule.kind >= kNaive && p->embedx_rule.kind <= kTorchAdaGrad;
  STREAMREC_CUDA_REQUIRE(
      kinds && p->dim >= 1 && p->embed_state == kEmbedW + p->dim &&
          p->embedx_state == p->embed_state + state_width(p->embed_rule.kind, 1) &&
          p->width == row_width(p->dtype, p->dim + state_width(p->embed_rule.kind, 1) +
                                              state_width(p->embedx_rule.kind, p->dim - 1)),
      "%s: params not finalized (dim %lld, width %lld): finalize them after every change", op,
      static_cast<long long>(p->dim), static_cast<long long>(p->width));
  STREAMREC_CUDA_REQUIRE(p->stride >= p->width, "%s: params stride %lld is below the width %lld",
                         op, static_cast<long long>(p->stride), static_cast<long long>(p->width));
  return STREAMREC_CUDA_OK;
}

int check_table(const StreamrecRows& t, bool values, bool keys, const char* op) {
  STREAMREC_CUDA_REQUIRE(t.R >= 0 && t.shift >= 0 && t.shift <= 62,
                         "%s: table R %lld and shift %lld must be >= 0 and shift <= 62", op,
                         static_cast<long long>(t.R), static_cast<long long>(t.shift));
  STREAMREC_CUDA_REQUIRE(t.R == 0 || !values || t.chunks != nullptr, "%s: table.chunks is NULL",
                         op);
  STREAMREC_CUDA_REQUIRE(t.R == 0 || !keys || t.key_chunks != nullptr,
                         "%s: table.key_chunks is NULL", op);
  return STREAMREC_CUDA_OK;
}

#if defined(__CUDACC__)
namespace {
int cuda_failed(cudaError_t err, const char* what, const char* op) {
  return set_error(STREAMREC_CUDA_ERR_CUDA, "%s: %s failed: %s", op, what,
                   cudaGetErrorString(err));
}
}  // namespace

int zero_async(void* p, size_t bytes, cudaStream_t stream, const char* op) {
  count_launch();
  const cudaError_t err = cudaMemsetAsync(p, 0, bytes, stream);
  return err == cudaSuccess ? STREAMREC_CUDA_OK : cuda_failed(err, "cudaMemsetAsync", op);
}

int read_back(void* host, const void* device, size_t bytes, cudaStream_t stream,
              const char* op) {
  count_sync();
  cudaError_t err = cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream);
  if (err != cudaSuccess) return cuda_failed(err, "cudaMemcpyAsync", op);
  err = cudaStreamSynchronize(stream);
  return err == cudaSuccess ? STREAMREC_CUDA_OK : cuda_failed(err, "cudaStreamSynchronize", op);
}

int launched(const char* op) {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? STREAMREC_CUDA_OK : cuda_failed(err, "a kernel launch", op);
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

int runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}
#else
int zero_async(void* p, size_t bytes, cudaStream_t /*stream*/, const char* /*op*/) {
  count_launch();
  std::memset(p, 0, bytes);
  return STREAMREC_CUDA_OK;
}

int read_back(void* host, const void* device, size_t bytes, cudaStream_t /*stream*/,
              const char* /*op*/) {
  count_sync();
  std::memcpy(host, device, bytes);
  return STREAMREC_CUDA_OK;
}

int launched(const char* /*op*/) { return STREAMREC_CUDA_OK; }

int device_count() { return 0; }  // no CUDA device: the CPU build's device is the host

int driver_version() { return 0; }  // no CUDA runtime linked

int runtime_version() { return 0; }
#endif

}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" const char* streamrec_cuda_last_error(void) { return last_message; }

extern "C" int streamrec_cuda_api_version(void) { return 6; }

extern "C" uint64_t streamrec_cuda_launch_count(void) { return launches; }

extern "C" uint64_t streamrec_cuda_sync_count(void) { return syncs; }

extern "C" int streamrec_cuda_device_count(void) { return device_count(); }

extern "C" int streamrec_cuda_driver_version(void) { return driver_version(); }

extern "C" int streamrec_cuda_runtime_version(void) { return runtime_version(); }

extern "C" int streamrec_cuda_cpu_device(void) {
#if defined(__CUDACC__)
  return 0;
#else
  return 1;
#endif
}

extern "C" int streamrec_cuda_status(int32_t* flag, cudaStream_t stream) {
  STREAMREC_CUDA_REQUIRE(flag != nullptr, "status: flag is NULL");
  int32_t code = 0;
  STREAMREC_CUDA_TRY(read_back(&code, flag, sizeof code, stream, "status"));
  if (code == 0) return ok();
  STREAMREC_CUDA_TRY(zero_async(flag, sizeof code, stream, "status"));
  switch (code) {
    case STREAMREC_CUDA_ERR_INDEX_FULL:
      return set_error(code, "the hash index is full (no empty slot for a new key); rebuild it "
                             "larger (streamrec_cuda_index_rebuild) and retry");
    case STREAMREC_CUDA_ERR_ROWS_FULL:
      return set_error(code, "no free row for a new key (next_row reached max_rows); grow the "
                             "row matrix and retry");
    case STREAMREC_CUDA_ERR_ARGUMENT:
      return set_error(code, "a kernel found a bad argument (insert_or_assign: a val < 0; "
                             "those keys were left as they were)");
    case STREAMREC_CUDA_ERR_ROW_OUTSIDE:
      return set_error(code, "a row id is outside the table's rows (an index of another table?)");
    case STREAMREC_CUDA_ERR_NONFINITE:
      return set_error(code, "a push's gradients hold NaN or Inf; nothing of it was written");
    case STREAMREC_CUDA_ERR_BAD_COUNT:
      return set_error(code, "a push's shows or clicks are not finite and >= 0; nothing of it "
                             "was written");
    default:
      return set_error(code, "a kernel reported error code %d", code);
  }
}
