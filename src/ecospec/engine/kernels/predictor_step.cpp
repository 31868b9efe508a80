// The native expert predictor on the CPU (engine/static_predictor.py, `StaticPredictor.native_step`): a step's pass
// in one call, the arithmetic of `StaticPredictor.forward` (and so of the eager predictor): the embedding and its
// projection, the backbone's decoder layers over the static cache (the block's window of slots after its first
// slot, each row seeing what `block` marks), the final norm at the rows asked for, the head's logits, and each
// layer's top-k experts packed into bitmask words (`engine.routing.pack_bitmasks`: word j holds bits 32j .. 32j + 31
// of a row's mask, bit layer * N + expert).
//
// Why native: the predictor reads a few hundred kilobytes a pass, yet its compiled graph took about as long as the
// target's AR step, most of it around its ops.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "attention.h"
#include "experts.h"
#include "handles.h"
#include "layers.h"

namespace {

using namespace ecospec;

// A backbone layer's tensors in the list `predictor_native_setup` takes (`StaticPredictor._native_setup`); an
// absent one (a bias, the q / k norms) is an empty tensor. GATE_UP is the MLP's gate and up rows stacked [2I, H].
enum Slot { LN1, WQ, WK, WV, WO, BQ, BK, BV, BO, QNORM, KNORM, LN2, GATE_UP, DOWN, B_GATE_UP, B_DOWN, SLOTS };
// The rest: the embedding [V, E], its projection [H, E] and bias, the final norm, the head [L N, H] and its bias,
// the rotary cos / sin tables [P, d].
enum Top { EMBED, PROJ, PROJ_BIAS, NORM, HEAD, HEAD_BIAS, COS, SIN, TOPS };

struct Predictor {
  std::vector<std::vector<at::Tensor>> layers;
  std::vector<at::Tensor> k_cache, v_cache, top;  // caches [kv heads, S, d] a layer
  std::vector<double> eps;                        // per layer: ln1, ln2, q_norm, k_norm; then the final norm
  int64_t heads = 0, kv_heads = 0, head_dim = 0, moe_layers = 0, experts = 0, top_k = 0;
  double scale = 1.0;
};

Handles<Predictor> registry("ecospec native predictor");

template <typename T>
at::Tensor step(Predictor& m, const int64_t* tokens, const int64_t* pos, const int64_t* slots, int64_t q,
                const bool* block, const int64_t* pick, int64_t r) {
  const auto& top = m.top;
  const int64_t H = top[PROJ].size(0), Hq = m.heads, Hkv = m.kv_heads, D = m.head_dim, per_kv = Hq / Hkv;
  const int64_t S = m.k_cache[0].size(1), P = top[COS].size(0), start = slots[0];
  TORCH_CHECK(start >= 0 && start + q <= S, "ecospec native predictor: a block at slot ", start, " overruns ", S);
  for (int64_t i = 0; i < q; ++i) {
    TORCH_CHECK(slots[i] >= 0 && slots[i] < S, "ecospec native predictor: slot ", slots[i], " of ", S);
    TORCH_CHECK(pos[i] >= 0 && pos[i] < P && tokens[i] >= 0 && tokens[i] < top[EMBED].size(0),
                "ecospec native predictor: a position or token out of range");
  }
  const int64_t E = top[EMBED].size(1);  // the embedding's width (the target's), projected to the backbone's
  std::vector<T> e(q * E), h(q * H), x(q * H), qs(q * Hq * D), ks(q * Hkv * D), vs(q * Hkv * D), qh(q * Hq * D),
      oh(q * Hq * D), attn(q * Hq * D), o(q * H), tmp(D), scores;
  const T* emb = top[EMBED].data_ptr<T>();
  for (int64_t i = 0; i < q; ++i) std::memcpy(&e[i * E], emb + tokens[i] * E, E * sizeof(T));
  linear(e.data(), q, top[PROJ].data_ptr<T>(), H, E, h.data(), ptr<T>(top[PROJ_BIAS]));
  const T* cos = top[COS].data_ptr<T>();
  const T* sin = top[SIN].data_ptr<T>();
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const auto& w = m.layers[l];
    const double* eps = &m.eps[4 * l];
    for (int64_t i = 0; i < q; ++i) rms(&h[i * H], w[LN1].data_ptr<T>(), H, eps[0], &x[i * H]);
    linear(x.data(), q, w[WQ].data_ptr<T>(), Hq * D, H, qs.data(), ptr<T>(w[BQ]));
    linear(x.data(), q, w[WK].data_ptr<T>(), Hkv * D, H, ks.data(), ptr<T>(w[BK]));
    linear(x.data(), q, w[WV].data_ptr<T>(), Hkv * D, H, vs.data(), ptr<T>(w[BV]));
    T* kc = m.k_cache[l].data_ptr<T>();
    T* vc = m.v_cache[l].data_ptr<T>();
    for (int64_t i = 0; i < q; ++i) {
      for (int64_t hh = 0; hh < Hq; ++hh) {
        T* row = &qs[(i * Hq + hh) * D];
        if (w[QNORM].numel()) rms(row, w[QNORM].data_ptr<T>(), D, eps[2], row);
        rope(row, cos + pos[i] * D, sin + pos[i] * D, D, tmp.data());
        std::memcpy(&qh[(hh * q + i) * D], row, D * sizeof(T));  // [Hq, q, D]
      }
      for (int64_t g = 0; g < Hkv; ++g) {
        T* row = &ks[(i * Hkv + g) * D];
        if (w[KNORM].numel()) rms(row, w[KNORM].data_ptr<T>(), D, eps[3], row);
        rope(row, cos + pos[i] * D, sin + pos[i] * D, D, tmp.data());
        std::memcpy(kc + (g * S + slots[i]) * D, row, D * sizeof(T));
        std::memcpy(vc + (g * S + slots[i]) * D, &vs[(i * Hkv + g) * D], D * sizeof(T));
      }
    }
    const int64_t n = per_kv * q;
    scores.resize(n * (start + q));
    for (int64_t g = 0; g < Hkv; ++g)
      attend<T>(&qh[g * n * D], kc + g * S * D, vc + g * S * D, n, q, start + q, D, start, block,
                static_cast<T>(m.scale), &oh[g * n * D], scores.data());
    for (int64_t i = 0; i < q; ++i)  // [Hq, q, D] -> [q, Hq * D]
      for (int64_t hh = 0; hh < Hq; ++hh) std::memcpy(&attn[(i * Hq + hh) * D], &oh[(hh * q + i) * D], D * sizeof(T));
    linear(attn.data(), q, w[WO].data_ptr<T>(), H, Hq * D, o.data(), ptr<T>(w[BO]));
    for (int64_t i = 0; i < q * H; ++i) h[i] += o[i];
    for (int64_t i = 0; i < q; ++i) rms(&h[i * H], w[LN2].data_ptr<T>(), H, eps[1], &x[i * H]);
    const int64_t inter = w[DOWN].size(1);
    std::vector<T> gu(q * 2 * inter), act(q * inter);
    linear(x.data(), q, w[GATE_UP].data_ptr<T>(), 2 * inter, H, gu.data(), ptr<T>(w[B_GATE_UP]));
    swiglu_rows(gu.data(), q, inter, act.data());
    linear(act.data(), q, w[DOWN].data_ptr<T>(), H, inter, o.data(), ptr<T>(w[B_DOWN]));
    for (int64_t i = 0; i < q * H; ++i) h[i] += o[i];
  }
  const int64_t L = m.moe_layers, N = m.experts, k = m.top_k, words = (L * N + 31) / 32;
  std::vector<T> normed(r * H), logits(r * L * N);
  for (int64_t j = 0; j < r; ++j) {
    TORCH_CHECK(pick[j] >= 0 && pick[j] < q, "ecospec native predictor: row ", pick[j], " of ", q);
    rms(&h[pick[j] * H], top[NORM].data_ptr<T>(), H, m.eps[4 * m.layers.size()], &normed[j * H]);
  }
  linear(normed.data(), r, top[HEAD].data_ptr<T>(), L * N, H, logits.data(), ptr<T>(top[HEAD_BIAS]));
  auto out = at::zeros({r, words}, at::TensorOptions().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  std::vector<int64_t> chosen(k);
  for (int64_t j = 0; j < r; ++j)
    for (int64_t l = 0; l < L; ++l) {
      const T* row = &logits[(j * L + l) * N];
      top_k(row, N, k, chosen.data());
      for (int64_t c = 0; c < k; ++c) {
        const int64_t bit = l * N + chosen[c];
        op[j * words + bit / 32] |= int64_t(1) << (bit % 32);
      }
    }
  return out;
}

}  // namespace

int64_t predictor_native_setup(at::TensorList weights, at::TensorList k_cache, at::TensorList v_cache,
                               at::TensorList top, at::IntArrayRef dims, at::ArrayRef<double> eps, double scale) {
  const int64_t L = static_cast<int64_t>(k_cache.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == L * SLOTS && top.size() == TOPS && dims.size() == 6 &&
                  static_cast<int64_t>(eps.size()) == 4 * L + 1,
              "ecospec native predictor: tensors, dims or epsilons of the wrong length");
  auto m = std::make_unique<Predictor>();
  const auto dtype = top[EMBED].scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "ecospec native predictor: float32 or float64 weights");
  auto check = [&](const at::Tensor& t) {
    TORCH_CHECK(t.numel() == 0 || (t.is_contiguous() && t.scalar_type() == dtype && t.device().is_cpu()),
                "ecospec native predictor: a tensor is not a contiguous CPU tensor of the predictor's dtype");
  };
  for (int64_t l = 0; l < L; ++l) {
    std::vector<at::Tensor> layer(weights.begin() + l * SLOTS, weights.begin() + (l + 1) * SLOTS);
    for (const auto& t : layer) check(t);
    m->layers.push_back(std::move(layer));
    check(k_cache[l]);
    check(v_cache[l]);
  }
  for (const auto& t : top) check(t);
  m->k_cache.assign(k_cache.begin(), k_cache.end());
  m->v_cache.assign(v_cache.begin(), v_cache.end());
  m->top.assign(top.begin(), top.end());
  m->eps.assign(eps.begin(), eps.end());
  m->heads = dims[0];
  m->kv_heads = dims[1];
  m->head_dim = dims[2];
  m->moe_layers = dims[3];
  m->experts = dims[4];
  m->top_k = dims[5];
  m->scale = scale;
  return registry.add(std::move(m));
}

at::Tensor predictor_native_step(int64_t handle, const at::Tensor& ints_in, const at::Tensor& block_in,
                                 const at::Tensor& pick_in) {
  Predictor& m = registry.get(handle);
  auto ints = ints_in.to(at::kLong).contiguous();
  auto block = block_in.to(at::kBool).contiguous();
  auto pick = pick_in.to(at::kLong).contiguous();
  const int64_t q = ints.size(1);
  TORCH_CHECK(ints.size(0) == 3 && block.size(0) == q && block.size(1) == q,
              "ecospec native predictor: ints [3, q], block [q, q]");
  const int64_t* ip = ints.data_ptr<int64_t>();
  if (m.top[EMBED].scalar_type() == at::kDouble)
    return step<double>(m, ip, ip + q, ip + 2 * q, q, block.data_ptr<bool>(), pick.data_ptr<int64_t>(), pick.numel());
  return step<float>(m, ip, ip + q, ip + 2 * q, q, block.data_ptr<bool>(), pick.data_ptr<int64_t>(), pick.numel());
}

void predictor_native_free(int64_t handle) {
  registry.drop(handle);
}

TORCH_LIBRARY_FRAGMENT(ecospec, m) {
  m.def("predictor_native_setup(Tensor[] weights, Tensor[] k_cache, Tensor[] v_cache, Tensor[] top, int[] dims, "
        "float[] eps, float scale) -> int",
        &predictor_native_setup);
  m.def("predictor_native_step(int handle, Tensor ints, Tensor block, Tensor pick) -> Tensor", &predictor_native_step);
  m.def("predictor_native_free(int handle) -> ()", &predictor_native_free);
}
