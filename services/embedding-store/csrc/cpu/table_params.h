// Parameters of one sparse table, shared by every op of the CPU extension; the CUDA
// extension's StreamrecTableParams (csrc/cuda/streamrec_cuda.h) has the same fields. The row
// layout, the rule and initializer kinds and the key mix are in ../shared/row_layout.h (one
// definition for the CPU core and the kernels).
#pragma once

#include <cstdint>
#include <cstring>

#include "../shared/row_codec.h"

namespace streamrec {

struct RuleParams {
  int64_t kind = kAdaGrad;
  double learning_rate = 0.05;
  double initial_g2sum = 3.0;
  double lower_bound = -10.0;  // weight_bounds[0]
  double upper_bound = 10.0;   // weight_bounds[1]
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
};

struct InitParams {
  int64_t kind = kUniform;
  double a = -1e-4;
  double b = 1e-4;
};

struct TableParams {
  int64_t dim = 9;  // 1 + embedx_dim
  RuleParams embed_rule;
  RuleParams embedx_rule;
  InitParams embed_init;
  InitParams embedx_init;
  double nonclk_coeff = 0.1;
  double click_coeff = 1.0;
  double embedx_threshold = 10.0;
  double show_click_decay_rate = 0.98;
  double delete_threshold = 0.8;
  double delete_after_unseen_days = 30.0;
  double base_threshold = 1.5;
  double delta_threshold = 0.25;
  double delta_keep_days = 16.0;
  uint64_t seed = 0;  // initializer seed (store seed mixed with the table name)
  int64_t dtype = kFp32;  // RowDtype of the payload (weights and optimizer state)
  uint64_t round_step = 0;  // push counter: stochastic rounding's salt (bumped per push call)

  // Derived by finalize().
  int64_t embed_state = 0;   // first column of the embed optimizer state
  int64_t embedx_state = 0;  // first column of the embedx optimizer state
  int64_t payload = 0;       // values after the header: dim weights, then optimizer state
  int64_t width = 0;         // 32-bit words per row: row_width(dtype, payload)

  // Computes the derived columns and width; throws on a bad value, an unknown dtype too
  // (std::invalid_argument, ValueError in Python), including a dim whose row width overflows
  // int64. Every op taking TableParams checks finalized() first: params changed after
  // finalize() are refused, not misread.
  void finalize();
  // Whether the derived columns are those finalize() gives for the current dim and rules.
  bool finalized() const;

  inline double score(double show, double click) const {
    return streamrec::score(*this, show, click);
  }
};

// Prefetches every cache line of [p, p + bytes) (a row spans several: 280 bytes at dim 64);
// write: for a line about to be written. Into L2, not L1 (locality 2): a core keeps more L2
// misses in flight than L1 ones, and a random row's lines are bound by that count (find_gather
// of 106k keys over 1M rows: 1.85 against 2.17 ms into L1).
inline void prefetch_lines(const void* p, int64_t bytes, bool write = false) {
  const char* c = static_cast<const char*>(p);
  const uintptr_t first = reinterpret_cast<uintptr_t>(c) & ~uintptr_t{63};
  for (uintptr_t a = first; a < reinterpret_cast<uintptr_t>(c) + bytes; a += 64) {
    if (write)
      __builtin_prefetch(reinterpret_cast<const void*>(a), 1, 2);
    else
      __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 2);
  }
}

// Copies count floats: whole 16-float blocks as fixed-size copies (a few vector moves, inlined),
// then the rest. A row's weights are copied once per key, and a memcpy call of a size known
// only at run time costs as much as the copy of a dim-16 row.
inline void copy_floats(float* dst, const float* src, int64_t count) {
  int64_t c = 0;
  for (; c + 16 <= count; c += 16) std::memcpy(dst + c, src + c, 16 * sizeof(float));
  if (c < count) std::memcpy(dst + c, src + c, sizeof(float) * (count - c));
}

// The dim weights of a row as float32 into out (dim,): copied, or decoded from a compact row.
inline void read_weights(float* out, const float* row, const TableParams& p) {
  if (p.dtype == kFp32)
    copy_floats(out, row + kEmbedW, p.dim);
  else
    decode_cols(out, row, kEmbedW, p.dim, p.dtype);
}

// Whether none of count floats is NaN or Inf: those are the floats whose exponent bits are
// all ones; testing the bits vectorises where std::isfinite does not. Read through memcpy,
// which is a plain load at any alignment (a message's array may start at any byte).
inline bool all_finite(const float* v, int64_t count) {
  const char* bytes = reinterpret_cast<const char*>(v);
  uint32_t bad = 0;
  for (int64_t c = 0; c < count; ++c) {
    uint32_t bits;
    std::memcpy(&bits, bytes + 4 * c, sizeof bits);
    bad |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  return bad == 0;
}

}  // namespace streamrec
