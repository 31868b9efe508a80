"""Capture which experts each token is routed to, and summarise expert sets.

Routes are LongTensors ``[num_moe_layers, tokens, k]`` (layer axis in ``moe_info(model).moe_layers``
order; expert ids in ``[0, N)``).
"""

from __future__ import annotations

import numpy as np
import torch

from ecospec.models.adapters import bypasses_router, moe_blocks, routers


class RoutingCapture:
    """Context manager recording the top-k expert indices of every MoE layer during forwards.

    ``with RoutingCapture(model) as cap: model(ids); routes = cap.take()``

    A forward hook on each router (``ecospec.models.routers``) keeps the third element of the router's
    output (the top-k indices, ``[batch * seq, k]``, batch-major). A block that routes without calling its
    router (transformers' kept-MXFP4 GPT-OSS kernel path: `models.adapters.bypasses_router`) is hooked instead,
    and its top-k is taken from the router logits it returns (GPT-OSS's router: top-k of those logits). Hooks
    return None, so outputs are unchanged; they are removed on exit. Indices stay on the model's device until
    ``take``.
    """

    def __init__(self, model: torch.nn.Module):
        self.routers = routers(model)
        self.blocks = moe_blocks(model)
        self.from_logits = [bypasses_router(b) for b in self.blocks]
        self._buffers: list[list[torch.Tensor]] = [[] for _ in self.routers]
        self._handles: list = []

    def _hook(self, layer: int):
        def hook(module, args, output):
            self._buffers[layer].append(output[2])  # integer indices: never part of an autograd graph

        return hook

    def _logits_hook(self, layer: int, k: int):
        def hook(module, args, output):
            self._buffers[layer].append(torch.topk(output[1].detach(), k, dim=-1).indices)

        return hook

    def __enter__(self) -> RoutingCapture:
        self._handles = []
        for i, (router, block, logits) in enumerate(zip(self.routers, self.blocks, self.from_logits, strict=True)):
            hook = self._logits_hook(i, int(router.top_k)) if logits else self._hook(i)
            self._handles.append((block if logits else router).register_forward_hook(hook))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def clear(self) -> None:
        for buf in self._buffers:
            buf.clear()

    def pop(self, device: str | torch.device | None = "cpu") -> torch.Tensor:
        """Routes of the most recent forward alone, [num_moe_layers, tokens, k]; earlier forwards stay buffered (the
        oracle's look-up pass between verify passes that are counted at the end)."""
        if not self._buffers[0]:
            raise RuntimeError("no forward captured since the last take")
        routes = torch.stack([buf.pop() for buf in self._buffers]).long()
        return routes if device is None else routes.to(device)

    def take(self, device: str | torch.device | None = "cpu") -> torch.Tensor:
        """Routes of the forward(s) since the last take: LongTensor [num_moe_layers, tokens, k], tokens in
        call order (within a forward: batch-major). Clears the buffer. ``device=None`` keeps the
        model's device (one transfer per take, not per layer)."""
        counts = {sum(t.shape[0] for t in buf) for buf in self._buffers}
        if len(counts) != 1:
            self.clear()
            raise RuntimeError(f"routers saw different token counts {sorted(counts)} (interrupted forward?)")
        if not self._buffers[0]:
            k = int(getattr(self.routers[0], "top_k", 0))
            return torch.empty(len(self.routers), 0, k, dtype=torch.long, device=device)
        per_layer = [buf[0] if len(buf) == 1 else torch.cat(buf, dim=0) for buf in self._buffers]
        routes = torch.stack(per_layer).long()
        self.clear()
        return routes if device is None else routes.to(device)


def unique_per_layer(routes: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[L] number of distinct experts each layer uses over all tokens of ``routes`` [L, T, k]."""
    num_layers = routes.shape[0]
    used = torch.zeros(num_layers, num_experts, dtype=torch.bool, device=routes.device)
    used.scatter_(1, routes.reshape(num_layers, -1).long(), True)
    return used.sum(dim=1)


def expert_counts(routes: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[L, N] how many tokens of ``routes`` [L, T, k] each layer routes to each expert (the load)."""
    num_layers = routes.shape[0]
    flat = routes.reshape(num_layers, -1).long() + torch.arange(num_layers, device=routes.device)[:, None] * num_experts
    return torch.bincount(flat.reshape(-1), minlength=num_layers * num_experts).view(num_layers, num_experts)


def pass_counts(routes: torch.Tensor, sizes: list[int], num_experts: int) -> torch.Tensor:
    """[P, L, N]: how many tokens each MoE layer routes to each expert in each of P passes, from the passes' routes
    back to back (`routes` [L, sum(sizes), k], any device) and their token counts, in one bincount on the CPU: a
    decode loop counts its passes once, at the end."""
    num_layers = routes.shape[0]
    if not sizes:
        return torch.zeros(0, num_layers, num_experts, dtype=torch.long)
    k = routes.shape[2]
    routes = routes.to("cpu", torch.long).reshape(num_layers, -1)  # [L, sum(sizes) * k]
    pass_id = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes) * k)
    flat = (pass_id[None, :] * num_layers + torch.arange(num_layers)[:, None]) * num_experts + routes
    size = len(sizes) * num_layers * num_experts
    return torch.bincount(flat.reshape(-1), minlength=size).view(len(sizes), num_layers, num_experts)


def expert_bitmasks(routes: torch.Tensor, num_experts: int) -> list[int]:
    """Per token, a Python int with bit ``layer * N + expert`` set for each expert it is routed to.

    ``routes`` [L, T, k] -> list of T ints. Vectorised: the [T, L*N] one-hot is packed little-endian with
    numpy.packbits and each row becomes one int via int.from_bytes.
    """
    num_layers, tokens, k = routes.shape
    if tokens == 0:
        return []
    idx = routes.detach().to("cpu", torch.long).numpy()
    bits = idx + (np.arange(num_layers, dtype=np.int64) * num_experts)[:, None, None]  # [L, T, k]
    onehot = np.zeros((tokens, num_layers * num_experts), dtype=np.bool_)
    rows = np.broadcast_to(np.arange(tokens)[None, :, None], bits.shape)
    onehot[rows.reshape(-1), bits.reshape(-1)] = True
    packed = np.packbits(onehot, axis=1, bitorder="little")  # [T, ceil(L*N / 8)]
    width = packed.shape[1]
    raw = packed.tobytes()
    return [int.from_bytes(raw[i * width : (i + 1) * width], "little") for i in range(tokens)]
