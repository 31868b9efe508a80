// Vector helpers of the compiled engine's CPU kernels (moe_experts.cpp, block_attention.cpp): small matrix products
// in register tiles and a vectorised exp, written with the compiler's vector extensions (GCC, Clang), so that one
// source builds for whatever instruction set `-march=native` finds.
#pragma once

#include <cstdint>
#include <cstring>

namespace ecospec {

constexpr int kLanes = 8;
constexpr int kAhead = 8;  // tiles of weight rows prefetched ahead  // floats per vector: one AVX register, two SSE ones
typedef float vf __attribute__((vector_size(kLanes * sizeof(float))));
typedef int vi __attribute__((vector_size(kLanes * sizeof(int))));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// Ask for `bytes` from `p` in the cache ahead of use: weights read once a step come from the last-level cache or
// memory, and a few hundred short rows read in small tiles are too short a stream for the hardware's prefetchers.
inline void prefetch(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 2);
}

// The lane sums of eight vectors, as one vector: three rounds of pairwise adds over interleaved lanes, instead of
// eight separate horizontal sums (at a width of 64 a dot product is eight multiply-adds, as many as its own sum).
inline vf sum8(const vf* v) {
  vf p[4], q[2];
  for (int j = 0; j < 4; ++j)
    p[j] = __builtin_shufflevector(v[2 * j], v[2 * j + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(v[2 * j], v[2 * j + 1], 1, 9, 3, 11, 5, 13, 7, 15);
  for (int j = 0; j < 2; ++j)
    q[j] = __builtin_shufflevector(p[2 * j], p[2 * j + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
           __builtin_shufflevector(p[2 * j], p[2 * j + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(q[0], q[1], 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(q[0], q[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

// y[s, o] = x[s] · w[o] for R weight rows and S token rows of length k (a multiple of kLanes): R·S = 8
// accumulators, so each loaded weight vector serves S rows and the eight reductions run side by side.
template <int R, int S>
__attribute__((always_inline)) inline void tile(const float* x, int64_t ldx, const float* w, int64_t k, float* y, int64_t ldy) {
  static_assert(R * S == 8, "one tile fills one vector of sums");
  vf acc[S * R] = {};
  // the weight rows a few tiles on, a few lines each iteration: weights read once a step stream from memory, in
  // rows too short for the hardware's prefetchers to follow
  const char* ahead = reinterpret_cast<const char*>(w + kAhead * R * k);
  for (int64_t i = 0; i < k; i += kLanes) {
    for (int p = 0; p < R / 2; ++p) __builtin_prefetch(ahead + ((i / kLanes) * (R / 2) + p) * 64, 0, 3);
    vf xs[S];
    for (int s = 0; s < S; ++s) xs[s] = load(x + s * ldx + i);
    for (int o = 0; o < R; ++o) {
      const vf wv = load(w + o * k + i);
      for (int s = 0; s < S; ++s) acc[s * R + o] += xs[s] * wv;
    }
  }
  const vf sums = sum8(acc);
  for (int s = 0; s < S; ++s) std::memcpy(y + s * ldy, reinterpret_cast<const float*>(&sums) + s * R, R * sizeof(float));
}

inline float dot(const float* a, const float* b, int64_t n) {
  vf acc = {};
  for (int64_t i = 0; i < n; i += kLanes) acc += load(a + i) * load(b + i);
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// y [s, rows] (row stride ldy) = x [s, k] · w [rows, k]ᵀ, k a multiple of kLanes: token rows two at a time against
// four weight rows, a last odd one against eight, the rows past a multiple of eight by single dot products.
inline void rows_times(const float* x, int64_t s, const float* w, int64_t rows, int64_t k, float* y, int64_t ldy) {
  const int64_t full = rows / 8 * 8;
  int64_t r = 0;
  for (; r + 2 <= s; r += 2)
    for (int64_t o = 0; o < full; o += 4) tile<4, 2>(x + r * k, k, w + o * k, k, y + r * ldy + o, ldy);
  if (r < s)
    for (int64_t o = 0; o < full; o += 8) tile<8, 1>(x + r * k, k, w + o * k, k, y + r * ldy + o, ldy);
  for (r = 0; r < s; ++r)
    for (int64_t o = full; o < rows; ++o) y[r * ldy + o] = dot(x + r * k, w + o * k, k);
}

// The same products by plain dot products, for any element type (double precision) and widths the tiles do not
// divide: y [s, rows] = x [s, k] · w [rows, k]ᵀ.
template <typename T>
inline T dot_plain(const T* a, const T* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <typename T>
void rows_times_plain(const T* x, int64_t s, const T* w, int64_t rows, int64_t k, T* y) {
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t r = 0; r < s; ++r) y[r * rows + o] = dot_plain(x + r * k, w + o * k, k);
}

// exp on a vector: 2^n · e^f with n = round(x / ln 2) and |f| <= ln 2 / 2, e^f by its Taylor series to degree 7
// (relative error below float's rounding), x clamped to float's range (so exp(-inf) is about 1e-38, not 0).
inline vf vexp(vf x) {
  x = x < -87.3f ? vf{} - 87.3f : x;
  x = x > 88.3f ? vf{} + 88.3f : x;
  const vf magic = vf{} + 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer
  const vf t = x * 1.44269504088896341f + magic;
  const vf n = t - magic;
  vf f = x - n * 0.693145751953125f;  // ln 2 split in two: this part exact in float
  f = f - n * 1.428606765330187e-06f;
  vf p = vf{} + 1.0f / 5040;
  p = p * f + 1.0f / 720;
  p = p * f + 1.0f / 120;
  p = p * f + 1.0f / 24;
  p = p * f + 1.0f / 6;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace ecospec
