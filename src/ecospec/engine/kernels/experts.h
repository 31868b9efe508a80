// Routed SwiGLU experts over a block's token-slots, shared by ecospec::moe_experts (moe_experts.cpp) and the native
// Qwen3-MoE step (qwen3_step.cpp): the slots grouped by expert, each expert that has slots run once over all of them
// (its weights read once) and each token's weighted outputs summed in ascending expert order, as transformers' expert
// loop does.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace ecospec {

// act [s, I] = silu(h[:, :I]) · h[:, I:], h [s, 2I].
inline void swiglu(const float* h, int64_t s, int64_t inter, float* act) {
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

// act [s, I] = silu(h[:, :I]) · h[:, I:] for any element type: vectors for float at widths of a multiple of the
// vector, plain otherwise.
template <typename T>
void swiglu_rows(const T* h, int64_t s, int64_t inter, T* act) {
  if constexpr (std::is_same_v<T, float>) {
    if (inter % kLanes == 0) return swiglu(h, s, inter, act);
  }
  swiglu_plain<T>(h, s, inter, act);
}

// Slots (token t, choice j) grouped by expert, experts ascending, token order kept within an expert.
struct Groups {
  std::vector<int64_t> start;  // [N + 1]: expert e's slots are slot[start[e] .. start[e + 1])
  std::vector<int64_t> slot;   // t * k + j
};

inline Groups group(const int64_t* ids, int64_t slots, int64_t experts) {
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

// out [T, hid] += each slot's weighted expert output, over x [T, hid] (row t holds token t), the slots of `g`
// (t * k + j), their weights [T * k], gate_up [N, 2I, hid] and down [N, hid, I]. `out` is not cleared: the native
// step adds the layer's output onto the residual stream directly.
template <typename T>
void experts_into(const T* xp, int64_t hid, const Groups& g, const T* wp, const T* gu, const T* dn, int64_t inter,
                  int64_t k, T* op) {
  bool tiled = false;
  if constexpr (std::is_same_v<T, float>) tiled = hid % kLanes == 0 && inter % kLanes == 0;  // the reduced widths
  int64_t most = 0;  // the most slots of one expert (a token may name an expert twice: forced routing does)
  for (size_t e = 0; e + 1 < g.start.size(); ++e) most = std::max(most, g.start[e + 1] - g.start[e]);
  std::vector<T> rows(most * hid), h(most * 2 * inter), act(most * inter), y(most * hid);
  std::vector<int64_t> used;  // the experts that have slots, ascending
  for (size_t e = 0; e + 1 < g.start.size(); ++e)
    if (g.start[e + 1] > g.start[e]) used.push_back(static_cast<int64_t>(e));
  const int64_t gu_bytes = 2 * inter * hid * sizeof(T), dn_bytes = hid * inter * sizeof(T);
  auto fetch = [&](size_t j) {  // an expert's weights on their way into the cache while the one before computes
    if (j < used.size()) {
      prefetch(gu + used[j] * 2 * inter * hid, std::min<int64_t>(gu_bytes, 8192));
      prefetch(dn + used[j] * hid * inter, std::min<int64_t>(dn_bytes, 8192));
    }
  };
  fetch(0);
  for (size_t j = 0; j < used.size(); ++j) {
    fetch(j + 1);
    const int64_t e = used[j], first = g.start[e], s = g.start[e + 1] - first;
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

}  // namespace ecospec
