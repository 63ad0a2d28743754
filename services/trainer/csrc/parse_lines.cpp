// The text line parser (see ops.h): one pass, the digits of a field read 8 bytes at a time
// (SWAR, no branch per byte), into outputs the caller allocated (no allocation but a copy of
// an unterminated last line). A line is parsed on the way it is expected to look; any
// surprise (a byte that ends a field too early, a value out of range) sends it to a slow path
// that finds its end and decides between the two reasons a line is malformed, so the fast
// path never has to.
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ops.h"

namespace streamrec::trainer {
namespace {

constexpr uint8_t kNotDigit = 255;

// Digit value of every byte, kNotDigit for the bytes that are no digit of the kind.
struct DigitTables {
  std::array<uint8_t, 256> dec{};
  std::array<uint8_t, 256> hex{};
  constexpr DigitTables() {
    for (int c = 0; c < 256; ++c) dec[c] = hex[c] = kNotDigit;
    for (int c = 0; c < 10; ++c) dec['0' + c] = hex['0' + c] = static_cast<uint8_t>(c);
    for (int c = 0; c < 6; ++c) hex['a' + c] = hex['A' + c] = static_cast<uint8_t>(10 + c);
  }
};
constexpr DigitTables kDigits;

// 10**k, exact (what numpy's np.power(10.0, k) gives for these k, checked by the tests).
constexpr double kPow10[19] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8, 1e9,
                               1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18};

// Longest field of each kind, in bytes (a sign and a dot included).
constexpr ptrdiff_t kMaxDecimal = 19;
constexpr ptrdiff_t kMaxHex = 16;

// SWAR (8 bytes in a uint64, first byte lowest): 0x80 in each byte whose value is in
// (lo, hi), 0 in the others; exact for every byte value (bytes >= 0x80 are never in range).
// Bit Twiddling Hacks' hasbetween: no carry or borrow crosses a byte.
constexpr uint64_t kOnes = 0x0101010101010101ULL;
constexpr uint64_t kHigh = 0x8080808080808080ULL;
constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7fULL;
constexpr uint64_t between(uint64_t x, uint64_t lo, uint64_t hi) {
  return (kOnes * (127 + hi) - (x & kLow7)) & ~x & ((x & kLow7) + kOnes * (127 - lo)) & kHigh;
}

// The hex digits at the start of 8 bytes: (how many, 0 to 8; the value they spell).
inline std::pair<int, uint64_t> hex_prefix8(uint64_t x) {
  const uint64_t letters = between(x | (kOnes * 0x20), 0x60, 0x67);  // a-f, A-F
  const uint64_t hex = between(x, 0x2f, 0x3a) | letters;               // and 0-9
  const uint64_t other = ~hex & kHigh;
  const int k = other == 0 ? 8 : __builtin_ctzll(other) / 8;
  if (k == 0) return {0, 0};
  // nibble per byte ('a' and 'A' have low nibble 1: + 9), the k digits moved to the top bytes
  // (leading zeros below), then the 8 nibbles packed, first byte most significant
  uint64_t v = ((x & (kOnes * 0x0f)) + (letters >> 7) * 9) << (8 * (8 - k));
  v = ((v << 4) | (v >> 8)) & 0x00ff00ff00ff00ffULL;
  v = ((v << 8) | (v >> 16)) & 0x0000ffff0000ffffULL;
  v = ((v << 16) | (v >> 32)) & 0x00000000ffffffffULL;
  return {k, v};
}

// The decimal digits at the start of 8 bytes: (how many, 0 to 8; the value they spell).
inline std::pair<int, uint64_t> dec_prefix8(uint64_t x) {
  const uint64_t other = ~between(x, 0x2f, 0x3a) & kHigh;
  const int k = other == 0 ? 8 : __builtin_ctzll(other) / 8;
  if (k == 0) return {0, 0};
  uint64_t v = (x & (kOnes * 0x0f)) << (8 * (8 - k));  // digit values, as in hex_prefix8
  v = (v * 10 + (v >> 8)) & 0x00ff00ff00ff00ffULL;
  v = (v * 100 + (v >> 16)) & 0x0000ffff0000ffffULL;
  v = (v * 10000 + (v >> 32)) & 0x00000000ffffffffULL;
  return {k, v};
}

// How many bytes a reader may load at once: 8 when little-endian (the SWAR helpers' byte
// order), else 0 (byte by byte only).
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr ptrdiff_t kWord = 8;
#else
constexpr ptrdiff_t kWord = 0;
#endif

// The digits at q, 8 bytes at once if `limit` allows: false when all 8 were digits (more
// may follow: the caller goes on byte by byte from q).
template <bool kHex>
inline bool read_word(const uint8_t*& q, const uint8_t* limit, uint64_t& acc) {
  if (kWord == 0 || limit - q < kWord) return false;
  uint64_t x;
  std::memcpy(&x, q, 8);
  const auto [k, value] = kHex ? hex_prefix8(x) : dec_prefix8(x);
  acc = value;
  q += k;
  return k < 8;
}

// Every reader below starts at a field's first byte and returns the first byte after its
// digits: the field's end if the field is good. They read byte by byte up to the line's
// '\n', and 8 bytes at a time where `limit` (the end of the readable buffer) allows.

// 'int': [-]digits, <= kMaxDecimal bytes, <= 2**63-1, empty reads 0. bits: the value's
// two's complement (computed unsigned: more than 19 digits wrap, harmlessly, as not ok).
inline const uint8_t* read_int(const uint8_t* p, const uint8_t* limit, uint64_t& bits,
                               bool& ok) {
  const bool neg = *p == '-';
  const uint8_t* q = p + neg;
  uint64_t acc = 0;
  if (!read_word<false>(q, limit, acc)) {
    for (uint8_t d; (d = kDigits.dec[*q]) != kNotDigit; ++q) acc = acc * 10 + d;
  }
  const ptrdiff_t len = q - p;
  ok = len <= kMaxDecimal && !(neg && len == 1) &&
       acc <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  bits = neg ? 0 - acc : acc;
  return q;
}

// 'hex': <= kMaxHex hex digits of either case, the uint64 they spell; empty reads 0.
inline const uint8_t* read_hex(const uint8_t* p, const uint8_t* limit, uint64_t& bits,
                               bool& ok) {
  const uint8_t* q = p;
  uint64_t acc = 0;
  if (!read_word<true>(q, limit, acc)) {
    for (uint8_t d; (d = kDigits.hex[*q]) != kNotDigit; ++q) acc = (acc << 4) | d;
  }
  ok = q - p <= kMaxHex;
  bits = acc;
  return q;
}

// 'fixed' as p_true needs it: digits with at most one '.', not "." alone, non-empty,
// <= kMaxDecimal bytes, value <= 1. The value is numpy's: all digits as an integer, in
// float64, divided by 10**(digits after the dot). A second '.' ends the digits (not ok then:
// the field does not end there).
inline const uint8_t* read_prob(const uint8_t* p, double& value, bool& ok) {
  const uint8_t* q = p;
  const uint8_t* dot = nullptr;
  uint64_t acc = 0;
  for (;; ++q) {
    const uint8_t d = kDigits.dec[*q];
    if (d != kNotDigit) {
      acc = acc * 10 + d;
    } else if (*q == '.' && dot == nullptr) {
      dot = q;
    } else {
      break;
    }
  }
  const ptrdiff_t len = q - p;
  ok = len > 0 && len <= kMaxDecimal && !(dot != nullptr && len == 1);
  value = 0.0;
  if (ok) {
    value = static_cast<double>(acc) / kPow10[dot == nullptr ? 0 : q - dot - 1];
    ok = value <= 1.0;
  }
  return q;
}

// Steps over the byte that ends a field: a tab, or for the line's last field the line's end
// ('\n', or "\r\n"). False when another byte is there.
inline bool step(const uint8_t*& p, bool last) {
  if (!last) {
    if (*p != '\t') return false;
    ++p;
    return true;
  }
  if (*p == '\n') {
    ++p;
    return true;
  }
  if (*p == '\r' && p[1] == '\n') {
    p += 2;
    return true;
  }
  return false;
}

// Parses the non-blank line at p into row r: the next line's start, nullptr if malformed
// (whatever the reason; the row then holds garbage). Bytes up to `limit` may be read.
template <bool kGenerated>
const uint8_t* parse_line(const uint8_t* p, const uint8_t* limit, int64_t num_slots,
                          const LineOutputs& out, int64_t r) {
  uint64_t bits;
  bool ok;
  const uint8_t* start = p;
  p = read_int(p, limit, bits, ok);
  bool good = ok && p != start && bits <= 1;  // "-0" is 0, as in numpy
  if (!step(p, false)) return nullptr;
  out.labels[r] = static_cast<float>(bits);
  if constexpr (kGenerated) {
    double prob;
    p = read_prob(p, prob, ok);
    good &= ok;
    if (!step(p, false)) return nullptr;
    out.ptrue[r] = static_cast<float>(prob);
  }
  float* dense = out.dense + r * kNumDense;
  for (int64_t j = 0; j < kNumDense; ++j) {
    p = read_int(p, limit, bits, ok);
    good &= ok;
    if (!step(p, num_slots == 0 && j == kNumDense - 1)) return nullptr;
    const auto x = static_cast<int64_t>(bits);
    dense[j] = static_cast<float>(x > 0 ? x : 0);
  }
  int64_t* keys = out.keys + r * num_slots;
  bool* present = out.present + r * num_slots;
  for (int64_t j = 0; j < num_slots; ++j) {
    start = p;
    p = kGenerated ? read_int(p, limit, bits, ok) : read_hex(p, limit, bits, ok);
    good &= ok;
    present[j] = p != start;  // an empty field is no key
    if (!step(p, j == num_slots - 1)) return nullptr;
    keys[j] = static_cast<int64_t>(bits);
  }
  return good ? p : nullptr;
}

// Newlines in [p, end): memchr from one to the next (glibc's is SIMD; std::count is not
// vectorised well: measured 10x slower on Criteo lines).
int64_t count_lines(const uint8_t* p, const uint8_t* end) {
  int64_t n = 0;
  while ((p = static_cast<const uint8_t*>(std::memchr(p, '\n', end - p))) != nullptr) {
    ++n;
    ++p;
  }
  return n;
}

struct State {
  int64_t line = 0;  // 0-based index of the next line, blank lines counted
  int64_t rows = 0;  // good lines so far
  int64_t lines = 0;
  int64_t malformed = 0;
  int64_t first_bad_fields = -1;
  int64_t first_bad_value = -1;
  int64_t first_overlong = -1;
};

// Parses the lines of [p, end), whose last byte is '\n'.
template <bool kGenerated>
void parse_region(const uint8_t* p, const uint8_t* end, int64_t num_slots,
                  int64_t max_line_bytes, const LineOutputs& out, State& st) {
  const int64_t tabs_wanted = (kGenerated ? 2 : 1) + kNumDense + num_slots - 1;
  for (; p < end; ++st.line) {
    if (*p == '\n' || (*p == '\r' && p[1] == '\n')) {  // blank
      p += *p == '\n' ? 1 : 2;
      continue;
    }
    ++st.lines;
    const uint8_t* next = parse_line<kGenerated>(p, end, num_slots, out, st.rows);
    // a good line ends at next: its '\n' just before
    const auto* nl = next != nullptr
                         ? next - 1
                         : static_cast<const uint8_t*>(std::memchr(p, '\n', end - p));
    const bool overlong = nl - p > max_line_bytes;
    if (next != nullptr && !overlong) {
      ++st.rows;
      p = next;
      continue;
    }
    // malformed: too long whatever it holds, else the field count decides which way
    int64_t* first = &st.first_overlong;
    if (!overlong) {
      first = std::count(p, nl, '\t') == tabs_wanted ? &st.first_bad_value : &st.first_bad_fields;
    }
    if (*first < 0) *first = st.line;
    ++st.malformed;
    p = nl + 1;
  }
}

// [data, body) is whole lines; the tail after the last '\n' is parsed from a copy ending in
// one, so the readers can stop at a '\n' without checking for the buffer's end.
const uint8_t* body_end(const uint8_t* data, int64_t nbytes) {
  const auto* last_nl =
      nbytes ? static_cast<const uint8_t*>(memrchr(data, '\n', static_cast<size_t>(nbytes)))
             : nullptr;
  return last_nl == nullptr ? data : last_nl + 1;
}

}  // namespace

int64_t parse_capacity(const uint8_t* data, int64_t nbytes, int64_t num_slots) {
  if (nbytes < 0) throw std::invalid_argument("nbytes must be >= 0, got " + std::to_string(nbytes));
  if (num_slots < 0)
    throw std::invalid_argument("num_slots must be >= 0, got " + std::to_string(num_slots));
  const uint8_t* body = body_end(data, nbytes);
  return count_lines(data, body) + (body == data + nbytes ? 0 : 1);
}

LineCounts parse_lines(const uint8_t* data, int64_t nbytes, bool generated, int64_t num_slots,
                       int64_t max_line_bytes, const LineOutputs& out) {
  if (max_line_bytes < 0) {
    throw std::invalid_argument("max_line_bytes must be >= 0, got " +
                                std::to_string(max_line_bytes));
  }
  const uint8_t* end = data + nbytes;
  const uint8_t* body = body_end(data, nbytes);
  std::vector<uint8_t> tail(body, end);
  State st;
  auto region = generated ? parse_region<true> : parse_region<false>;
  region(data, body, num_slots, max_line_bytes, out, st);
  if (!tail.empty()) {
    tail.push_back('\n');
    region(tail.data(), tail.data() + tail.size(), num_slots, max_line_bytes, out, st);
  }
  LineCounts res;
  res.rows = st.rows;
  const size_t cells = static_cast<size_t>(st.rows * num_slots);
  res.all_present = cells == 0 || std::memchr(out.present, 0, cells) == nullptr;
  res.lines = st.lines;
  res.malformed = st.malformed;
  res.first_bad_fields = st.first_bad_fields;
  res.first_bad_value = st.first_bad_value;
  res.first_overlong = st.first_overlong;
  return res;
}

}  // namespace streamrec::trainer
