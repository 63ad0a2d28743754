// Day advance, shrink (decay + keep mask), save selection and dirty marks: one thread per row,
// the per-row rules of ../shared/row_update.h (the CPU core's shrink.cpp runs the same).
#include "common.cuh"

namespace streamrec_cuda {
namespace {

struct AdvanceDay {
  StreamrecRows t;
  int64_t w;
  STREAMREC_HD void operator()(int64_t r) const { advance_day_row(row_at(t, r, w)); }
};

struct Shrink {
  StreamrecRows t;
  uint8_t* keep;
  StreamrecTableParams p;
  STREAMREC_HD void operator()(int64_t r) const {
    keep[r] = shrink_row(row_at(t, r, p.stride), p);
  }
};

struct Select {
  StreamrecRows t;
  int mode;
  uint8_t* sel;
  StreamrecTableParams p;
  STREAMREC_HD void operator()(int64_t r) const {
    sel[r] = select_row(row_at(t, r, p.stride), mode, p);
  }
};

struct ClearDirty {
  StreamrecRows t;
  int64_t w;
  STREAMREC_HD void operator()(int64_t r) const { clear_dirty_row(row_at(t, r, w)); }
};

// Duplicate rows write the same bits; the store is atomic so that it is no data race.
struct MarkDirty {
  StreamrecRows t;
  const int64_t* rows;
  int64_t w;
  STREAMREC_HD void operator()(int64_t i) const {
    const int64_t r = rows[i];
    if (r < 0 || r >= t.R) return;
    Atomic<float> flags(row_at(t, r, w)[kFlags]);
    flags.store(with_dirty(flags.load(cuda::memory_order_relaxed)), cuda::memory_order_relaxed);
  }
};

int check_rows(const StreamrecRows& t, int64_t size, const char* op) {
  STREAMREC_CUDA_TRY(check_table(t, true, false, op));
  STREAMREC_CUDA_REQUIRE(size >= 0 && size <= t.R, "%s: size %lld outside [0, %lld]", op,
                         static_cast<long long>(size), static_cast<long long>(t.R));
  return STREAMREC_CUDA_OK;
}

}  // namespace
}  // namespace streamrec_cuda

using namespace streamrec_cuda;

extern "C" int streamrec_cuda_advance_day(StreamrecRows table, int64_t size,
                                          const StreamrecTableParams* params,
                                          cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "advance_day"));
  STREAMREC_CUDA_TRY(check_rows(table, size, "advance_day"));
  STREAMREC_CUDA_TRY(launch(size, AdvanceDay{table, params->stride}, stream, "advance_day"));
  return ok();
}

extern "C" int streamrec_cuda_shrink(StreamrecRows table, int64_t size, uint8_t* keep,
                                     const StreamrecTableParams* params, cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "shrink"));
  STREAMREC_CUDA_TRY(check_rows(table, size, "shrink"));
  if (size == 0) return ok();
  STREAMREC_CUDA_REQUIRE(keep != nullptr, "shrink: keep is NULL");
  STREAMREC_CUDA_TRY(launch(size, Shrink{table, keep, *params}, stream, "shrink"));
  return ok();
}

extern "C" int streamrec_cuda_select_rows(StreamrecRows table, int64_t size, int mode,
                                          uint8_t* sel, const StreamrecTableParams* params,
                                          cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "select_rows"));
  STREAMREC_CUDA_TRY(check_rows(table, size, "select_rows"));
  STREAMREC_CUDA_REQUIRE(mode >= 0 && mode <= 2, "select_rows: unknown select mode %d", mode);
  if (size == 0) return ok();
  STREAMREC_CUDA_REQUIRE(sel != nullptr, "select_rows: sel is NULL");
  STREAMREC_CUDA_TRY(launch(size, Select{table, mode, sel, *params}, stream, "select_rows"));
  return ok();
}

extern "C" int streamrec_cuda_clear_dirty(StreamrecRows table, int64_t size,
                                          const StreamrecTableParams* params,
                                          cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "clear_dirty"));
  STREAMREC_CUDA_TRY(check_rows(table, size, "clear_dirty"));
  STREAMREC_CUDA_TRY(launch(size, ClearDirty{table, params->stride}, stream, "clear_dirty"));
  return ok();
}

extern "C" int streamrec_cuda_mark_dirty(StreamrecRows table, const int64_t* rows, int64_t n,
                                         const StreamrecTableParams* params,
                                         cudaStream_t stream) {
  STREAMREC_CUDA_TRY(check_params(params, "mark_dirty"));
  STREAMREC_CUDA_TRY(check_table(table, true, false, "mark_dirty"));
  STREAMREC_CUDA_REQUIRE(n >= 0, "mark_dirty: n must be >= 0");
  if (n == 0 || table.R == 0) return ok();
  STREAMREC_CUDA_REQUIRE(rows != nullptr, "mark_dirty: rows must be set");
  STREAMREC_CUDA_TRY(launch(n, MarkDirty{table, rows, params->stride}, stream, "mark_dirty"));
  return ok();
}
