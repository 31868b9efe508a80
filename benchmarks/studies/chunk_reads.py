"""How fast one thread of this machine reads experts: chunks of one expert's bytes (48 KiB on the embedded default:
its gate, up and down rows) at random offsets in a buffer of the target's expert bytes (30 MiB) and of 512 MiB,
against reading the same buffer front to back, each read summed in vector registers (C++, `-march=native`, built
here in a few seconds). A verify pass reads its unique experts this way, so their rate bounds what a block of more
tokens can cost (docs/engine.md, "The native steps").

    python benchmarks/studies/chunk_reads.py [--chunk-kib 48] [--mib 30,512] [--reads 20000]

Printed only. `--prefetch` also times the reads with each next chunk asked for ahead (`__builtin_prefetch`).
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <chrono>
#include <cstring>

// Seconds to sum the chunks of `chunk` floats at offsets `offs` of `buf` (four independent vector sums, so the
// additions keep up with the loads), asking for each next chunk ahead when `ahead` is set.
double read_chunks(torch::Tensor buf, torch::Tensor offs, int64_t chunk, bool ahead) {
  typedef float vf __attribute__((vector_size(32)));
  const float* b = buf.data_ptr<float>();
  const int64_t* o = offs.data_ptr<int64_t>();
  const int64_t n = offs.numel();
  vf acc[4] = {};
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n; ++c) {
    const float* p = b + o[c];
    if (ahead && c + 1 < n)
      for (int64_t i = 0; i < chunk * 4; i += 64) __builtin_prefetch(reinterpret_cast<const char*>(b + o[c + 1]) + i);
    for (int64_t i = 0; i + 32 <= chunk; i += 32)
      for (int j = 0; j < 4; ++j) {
        vf v;
        std::memcpy(&v, p + i + 8 * j, sizeof v);
        acc[j] += v;
      }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return seconds + 0 * (acc[0][0] + acc[1][0] + acc[2][0] + acc[3][0]);
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk-kib", type=int, default=48)
    ap.add_argument("--mib", default="30,512", help="buffer sizes, comma-separated")
    ap.add_argument("--reads", type=int, default=20000)
    ap.add_argument("--prefetch", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ext = load_inline(
        "ecospec_chunk_reads", cpp_sources=SOURCE, functions=["read_chunks"], extra_cflags=["-O3", "-march=native"]
    )
    chunk = a.chunk_kib * 1024 // 4
    gen = torch.Generator().manual_seed(0)
    for mib in (int(m) for m in a.mib.split(",")):
        buf = torch.randn(mib * 2**20 // 4, generator=gen)
        chunks = buf.numel() // chunk
        runs = {"front to back": (torch.arange(chunks) * chunk, False)}
        offs = torch.randint(0, chunks, (a.reads,), generator=gen) * chunk
        runs[f"random {a.chunk_kib} KiB chunks"] = (offs, False)
        if a.prefetch:
            runs[f"random {a.chunk_kib} KiB chunks, the next asked for ahead"] = (offs, True)
        for name, (where, ahead) in runs.items():
            ext.read_chunks(buf, where[:100].contiguous(), chunk, ahead)  # warm the code, not the data
            seconds = ext.read_chunks(buf, where.contiguous(), chunk, ahead)
            print(f"{mib} MiB buffer, {name}: {where.numel() * chunk * 4 / seconds / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
