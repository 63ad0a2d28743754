// The error state of the C API (streamrec_cuda_last_error), the kernel flag read-back
// (streamrec_cuda_status) and the params check every op makes.
#include <cstdarg>
#include <cstdio>

#include "row_init.cuh"

namespace streamrec_cuda {
namespace {

// One message per host thread: two Python threads calling at once keep their own errors.
thread_local char last_message[512] = "";

}  // namespace

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
  const bool kinds = p->embed_rule.kind >= kNaive && p->embed_rule.kind <= kAdam &&
                     p->embedx_rule.kind >= kNaive && p->embedx_rule.kind <= kAdam;
  STREAMREC_CUDA_REQUIRE(
      kinds && p->dim >= 1 && p->embed_state == kEmbedW + p->dim &&
          p->embedx_state == p->embed_state + state_width(p->embed_rule.kind, 1) &&
          p->width == p->embedx_state + state_width(p->embedx_rule.kind, p->dim - 1),
      "%s: params not finalized (dim %lld, width %lld): finalize them after every change", op,
      static_cast<long long>(p->dim), static_cast<long long>(p->width));
  return STREAMREC_CUDA_OK;
}

}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" const char* streamrec_cuda_last_error(void) { return last_message; }

extern "C" int streamrec_cuda_api_version(void) { return 1; }

extern "C" int streamrec_cuda_device_count(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

extern "C" int streamrec_cuda_status(int32_t* flag, cudaStream_t stream) {
  STREAMREC_CUDA_REQUIRE(flag != nullptr, "status: flag is NULL");
  int32_t code = 0;
  STREAMREC_CUDA_CHECK(cudaMemcpyAsync(&code, flag, sizeof code, cudaMemcpyDeviceToHost, stream));
  STREAMREC_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (code == 0) return ok();
  STREAMREC_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof code, stream));
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
    default:
      return set_error(code, "a kernel reported error code %d", code);
  }
}
