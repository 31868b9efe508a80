"""Capture which experts each token is routed to, and summarise expert sets.

Routes are LongTensors ``[num_moe_layers, tokens, k]`` (layer axis in ``moe_info(model).moe_layers``
order; expert ids in ``[0, N)``).
"""

from __future__ import annotations

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


def pass_counts(routes: torch.Tensor, sizes: list[int], num_experts: int) -> torch.Tensor:
    """[P, L, N]: how many tokens each MoE layer routes to each expert in each of P passes, from the passes' routes
    back to back (`routes` [L, sum(sizes), k], any device) and their token counts, in one bincount on the CPU: a
    decode loop counts its passes once, at the end. The one count of the engine: a pass's load is its [L, N], its
    unique experts per layer `(counts > 0).sum(-1)`."""
    num_layers = routes.shape[0]
    if not sizes:
        return torch.zeros(0, num_layers, num_experts, dtype=torch.long)
    k = routes.shape[2]
    routes = routes.to("cpu", torch.long).reshape(num_layers, -1)  # [L, sum(sizes) * k]
    pass_id = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes) * k)
    flat = (pass_id[None, :] * num_layers + torch.arange(num_layers)[:, None]) * num_experts + routes
    size = len(sizes) * num_layers * num_experts
    return torch.bincount(flat.reshape(-1), minlength=size).view(len(sizes), num_layers, num_experts)


def pack_bitmasks(ids: torch.Tensor, experts: int) -> torch.Tensor:
    """Top-k expert ids [r, L, k] -> int64 [r, W]: word j holds bits 32j .. 32j + 31 of each row's bitmask (bit
    layer * N + expert, as `expert_bitmasks`), so the host reads W words a row instead of L * k ids."""
    r, layers, k = ids.shape
    width = -(-layers * experts // 32)
    bits = (ids + torch.arange(layers, device=ids.device)[:, None] * experts).reshape(r, layers * k)
    onehot = torch.zeros(r, width * 32, dtype=torch.int64, device=ids.device).scatter_(1, bits, 1)
    return (onehot.view(r, width, 32) << torch.arange(32, device=ids.device)).sum(-1)


def unpack_bitmasks(words: torch.Tensor) -> list[int]:
    """`pack_bitmasks`' words [r, W] -> one Python int per row."""
    raw = words.cpu().numpy().astype("<u4").tobytes()
    size = 4 * words.shape[1]
    return [int.from_bytes(raw[i * size : (i + 1) * size], "little") for i in range(words.shape[0])]


def expert_bitmasks(routes: torch.Tensor, num_experts: int) -> list[int]:
    """Per token, a Python int with bit ``layer * N + expert`` set for each expert it is routed to: ``routes``
    [L, T, k] -> list of T ints (`pack_bitmasks` then `unpack_bitmasks`, the compiled predictor's packing)."""
    if routes.shape[1] == 0:
        return []
    return unpack_bitmasks(pack_bitmasks(routes.detach().to("cpu", torch.long).permute(1, 0, 2), num_experts))
