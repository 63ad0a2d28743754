// Whole-row (or column range) reads and writes by row id: export, inspection, loads and the
// device tier's compaction move rows through these, so that no caller needs the chunk layout.
// One thread per float: consecutive threads touch consecutive columns of a row (coalesced).
#include "common.cuh"

namespace streamrec_cuda {
namespace {

// out (n, cols) = columns [col, col + cols) of rows; the key once per row.
struct ReadRows {
  StreamrecRows t;
  const int64_t* rows;
  int64_t col, cols, stride;
  float* out;
  int64_t* out_keys;
  int32_t* flag;
  STREAMREC_HD void operator()(int64_t j) const {
    const int64_t i = j / cols, c = j - i * cols;
    const int64_t r = rows[i];
    const bool in = r >= 0 && r < t.R;
    if (r >= t.R && c == 0) raise_flag(flag, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
    out[j] = in ? row_at(t, r, stride)[col + c] : 0.0f;
    if (out_keys != nullptr && c == 0) out_keys[i] = in ? *key_at(t, r) : -1;
  }
};

struct WriteRows {
  StreamrecRows t;
  const int64_t* rows;
  int64_t col, cols, stride;
  const float* in;
  const int64_t* in_keys;
  int32_t* flag;
  STREAMREC_HD void operator()(int64_t j) const {
    const int64_t i = j / cols, c = j - i * cols;
    const int64_t r = rows[i];
    if (r >= t.R && c == 0) raise_flag(flag, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
    if (r < 0 || r >= t.R) return;
    row_at(t, r, stride)[col + c] = in[j];
    if (in_keys != nullptr && c == 0) *key_at(t, r) = in_keys[i];
  }
};

int check_span(const StreamrecRows& t, bool keys, const int64_t* rows, int64_t n, int64_t col,
               int64_t cols, const void* buf, const int32_t* flag,
               const StreamrecTableParams* params, const char* op) {
  STREAMREC_CUDA_TRY(check_params(params, op));
  STREAMREC_CUDA_TRY(check_table(t, true, keys, op));
  STREAMREC_CUDA_REQUIRE(n >= 0, "%s: n must be >= 0", op);
  STREAMREC_CUDA_REQUIRE(col >= 0 && cols >= 1 && col + cols <= params->stride,
                         "%s: columns [%lld, %lld + %lld) outside the row's %lld", op,
                         static_cast<long long>(col), static_cast<long long>(col),
                         static_cast<long long>(cols), static_cast<long long>(params->stride));
  STREAMREC_CUDA_REQUIRE(n == 0 || (rows != nullptr && buf != nullptr && flag != nullptr),
                         "%s: rows, the values and flag must be set", op);
  return STREAMREC_CUDA_OK;
}

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" int streamrec_cuda_read_rows(StreamrecRows table, const int64_t* rows, int64_t n,
                                        int64_t col, int64_t cols, float* out, int64_t* out_keys,
                                        int32_t* flag, const StreamrecTableParams* params,
                                        cudaStream_t stream) {
  constexpr const char* kOp = "read_rows";
  STREAMREC_CUDA_TRY(check_span(table, out_keys != nullptr, rows, n, col, cols, out, flag,
                                params, kOp));
  STREAMREC_CUDA_TRY(launch(
      n * cols, ReadRows{table, rows, col, cols, params->stride, out, out_keys, flag}, stream,
      kOp));
  return ok();
}

extern "C" int streamrec_cuda_write_rows(StreamrecRows table, const int64_t* rows, int64_t n,
                                         int64_t col, int64_t cols, const float* in,
                                         const int64_t* in_keys, int32_t* flag,
                                         const StreamrecTableParams* params,
                                         cudaStream_t stream) {
  constexpr const char* kOp = "write_rows";
  STREAMREC_CUDA_TRY(check_span(table, in_keys != nullptr, rows, n, col, cols, in, flag, params,
                                kOp));
  STREAMREC_CUDA_TRY(launch(
      n * cols, WriteRows{table, rows, col, cols, params->stride, in, in_keys, flag}, stream,
      kOp));
  return ok();
}
