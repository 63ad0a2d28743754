// Row creation, host and device: counter-based initial weights, initial optimizer state and
// a new row. A row's stream is mix64(seed ^ mix64(key)); column c's value is a function of
// (stream, c) only, so a row's initial values do not depend on the order or the thread that
// creates it, and a pull on another shard (or the GPU) draws the same.
//
// Plain IEEE float operations, never fused: the CPU builds with -ffp-contract=off, nvcc with
// -fmad=false, so uniform draws and zeros are bit for bit the same on both; normal draws go
// through logf/cosf/sqrtf, within 2 ulp of glibc's on the GPU (CUDA's documented bounds).
// P: TableParams or StreamrecTableParams; their init and rule structs have the same fields.
#pragma once

#include <math.h>

#include <cstdint>

#include "row_codec.h"

namespace streamrec {

STREAMREC_HD inline uint64_t row_stream(uint64_t seed, int64_t key) {
  return mix64(seed ^ mix64(static_cast<uint64_t>(key)));
}

// 64 random bits per column pair (uniform: each column takes 32 of them) or per column
// (normal: its two halves are the Box-Muller pair): a Weyl step of the row stream, one
// multiply and an xor-shift. The stream is already a full mix of seed and key, so this
// is enough for initial weights, and it is a third of the work of a full mix per pair.
STREAMREC_HD inline uint64_t col_hash(uint64_t stream, uint64_t j) {
  const uint64_t h = (stream + (j + 1) * 0x9E3779B97F4A7C15ULL) * 0xD6E8FEB86659FD93ULL;
  return h ^ (h >> 32);
}

// Uniform in [0, 1) from the top 24 bits of 32.
STREAMREC_HD inline float unit24(uint32_t h) {
  return static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
}

// The step of a uniform draw over [a, b): 24-bit integers times this.
STREAMREC_HD inline float uniform_scale(float a, float b) { return (b - a) * (1.0f / 16777216.0f); }

// Columns 2j and 2j + 1 of a uniform draw: column 2j takes the high 32 bits of pair j's hash,
// column 2j + 1 the low 32 (24 bits of each make the value; a 24-bit integer converts to float
// exactly, so every build gives the same floats). csrc/cpu/row_init.cpp's AVX-512 loop draws
// 8 pairs at once with the same bits.
STREAMREC_HD inline void uniform_pair(uint64_t stream, uint64_t j, float a, float scale,
                                      float* out) {
  const uint64_t h = col_hash(stream, j);
  out[0] = a + scale * static_cast<float>(static_cast<int32_t>(h >> 40));
  out[1] = a + scale * static_cast<float>(static_cast<int32_t>((h & 0xFFFFFFFFu) >> 8));
}

// Column c of a normal draw (mean a, std b): Box-Muller on the column's 64 bits.
STREAMREC_HD inline float normal_draw(uint64_t stream, int64_t c, float a, float b) {
  const uint64_t h = col_hash(stream, static_cast<uint64_t>(c));
  const float u1 = 1.0f - unit24(static_cast<uint32_t>(h >> 32));  // (0, 1]
  const float u2 = unit24(static_cast<uint32_t>(h));
  return a + b * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

// Uniform pairs j0 .. j0 + count - 1 into out[0 .. 2 count), one pair at a time. The CPU core
// passes its own (vectorised where the CPU allows) with the same bits.
struct PortablePairs {
  STREAMREC_HD void operator()(uint64_t stream, uint64_t j0, int64_t count, float a, float scale,
                               float* out) const {
    for (int64_t q = 0; q < count; ++q)
      uniform_pair(stream, j0 + static_cast<uint64_t>(q), a, scale, out + 2 * q);
  }
};

// out[c] for columns c in [c0, c1) of a row stream, drawn from initializer ip.
template <class Pairs, class Init>
STREAMREC_HD inline void draw_columns(const Init& ip, uint64_t stream, int64_t c0, int64_t c1,
                                      float* out, const Pairs& pairs) {
  const float a = static_cast<float>(ip.a), b = static_cast<float>(ip.b);
  if (ip.kind == kUniform) {
    const float scale = uniform_scale(a, b);
    float two[2];
    int64_t c = c0;
    if (c < c1 && (c & 1)) {  // an odd first column: the low half of its pair
      uniform_pair(stream, static_cast<uint64_t>(c) >> 1, a, scale, two);
      out[c++] = two[1];
    }
    const int64_t count = (c1 - c) / 2;
    if (count > 0) pairs(stream, static_cast<uint64_t>(c) >> 1, count, a, scale, out + c);
    c += 2 * count;
    if (c < c1) {  // an even last column: the high half of its pair
      uniform_pair(stream, static_cast<uint64_t>(c) >> 1, a, scale, two);
      out[c] = two[0];
    }
  } else if (ip.kind == kNormal) {
    for (int64_t c = c0; c < c1; ++c) out[c] = normal_draw(stream, c, a, b);
  } else {
    for (int64_t c = c0; c < c1; ++c) out[c] = 0.0f;
  }
}

// Whether two initializers draw the same value for a column (then a row's columns 0 .. dim
// come from one call: column c's value depends only on the stream, c and the initializer).
template <class Init>
STREAMREC_HD inline bool same_init(const Init& x, const Init& y) {
  return x.kind == y.kind && x.a == y.a && x.b == y.b;
}

// Weights [0, dim) of a new row: the embed from embed_init, the embedx part drawn from
// embedx_init when expand, zeros otherwise.
template <class Pairs, class P>
STREAMREC_HD inline void draw_weights(float* w, uint64_t stream, const P& p, bool expand,
                                      const Pairs& pairs) {
  if (expand) {
    draw_columns(p.embedx_init, stream, 0, p.dim, w, pairs);
    if (!same_init(p.embed_init, p.embedx_init))
      draw_columns(p.embed_init, stream, 0, 1, w, pairs);
  } else {
    draw_columns(p.embed_init, stream, 0, 1, w, pairs);
    for (int64_t c = 1; c < p.dim; ++c) w[c] = 0.0f;
  }
}

// Initial optimizer state of d weights under rule rp.
template <class Rule>
STREAMREC_HD inline void init_state(float* st, const Rule& rp, int64_t d) {
  const int64_t w = state_width(rp.kind, d);
  for (int64_t c = 0; c < w; ++c) st[c] = 0.0f;
  if (rp.kind == kAdam && d > 0) {
    st[2 * d] = static_cast<float>(rp.beta1);
    st[2 * d + 1] = static_cast<float>(rp.beta2);
  }
}

// One new fp32 row: every column written once (row creation is bound by its stores).
template <class Pairs, class P>
STREAMREC_HD inline void init_row_f32(float* row, int64_t key, const P& p, bool expand,
                                      const Pairs& pairs) {
  row[kShow] = row[kClick] = row[kUnseen] = 0.0f;
  row[kFlags] = static_cast<float>(kFlagDirty | (expand ? kFlagExpanded : 0));
  draw_weights(row + kEmbedW, row_stream(p.seed, key), p, expand, pairs);
  init_state(row + p.embed_state, p.embed_rule, 1);
  init_state(row + p.embedx_state, p.embedx_rule, p.dim - 1);
}

// ---- one column at a time: the GPU's warp-per-row creation (lanes of a warp take columns
// lane, lane + 32, ...: coalesced stores), bit for bit what the whole-row functions write ----

// Column c of a draw from initializer ip (draw_columns' value at c).
template <class Init>
STREAMREC_HD inline float draw_column(const Init& ip, uint64_t stream, int64_t c) {
  const float a = static_cast<float>(ip.a), b = static_cast<float>(ip.b);
  if (ip.kind == kUniform) {
    const uint64_t h = col_hash(stream, static_cast<uint64_t>(c) >> 1);
    const int32_t bits = (c & 1) ? static_cast<int32_t>((h & 0xFFFFFFFFu) >> 8)
                                 : static_cast<int32_t>(h >> 40);  // uniform_pair's halves
    return a + uniform_scale(a, b) * static_cast<float>(bits);
  }
  if (ip.kind == kNormal) return normal_draw(stream, c, a, b);
  return 0.0f;
}

// Weight c of a new row (draw_weights' value at c): column 0 is always embed_init's draw (with
// expand and the same initializer, embedx_init's draw there is the same value).
template <class P>
STREAMREC_HD inline float initial_weight(uint64_t stream, const P& p, bool expand, int64_t c) {
  if (c == 0) return draw_column(p.embed_init, stream, 0);
  return expand ? draw_column(p.embedx_init, stream, c) : 0.0f;
}

// Column c of the initial optimizer state of d weights under rule rp (init_state's value).
template <class Rule>
STREAMREC_HD inline float initial_state(const Rule& rp, int64_t d, int64_t c) {
  if (rp.kind == kAdam && d > 0) {
    if (c == 2 * d) return static_cast<float>(rp.beta1);
    if (c == 2 * d + 1) return static_cast<float>(rp.beta2);
  }
  return 0.0f;
}

// init_row_lanes' lanes when one thread creates the row.
struct OneLane {
  STREAMREC_HD int64_t first() const { return 0; }
  STREAMREC_HD int64_t step() const { return 1; }
  STREAMREC_HD bool leader() const { return true; }
};

// init_row by cooperating lanes (Lanes: first(), step(), leader(), as update_row's): lane k
// writes columns first() + k step() of each part, the leader the header. The caller syncs
// the lanes before anything reads the row. A compact row's values are rounded to nearest.
template <class P, class Lanes>
STREAMREC_HD inline void init_row_lanes(float* row, int64_t key, const P& p, bool expand,
                                        const Lanes& lanes) {
  if (lanes.leader()) {
    row[kShow] = row[kClick] = row[kUnseen] = 0.0f;
    row[kFlags] = static_cast<float>(kFlagDirty | (expand ? kFlagExpanded : 0));
  }
  const uint64_t stream = row_stream(p.seed, key);
  with_cols(p.dtype, row, 0, [&](const auto& cols) {
    for (int64_t c = lanes.first(); c < p.dim; c += lanes.step())
      cols.put(kEmbedW + c, initial_weight(stream, p, expand, c));
    const int64_t w1 = state_width(p.embed_rule.kind, 1);
    for (int64_t c = lanes.first(); c < w1; c += lanes.step())
      cols.put(p.embed_state + c, initial_state(p.embed_rule, 1, c));
    const int64_t wx = state_width(p.embedx_rule.kind, p.dim - 1);
    for (int64_t c = lanes.first(); c < wx; c += lanes.step())
      cols.put(p.embedx_state + c, initial_state(p.embedx_rule, p.dim - 1, c));
    // an odd payload leaves the last word's high half unused: zeros, not the memory's old
    // bytes (they reach checkpoint files)
    const int64_t payload = p.embedx_state + wx - kEmbedW;
    if (p.dtype != kFp32 && (payload & 1) && lanes.leader()) store16(row, payload, 0);
  });
}

// One new row: every column written once (row creation is bound by its stores). An fp32 row
// draws its uniform weights a pair at a time through pairs (vectorised on the CPU), a compact
// one a column at a time (the same values), rounded to nearest.
template <class Pairs, class P>
STREAMREC_HD inline void init_row(float* row, int64_t key, const P& p, bool expand,
                                  const Pairs& pairs) {
  if (p.dtype == kFp32) {
    init_row_f32(row, key, p, expand, pairs);
  } else {
    init_row_lanes(row, key, p, expand, OneLane{});
  }
}

// draw_weights by cooperating lanes, into out[0 .. dim).
template <class P, class Lanes>
STREAMREC_HD inline void draw_weights_lanes(float* out, uint64_t stream, const P& p, bool expand,
                                            const Lanes& lanes) {
  for (int64_t c = lanes.first(); c < p.dim; c += lanes.step())
    out[c] = initial_weight(stream, p, expand, c);
}

// The embedx weights of an expanding row (payload view cols of row, row_codec.h): an fp32
// row's drawn a pair at a time through pairs, a compact row's a column at a time (the same
// values) and rounded to nearest.
template <class Pairs, class P>
STREAMREC_HD inline void init_embedx_cols(float* row, const F32Cols&, int64_t key, const P& p,
                                          const Pairs& pairs) {
  draw_columns(p.embedx_init, row_stream(p.seed, key), 1, p.dim, row + kEmbedW, pairs);
}

template <class Pairs, class P, int64_t Dtype>
STREAMREC_HD inline void init_embedx_cols(float*, const HalfCols<Dtype>& cols, int64_t key,
                                          const P& p, const Pairs&) {
  const uint64_t stream = row_stream(p.seed, key);
  for (int64_t c = 1; c < p.dim; ++c) cols.put(kEmbedW + c, draw_column(p.embedx_init, stream, c));
}

// The embedx weights of an expanding row.
template <class Pairs, class P>
STREAMREC_HD inline void init_embedx(float* row, int64_t key, const P& p, const Pairs& pairs) {
  with_cols(p.dtype, row, 0, [&](const auto& cols) { init_embedx_cols(row, cols, key, p, pairs); });
}

}  // namespace streamrec
