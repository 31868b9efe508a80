// The native Qwen3-MoE step on the CPU (engine/static_qwen3.py, `StaticQwen3.native_step`): the whole forward of a
// block of q tokens per sequence over the static KV cache, in one call, layer for layer the arithmetic of
// `StaticQwen3.forward` (and so of transformers' modules): embedding, then per layer RMSNorm, q/k/v projections,
// per-head q/k norms, rotary embedding, the cache write, attention over the filled slots under the block's tree
// (attention.h), the output projection, RMSNorm, the router's softmax and top-k, the routed experts (experts.h) or a
// dense SwiGLU MLP; then the final norm, the LM head and the hidden states an EAGLE-3 head reads.
//
// Why one native call rather than inductor's graph of the same forward: at the embedded default's widths the
// arithmetic of a step is a few hundred microseconds, and a compiled graph of 20 layers spent more than that around
// it (a C++ wrapper handing some 300 tensors and every intermediate through torch's C shim, MKL's small-matrix
// paths, one dispatcher call per op), more so for a block of several tokens than for one. Here the weights are
// held once (`qwen3_native_setup`), the intermediates are a few rows of scratch, and a weight matrix is read once a
// step for all the block's rows (register tiles, simd.h), never once per token.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "attention.h"
#include "experts.h"
#include "handles.h"
#include "layers.h"

namespace {

using namespace ecospec;

// A layer's weights in the list `qwen3_native_setup` takes (`StaticQwen3.native_weights`); an absent one (a bias,
// a dense layer's router) is an empty tensor. A dense layer's GATE_UP is [2I, H] (its gate and up rows stacked) and
// DOWN [H, I]; a MoE layer's are the experts' [N, 2I, H] and [N, H, I].
enum Slot { LN1, WQ, WK, WV, WO, BQ, BK, BV, BO, QNORM, KNORM, LN2, ROUTER, GATE_UP, DOWN, SLOTS };
// Head tensors: the embedding [V, H], the final norm [H], the LM head [V, H], rotary cos / sin tables [P, D].
enum Head { EMBED, NORM, LM_HEAD, COS, SIN, HEADS };

struct Model {
  std::vector<std::vector<at::Tensor>> layers;  // [L][SLOTS]
  std::vector<at::Tensor> k_cache, v_cache;     // per layer [rows, Hkv, S, D]
  at::Tensor routes, forced;                    // [L_moe, rows * S, k] long; forced: the same or empty
  std::vector<at::Tensor> head;                 // [HEADS]
  std::vector<int64_t> moe_row, hidden;         // per layer: its routes row (-1: dense); hidden-state indices
  std::vector<double> eps;                      // per layer: ln1, ln2, q_norm, k_norm; then the final norm
  int64_t heads = 0, kv_heads = 0, head_dim = 0, top_k = 0;
  bool norm_topk = false;
  double scale = 1.0;
};

Handles<Model> registry("ecospec native step");

// The router's top-k over token t's logits [N]: probabilities in float (softmax), the k largest in descending order
// (ties to the lower id), normalised over the k where the model says so; ids and weights written for the slots.
template <typename T>
void route(const T* logits, int64_t n, int64_t k, bool normalise, const int64_t* forced, int64_t* ids, T* weights,
           std::vector<float>& probs) {
  probs.resize(n);
  float most = -std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < n; ++e) most = std::max(most, static_cast<float>(logits[e]));
  float total = 0;
  for (int64_t e = 0; e < n; ++e) total += probs[e] = std::exp(static_cast<float>(logits[e]) - most);
  for (int64_t e = 0; e < n; ++e) probs[e] /= total;
  float top[64];
  TORCH_CHECK(k <= 64 && k <= n, "ecospec native step: top-k of ", k, " experts of ", n);
  if (forced)
    std::copy(forced, forced + k, ids);
  else
    top_k(probs.data(), n, k, ids);
  for (int64_t j = 0; j < k; ++j) top[j] = probs[ids[j]];
  float sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += top[j];
  for (int64_t j = 0; j < k; ++j) weights[j] = static_cast<T>(normalise ? top[j] / sum : top[j]);
}

template <typename T>
std::tuple<at::Tensor, at::Tensor> step(Model& m, const at::Tensor& tokens, const at::Tensor& pos,
                                        const at::Tensor& start_t, const at::Tensor& tree_t) {
  const int64_t B = tokens.size(0), Q = tokens.size(1), NT = B * Q;
  const at::Tensor& embed = m.head[EMBED];
  const int64_t H = embed.size(1), V = m.head[LM_HEAD].size(0), D = m.head_dim;
  const int64_t Hq = m.heads, Hkv = m.kv_heads, per_kv = Hq / Hkv, k = m.top_k;
  const int64_t rows = m.k_cache[0].size(0), S = m.k_cache[0].size(2), P = m.head[COS].size(0);
  TORCH_CHECK(B == rows, "ecospec native step: ", B, " sequences for a cache of ", rows, " rows");
  const int64_t* tok = tokens.data_ptr<int64_t>();
  const int64_t* ps = pos.data_ptr<int64_t>();
  const int64_t* starts = start_t.data_ptr<int64_t>();
  const bool* tree = tree_t.data_ptr<bool>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(starts[b] >= 0 && starts[b] + Q <= S, "ecospec native step: a block at slot ", starts[b],
                " overruns ", S, " slots");
  for (int64_t t = 0; t < NT; ++t) {
    TORCH_CHECK(tok[t] >= 0 && tok[t] < embed.size(0), "ecospec native step: token ", tok[t], " out of range");
    TORCH_CHECK(ps[t] >= 0 && ps[t] < P, "ecospec native step: position ", ps[t], " beyond ", P);
  }
  const auto opts = embed.options();
  auto logits = at::empty({B, Q, V}, opts);
  const int64_t F = H * static_cast<int64_t>(m.hidden.size());
  auto feats = at::empty({B, Q, F}, opts);
  T* fp = feats.data_ptr<T>();
  auto keep = [&](int64_t index, const T* x) {  // hidden state `index` into the features, if the drafter reads it
    for (size_t j = 0; j < m.hidden.size(); ++j)
      if (m.hidden[j] == index)
        for (int64_t t = 0; t < NT; ++t) std::memcpy(fp + t * F + j * H, x + t * H, H * sizeof(T));
  };

  std::vector<T> x(NT * H), h(NT * H), q(NT * Hq * D), kk(NT * Hkv * D), v(NT * Hkv * D), qh(NT * Hq * D),
      oh(NT * Hq * D), attn(NT * Hq * D), o(NT * H), tmp(D), wts(NT * k);
  std::vector<int64_t> ids(NT * k);
  std::vector<float> probs;
  std::vector<T> scores;
  const T* emb = embed.data_ptr<T>();
  for (int64_t t = 0; t < NT; ++t) std::memcpy(&x[t * H], emb + tok[t] * H, H * sizeof(T));
  keep(0, x.data());
  const T* cos_t = m.head[COS].data_ptr<T>();
  const T* sin_t = m.head[SIN].data_ptr<T>();
  const int64_t L = static_cast<int64_t>(m.layers.size());

  for (int64_t l = 0; l < L; ++l) {
    const auto& w = m.layers[l];
    const double* eps = &m.eps[4 * l];
    // attention
    for (int64_t t = 0; t < NT; ++t) rms(&x[t * H], w[LN1].data_ptr<T>(), H, eps[0], &h[t * H]);
    linear(h.data(), NT, w[WQ].data_ptr<T>(), Hq * D, H, q.data(), ptr<T>(w[BQ]));
    linear(h.data(), NT, w[WK].data_ptr<T>(), Hkv * D, H, kk.data(), ptr<T>(w[BK]));
    linear(h.data(), NT, w[WV].data_ptr<T>(), Hkv * D, H, v.data(), ptr<T>(w[BV]));
    T* kc = m.k_cache[l].data_ptr<T>();
    T* vc = m.v_cache[l].data_ptr<T>();
    for (int64_t t = 0; t < NT; ++t) {
      const int64_t b = t / Q, i = t % Q;
      const T* cs = cos_t + ps[t] * D;
      const T* sn = sin_t + ps[t] * D;
      for (int64_t hh = 0; hh < Hq; ++hh) {
        T* row = &q[(t * Hq + hh) * D];
        rms(row, w[QNORM].data_ptr<T>(), D, eps[2], row);
        rope(row, cs, sn, D, tmp.data());
        std::memcpy(&qh[((b * Hq + hh) * Q + i) * D], row, D * sizeof(T));  // [B, Hq, Q, D]
      }
      const int64_t slot = starts[b] + i;
      for (int64_t g = 0; g < Hkv; ++g) {
        T* row = &kk[(t * Hkv + g) * D];
        rms(row, w[KNORM].data_ptr<T>(), D, eps[3], row);
        rope(row, cs, sn, D, tmp.data());
        std::memcpy(kc + ((b * Hkv + g) * S + slot) * D, row, D * sizeof(T));
        std::memcpy(vc + ((b * Hkv + g) * S + slot) * D, &v[(t * Hkv + g) * D], D * sizeof(T));
      }
    }
    for (int64_t b = 0; b < B; ++b) {
      const int64_t seen = starts[b] + Q, n = per_kv * Q;
      scores.resize(n * seen);
      for (int64_t g = 0; g < Hkv; ++g) {
        const int64_t first = (b * Hq + g * per_kv) * Q * D;
        attend<T>(&qh[first], kc + (b * Hkv + g) * S * D, vc + (b * Hkv + g) * S * D, n, Q, seen, D, starts[b],
                  tree + b * Q * Q, static_cast<T>(m.scale), &oh[first], scores.data());
      }
    }
    for (int64_t t = 0; t < NT; ++t)  // [B, Hq, Q, D] -> [B * Q, Hq * D]
      for (int64_t hh = 0; hh < Hq; ++hh)
        std::memcpy(&attn[(t * Hq + hh) * D], &oh[(((t / Q) * Hq + hh) * Q + t % Q) * D], D * sizeof(T));
    linear(attn.data(), NT, w[WO].data_ptr<T>(), H, Hq * D, o.data(), ptr<T>(w[BO]));
    for (int64_t i = 0; i < NT * H; ++i) x[i] += o[i];
    // the MLP: routed experts or a dense SwiGLU
    for (int64_t t = 0; t < NT; ++t) rms(&x[t * H], w[LN2].data_ptr<T>(), H, eps[1], &h[t * H]);
    std::fill(o.begin(), o.end(), T(0));
    const at::Tensor& gu = w[GATE_UP];
    const at::Tensor& dn = w[DOWN];
    if (m.moe_row[l] >= 0) {
      const int64_t N = gu.size(0), inter = dn.size(2);
      std::vector<T> router(NT * N);
      linear(h.data(), NT, w[ROUTER].data_ptr<T>(), N, H, router.data(), static_cast<const T*>(nullptr));
      int64_t* out_ids = m.routes.data_ptr<int64_t>() + m.moe_row[l] * m.routes.size(1) * k;
      const int64_t* forced = m.forced.numel() ? m.forced.data_ptr<int64_t>() + m.moe_row[l] * m.forced.size(1) * k
                                               : nullptr;
      for (int64_t t = 0; t < NT; ++t) {
        route(&router[t * N], N, k, m.norm_topk, forced ? forced + t * k : nullptr, &ids[t * k], &wts[t * k], probs);
        std::memcpy(out_ids + t * k, &ids[t * k], k * sizeof(int64_t));
      }
      const Groups g = group(ids.data(), NT * k, N);
      experts_into<T>(h.data(), H, g, wts.data(), gu.data_ptr<T>(), dn.data_ptr<T>(), inter, k, o.data());
    } else {
      const int64_t inter = dn.size(1);
      Groups g;  // every token one slot of the one "expert", weight 1
      g.start = {0, NT};
      g.slot.resize(NT);
      for (int64_t t = 0; t < NT; ++t) g.slot[t] = t;
      std::vector<T> ones(NT, T(1));
      experts_into<T>(h.data(), H, g, ones.data(), gu.data_ptr<T>(), dn.data_ptr<T>(), inter, 1, o.data());
    }
    for (int64_t i = 0; i < NT * H; ++i) x[i] += o[i];
    if (l + 1 < L) keep(l + 1, x.data());
  }
  for (int64_t t = 0; t < NT; ++t) rms(&x[t * H], m.head[NORM].data_ptr<T>(), H, m.eps[4 * L], &h[t * H]);
  keep(L, h.data());
  linear(h.data(), NT, m.head[LM_HEAD].data_ptr<T>(), V, H, logits.data_ptr<T>(), static_cast<const T*>(nullptr));
  return {logits, feats};
}

}  // namespace

int64_t qwen3_native_setup(at::TensorList weights, at::TensorList k_cache, at::TensorList v_cache,
                           const at::Tensor& routes, const at::Tensor& forced, at::TensorList head,
                           at::IntArrayRef moe_row, at::IntArrayRef hidden, at::ArrayRef<double> eps,
                           at::IntArrayRef dims, double scale) {
  const int64_t L = static_cast<int64_t>(moe_row.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == L * SLOTS, "ecospec native step: ", weights.size(),
              " weights for ", L, " layers of ", static_cast<int>(SLOTS));
  TORCH_CHECK(head.size() == HEADS && dims.size() == 5 && static_cast<int64_t>(eps.size()) == 4 * L + 1,
              "ecospec native step: head tensors, dims or epsilons of the wrong length");
  auto m = std::make_unique<Model>();
  const auto dtype = head[EMBED].scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "ecospec native step: float32 or float64 weights");
  for (int64_t l = 0; l < L; ++l) {
    std::vector<at::Tensor> layer;
    for (int s = 0; s < SLOTS; ++s) {
      const at::Tensor& t = weights[l * SLOTS + s];
      TORCH_CHECK(t.numel() == 0 || (t.is_contiguous() && t.scalar_type() == dtype && t.device().is_cpu()),
                  "ecospec native step: layer ", l, " weight ", s, " is not a contiguous CPU tensor of the model's dtype");
      layer.push_back(t);
    }
    m->layers.push_back(std::move(layer));
  }
  for (const auto& t : head) TORCH_CHECK(t.is_contiguous() && t.scalar_type() == dtype, "ecospec native step: head");
  for (size_t l = 0; l < k_cache.size(); ++l)
    TORCH_CHECK(k_cache[l].is_contiguous() && v_cache[l].is_contiguous(), "ecospec native step: caches");
  TORCH_CHECK(routes.is_contiguous() && routes.scalar_type() == at::kLong, "ecospec native step: routes");
  m->k_cache.assign(k_cache.begin(), k_cache.end());
  m->v_cache.assign(v_cache.begin(), v_cache.end());
  m->routes = routes;
  m->forced = forced;
  m->head.assign(head.begin(), head.end());
  m->moe_row.assign(moe_row.begin(), moe_row.end());
  m->hidden.assign(hidden.begin(), hidden.end());
  m->eps.assign(eps.begin(), eps.end());
  m->heads = dims[0];
  m->kv_heads = dims[1];
  m->head_dim = dims[2];
  m->top_k = dims[3];
  m->norm_topk = dims[4] != 0;
  m->scale = scale;
  return registry.add(std::move(m));
}

std::tuple<at::Tensor, at::Tensor> qwen3_native_step(int64_t handle, const at::Tensor& tokens, const at::Tensor& pos,
                                                     const at::Tensor& start, const at::Tensor& tree) {
  Model& m = registry.get(handle);
  TORCH_CHECK(tokens.dim() == 2 && pos.sizes() == tokens.sizes() && start.dim() == 1 && tree.dim() == 3,
              "ecospec native step: tokens / pos [B, q], start [B], tree [B, q, q]");
  auto tok = tokens.to(at::kLong).contiguous();
  auto ps = pos.to(at::kLong).contiguous();
  auto st = start.to(at::kLong).contiguous();
  auto tr = tree.to(at::kBool).contiguous();
  if (m.head[EMBED].scalar_type() == at::kDouble) return step<double>(m, tok, ps, st, tr);
  return step<float>(m, tok, ps, st, tr);
}

// Each row's slots start[b] + src[b, j] of every layer's caches to start[b] + j (src [rows, γ]: the accepted path,
// then identity), gathered before written.
void qwen3_native_compact(int64_t handle, const at::Tensor& src_in, const at::Tensor& start_in) {
  Model& m = registry.get(handle);
  auto src = src_in.to(at::kLong).contiguous();
  auto start = start_in.to(at::kLong).contiguous();
  const int64_t rows = src.size(0), G = src.size(1);
  const int64_t* sp = src.data_ptr<int64_t>();
  const int64_t* st = start.data_ptr<int64_t>();
  for (auto* caches : {&m.k_cache, &m.v_cache})
    for (auto& cache : *caches) {
      const int64_t heads = cache.size(1), S = cache.size(2), bytes = cache.size(3) * cache.element_size();
      char* base = static_cast<char*>(cache.data_ptr());
      std::vector<char> tmp(G * bytes);
      for (int64_t b = 0; b < rows; ++b)
        for (int64_t hh = 0; hh < heads; ++hh) {
          char* slots = base + (b * heads + hh) * S * bytes;
          for (int64_t j = 0; j < G; ++j) std::memcpy(&tmp[j * bytes], slots + (st[b] + sp[b * G + j]) * bytes, bytes);
          std::memcpy(slots + st[b] * bytes, tmp.data(), G * bytes);
        }
    }
}

void qwen3_native_free(int64_t handle) {
  registry.drop(handle);
}

TORCH_LIBRARY_FRAGMENT(ecospec, m) {
  m.def("qwen3_native_setup(Tensor[] weights, Tensor[] k_cache, Tensor[] v_cache, Tensor routes, Tensor forced, "
        "Tensor[] head, int[] moe_row, int[] hidden, float[] eps, int[] dims, float scale) -> int",
        &qwen3_native_setup);
  m.def("qwen3_native_step(int handle, Tensor tokens, Tensor pos, Tensor start, Tensor tree) -> (Tensor, Tensor)",
        &qwen3_native_step);
  m.def("qwen3_native_compact(int handle, Tensor src, Tensor start) -> ()", &qwen3_native_compact);
  m.def("qwen3_native_free(int handle) -> ()", &qwen3_native_free);
}
