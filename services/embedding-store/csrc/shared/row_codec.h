// The payload columns of a row, host and device: float32 columns as they are, or 16-bit
// values (fp16, bf16) packed two per word (the layout: row_layout.h).
//
// Encoding from float32 rounds to nearest (ties to even) or stochastically: up with
// probability equal to the fraction of the unit dropped, as FBGEMM's fp16 tables do, so that
// many small updates are not lost to rounding and the rounding error has mean zero. The
// random bits come from a hash (mix64) of the row's key, the column and the table's push
// counter (round_salt, round_bits), so the CPU core, the kernels and their CPU build write
// the same bits. fp16 saturates at +-65504 (a finite value never becomes Inf); NaN stays NaN.
//
// The rule and initializer code (row_update.h, row_init.h) reads and writes a row's payload
// through a column view: F32Cols (a float pointer) or HalfCols<dtype> (decode on get, encode
// on set); both give column i of a part as get(i), set(i, v) (stochastic), put(i, v)
// (nearest) and at(k) (the part from column k on).
#pragma once

#include <cstdint>
#include <cstring>

#include "row_layout.h"

namespace streamrec {

STREAMREC_HD inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

STREAMREC_HD inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// ---- fp16 (IEEE binary16) ----
STREAMREC_HD inline float fp16_decode(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {  // zero or subnormal: m 2^-24, exact in float32
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

// f as fp16 bits: rounded to nearest (ties to even) unless stochastic, then up with
// probability equal to the dropped fraction, from the random bits rnd. Saturates at 65504.
STREAMREC_HD inline uint16_t fp16_encode(float f, bool stochastic, uint64_t rnd) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (mag >= 0x38800000u) {  // at least 2^-14 (fp16's least normal): 13 mantissa bits dropped
    const uint32_t h = mag - 0x38000000u;  // the exponent rebiased (127 -> 15)
    const uint32_t add =
        stochastic ? static_cast<uint32_t>(rnd & 0x1fffu) : 0xfffu + ((h >> 13) & 1u);
    const uint32_t q = (h + add) >> 13;  // a carry out of the mantissa steps the exponent
    return sign | static_cast<uint16_t>(q > 0x7bffu ? 0x7bffu : q);
  }
  // an fp16 subnormal (or zero): units of 2^-24; the value is m 2^-(s), s >= 14
  const uint32_t e = mag >> 23;
  const uint64_t m = e ? (mag & 0x7fffffu) | 0x800000u : mag;
  const int s = 126 - static_cast<int>(e ? e : 1);
  if (s > 63) return sign;  // below 2^-87: rounds to zero
  const uint64_t low = (uint64_t{1} << s) - 1;
  const uint64_t add = stochastic ? (rnd & low) : (low >> 1) + ((m >> s) & 1u);
  return sign | static_cast<uint16_t>((m + add) >> s);
}

// ---- bf16 (the top half of a float32) ----
STREAMREC_HD inline float bf16_decode(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

// f as bf16 bits, rounded as fp16_encode; saturates at the largest finite bf16.
STREAMREC_HD inline uint16_t bf16_encode(float f, bool stochastic, uint64_t rnd) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return sign | 0x7fc0u;  // NaN
  const uint32_t add =
      stochastic ? static_cast<uint32_t>(rnd & 0xffffu) : 0x7fffu + ((mag >> 16) & 1u);
  const uint32_t q = (mag + add) >> 16;
  return sign | static_cast<uint16_t>(q > 0x7f7fu ? 0x7f7fu : q);
}

template <int64_t Dtype>
STREAMREC_HD inline float decode16(uint16_t h) {
  return Dtype == kFp16 ? fp16_decode(h) : bf16_decode(h);
}

template <int64_t Dtype>
STREAMREC_HD inline uint16_t encode16(float f, bool stochastic, uint64_t rnd) {
  return Dtype == kFp16 ? fp16_encode(f, stochastic, rnd) : bf16_encode(f, stochastic, rnd);
}

// ---- stochastic rounding's random bits ----
// A row's salt for one push: its key and the table's push counter (round_step).
STREAMREC_HD inline uint64_t round_salt(int64_t key, uint64_t step) {
  return mix64(static_cast<uint64_t>(key) ^ mix64(step + 0x9E3779B97F4A7C15ULL));
}

// 64 random bits of column c (a payload column number, kEmbedW for the first weight).
STREAMREC_HD inline uint64_t round_bits(uint64_t salt, int64_t c) {
  return mix64(salt + (static_cast<uint64_t>(c) + 1) * 0x9E3779B97F4A7C15ULL);
}

// ---- packed access: payload element e of a row (byte 4 kEmbedW + 2 e), at any alignment ----
STREAMREC_HD inline uint16_t load16(const float* row, int64_t e) {
  uint16_t v;
  memcpy(&v, reinterpret_cast<const char*>(row + kEmbedW) + 2 * e, sizeof v);
  return v;
}

STREAMREC_HD inline void store16(float* row, int64_t e, uint16_t v) {
  memcpy(reinterpret_cast<char*>(row + kEmbedW) + 2 * e, &v, sizeof v);
}

// ---- column views of a part of a row's payload ----
// float32 columns: column i of the part is p[i].
struct F32Cols {
  float* p;
  STREAMREC_HD float get(int64_t i) const { return p[i]; }
  STREAMREC_HD void set(int64_t i, float v) const { p[i] = v; }
  STREAMREC_HD void put(int64_t i, float v) const { p[i] = v; }
  STREAMREC_HD F32Cols at(int64_t k) const { return F32Cols{p + k}; }
};

// 16-bit columns of dtype Dtype: column i of the part is the row's column c0 + i (payload
// element c0 + i - kEmbedW); set rounds stochastically with the row's salt, put to nearest.
template <int64_t Dtype>
struct HalfCols {
  float* row;
  int64_t c0;
  uint64_t salt;
  STREAMREC_HD float get(int64_t i) const { return decode16<Dtype>(load16(row, c0 + i - kEmbedW)); }
  STREAMREC_HD void set(int64_t i, float v) const {
    store16(row, c0 + i - kEmbedW, encode16<Dtype>(v, true, round_bits(salt, c0 + i)));
  }
  STREAMREC_HD void put(int64_t i, float v) const {
    store16(row, c0 + i - kEmbedW, encode16<Dtype>(v, false, 0));
  }
  STREAMREC_HD HalfCols at(int64_t k) const { return HalfCols{row, c0 + k, salt}; }
};

// The views of a whole row: column c of cols_of(...) is the row's column c (c >= kEmbedW).
STREAMREC_HD inline F32Cols f32_cols(float* row) { return F32Cols{row}; }
template <int64_t Dtype>
STREAMREC_HD inline HalfCols<Dtype> half_cols(float* row, uint64_t salt) {
  return HalfCols<Dtype>{row, 0, salt};
}

// Calls f(cols) with the view of row that dtype asks for (salt: stochastic rounding's, see
// round_salt; unused by fp32 and by views only read or put).
template <class F>
STREAMREC_HD inline auto with_cols(int64_t dtype, float* row, uint64_t salt, const F& f) {
  if (dtype == kFp16) return f(half_cols<kFp16>(row, salt));
  if (dtype == kBf16) return f(half_cols<kBf16>(row, salt));
  return f(f32_cols(row));
}

// Payload columns [c0, c0 + n) of a row (c0 >= kEmbedW) as float32 into out (n,).
STREAMREC_HD inline void decode_cols(float* out, const float* row, int64_t c0, int64_t n,
                                     int64_t dtype) {
  if (dtype == kFp16) {
    for (int64_t i = 0; i < n; ++i) out[i] = fp16_decode(load16(row, c0 - kEmbedW + i));
  } else if (dtype == kBf16) {
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_decode(load16(row, c0 - kEmbedW + i));
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = row[c0 + i];
  }
}

// Payload columns [c0, c0 + n) of a row from float32 values (n,), rounded to nearest.
STREAMREC_HD inline void encode_cols(float* row, int64_t c0, const float* values, int64_t n,
                                     int64_t dtype) {
  if (dtype == kFp16) {
    for (int64_t i = 0; i < n; ++i)
      store16(row, c0 - kEmbedW + i, fp16_encode(values[i], false, 0));
  } else if (dtype == kBf16) {
    for (int64_t i = 0; i < n; ++i)
      store16(row, c0 - kEmbedW + i, bf16_encode(values[i], false, 0));
  } else {
    for (int64_t i = 0; i < n; ++i) row[c0 + i] = values[i];
  }
}

}  // namespace streamrec
