// The native EAGLE-3 head on the CPU (engine/static_eagle3.py, `StaticEagle3.native_draft_step` and
// `native_level_step`): a step's whole draft tree in one call, the arithmetic of `StaticEagle3.draft_step` and
// `level_step` (and so of the eager head): the begin pass over the entries a step accepted, then each tree level's
// beam through the decoder layer, the draft distribution's top-k at every head output, the next beam by cumulative
// probability in float64 (ties to the smaller index).
//
// Why native: the head reads about a quarter of the target's bytes a pass, yet its compiled graph spent most of a
// pass around its ops, so that on the CPU's native target a tree's drafting cost more than the verify pass it feeds.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <tuple>
#include <vector>

#include "attention.h"
#include "experts.h"
#include "handles.h"
#include "layers.h"

namespace {

using namespace ecospec;

// The head's tensors in the list `eagle3_native_setup` takes (`StaticEagle3._native_setup`); an absent one (the
// input norm, the q / k norms) is an empty tensor. QKV is the q, k and v projections stacked [(nq + 2 nk) d, 2H],
// GATE_UP the MLP's gate and up rows [2I, H]; COS / SIN the head's own rotary tables [P, d] (SIN with its first half
// negated, so that x · cos + roll(x, d / 2) · sin rotates).
enum W { FC, QKV, O, GATE_UP, DOWN, HIDDEN_NORM, INPUT_LN, POST_LN, NORM, LM_HEAD, D2T, EMBED, INPUT_NORM, Q_NORM,
         K_NORM, COS, SIN, WEIGHTS };

struct Head {
  std::vector<at::Tensor> w;
  at::Tensor k_cache, v_cache, node_out;  // [nk, S, d] each; [1 + window, H]
  int64_t nq = 0, nk = 0, d = 0, topk = 0;
  double eps = 0;
  bool norm_before_residual = false, mapped = false;
};

Handles<Head> registry("ecospec native head");

// The decoder layer over q head inputs `hidden` [q, H] with their tokens, at positions `pos`, their keys written at
// cache slots `slots`, query i seeing every slot before `start` and window slot j where block[i * W + j] is set
// -> out [q, H].
template <typename T>
void layer(Head& m, const T* hidden, const int64_t* tokens, const int64_t* pos, const int64_t* slots, int64_t start,
           const bool* block, int64_t W, int64_t q, T* out) {
  const auto& w = m.w;
  const int64_t H = w[O].size(0), nq = m.nq, nk = m.nk, d = m.d, heads = nq + 2 * nk, S = m.k_cache.size(1);
  const int64_t inter = w[DOWN].size(1), P = w[COS].size(0);
  TORCH_CHECK(start >= 0 && start + W <= S, "ecospec native head: a window at slot ", start, " overruns ", S);
  std::vector<T> normed(q * H), x(q * 2 * H), qkv(q * heads * d), qh(q * nq * d), oh(q * nq * d), attn(q * nq * d),
      h(q * H), tmp(d), gu(q * 2 * inter), act(q * inter), y(q * H), scores;
  const T* emb = w[EMBED].data_ptr<T>();
  for (int64_t i = 0; i < q; ++i) {
    TORCH_CHECK(pos[i] >= 0 && pos[i] < P && slots[i] >= 0 && slots[i] < S, "ecospec native head: position ",
                pos[i], " or slot ", slots[i], " out of range");
    rms_same(hidden + i * H, w[HIDDEN_NORM].data_ptr<T>(), H, m.eps, &normed[i * H]);
    rms_same(emb + tokens[i] * H, w[INPUT_LN].data_ptr<T>(), H, m.eps, &x[i * 2 * H]);
    std::memcpy(&x[i * 2 * H + H], &normed[i * H], H * sizeof(T));
  }
  linear(x.data(), q, w[QKV].data_ptr<T>(), heads * d, 2 * H, qkv.data(), static_cast<const T*>(nullptr));
  T* kc = m.k_cache.data_ptr<T>();
  T* vc = m.v_cache.data_ptr<T>();
  const T* cos = w[COS].data_ptr<T>();
  const T* sin = w[SIN].data_ptr<T>();
  for (int64_t i = 0; i < q; ++i)
    for (int64_t hh = 0; hh < nq + nk; ++hh) {  // the q and k heads: their norms, then the rotation
      T* row = &qkv[(i * heads + hh) * d];
      if (w[Q_NORM].numel()) rms_same(row, (hh < nq ? w[Q_NORM] : w[K_NORM]).data_ptr<T>(), d, m.eps, row);
      for (int64_t j = 0; j < d; ++j) tmp[j] = row[(j + d / 2) % d];
      for (int64_t j = 0; j < d; ++j) row[j] = row[j] * cos[pos[i] * d + j] + tmp[j] * sin[pos[i] * d + j];
      if (hh < nq) std::memcpy(&qh[(hh * q + i) * d], row, d * sizeof(T));  // [nq, q, d]
      else std::memcpy(kc + ((hh - nq) * S + slots[i]) * d, row, d * sizeof(T));
    }
  for (int64_t i = 0; i < q; ++i)
    for (int64_t g = 0; g < nk; ++g)
      std::memcpy(vc + (g * S + slots[i]) * d, &qkv[(i * heads + nq + nk + g) * d], d * sizeof(T));
  const int64_t per_kv = nq / nk, n = per_kv * q, L = start + W;
  scores.resize(n * L);
  for (int64_t g = 0; g < nk; ++g)
    attend<T>(&qh[g * n * d], kc + g * S * d, vc + g * S * d, n, q, L, d, start, block,
              static_cast<T>(1.0 / std::sqrt(static_cast<double>(d))), &oh[g * n * d], scores.data());
  for (int64_t i = 0; i < q; ++i)  // [nq, q, d] -> [q, nq * d]
    for (int64_t hh = 0; hh < nq; ++hh) std::memcpy(&attn[(i * nq + hh) * d], &oh[(hh * q + i) * d], d * sizeof(T));
  linear(attn.data(), q, w[O].data_ptr<T>(), H, nq * d, h.data(), static_cast<const T*>(nullptr));
  const T* residual = m.norm_before_residual ? normed.data() : hidden;
  for (int64_t i = 0; i < q * H; ++i) h[i] += residual[i];
  for (int64_t i = 0; i < q; ++i) rms_same(&h[i * H], w[POST_LN].data_ptr<T>(), H, m.eps, &y[i * H]);
  linear(y.data(), q, w[GATE_UP].data_ptr<T>(), 2 * inter, H, gu.data(), static_cast<const T*>(nullptr));
  swiglu_rows(gu.data(), q, inter, act.data());
  linear(act.data(), q, w[DOWN].data_ptr<T>(), H, inter, y.data(), static_cast<const T*>(nullptr));
  for (int64_t i = 0; i < q * H; ++i) out[i] = h[i] + y[i];
}

// The draft distribution's top-k at head outputs `out` [r, H]: log-probabilities `vals` [r, k] and target ids
// `ids` [r, k] (ties to the smaller id), and the logits over `temperature` [r, V] written to `logits`.
template <typename T>
void children(Head& m, const T* out, int64_t r, T temperature, T* vals, int64_t* ids, T* logits) {
  const auto& w = m.w;
  const int64_t H = w[O].size(0), V = w[LM_HEAD].size(0), k = m.topk;
  std::vector<T> normed(r * H);
  for (int64_t i = 0; i < r; ++i) rms_same(out + i * H, w[NORM].data_ptr<T>(), H, m.eps, &normed[i * H]);
  linear(normed.data(), r, w[LM_HEAD].data_ptr<T>(), V, H, logits, static_cast<const T*>(nullptr));
  const int64_t* d2t = w[D2T].data_ptr<int64_t>();
  for (int64_t i = 0; i < r; ++i) {
    T* row = logits + i * V;
    T most = -std::numeric_limits<T>::infinity();
    for (int64_t v = 0; v < V; ++v) {
      row[v] /= temperature;
      most = std::max(most, row[v]);
    }
    T total = 0;
    int64_t v = 0;
    if constexpr (std::is_same_v<T, float>) {  // the draft vocabulary's exponentials, a vector at a time
      vf sum = {};
      for (; v + kLanes <= V; v += kLanes) sum += vexp(load(row + v) - most);
      for (int l = 0; l < kLanes; ++l) total += sum[l];
    }
    for (; v < V; ++v) total += std::exp(row[v] - most);
    const T shift = most + std::log(total);
    top_k(row, V, k, ids + i * k);
    for (int64_t j = 0; j < k; ++j) {
      vals[i * k + j] = row[ids[i * k + j]] - shift;
      if (m.mapped) ids[i * k + j] += d2t[ids[i * k + j]];
    }
  }
}

template <typename T>
std::tuple<at::Tensor, at::Tensor, at::Tensor> level(Head& m, const at::Tensor& parents, const at::Tensor& tokens,
                                                     const at::Tensor& pos, const at::Tensor& slots, int64_t start,
                                                     const at::Tensor& block, const at::Tensor& rows, T temperature) {
  const int64_t q = tokens.size(0), H = m.node_out.size(1), W = block.size(1), k = m.topk;
  const int64_t V = m.w[LM_HEAD].size(0);
  T* node = m.node_out.data_ptr<T>();
  std::vector<T> hidden(q * H), out(q * H);
  const int64_t* par = parents.data_ptr<int64_t>();
  for (int64_t i = 0; i < q; ++i) std::memcpy(&hidden[i * H], node + par[i] * H, H * sizeof(T));
  layer<T>(m, hidden.data(), tokens.data_ptr<int64_t>(), pos.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), start,
           block.data_ptr<bool>(), W, q, out.data());
  const int64_t* rw = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < q; ++i) std::memcpy(node + rw[i] * H, &out[i * H], H * sizeof(T));
  auto opts = m.node_out.options();
  auto vals = at::empty({q, k}, opts), logits = at::empty({q, V}, opts);
  auto ids = at::empty({q, k}, opts.dtype(at::kLong));
  children<T>(m, out.data(), q, temperature, vals.data_ptr<T>(), ids.data_ptr<int64_t>(), logits.data_ptr<T>());
  return {vals, ids, logits};
}

template <typename T>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> draft(Head& m, const at::Tensor& feats,
                                                                 const at::Tensor& tokens, const at::Tensor& pos,
                                                                 int64_t start, const at::Tensor& block, int64_t pick,
                                                                 const at::Tensor& temperatures, int64_t depth) {
  const auto& w = m.w;
  const int64_t g = tokens.size(0), F = feats.size(1), H = m.node_out.size(1), W = block.size(1), k = m.topk;
  const int64_t V = w[LM_HEAD].size(0);
  TORCH_CHECK(depth >= 1 && depth <= temperatures.size(0), "ecospec native head: depth ", depth);
  TORCH_CHECK(pick >= 0 && pick < g, "ecospec native head: root row ", pick, " of ", g);
  const T* temps = temperatures.data_ptr<T>();
  // begin: the fc over the target's features, the layer over the accepted entries, the root's children
  std::vector<T> fin(g * F), hidden(g * H), out(g * H);
  const T* fp = feats.data_ptr<T>();
  if (w[INPUT_NORM].numel())
    for (int64_t i = 0; i < g; ++i) rms_same(fp + i * F, w[INPUT_NORM].data_ptr<T>(), F, m.eps, &fin[i * F]);
  else
    std::memcpy(fin.data(), fp, g * F * sizeof(T));
  linear(fin.data(), g, w[FC].data_ptr<T>(), H, F, hidden.data(), static_cast<const T*>(nullptr));
  const int64_t* ps = pos.data_ptr<int64_t>();
  layer<T>(m, hidden.data(), tokens.data_ptr<int64_t>(), ps, ps, start, block.data_ptr<bool>(), W, g, out.data());
  T* node = m.node_out.data_ptr<T>();
  std::memcpy(node, &out[pick * H], H * sizeof(T));
  const int64_t levels = depth - 1, nv = k + levels * k * k;
  auto opts = m.node_out.options();
  auto vals = at::empty({nv}, opts), logits = at::empty({1 + levels * k, V}, opts);
  auto ids = at::empty({nv}, opts.dtype(at::kLong));
  auto beams = at::empty({std::max<int64_t>(levels - 1, 0), k}, opts.dtype(at::kLong));
  T* vp = vals.data_ptr<T>();
  int64_t* ip = ids.data_ptr<int64_t>();
  T* lp = logits.data_ptr<T>();
  children<T>(m, node, 1, temps[0], vp, ip, lp);
  // the levels: each beam's k nodes through the layer, their children, the next beam
  const int64_t n = start + pick + 1;
  std::vector<int64_t> beam_tokens(ip, ip + k), beam_rows(k, 0), lv_pos(k, n), lv_slots(k), lv_rows(k),
      order(k * k);
  std::vector<double> beam_prob(k), probs(k * k);
  for (int64_t j = 0; j < k; ++j) beam_prob[j] = std::exp(static_cast<double>(vp[j]));
  std::vector<char> beam_block(k * W, 0), next_block(k * W);
  std::vector<T> lv_hidden(k * H), lv_out(k * H);
  int64_t* bp = beams.data_ptr<int64_t>();
  for (int64_t lvl = 1; lvl < depth; ++lvl) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = (lvl - 1) * k + j;  // the level's slots in the window
      beam_block[j * W + slot] = 1;
      lv_pos[j] = n - 1 + lvl;
      lv_slots[j] = n + slot;
      lv_rows[j] = 1 + slot;
      std::memcpy(&lv_hidden[j * H], node + beam_rows[j] * H, H * sizeof(T));
    }
    layer<T>(m, lv_hidden.data(), beam_tokens.data(), lv_pos.data(), lv_slots.data(), n,
             reinterpret_cast<const bool*>(beam_block.data()), W, k, lv_out.data());
    for (int64_t j = 0; j < k; ++j) std::memcpy(node + lv_rows[j] * H, &lv_out[j * H], H * sizeof(T));
    T* lv_vals = vp + k + (lvl - 1) * k * k;
    int64_t* lv_ids = ip + k + (lvl - 1) * k * k;
    children<T>(m, lv_out.data(), k, temps[lvl], lv_vals, lv_ids, lp + (1 + (lvl - 1) * k) * V);
    if (lvl == depth - 1) break;
    for (int64_t c = 0; c < k * k; ++c) probs[c] = beam_prob[c / k] * std::exp(static_cast<double>(lv_vals[c]));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return probs[a] > probs[b]; });
    for (int64_t j = 0; j < k; ++j) {
      const int64_t c = order[j], parent = c / k;
      bp[(lvl - 1) * k + j] = c;
      std::memcpy(&next_block[j * W], &beam_block[parent * W], W);
      beam_tokens[j] = lv_ids[c];
      beam_rows[j] = lv_rows[parent];
      beam_prob[j] = probs[c];
    }
    beam_block.swap(next_block);
  }
  return {vals, ids, beams, logits};
}

template <typename T>
T scalar(const at::Tensor& t) {
  return t.to(c10::CppTypeToScalarType<T>::value).template item<T>();
}

}  // namespace

int64_t eagle3_native_setup(at::TensorList weights, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& node_out, at::IntArrayRef dims, double eps) {
  TORCH_CHECK(weights.size() == WEIGHTS && dims.size() == 6, "ecospec native head: ", weights.size(), " tensors");
  auto m = std::make_unique<Head>();
  const auto dtype = node_out.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "ecospec native head: float32 or float64 weights");
  for (int s = 0; s < WEIGHTS; ++s) {
    const at::Tensor& t = weights[s];
    const auto want = s == D2T ? at::kLong : dtype;
    TORCH_CHECK(t.numel() == 0 || (t.is_contiguous() && t.scalar_type() == want && t.device().is_cpu()),
                "ecospec native head: tensor ", s, " is not a contiguous CPU tensor of the head's dtype");
    m->w.push_back(t);
  }
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && node_out.is_contiguous(),
              "ecospec native head: caches");
  m->k_cache = k_cache;
  m->v_cache = v_cache;
  m->node_out = node_out;
  m->nq = dims[0];
  m->nk = dims[1];
  m->d = dims[2];
  m->topk = dims[3];
  m->norm_before_residual = dims[4] != 0;
  m->mapped = dims[5] != 0;
  m->eps = eps;
  return registry.add(std::move(m));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> eagle3_native_draft(
    int64_t handle, const at::Tensor& feats, const at::Tensor& tokens, const at::Tensor& pos, const at::Tensor& start,
    const at::Tensor& block, const at::Tensor& pick, const at::Tensor& temperatures, int64_t depth) {
  Head& m = registry.get(handle);
  auto tok = tokens.to(at::kLong).contiguous();
  auto ps = pos.to(at::kLong).contiguous();
  auto blk = block.to(at::kBool).contiguous();
  auto f = feats.contiguous();
  const int64_t s = start.item<int64_t>(), p = pick.reshape(-1)[0].item<int64_t>();
  if (m.node_out.scalar_type() == at::kDouble)
    return draft<double>(m, f, tok, ps, s, blk, p, temperatures.to(at::kDouble).contiguous(), depth);
  return draft<float>(m, f, tok, ps, s, blk, p, temperatures.to(at::kFloat).contiguous(), depth);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> eagle3_native_level(int64_t handle, const at::Tensor& parents,
                                                                   const at::Tensor& tokens, const at::Tensor& pos,
                                                                   const at::Tensor& slots, const at::Tensor& start,
                                                                   const at::Tensor& block, const at::Tensor& rows,
                                                                   const at::Tensor& temperature) {
  Head& m = registry.get(handle);
  auto args = std::make_tuple(parents.to(at::kLong).contiguous(), tokens.to(at::kLong).contiguous(),
                              pos.to(at::kLong).contiguous(), slots.to(at::kLong).contiguous(),
                              block.to(at::kBool).contiguous(), rows.to(at::kLong).contiguous());
  const int64_t s = start.item<int64_t>();
  const auto& [par, tok, ps, sl, blk, rw] = args;
  if (m.node_out.scalar_type() == at::kDouble)
    return level<double>(m, par, tok, ps, sl, s, blk, rw, scalar<double>(temperature));
  return level<float>(m, par, tok, ps, sl, s, blk, rw, scalar<float>(temperature));
}

void eagle3_native_free(int64_t handle) {
  registry.drop(handle);
}

TORCH_LIBRARY_FRAGMENT(ecospec, m) {
  m.def("eagle3_native_setup(Tensor[] weights, Tensor k_cache, Tensor v_cache, Tensor node_out, int[] dims, "
        "float eps) -> int",
        &eagle3_native_setup);
  m.def("eagle3_native_draft(int handle, Tensor feats, Tensor tokens, Tensor pos, Tensor start, Tensor block, "
        "Tensor pick, Tensor temperatures, int depth) -> (Tensor, Tensor, Tensor, Tensor)",
        &eagle3_native_draft);
  m.def("eagle3_native_level(int handle, Tensor parents, Tensor tokens, Tensor pos, Tensor slots, Tensor start, "
        "Tensor block, Tensor rows, Tensor temperature) -> (Tensor, Tensor, Tensor)",
        &eagle3_native_level);
  m.def("eagle3_native_free(int handle) -> ()", &eagle3_native_free);
}
