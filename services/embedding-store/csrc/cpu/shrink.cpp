// Day advance, shrink (decay and delete mask) and the rows each save mode takes.
#include <ATen/Parallel.h>

#include "../shared/row_update.h"
#include "checks.h"
#include "ops.h"

namespace streamrec {
namespace {

constexpr int64_t kGrain = 4096;

// data: (R, w) contiguous float32 with w >= kFlags + 1 (these ops read the stats columns;
// shrink and select_rows step by the params' width, checked there); 0 <= size <= R.
void check_rows_in_use(const torch::Tensor& data, int64_t size, const char* op) {
  TORCH_CHECK(data.defined() && data.scalar_type() == torch::kFloat32 && data.is_contiguous() &&
                  data.dim() == 2 && data.size(1) > kFlags,
              op, ": data must be a contiguous (R, width) float32 tensor");
  TORCH_CHECK(size >= 0 && size <= data.size(0), op, ": size ", size, " outside [0, ",
              data.size(0), "]");
  check_aligned(data, op, "data");
}

}  // namespace

void advance_day(torch::Tensor data, int64_t size) {
  check_rows_in_use(data, size, "advance_day");
  float* d = data.data_ptr<float>();
  const int64_t w = data.size(1);
  at::parallel_for(0, size, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) advance_day_row(d + r * w);
  });
}

torch::Tensor shrink(torch::Tensor data, int64_t size, const TableParams& p) {
  check_rows_in_use(data, size, "shrink");
  check_data(data, p, "shrink");
  auto keep = torch::empty({size}, torch::kBool);
  float* d = data.data_ptr<float>();
  bool* kp = keep.data_ptr<bool>();
  at::parallel_for(0, size, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) kp[r] = shrink_row(d + r * p.width, p);
  });
  return keep;
}

torch::Tensor select_rows(const torch::Tensor& data, int64_t size, int64_t mode,
                          const TableParams& p) {
  check_rows_in_use(data, size, "select_rows");
  check_data(data, p, "select_rows");
  TORCH_CHECK(mode >= 0 && mode <= 2, "unknown select mode ", mode);
  auto sel = torch::empty({size}, torch::kBool);
  const float* d = data.data_ptr<float>();
  bool* s = sel.data_ptr<bool>();
  at::parallel_for(0, size, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) s[r] = select_row(d + r * p.width, mode, p);
  });
  return sel;
}

void clear_dirty(torch::Tensor data, int64_t size) {
  check_rows_in_use(data, size, "clear_dirty");
  float* d = data.data_ptr<float>();
  const int64_t w = data.size(1);
  at::parallel_for(0, size, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) clear_dirty_row(d + r * w);
  });
}

}  // namespace streamrec
