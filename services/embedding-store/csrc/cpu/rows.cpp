// Row initialisation and gather.
#include <ATen/Parallel.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ops.h"

namespace streamrec {
namespace {

constexpr int64_t kGrain = 1024;

// Counter-based draws: a row's stream starts at mix64(seed ^ mix64(key)); column c's value
// is a function of (stream, c) only, so a row's initial values do not depend on the order
// or the thread that creates it, and a pull on another shard draws the same.
inline uint64_t row_stream(uint64_t seed, int64_t key) {
  return mix64(seed ^ mix64(static_cast<uint64_t>(key)));
}

// 64 random bits per column pair (uniform: each column takes 32 of them) or per column
// (normal: its two halves are the Box-Muller pair): a Weyl step of the row stream, one
// multiply and an xor-shift. The stream is already a full mix of seed and key, so this
// is enough for initial weights, and it is a third of the work of a full mix per pair.
inline uint64_t col_hash(uint64_t stream, uint64_t j) {
  const uint64_t h = (stream + (j + 1) * 0x9E3779B97F4A7C15ULL) * 0xD6E8FEB86659FD93ULL;
  return h ^ (h >> 32);
}

// Uniform in [0, 1) from the top 24 bits of 32.
inline float unit24(uint32_t h) { return static_cast<float>(h >> 8) * (1.0f / 16777216.0f); }

// out[c] for columns c in [c0, c1) of a row stream, drawn from ip.
void draw_columns(const InitParams& ip, uint64_t stream, int64_t c0, int64_t c1, float* out) {
  const float a = static_cast<float>(ip.a), b = static_cast<float>(ip.b);
  switch (ip.kind) {
    case kUniform: {
      // column 2j takes the high 32 bits of pair j's hash, column 2j + 1 the low 32
      const float scale = (b - a) * (1.0f / 16777216.0f);
      auto high = [&](uint64_t h) { return a + scale * static_cast<float>(h >> 40); };
      auto low = [&](uint64_t h) { return a + scale * static_cast<float>((h & 0xFFFFFFFFu) >> 8); };
      int64_t c = c0;
      if (c < c1 && (c & 1)) {
        out[c] = low(col_hash(stream, static_cast<uint64_t>(c) >> 1));
        ++c;
      }
      for (; c + 1 < c1; c += 2) {
        const uint64_t h = col_hash(stream, static_cast<uint64_t>(c) >> 1);
        out[c] = high(h);
        out[c + 1] = low(h);
      }
      if (c < c1) out[c] = high(col_hash(stream, static_cast<uint64_t>(c) >> 1));
      break;
    }
    case kNormal:
      for (int64_t c = c0; c < c1; ++c) {
        const uint64_t h = col_hash(stream, static_cast<uint64_t>(c));
        const float u1 = 1.0f - unit24(static_cast<uint32_t>(h >> 32));  // (0, 1]
        const float u2 = unit24(static_cast<uint32_t>(h));
        out[c] = a + b * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
      }
      break;
    default:
      for (int64_t c = c0; c < c1; ++c) out[c] = 0.0f;
  }
}

void init_state(float* st, const RuleParams& rp, int64_t d) {
  const int64_t w = state_width(rp.kind, d);
  std::memset(st, 0, sizeof(float) * w);
  if (rp.kind == kAdam && d > 0) {
    st[2 * d] = static_cast<float>(rp.beta1);
    st[2 * d + 1] = static_cast<float>(rp.beta2);
  }
}

}  // namespace

void TableParams::finalize() {
  if (dim < 1) throw std::invalid_argument("dim must be >= 1, got " + std::to_string(dim));
  const int64_t ws1 = state_width(embed_rule.kind, 1);
  const int64_t ws2 = state_width(embedx_rule.kind, dim - 1);
  if (ws1 < 0 || ws2 < 0) throw std::invalid_argument("unknown optimizer rule kind");
  embed_state = kEmbedW + dim;
  embedx_state = embed_state + ws1;
  width = embedx_state + ws2;
}

// Fills the embedx weights of one row from its initializer.
void init_embedx(float* row, int64_t key, const TableParams& p) {
  draw_columns(p.embedx_init, row_stream(p.seed, key), 1, p.dim, row + kEmbedW);
}

void init_row(float* row, int64_t key, const TableParams& p, bool expand) {
  // every column written once (no memset first: row creation is bound by its stores)
  row[kShow] = row[kClick] = row[kUnseen] = 0.0f;
  row[kFlags] = static_cast<float>(kFlagDirty | (expand ? kFlagExpanded : 0));
  const uint64_t st = row_stream(p.seed, key);
  draw_columns(p.embed_init, st, 0, 1, row + kEmbedW);
  if (expand)
    draw_columns(p.embedx_init, st, 1, p.dim, row + kEmbedW);
  else
    std::memset(row + kEmbedW + 1, 0, sizeof(float) * (p.dim - 1));
  init_state(row + p.embed_state, p.embed_rule, 1);
  init_state(row + p.embedx_state, p.embedx_rule, p.dim - 1);
}

void init_rows(torch::Tensor data, const torch::Tensor& row_keys, int64_t start, int64_t count,
               const TableParams& p) {
  TORCH_CHECK(data.dtype() == torch::kFloat32 && data.is_contiguous() && data.dim() == 2 &&
                  data.size(1) == p.width, "data must be contiguous (R, width) float32");
  TORCH_CHECK(start >= 0 && count >= 0 && start + count <= data.size(0) &&
                  start + count <= row_keys.numel(), "rows out of range");
  float* d = data.data_ptr<float>();
  const int64_t* k = row_keys.data_ptr<int64_t>();
  const bool expand = p.score(0.0, 0.0) >= p.embedx_threshold;
  at::parallel_for(start, start + count, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) init_row(d + r * p.width, k[r], p, expand);
  });
}

torch::Tensor gather(const torch::Tensor& data, const torch::Tensor& rows, const TableParams& p) {
  TORCH_CHECK(data.dtype() == torch::kFloat32 && data.is_contiguous() &&
                  data.size(1) == p.width, "data must be contiguous (R, width) float32");
  TORCH_CHECK(rows.dtype() == torch::kInt64 && rows.is_contiguous(), "rows must be int64");
  const int64_t n = rows.numel();
  auto out = torch::empty({n, p.dim}, data.options());
  const float* d = data.data_ptr<float>();
  const int64_t* r = rows.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  const int64_t R = data.size(0);
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i + 8 < e && r[i + 8] >= 0 && r[i + 8] < R)
        prefetch_lines(d + r[i + 8] * p.width + kEmbedW, 4 * p.dim);
      if (r[i] < 0 || r[i] >= R) {
        std::memset(o + i * p.dim, 0, sizeof(float) * p.dim);
      } else {
        std::memcpy(o + i * p.dim, d + r[i] * p.width + kEmbedW, sizeof(float) * p.dim);
      }
    }
  });
  return out;
}

bool prefault(const torch::Tensor& t, int64_t start, int64_t end) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  TORCH_CHECK(t.is_contiguous() && t.dim() >= 1, "prefault needs a contiguous tensor");
  start = std::max<int64_t>(start, 0);
  end = std::min<int64_t>(end, t.size(0));
  if (end <= start) return true;
  const int64_t row_bytes = t.numel() / std::max<int64_t>(t.size(0), 1) * t.element_size();
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data_ptr());
  // whole pages inside the range only, so no byte outside [start, end) is involved
  const uintptr_t lo = (base + start * row_bytes + page - 1) & ~(page - 1);
  const uintptr_t hi = (base + end * row_bytes) & ~(page - 1);
  if (hi <= lo) return true;
  return madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) == 0;
}

bool advise_huge(const torch::Tensor& t) {
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  TORCH_CHECK(t.is_contiguous(), "advise_huge needs a contiguous tensor");
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t lo = (base + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (base + t.numel() * t.element_size()) & ~(kHuge - 1);
  if (hi <= lo) return false;
  return madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) == 0;
}

torch::Tensor initial_weights(const torch::Tensor& keys, const TableParams& p, bool with_embedx) {
  TORCH_CHECK(keys.dtype() == torch::kInt64 && keys.is_contiguous(), "keys must be int64");
  const int64_t n = keys.numel();
  auto out = torch::zeros({n, p.dim}, torch::kFloat32);
  const int64_t* k = keys.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  const bool expand = with_embedx;
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint64_t st = row_stream(p.seed, k[i]);
      draw_columns(p.embed_init, st, 0, 1, o + i * p.dim);
      if (expand) draw_columns(p.embedx_init, st, 1, p.dim, o + i * p.dim);
    }
  });
  return out;
}

}  // namespace streamrec
