// Day advance, shrink (decay and delete mask) and the rows each save mode takes.
#include "../shared/row_update.h"
#include "checks.h"
#include "ops.h"
#include "parallel.h"

namespace streamrec {
namespace {

constexpr int64_t kGrain = 4096;

}  // namespace

void advance_day(Matrix<float> data, int64_t size) {
  float* d = data.data;
  const int64_t w = data.cols;
  parallel_for(0, size, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) advance_day_row(d + r * w);
  });
}

void shrink(Matrix<float> data, int64_t size, const TableParams& p, bool* kp) {
  float* d = data.data;
  parallel_for(0, size, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) kp[r] = shrink_row(d + r * p.width, p);
  });
}

void select_rows(Matrix<const float> data, int64_t size, int64_t mode, const TableParams& p,
                 bool* s) {
  STREAMREC_CHECK(mode >= 0 && mode <= 2, "unknown select mode ", mode);
  const float* d = data.data;
  parallel_for(0, size, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) s[r] = select_row(d + r * p.width, mode, p);
  });
}

void clear_dirty(Matrix<float> data, int64_t size) {
  float* d = data.data;
  const int64_t w = data.cols;
  parallel_for(0, size, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) clear_dirty_row(d + r * w);
  });
}

}  // namespace streamrec
