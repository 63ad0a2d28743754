// Parameters and row layout of one sparse table, shared by every op of the CPU extension (the
// CUDA extension, when it lands (issue #14), implements the same ops over the same layout).
//
// A table's rows live in one float32 matrix `data` (rows_capacity, width); row r is
//
//   [show, click, unseen_days, flags, embed_w (1), embedx_w (dim-1), embed_state, embedx_state]
//    0     1      2            3      4           5 ..                ...
//
// so the weights a pull returns are the contiguous columns [kEmbedW, kEmbedW + dim).
// flags (a small integer held in a float): bit 0 = embedx expanded, bit 1 = changed since the
// last base/delta save. The optimizer state width depends on the rule (see state_width).
// A separate (rows_capacity,) int64 tensor `row_keys` holds each row's key.
#pragma once

#include <cstdint>
#include <cstring>

namespace streamrec {

constexpr int64_t kShow = 0;
constexpr int64_t kClick = 1;
constexpr int64_t kUnseen = 2;
constexpr int64_t kFlags = 3;
constexpr int64_t kEmbedW = 4;
constexpr int kFlagExpanded = 1;
constexpr int kFlagDirty = 2;

// Sparse optimizer rules of PaddleRec's CtrCommonAccessor (seed 002).
enum RuleKind : int64_t { kNaive = 0, kAdaGrad = 1, kStdAdaGrad = 2, kAdam = 3 };

// Initializers: zeros, uniform [a, b), normal (mean a, std b).
enum InitKind : int64_t { kZeros = 0, kUniform = 1, kNormal = 2 };

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

// Floats of optimizer state for `dim` weights under `kind`.
inline int64_t state_width(int64_t kind, int64_t dim) {
  switch (kind) {
    case kNaive: return 0;
    case kAdaGrad: return dim > 0 ? 1 : 0;          // one g2sum shared by the part
    case kStdAdaGrad: return dim;                    // one g2sum per weight
    case kAdam: return dim > 0 ? 2 * dim + 2 : 0;    // gsum, g2sum, beta1_pow, beta2_pow
    default: return -1;
  }
}

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

  // Derived by finalize().
  int64_t embed_state = 0;   // first column of the embed optimizer state
  int64_t embedx_state = 0;  // first column of the embedx optimizer state
  int64_t width = 0;         // floats per row

  // Computes the derived columns; throws on a bad value (std::invalid_argument, ValueError in
  // Python), including a dim whose row width overflows int64. Every op taking TableParams
  // checks finalized() first: params changed after finalize() are refused, not misread.
  void finalize();
  // Whether the derived columns are those finalize() gives for the current dim and rules.
  bool finalized() const;

  inline double score(double show, double click) const {
    return nonclk_coeff * (show - click) + click_coeff * click;
  }
};

// Prefetches every cache line of [p, p + bytes) (a row spans several: 280 bytes at dim 64);
// write: for a line about to be written.
inline void prefetch_lines(const void* p, int64_t bytes, bool write = false) {
  const char* c = static_cast<const char*>(p);
  const uintptr_t first = reinterpret_cast<uintptr_t>(c) & ~uintptr_t{63};
  for (uintptr_t a = first; a < reinterpret_cast<uintptr_t>(c) + bytes; a += 64) {
    if (write)
      __builtin_prefetch(reinterpret_cast<const void*>(a), 1);
    else
      __builtin_prefetch(reinterpret_cast<const void*>(a), 0);
  }
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

// SplitMix64 finalizer (the same as streamrec.keyhash.mix64).
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace streamrec
