// Row initialisation: counter-based initial weights (AVX-512 where the CPU has it, the same
// bits either way), optimizer state, and the ops init_rows and initial_weights.
#include <ATen/Parallel.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "checks.h"
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

// Uniform draws for column pairs j0 .. j0 + count - 1 of a row stream, written to out[0 ..
// 2 count): column 2j takes the high 32 bits of pair j's hash, column 2j + 1 the low 32 (24
// bits of each make the value; a 24-bit integer converts to float exactly, so every build
// below gives the same floats).
inline __attribute__((always_inline)) void uniform_pair(uint64_t stream, uint64_t j, float a,
                                                        float scale, float* out) {
  const uint64_t h = col_hash(stream, j);
  out[0] = a + scale * static_cast<float>(static_cast<int32_t>(h >> 40));
  out[1] = a + scale * static_cast<float>(static_cast<int32_t>((h & 0xFFFFFFFFu) >> 8));
}

// Row creation is bound by these draws (one 64-bit multiply-xorshift per pair): AVX-512
// (vpmullq) draws 8 pairs at once where the CPU has it, chosen once at load. Both paths give
// the same bits (mul then add, no fused multiply-add: setup.py passes -ffp-contract=off).
using UniformPairs = void (*)(uint64_t, uint64_t, int64_t, float, float, float*);

void uniform_pairs_portable(uint64_t stream, uint64_t j0, int64_t count, float a, float scale,
                            float* out) {
  for (int64_t q = 0; q < count; ++q)
    uniform_pair(stream, j0 + static_cast<uint64_t>(q), a, scale, out + 2 * q);
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512dq"))) void uniform_pairs_avx512(
    uint64_t stream, uint64_t j0, int64_t count, float a, float scale, float* out) {
  const __m512i golden = _mm512_set1_epi64(static_cast<int64_t>(0x9E3779B97F4A7C15ULL));
  const __m512i mult = _mm512_set1_epi64(static_cast<int64_t>(0xD6E8FEB86659FD93ULL));
  const __m512i low32 = _mm512_set1_epi64(0xFFFFFFFFLL);
  const __m512i st = _mm512_set1_epi64(static_cast<int64_t>(stream));
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 va = _mm512_set1_ps(a), vs = _mm512_set1_ps(scale);
  int64_t q = 0;
  for (; q + 8 <= count; q += 8) {
    const __m512i j1 = _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(j0 + q + 1)), lane);
    __m512i h = _mm512_mullo_epi64(_mm512_add_epi64(st, _mm512_mullo_epi64(j1, golden)), mult);
    h = _mm512_xor_si512(h, _mm512_srli_epi64(h, 32));
    // each 64-bit lane becomes [high draw, low draw] as two int32: the output's column order
    const __m512i hi = _mm512_srli_epi64(h, 40);
    const __m512i lo = _mm512_slli_epi64(_mm512_srli_epi64(_mm512_and_si512(h, low32), 8), 32);
    const __m512 x = _mm512_cvtepi32_ps(_mm512_or_si512(hi, lo));
    _mm512_storeu_ps(out + 2 * q, _mm512_add_ps(va, _mm512_mul_ps(vs, x)));
  }
  for (; q < count; ++q)
    uniform_pair(stream, j0 + static_cast<uint64_t>(q), a, scale, out + 2 * q);
}

bool use_avx512() {
  const char* forced = std::getenv("STREAMREC_SIMD");  // "portable": the plain build only
  if (forced != nullptr && std::strcmp(forced, "portable") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
}

const bool kAvx512 = use_avx512();
const UniformPairs uniform_pairs = kAvx512 ? uniform_pairs_avx512 : uniform_pairs_portable;
#else  // not x86-64: the portable build only
const bool kAvx512 = false;
const UniformPairs uniform_pairs = uniform_pairs_portable;
#endif

// out[c] for columns c in [c0, c1) of a row stream, drawn from ip.
void draw_columns(const InitParams& ip, uint64_t stream, int64_t c0, int64_t c1, float* out) {
  const float a = static_cast<float>(ip.a), b = static_cast<float>(ip.b);
  switch (ip.kind) {
    case kUniform: {
      const float scale = (b - a) * (1.0f / 16777216.0f);
      float two[2];
      int64_t c = c0;
      if (c < c1 && (c & 1)) {  // an odd first column: the low half of its pair
        uniform_pair(stream, static_cast<uint64_t>(c) >> 1, a, scale, two);
        out[c++] = two[1];
      }
      const int64_t pairs = (c1 - c) / 2;
      if (pairs > 0) uniform_pairs(stream, static_cast<uint64_t>(c) >> 1, pairs, a, scale, out + c);
      c += 2 * pairs;
      if (c < c1) {  // an even last column: the high half of its pair
        uniform_pair(stream, static_cast<uint64_t>(c) >> 1, a, scale, two);
        out[c] = two[0];
      }
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
  if (w > 0) std::memset(st, 0, sizeof(float) * w);
  if (rp.kind == kAdam && d > 0) {
    st[2 * d] = static_cast<float>(rp.beta1);
    st[2 * d + 1] = static_cast<float>(rp.beta2);
  }
}

}  // namespace

const char* simd_path() { return kAvx512 ? "avx512" : "portable"; }

// Fills the embedx weights of one row from its initializer.
void init_embedx(float* row, int64_t key, const TableParams& p) {
  draw_columns(p.embedx_init, row_stream(p.seed, key), 1, p.dim, row + kEmbedW);
}

// Whether two initializers draw the same value for a column (then a row's columns 0 .. dim
// come from one call: column c's value depends only on the stream, c and the initializer).
inline bool same_init(const InitParams& x, const InitParams& y) {
  return x.kind == y.kind && x.a == y.a && x.b == y.b;
}

// Weights [0, dim) of a new row: the embed from embed_init, the embedx part drawn from
// embedx_init when expand, zeros otherwise.
inline void draw_weights(float* w, uint64_t stream, const TableParams& p, bool expand) {
  if (expand) {
    draw_columns(p.embedx_init, stream, 0, p.dim, w);
    if (!same_init(p.embed_init, p.embedx_init)) draw_columns(p.embed_init, stream, 0, 1, w);
  } else {
    draw_columns(p.embed_init, stream, 0, 1, w);
    std::fill(w + 1, w + p.dim, 0.0f);
  }
}

void init_row(float* row, int64_t key, const TableParams& p, bool expand) {
  // every column written once (no memset first: row creation is bound by its stores)
  row[kShow] = row[kClick] = row[kUnseen] = 0.0f;
  row[kFlags] = static_cast<float>(kFlagDirty | (expand ? kFlagExpanded : 0));
  draw_weights(row + kEmbedW, row_stream(p.seed, key), p, expand);
  init_state(row + p.embed_state, p.embed_rule, 1);
  init_state(row + p.embedx_state, p.embedx_rule, p.dim - 1);
}

void init_rows(torch::Tensor data, const torch::Tensor& row_keys, int64_t start, int64_t count,
               const TableParams& p) {
  constexpr const char* kOp = "init_rows";
  check_data(data, p, kOp);
  const torch::Tensor keys = input_ids(row_keys, kOp, "row_keys");
  const int64_t R = std::min(data.size(0), row_keys.numel());
  // count <= R - start, not start + count <= R: the sum could overflow
  TORCH_CHECK(start >= 0 && count >= 0 && start <= R && count <= R - start, kOp, ": rows [",
              start, ", ", start, " + ", count, ") outside the table's ", R, " rows");
  float* d = data.data_ptr<float>();
  const int64_t* k = keys.data_ptr<int64_t>();
  const bool expand = p.score(0.0, 0.0) >= p.embedx_threshold;
  at::parallel_for(start, start + count, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) init_row(d + r * p.width, k[r], p, expand);
  });
}

torch::Tensor initial_weights(const torch::Tensor& keys_in, const TableParams& p,
                              bool with_embedx) {
  constexpr const char* kOp = "initial_weights";
  check_params(p, kOp);
  const torch::Tensor keys = input_ids(keys_in, kOp, "keys");
  const int64_t n = keys.numel();
  auto out = torch::empty({n, p.dim}, torch::kFloat32);
  const int64_t* k = keys.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  const bool expand = with_embedx;
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      draw_weights(o + i * p.dim, row_stream(p.seed, k[i]), p, expand);
    }
  });
  return out;
}

}  // namespace streamrec
