// Host driver of the CUDA extension's row math (row_init.cuh, update_rule.cuh), for
// test_cuda_build.py: the very functions the kernels run, run on the CPU against the CPU core.
// stdin: mode (int64: 0 init, 1 update), StreamrecTableParams (raw bytes), n (int64), then
//   init:   expand (int64), keys (n int64)                      -> stdout: rows (n, width) f32
//   update: rows (n, width) f32, keys (n), grads (n, dim) f32, shows (n) f32, clicks (n) f32
//           -> stdout: rows (n, width) f32 after one push each (row i at position i), then
//              the number of rows expanded (int64)
#include <cstdio>
#include <vector>

#include "update_rule.cuh"

using namespace streamrec_cuda;

template <typename T>
static void read(std::vector<T>& v, size_t count) {
  v.resize(count);
  if (count && std::fread(v.data(), sizeof(T), count, stdin) != count) std::exit(2);
}

int main() {
  int64_t mode = 0, n = 0;
  StreamrecTableParams p{};
  if (std::fread(&mode, sizeof mode, 1, stdin) != 1 || std::fread(&p, sizeof p, 1, stdin) != 1 ||
      std::fread(&n, sizeof n, 1, stdin) != 1)
    return 2;
  const size_t rows = static_cast<size_t>(n), w = static_cast<size_t>(p.width);
  std::vector<float> data;
  std::vector<int64_t> keys;
  if (mode == 0) {
    int64_t expand = 0;
    if (std::fread(&expand, sizeof expand, 1, stdin) != 1) return 2;
    read(keys, rows);
    data.assign(rows * w, 0.0f);
    for (size_t i = 0; i < rows; ++i) init_row(data.data() + i * w, keys[i], p, expand != 0);
    std::fwrite(data.data(), sizeof(float), data.size(), stdout);
    return 0;
  }
  std::vector<float> grads, shows, clicks;
  read(data, rows * w);
  read(keys, rows);
  read(grads, rows * static_cast<size_t>(p.dim));
  read(shows, rows);
  read(clicks, rows);
  int64_t expanded = 0;
  for (size_t i = 0; i < rows; ++i)
    expanded += update_row(data.data(), keys.data(), static_cast<int64_t>(i),
                           grads.data() + i * static_cast<size_t>(p.dim), shows[i], clicks[i], p);
  std::fwrite(data.data(), sizeof(float), data.size(), stdout);
  std::fwrite(&expanded, sizeof expanded, 1, stdout);
  return 0;
}
