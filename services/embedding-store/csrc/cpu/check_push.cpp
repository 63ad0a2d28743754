// check_push: the bad inputs of a push counted before anything is written.
#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>

#include "checks.h"
#include "ops.h"

namespace streamrec {

std::tuple<int64_t, int64_t> check_push(const torch::Tensor& grads, const torch::Tensor& shows,
                                        const torch::Tensor& clicks) {
  TORCH_CHECK(grads.dtype() == torch::kFloat32 && grads.is_contiguous() && grads.dim() == 2,
              "grads must be contiguous (n, dim) float32");
  const int64_t n = grads.size(0), dim = grads.size(1);
  TORCH_CHECK(shows.dtype() == torch::kFloat32 && shows.numel() == n && shows.is_contiguous() &&
                  clicks.dtype() == torch::kFloat32 && clicks.numel() == n &&
                  clicks.is_contiguous(), "shows and clicks must be contiguous (n,) float32");
  // grads are read by all_finite (any alignment); shows and clicks as floats
  const torch::Tensor shows_a = aligned(shows), clicks_a = aligned(clicks);
  const float* g = grads.data_ptr<float>();
  const float* sh = shows_a.data_ptr<float>();
  const float* cl = clicks_a.data_ptr<float>();
  std::atomic<int64_t> bad_rows{0}, bad_counts{0};
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    int64_t rows = 0, counts = 0;
    for (int64_t i = b; i < e; ++i) {
      rows += !all_finite(g + i * dim, dim);
      counts += !(std::isfinite(sh[i]) && sh[i] >= 0.0f && std::isfinite(cl[i]) && cl[i] >= 0.0f);
    }
    bad_rows += rows;
    bad_counts += counts;
  });
  return {bad_rows.load(), bad_counts.load()};
}

}  // namespace streamrec
