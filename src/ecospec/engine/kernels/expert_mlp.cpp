// The compiled engine's routed experts on the CPU (ecospec::expert_mlp, engine/static_qwen3.py): SwiGLU experts over
// token-slots sorted by expert, one pass over the experts that have slots, each expert's weights read once. In C++
// because the same loop in Python costs ~35 us per expert and layer, which a verify pass pays for every expert.
#include <torch/extension.h>

at::Tensor expert_mlp(const at::Tensor& x, const at::Tensor& gate_up, const at::Tensor& down, const at::Tensor& offs) {
  auto out = at::empty({x.size(0), down.size(1)}, x.options());
  auto ends = offs.contiguous().to(at::kLong);
  const int64_t* end_of = ends.data_ptr<int64_t>();
  const int64_t inter = gate_up.size(1) / 2;
  int64_t start = 0;
  for (int64_t g = 0; g < ends.size(0); ++g) {
    const int64_t end = end_of[g];
    if (end == start) continue;  // an expert without slots is never read
    auto h = at::mm(x.slice(0, start, end), gate_up.select(0, g).t());
    auto act = at::silu(h.slice(1, 0, inter)) * h.slice(1, inter, 2 * inter);
    auto rows = out.slice(0, start, end);
    at::mm_out(rows, act, down.select(0, g).t());
    start = end;
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("expert_mlp", &expert_mlp, "routed SwiGLU experts, sorted slots"); }
