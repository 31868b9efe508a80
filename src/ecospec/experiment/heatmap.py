"""The expert-load figure of one cell: which experts the verify passes routed tokens to, per MoE layer."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def expert_load_figure(expert_load: Sequence[Sequence[float]], title: str) -> Figure:
    """Layer x expert heat map of routed-token counts, beside each layer's load distribution.

    `expert_load[l][e]` counts the tokens routed to expert e of MoE layer l over all verify passes.
    Left: the counts with expert ids kept in place (hot spots stay where they are). Right: every layer's
    experts sorted by their share of the layer's routed tokens, the median over layers, and the uniform
    1/N share; busiest/mean in the title is the median over layers of the busiest expert's load over the mean.
    Built on a bare `Figure` (Agg canvas, no pyplot state), so it is safe in workers and needs no closing.
    """
    load = np.asarray(expert_load, dtype=float)
    if load.ndim != 2 or load.size == 0:
        raise ValueError(f"expert_load must be a non-empty layers x experts matrix, got shape {load.shape}")
    n_layers, n_experts = load.shape
    share = load / np.maximum(load.sum(axis=1, keepdims=True), 1.0)
    ranked = -np.sort(-share, axis=1)
    imbalance = np.median(load.max(axis=1) / np.maximum(load.mean(axis=1), 1e-12))

    fig = Figure(figsize=(13, max(4.0, 2.5 + 0.12 * n_layers)), layout="constrained")
    heat_ax, dist_ax = fig.subplots(1, 2, width_ratios=[3, 2])
    fig.suptitle(title)

    image = heat_ax.imshow(load, aspect="auto", interpolation="nearest", cmap="magma")
    heat_ax.set_title(f"Expert load ({n_layers} MoE layers x {n_experts} experts)")
    heat_ax.set_xlabel("expert id")
    heat_ax.set_ylabel("MoE layer")
    heat_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    heat_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.colorbar(image, ax=heat_ax, label="tokens routed")

    rank = np.arange(1, n_experts + 1)
    layer_colour = ScalarMappable(Normalize(0, max(n_layers - 1, 1)), matplotlib.colormaps["viridis"])
    for layer in range(n_layers):
        dist_ax.plot(rank, ranked[layer], color=layer_colour.to_rgba(layer), linewidth=0.8, alpha=0.6)
    dist_ax.plot(rank, np.median(ranked, axis=0), color="black", linewidth=2, label="median over layers")
    dist_ax.axhline(1 / n_experts, color="tab:red", linestyle="--", label=f"uniform 1/N = {1 / n_experts:.3g}")
    dist_ax.set_title(f"Load distribution per layer (busiest/mean = {imbalance:.2f}, median)")
    dist_ax.set_xlabel("expert rank within layer (busiest first)")
    dist_ax.set_ylabel("share of the layer's routed tokens")
    dist_ax.legend(loc="upper right")
    dist_ax.grid(alpha=0.3)
    dist_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    layer_bar = fig.colorbar(layer_colour, ax=dist_ax, label="MoE layer (one thin line each)")
    layer_bar.locator = MaxNLocator(integer=True)
    layer_bar.update_ticks()
    return fig
