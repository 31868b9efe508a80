// The compiled engine's attention on the CPU (ecospec::block_attention, engine/static_qwen3.py): a block of Q
// queries written at cache slots start .. start + Q - 1 attends to the committed slots before `start` and to the
// block's slots its row of `tree` [Q, Q] marks, and to nothing after them.
//
// In C++ because the static cache has a fixed number of slots, and scaled_dot_product_attention over a materialised
// mask reads and scores every one of them, the empty ones included, for every query: this kernel reads only the
// start + Q slots that hold keys, once for all the queries of a key-value head (grouped-query attention), scores
// them in register tiles (simd.h) and sums the values in one pass per query.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention.h"

using namespace ecospec;

// One sequence: q [Hq, Q, D], k_cache / v_cache [Hkv, S, D], start, tree [Q, Q] bool -> out [Hq, Q, D] (in `work`).
void attend_sequence(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t start,
                     const at::Tensor& tree, double scale, at::ScalarType work, at::Tensor& out) {
  const int64_t hq = q.size(0), Q = q.size(1), D = q.size(2), hkv = k_cache.size(0), S = k_cache.size(1);
  TORCH_CHECK(hq % hkv == 0, "ecospec::block_attention: ", hq, " query heads over ", hkv, " key-value heads");
  const int64_t L = start + Q;
  TORCH_CHECK(start >= 0 && L <= S, "ecospec::block_attention: a block at slot ", start, " overruns ", S, " slots");
  auto k = k_cache.slice(1, 0, L).to(work);  // the cache itself where it is in the working dtype: no copy
  auto v = v_cache.slice(1, 0, L).to(work);
  if (k.stride(2) != 1 || k.stride(1) != D) k = k.contiguous();
  if (v.stride(2) != 1 || v.stride(1) != D) v = v.contiguous();
  const int64_t group = hq / hkv, n = group * Q;
  AT_DISPATCH_FLOATING_TYPES(work, "block_attention", [&] {
    std::vector<scalar_t> p(n * L);
    for (int64_t g = 0; g < hkv; ++g)
      attend<scalar_t>(q.data_ptr<scalar_t>() + g * n * D, k.data_ptr<scalar_t>() + g * k.stride(0),
                       v.data_ptr<scalar_t>() + g * v.stride(0), n, Q, L, D, start, tree.data_ptr<bool>(),
                       static_cast<scalar_t>(scale), out.data_ptr<scalar_t>() + g * n * D, p.data());
  });
}

// q [B, Hq, Q, D], k_cache / v_cache [B, Hkv, S, D], start [B] long, tree [B, Q, Q] bool -> [B, Hq, Q, D]: each
// sequence of the batch at its own start, under its own tree.
at::Tensor block_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& start_in, const at::Tensor& tree_in, double scale) {
  TORCH_CHECK(q_in.device().is_cpu(), "ecospec::block_attention runs on the CPU");
  TORCH_CHECK(q_in.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4 && tree_in.dim() == 3,
              "ecospec::block_attention: q [B, Hq, Q, D], caches [B, Hkv, S, D], tree [B, Q, Q]");
  const int64_t B = q_in.size(0);
  const auto dtype = q_in.scalar_type();
  const bool native = dtype == at::kFloat || dtype == at::kDouble;  // half precisions: computed in float
  const auto work = native ? dtype : at::kFloat;
  auto q = q_in.to(work).contiguous();
  auto tree = tree_in.to(at::kBool).contiguous();
  auto start = start_in.to(at::kLong).contiguous();
  TORCH_CHECK(start.numel() == B, "ecospec::block_attention: ", start.numel(), " starts for ", B, " sequences");
  auto out = at::empty(q.sizes(), q.options());
  const int64_t* starts = start.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    auto out_b = out[b];
    attend_sequence(q[b], k_cache[b], v_cache[b], starts[b], tree[b], scale, work, out_b);
  }
  return native ? out : out.to(dtype);
}

TORCH_LIBRARY_IMPL(ecospec, CPU, m) { m.impl("block_attention", &block_attention); }
