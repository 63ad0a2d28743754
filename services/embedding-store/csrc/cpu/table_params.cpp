// TableParams::finalize (the one validation of a table's params) and the check every op
// makes that it still holds.
#include "table_params.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace streamrec {
namespace {

// A row is at most kEmbedW + dim + 4 (embed state) + 2 dim (embedx state): below this dim
// no column index or row width overflows int64.
constexpr int64_t kMaxDim = (std::numeric_limits<int64_t>::max() - 16) / 3;

}  // namespace

void TableParams::finalize() {
  if (dim < 1 || dim > kMaxDim)
    throw std::invalid_argument("dim must be in [1, " + std::to_string(kMaxDim) +
                                "] (a larger one overflows the row width), got " +
                                std::to_string(dim));
  const int64_t ws1 = state_width(embed_rule.kind, 1);
  const int64_t ws2 = state_width(embedx_rule.kind, dim - 1);
  if (ws1 < 0 || ws2 < 0) throw std::invalid_argument("unknown optimizer rule kind");
  if (row_width(dtype, 0) < 0)
    throw std::invalid_argument("unknown row dtype " + std::to_string(dtype) +
                                " (0 fp32, 1 fp16, 2 bf16)");
  embed_state = kEmbedW + dim;
  embedx_state = embed_state + ws1;
  payload = dim + ws1 + ws2;
  width = row_width(dtype, payload);
}

bool TableParams::finalized() const {
  if (dim < 1 || dim > kMaxDim) return false;
  const int64_t ws1 = state_width(embed_rule.kind, 1);
  const int64_t ws2 = state_width(embedx_rule.kind, dim - 1);
  return ws1 >= 0 && ws2 >= 0 && row_width(dtype, 0) >= 0 && embed_state == kEmbedW + dim &&
         embedx_state == embed_state + ws1 && payload == dim + ws1 + ws2 &&
         width == row_width(dtype, payload);
}

}  // namespace streamrec
