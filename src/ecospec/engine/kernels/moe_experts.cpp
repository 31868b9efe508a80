// The compiled engine's routed experts on the CPU (ecospec::moe_experts, engine/static_qwen3.py): one call per MoE
// layer takes the block's tokens and their top-k ids and weights, groups the token-slots by expert, runs each expert
// that has slots once over all of them (its weights read once) and sums the weighted outputs per token in ascending
// expert order, as transformers' expert loop does. One path for every block size, the AR step's one token included.
//
// In C++, and as one op, because at the embedded default's widths (H = I = 64) the work around the arithmetic costs
// more than the arithmetic: the sort, scatter and index_add of a sorted-slot path were an ATen op each, and ATen's
// matmuls called per expert cost more than the expert's multiply-adds. The multiply-adds are small matrix products
// x [s, K] · W[rows, K]ᵀ computed in register tiles: a few weight rows against a few token rows at once, so that
// each loaded weight vector serves every row of the tile and the dot products' reductions run side by side instead
// of one dependent chain at a time; the SiLU's exponential is vectorised too.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "experts.h"

using namespace ecospec;

at::Tensor moe_experts(const at::Tensor& x_in, const at::Tensor& ids_in, const at::Tensor& weights_in,
                       const at::Tensor& gate_up_in, const at::Tensor& down_in) {
  TORCH_CHECK(x_in.device().is_cpu(), "ecospec::moe_experts runs on the CPU");
  auto x = x_in.contiguous();
  auto ids = ids_in.contiguous().to(at::kLong);
  auto weights = weights_in.contiguous().to(x.scalar_type());
  auto gate_up = gate_up_in.contiguous();  // a no-op for transformers' expert parameters
  auto down = down_in.contiguous();
  const int64_t k = ids.size(1), experts = gate_up.size(0);
  const Groups g = group(ids.data_ptr<int64_t>(), ids.numel(), experts);
  auto out = at::zeros_like(x);
  if (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "moe_experts",
                               [&] { experts_into<scalar_t>(x.data_ptr<scalar_t>(), x.size(1), g, weights.data_ptr<scalar_t>(),
                                                             gate_up.data_ptr<scalar_t>(), down.data_ptr<scalar_t>(),
                                                             down.size(2), k, out.data_ptr<scalar_t>()); });
    return out;
  }
  // half precisions: ATen's matmuls, which accumulate in float, and the per-token sum in the tensor's dtype
  const int64_t inter = gate_up.size(1) / 2;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t first = g.start[e], s = g.start[e + 1] - first;
    if (s == 0) continue;
    auto slot = at::from_blob(const_cast<int64_t*>(g.slot.data()) + first, {s}, at::kLong).clone();
    auto token = at::div(slot, k, "floor");
    auto h = at::mm(x.index_select(0, token), gate_up.select(0, e).t());
    auto act = at::silu(h.slice(1, 0, inter)) * h.slice(1, inter, 2 * inter);
    auto y = at::mm(act, down.select(0, e).t()) * weights.view(-1).index_select(0, slot).unsqueeze(1);
    out.index_add_(0, token, y);
  }
  return out;
}

// The CPU kernel of the op the Python side declares (torch.library.define in engine/static_qwen3.py): the compiled
// step's C++ wrapper then calls it through the dispatcher, with no trip through Python per layer.
TORCH_LIBRARY_IMPL(ecospec, CPU, m) { m.impl("moe_experts", &moe_experts); }

