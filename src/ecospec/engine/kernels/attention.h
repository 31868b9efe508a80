// One key-value head's attention over a static cache's slots, shared by ecospec::block_attention
// (block_attention.cpp) and the native steps (qwen3_step.cpp, eagle3_step.cpp): a block of Q queries written at slots
// start .. start + Q - 1 attends to the committed slots before `start` and to the block's slots its row of `tree`
// [Q, Q] marks (the EAGLE-3 head: to a window of slots after `start`). It reads only the slots that hold keys, once
// for all the queries of a key-value head (grouped-query attention), scores them in register tiles (simd.h) and sums
// the values in one pass per query.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "simd.h"

namespace ecospec {

// One key-value head's rows: q [n, D] (n = heads of the group × Q queries, head-major), k / v [L, D] -> out [n, D];
// p is scratch [n, L]. The slots after `start` are a window of W = L - start (the target's block: W = Q), query i
// seeing window slot j where tree[i * W + j] is set.
template <typename T>
inline void attend(const T* q, const T* k, const T* v, int64_t n, int64_t Q, int64_t L, int64_t D, int64_t start,
            const bool* tree, T scale, T* out, T* p) {
  bool tiled = false;
  if constexpr (std::is_same_v<T, float>) {
    tiled = D % kLanes == 0;
    if (tiled) rows_times(q, n, k, L, D, p, L);
  }
  if (!tiled) rows_times_plain<T>(q, n, k, L, D, p);
  for (int64_t r = 0; r < n; ++r) {
    T* row = p + r * L;
    const bool* sees = tree + (r % Q) * (L - start);  // a row of the block's window
    T most = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < L; ++j) {
      row[j] = j < start || sees[j - start] ? row[j] * scale : -std::numeric_limits<T>::infinity();
      most = row[j] > most ? row[j] : most;
    }
    T total = 0;
    int64_t j = 0;
    if constexpr (std::is_same_v<T, float>) {
      vf sum = {};
      for (; j + kLanes <= L; j += kLanes) {
        vf e = vexp(load(row + j) - most);
        e = load(row + j) == -std::numeric_limits<float>::infinity() ? vf{} : e;
        store(row + j, e);
        sum += e;
      }
      for (int l = 0; l < kLanes; ++l) total += sum[l];
    }
    for (; j < L; ++j) {
      row[j] = std::exp(row[j] - most);
      total += row[j];
    }
    T* o = out + r * D;
    for (int64_t d = 0; d < D; ++d) o[d] = 0;
    if constexpr (std::is_same_v<T, float>) {
      if (tiled) {
        for (int64_t d = 0; d < D; d += 4 * kLanes) {  // four vectors of the output at a time
          const int64_t w = std::min<int64_t>(4, (D - d) / kLanes);
          vf acc[4] = {};
          for (int64_t t = 0; t < L; ++t) {
            const float pt = row[t];
            for (int c = 0; c < w; ++c) acc[c] += pt * load(v + t * D + d + c * kLanes);
          }
          for (int c = 0; c < w; ++c) store(o + d + c * kLanes, acc[c] / total);
        }
        continue;
      }
    }
    for (int64_t t = 0; t < L; ++t)
      for (int64_t d = 0; d < D; ++d) o[d] += row[t] * v[t * D + d];
    for (int64_t d = 0; d < D; ++d) o[d] /= total;
  }
}

}  // namespace ecospec
