// Gather and bag pooling: the weights of given rows (a pull), and their sum or mean over CSR
// bags (DLRM's EmbeddingBag). One thread per output float, or per 4 floats (one 16-byte load)
// where rows are padded to 16 bytes and dim is a multiple of 4: consecutive threads read
// consecutive columns of a row (coalesced). A compact table's (fp16, bf16) weights are
// decoded to float32 (row_codec.h), one thread per output float; fp32 rows are read as they
// are, by the same loads as before compact rows.
#include "common.cuh"

namespace streamrec_cuda {
namespace {

// Weight c (0 <= c < dim) of a row of dtype Dtype, as float32.
template <int64_t Dtype>
STREAMREC_HD inline float weight_at(const float* row, int64_t c) {
  if (Dtype == kFp32) return row[kEmbedW + c];
  return decode16<Dtype>(load16(row, c));
}

// weight_at for a dtype known at run time (a block's tables each have their own).
STREAMREC_HD inline float weight_of(const float* row, int64_t c, int64_t dtype) {
  if (dtype == kFp16) return weight_at<kFp16>(row, c);
  if (dtype == kBf16) return weight_at<kBf16>(row, c);
  return weight_at<kFp32>(row, c);
}

// Weights of rows, T (a float, or a Vec4 of 4 weights) per thread: out (n, dim) as
// (n, per_row) T; the weights start at column kEmbedW.
template <class T>
struct Gather {
  StreamrecRows t;
  const int64_t* rows;
  T* out;
  int32_t* flag;
  int64_t per_row, stride;
  STREAMREC_HD void operator()(int64_t j) const {
    constexpr int64_t kWidth = sizeof(T) / sizeof(float);
    const int64_t i = j / per_row, q = j - i * per_row;
    const int64_t r = rows[i];
    if (r >= t.R && q == 0) raise_flag(flag, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
    out[i * per_row + q] =
        (r >= 0 && r < t.R)
            ? *reinterpret_cast<const T*>(row_at(t, r, stride) + kEmbedW + kWidth * q)
            : T{};
  }
};

// Weights of rows of a compact table (Dtype fp16 or bf16) decoded: out (n, dim), one
// thread per output float.
template <int64_t Dtype>
struct GatherHalf {
  StreamrecRows t;
  const int64_t* rows;
  float* out;
  int32_t* flag;
  int64_t dim, stride;
  STREAMREC_HD void operator()(int64_t j) const {
    const int64_t i = j / dim, c = j - i * dim;
    const int64_t r = rows[i];
    if (r >= t.R && c == 0) raise_flag(flag, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
    out[j] = (r >= 0 && r < t.R) ? weight_at<Dtype>(row_at(t, r, stride), c) : 0.0f;
  }
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A block's gather: as Gather, each position's row in its part's table (error to the table's
// word). T a Vec4 needs dim % 4 == 0; a table whose stride is not a multiple of 4 (rows not
// padded to 16 bytes) is read a float at a time, a compact table's weights decoded one at a
// time.
template <class T>
struct GatherTables {
  StreamrecBlock b;
  const int64_t* rows;
  T* out;
  int64_t per_row;
  STREAMREC_HD void operator()(int64_t j) const {
    constexpr int64_t kWidth = sizeof(T) / sizeof(float);
    const int64_t i = j / per_row, q = j - i * per_row;
    const int64_t r = rows[i];
    if (r < 0) {
      out[j] = T{};
      return;
    }
    const StreamrecBlockTable& t = table_of(b, i);
    if (r >= t.table.R) {
      if (q == 0) raise_flag(t.error, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
      out[j] = T{};
      return;
    }
    const float* row = row_at(t.table, r, t.params.stride);
    if (t.params.dtype != kFp32) {
      float* o = reinterpret_cast<float*>(out + j);
      for (int64_t c = 0; c < kWidth; ++c) o[c] = weight_of(row, kWidth * q + c, t.params.dtype);
      return;
    }
    const float* w = row + kEmbedW + kWidth * q;
    if (kWidth == 1 || t.params.stride % 4 == 0) {
      out[j] = *reinterpret_cast<const T*>(w);
    } else {
      float* o = reinterpret_cast<float*>(out + j);
      for (int64_t c = 0; c < kWidth; ++c) o[c] = w[c];
    }
  }
};

// Bag b's column c: summed in position order (as torch's embedding_bag on the CPU), the
// weights of rows of dtype Dtype.
template <int64_t Dtype>
struct Pooled {
  StreamrecRows t;
  const int64_t* rows;
  const int64_t* offsets;
  bool mean;
  float* out;
  int32_t* flag;
  int64_t dim, stride;
  STREAMREC_HD void operator()(int64_t j) const {
    const int64_t b = j / dim, c = j - b * dim;
    const int64_t begin = offsets[b], end = offsets[b + 1];
    float sum = 0.0f;
    for (int64_t j = begin; j < end; ++j) {
      const int64_t r = rows[j];
      if (r >= 0 && r < t.R)
        sum += weight_at<Dtype>(row_at(t, r, stride), c);
      else if (r >= t.R && c == 0)
        raise_flag(flag, STREAMREC_CUDA_ERR_ROW_OUTSIDE);
    }
    if (mean && end > begin) sum /= static_cast<float>(end - begin);
    out[j] = sum;
  }
};

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" int streamrec_cuda_gather(StreamrecRows table, const int64_t* rows, int64_t n,
                                     float* out, int32_t* flag,
                                     const StreamrecTableParams* params, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "gather"));
  STREAMREC_CUDA_TRY(check_table(table, true, false, "gather"));
  STREAMREC_CUDA_REQUIRE(n >= 0, "gather: n must be >= 0");
  if (n == 0) return ok();
  STREAMREC_CUDA_REQUIRE(rows != nullptr && out != nullptr && flag != nullptr,
                         "gather: rows, out and flag must be set");
  const int64_t dim = params->dim, stride = params->stride;
  if (params->dtype == kFp16) {
    const GatherHalf<kFp16> half{table, rows, out, flag, dim, stride};
    STREAMREC_CUDA_TRY(launch(n * dim, half, stream, "gather"));
    return ok();
  }
  if (params->dtype == kBf16) {
    const GatherHalf<kBf16> half{table, rows, out, flag, dim, stride};
    STREAMREC_CUDA_TRY(launch(n * dim, half, stream, "gather"));
    return ok();
  }
  // chunks are 16-byte aligned (the header's contract): a padded row's weights are too
  static_assert(kEmbedW % 4 == 0, "the weights of a padded row start 16-byte aligned");
  if (dim % 4 == 0 && stride % 4 == 0 && aligned16(out)) {
    const Gather<Vec4> by4{table, rows, reinterpret_cast<Vec4*>(out), flag, dim / 4, stride};
    STREAMREC_CUDA_TRY(launch(n * (dim / 4), by4, stream, "gather"));
    return ok();
  }
  STREAMREC_CUDA_TRY(
      launch(n * dim, Gather<float>{table, rows, out, flag, dim, stride}, stream, "gather"));
  return ok();
}

extern "C" int streamrec_cuda_gather_pooled(StreamrecRows table, const int64_t* rows,
                                            const int64_t* offsets, int64_t bags, int mode,
                                            float* out, int32_t* flag,
                                            const StreamrecTableParams* params,
                                            cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "gather_pooled"));
  STREAMREC_CUDA_REQUIRE(mode == 0 || mode == 1, "gather_pooled: mode must be 0 (sum) or 1 "
                                                 "(mean), got %d", mode);
  STREAMREC_CUDA_TRY(check_table(table, true, false, "gather_pooled"));
  STREAMREC_CUDA_REQUIRE(bags >= 0, "gather_pooled: bags must be >= 0");
  if (bags == 0) return ok();
  STREAMREC_CUDA_REQUIRE(offsets != nullptr && out != nullptr && flag != nullptr,
                         "gather_pooled: offsets, out and flag must be set");
  const int64_t dim = params->dim, stride = params->stride;
  const bool mean = mode == 1;
  if (params->dtype == kFp16) {
    const Pooled<kFp16> pooled{table, rows, offsets, mean, out, flag, dim, stride};
    STREAMREC_CUDA_TRY(launch(bags * dim, pooled, stream, "gather_pooled"));
  } else if (params->dtype == kBf16) {
    const Pooled<kBf16> pooled{table, rows, offsets, mean, out, flag, dim, stride};
    STREAMREC_CUDA_TRY(launch(bags * dim, pooled, stream, "gather_pooled"));
  } else {
    const Pooled<kFp32> pooled{table, rows, offsets, mean, out, flag, dim, stride};
    STREAMREC_CUDA_TRY(launch(bags * dim, pooled, stream, "gather_pooled"));
  }
  return ok();
}

extern "C" int streamrec_cuda_gather_tables(StreamrecBlock block, const int64_t* rows,
                                            float* out, cudaStream_t stream) {
  constexpr const char* kOp = "gather_tables";
  STREAMREC_CUDA_TRY(check_block(block, kOp));
  if (block.n == 0) return ok();
  STREAMREC_CUDA_REQUIRE(rows != nullptr && out != nullptr, "%s: rows and out must be set", kOp);
  const int64_t n = block.n, dim = block.dim;
  if (dim % 4 == 0 && aligned16(out)) {
    const GatherTables<Vec4> by4{block, rows, reinterpret_cast<Vec4*>(out), dim / 4};
    STREAMREC_CUDA_TRY(launch(n * (dim / 4), by4, stream, kOp));
    return ok();
  }
  STREAMREC_CUDA_TRY(launch(n * dim, GatherTables<float>{block, rows, out, dim}, stream, kOp));
  return ok();
}
