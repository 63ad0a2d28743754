// Row creation (internal; host and device, so a CPU test can run these very functions against
// the CPU core), bit for bit the CPU core's counter-based draws
// (csrc/cpu/row_init.cpp): a row's stream is mix64(seed ^ mix64(key)) and column c's value
// a function of (stream, c) only. Every float op is an explicit round-to-nearest intrinsic
// (no fused multiply-add), as the CPU build (-ffp-contract=off), so uniform draws and zeros
// are identical; normal draws go through logf/cosf, within 2 ulp of glibc's (CUDA's
// documented error bounds), so they match the CPU within a relative 1e-6.
#pragma once

#include <cmath>

#include "common.cuh"

namespace streamrec_cuda {

// Round-to-nearest float ops, never fused: intrinsics on the device, plain ops on the host
// (the host test build passes -ffp-contract=off).
STREAMREC_HD inline float mul_rn(float x, float y) {
#ifdef __CUDA_ARCH__
  return mul_rn(x, y);
#else
  return x * y;
#endif
}
STREAMREC_HD inline float add_rn(float x, float y) {
#ifdef __CUDA_ARCH__
  return add_rn(x, y);
#else
  return x + y;
#endif
}
STREAMREC_HD inline float sub_rn(float x, float y) {
#ifdef __CUDA_ARCH__
  return sub_rn(x, y);
#else
  return x - y;
#endif
}

STREAMREC_HD inline uint64_t row_stream(uint64_t seed, int64_t key) {
  return mix64(seed ^ mix64(static_cast<uint64_t>(key)));
}

STREAMREC_HD inline uint64_t col_hash(uint64_t stream, uint64_t j) {
  const uint64_t h = (stream + (j + 1) * 0x9E3779B97F4A7C15ULL) * 0xD6E8FEB86659FD93ULL;
  return h ^ (h >> 32);
}

STREAMREC_HD inline float unit24(uint32_t h) {
  return mul_rn(static_cast<float>(h >> 8), 1.0f / 16777216.0f);
}

// Column c of a row stream drawn from initializer ip.
STREAMREC_HD inline float draw(const StreamrecInit& ip, uint64_t stream, int64_t c) {
  const float a = static_cast<float>(ip.a), b = static_cast<float>(ip.b);
  if (ip.kind == kUniform) {
    const float scale = mul_rn(sub_rn(b, a), 1.0f / 16777216.0f);
    const uint64_t h = col_hash(stream, static_cast<uint64_t>(c) >> 1);
    const int32_t x = (c & 1) ? static_cast<int32_t>((h & 0xFFFFFFFFu) >> 8)
                              : static_cast<int32_t>(h >> 40);
    return add_rn(a, mul_rn(scale, static_cast<float>(x)));
  }
  if (ip.kind == kNormal) {
    const uint64_t h = col_hash(stream, static_cast<uint64_t>(c));
    const float u1 = sub_rn(1.0f, unit24(static_cast<uint32_t>(h >> 32)));  // (0, 1]
    const float u2 = unit24(static_cast<uint32_t>(h));
    const float radius = sqrtf(mul_rn(-2.0f, logf(u1)));
    return add_rn(a, mul_rn(mul_rn(b, radius), cosf(mul_rn(6.2831853f, u2))));
  }
  return 0.0f;
}

STREAMREC_HD inline bool same_init(const StreamrecInit& x, const StreamrecInit& y) {
  return x.kind == y.kind && x.a == y.a && x.b == y.b;
}

// Weight column c (0 = embed) of a new row: embed from embed_init, embedx from embedx_init
// when expand, else zero (csrc/cpu/row_init.cpp draw_weights).
STREAMREC_HD inline float initial_weight(const StreamrecTableParams& p, uint64_t stream, int64_t c,
                                       bool expand) {
  if (c == 0)
    return draw(expand && same_init(p.embed_init, p.embedx_init) ? p.embedx_init : p.embed_init,
                stream, 0);
  return expand ? draw(p.embedx_init, stream, c) : 0.0f;
}

STREAMREC_HD inline int64_t state_width(int64_t kind, int64_t d) {
  switch (kind) {
    case kNaive: return 0;
    case kAdaGrad: return d > 0 ? 1 : 0;
    case kStdAdaGrad: return d;
    case kAdam: return d > 0 ? 2 * d + 2 : 0;
    default: return 0;
  }
}

STREAMREC_HD inline void init_state(float* st, const StreamrecRule& rp, int64_t d) {
  const int64_t w = state_width(rp.kind, d);
  for (int64_t c = 0; c < w; ++c) st[c] = 0.0f;
  if (rp.kind == kAdam && d > 0) {
    st[2 * d] = static_cast<float>(rp.beta1);
    st[2 * d + 1] = static_cast<float>(rp.beta2);
  }
}

// One new row (csrc/cpu/row_init.cpp init_row). row: (width,) float32 device.
STREAMREC_HD inline void init_row(float* row, int64_t key, const StreamrecTableParams& p,
                                bool expand) {
  row[kShow] = row[kClick] = row[kUnseen] = 0.0f;
  row[kFlags] = static_cast<float>(kFlagDirty | (expand ? kFlagExpanded : 0));
  const uint64_t stream = row_stream(p.seed, key);
  for (int64_t c = 0; c < p.dim; ++c) row[kEmbedW + c] = initial_weight(p, stream, c, expand);
  init_state(row + p.embed_state, p.embed_rule, 1);
  init_state(row + p.embedx_state, p.embedx_rule, p.dim - 1);
}

// The embedx weights of an expanding row (csrc/cpu/row_init.cpp init_embedx).
STREAMREC_HD inline void init_embedx(float* row, int64_t key, const StreamrecTableParams& p) {
  const uint64_t stream = row_stream(p.seed, key);
  for (int64_t c = 1; c < p.dim; ++c) row[kEmbedW + c] = draw(p.embedx_init, stream, c);
}

}  // namespace streamrec_cuda
