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

#include "simd.h"

namespace {

using namespace ecospec;

// act [s, I] = silu(h[:, :I]) · h[:, I:], h [s, 2I].
void swiglu(const float* h, int64_t s, int64_t inter, float* act) {
  for (int64_t r = 0; r < s; ++r)
    for (int64_t o = 0; o < inter; o += kLanes) {
      const vf g = load(h + r * 2 * inter + o), u = load(h + r * 2 * inter + inter + o);
      const vf a = g / (1.0f + vexp(-g)) * u;
      store(act + r * inter + o, a);
    }
}

template <typename T>
void swiglu_plain(const T* h, int64_t s, int64_t inter, T* act) {
  for (int64_t r = 0; r < s; ++r)
    for (int64_t o = 0; o < inter; ++o) {
      const T g = h[r * 2 * inter + o];
      act[r * inter + o] = g / (T(1) + std::exp(-g)) * h[r * 2 * inter + inter + o];
    }
}

// Slots (token t, choice j) grouped by expert, experts ascending, token order kept within an expert.
struct Groups {
  std::vector<int64_t> start;  // [N + 1]: expert e's slots are slot[start[e] .. start[e + 1])
  std::vector<int64_t> slot;   // t * k + j
};

Groups group(const int64_t* ids, int64_t slots, int64_t experts) {
  Groups g;
  g.start.assign(experts + 1, 0);
  for (int64_t i = 0; i < slots; ++i) {
    TORCH_CHECK(ids[i] >= 0 && ids[i] < experts, "ecospec::moe_experts: expert id ", ids[i], " out of range");
    ++g.start[ids[i] + 1];
  }
  for (int64_t e = 0; e < experts; ++e) g.start[e + 1] += g.start[e];
  g.slot.resize(slots);
  std::vector<int64_t> next(g.start.begin(), g.start.end() - 1);
  for (int64_t i = 0; i < slots; ++i) g.slot[next[ids[i]]++] = i;
  return g;
}

template <typename T>
void all_experts(const at::Tensor& x, const Groups& g, const at::Tensor& weights, const at::Tensor& gate_up,
                 const at::Tensor& down, int64_t k, at::Tensor& out) {
  const int64_t hid = x.size(1), inter = down.size(2);
  const T* xp = x.data_ptr<T>();
  const T* wp = weights.data_ptr<T>();
  const T* gu = gate_up.data_ptr<T>();
  const T* dn = down.data_ptr<T>();
  T* op = out.data_ptr<T>();
  bool tiled = false;
  if constexpr (std::is_same_v<T, float>) tiled = hid % kLanes == 0 && inter % kLanes == 0;  // the reduced widths
  int64_t most = 0;  // the most slots of one expert (a token may name an expert twice: forced routing does)
  for (size_t e = 0; e + 1 < g.start.size(); ++e) most = std::max(most, g.start[e + 1] - g.start[e]);
  std::vector<T> rows(most * hid), h(most * 2 * inter), act(most * inter), y(most * hid);
  for (size_t e = 0; e + 1 < g.start.size(); ++e) {
    const int64_t first = g.start[e], s = g.start[e + 1] - first;
    if (s == 0) continue;  // an expert without slots is never read
    for (int64_t r = 0; r < s; ++r) std::memcpy(&rows[r * hid], xp + g.slot[first + r] / k * hid, hid * sizeof(T));
    const T* wg = gu + e * 2 * inter * hid;
    const T* wd = dn + e * hid * inter;
    if constexpr (std::is_same_v<T, float>) {
      if (tiled) {
        rows_times(rows.data(), s, wg, 2 * inter, hid, h.data(), 2 * inter);
        swiglu(h.data(), s, inter, act.data());
        rows_times(act.data(), s, wd, hid, inter, y.data(), hid);
      }
    }
    if (!tiled) {
      rows_times_plain<T>(rows.data(), s, wg, 2 * inter, hid, h.data());
      swiglu_plain<T>(h.data(), s, inter, act.data());
      rows_times_plain<T>(act.data(), s, wd, hid, inter, y.data());
    }
    for (int64_t r = 0; r < s; ++r) {
      const int64_t i = g.slot[first + r];
      T* o = op + i / k * hid;
      const T wt = wp[i];
      for (int64_t c = 0; c < hid; ++c) o[c] += y[r * hid + c] * wt;
    }
  }
}

}  // namespace

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
                               [&] { all_experts<scalar_t>(x, g, weights, gate_up, down, k, out); });
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

