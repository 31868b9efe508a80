// A decoder layer's small parts, shared by the native steps of the Qwen3-MoE target (qwen3_step.cpp) and the EAGLE-3
// head (eagle3_step.cpp): RMSNorm, a linear layer over a few rows, the rotary embedding.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "simd.h"

namespace ecospec {

// A tensor's data, or nullptr for an empty one (an absent bias or norm).
template <typename T>
inline const T* ptr(const at::Tensor& t) {
  return t.numel() ? t.data_ptr<T>() : nullptr;
}

// out [n] = weight · (x / rms(x)), the norm in float whatever T is, as transformers' RMSNorm computes it.
template <typename T>
inline void rms(const T* x, const T* weight, int64_t n, double eps, T* out) {
  float total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  const float r = 1.0f / std::sqrt(total / static_cast<float>(n) + static_cast<float>(eps));
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * static_cast<T>(static_cast<float>(x[i]) * r);
}

// y [s, rows] = x [s, k] · w [rows, k]ᵀ (+ bias): register tiles for float at widths of a multiple of the vector,
// plain dot products otherwise.
template <typename T>
inline void linear(const T* x, int64_t s, const T* w, int64_t rows, int64_t k, T* y, const T* bias) {
  bool done = false;
  if constexpr (std::is_same_v<T, float>) {
    if (k % kLanes == 0) {
      rows_times(x, s, w, rows, k, y, rows);
      done = true;
    }
  }
  if (!done) rows_times_plain<T>(x, s, w, rows, k, y);
  if (bias)
    for (int64_t r = 0; r < s; ++r)
      for (int64_t o = 0; o < rows; ++o) y[r * rows + o] += bias[o];
}

// x [D] rotated in place: x · cos + rotate_half(x) · sin, rotate_half(x) = (-x[D/2:], x[:D/2]).
template <typename T>
inline void rope(T* x, const T* cos, const T* sin, int64_t d, T* tmp) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < d; ++i) tmp[i] = i < half ? -x[i + half] : x[i - half];
  for (int64_t i = 0; i < d; ++i) x[i] = x[i] * cos[i] + tmp[i] * sin[i];
}

// out [n] = x / rms(x) · weight in T itself (the drafters' norm, `engine.norm.rms_norm`, keeps float64 in float64).
template <typename T>
inline void rms_same(const T* x, const T* weight, int64_t n, double eps, T* out) {
  T total = 0;
  for (int64_t i = 0; i < n; ++i) total += x[i] * x[i];
  const T r = T(1) / std::sqrt(total / static_cast<T>(n) + static_cast<T>(eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r * weight[i];
}

// ids [k] = the indices of the k largest of x [n] in descending order, ties to the smaller index (k <= n): one pass,
// each value against the k-th kept so far.
template <typename T>
inline void top_k(const T* x, int64_t n, int64_t k, int64_t* ids) {
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (kept == k && !(x[i] > x[ids[k - 1]])) continue;
    int64_t j = kept < k ? kept++ : k - 1;
    for (; j > 0 && x[i] > x[ids[j - 1]]; --j) ids[j] = ids[j - 1];
    ids[j] = i;
  }
}

}  // namespace ecospec
