// Row initialisation: the ops init_rows and initial_weights over the shared row creation
// (../shared/row_init.h), with uniform draws 8 pairs at a time by AVX-512 where the CPU has
// it (the same bits either way).
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "../shared/row_init.h"
#include "checks.h"
#include "ops.h"
#include "parallel.h"

namespace streamrec {
namespace {

constexpr int64_t kGrain = 1024;

// Row creation is bound by these draws (one 64-bit multiply-xorshift per pair): AVX-512
// (vpmullq) draws 8 pairs at once where the CPU has it, chosen once at load. Both paths give
// the same bits (mul then add, no fused multiply-add: setup.py passes -ffp-contract=off).
using UniformPairs = void (*)(uint64_t, uint64_t, int64_t, float, float, float*);

void uniform_pairs_portable(uint64_t stream, uint64_t j0, int64_t count, float a, float scale,
                            float* out) {
  PortablePairs{}(stream, j0, count, a, scale, out);
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

}  // namespace

const char* simd_path() { return kAvx512 ? "avx512" : "portable"; }

void CpuPairs::operator()(uint64_t stream, uint64_t j0, int64_t count, float a, float scale,
                          float* out) const {
  uniform_pairs(stream, j0, count, a, scale, out);
}

void init_embedx(float* row, int64_t key, const TableParams& p) {
  streamrec::init_embedx(row, key, p, CpuPairs{});
}

void init_row(float* row, int64_t key, const TableParams& p, bool expand) {
  streamrec::init_row(row, key, p, expand, CpuPairs{});
}

void init_rows(Matrix<float> data, Span<const int64_t> row_keys, int64_t start, int64_t count,
               const TableParams& p) {
  constexpr const char* kOp = "init_rows";
  const int64_t R = std::min(data.rows, row_keys.n);
  // count <= R - start, not start + count <= R: the sum could overflow
  STREAMREC_CHECK(start >= 0 && count >= 0 && start <= R && count <= R - start, kOp, ": rows [",
                  start, ", ", start, " + ", count, ") outside the table's ", R, " rows");
  float* d = data.data;
  const int64_t* k = row_keys.data;
  const bool expand = expand_at_creation(p);
  parallel_for(start, start + count, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) init_row(d + r * p.width, k[r], p, expand);
  });
}

void initial_weights(Span<const int64_t> keys, const TableParams& p, bool with_embedx,
                     float* out) {
  const int64_t n = keys.n;
  const int64_t* k = keys.data;
  float* o = out;
  const bool expand = with_embedx;
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      draw_weights(o + i * p.dim, row_stream(p.seed, k[i]), p, expand, CpuPairs{});
    }
  });
}

}  // namespace streamrec
