"""HBM traffic of a verify pass: each routed expert a pass activates is read once per MoE layer, and every
other weight (attention, shared experts, dense layers, norms, embeddings, lm_head) once per pass."""

from __future__ import annotations

from ecospec.models.adapters import MoeInfo


def hbm_bytes_per_verify(info: MoeInfo, experts_per_layer: float, bytes_per_param: float) -> float:
    """Estimated weight bytes read by one verify pass: E x MoE layers x one expert's bytes + the dense bytes.

    `experts_per_layer` is E (unique experts per MoE layer over the pass's tokens); `bytes_per_param` the
    storage width (2 for bf16). KV-cache and activation traffic are not counted.
    """
    expert_bytes = info.expert_params * bytes_per_param
    return experts_per_layer * info.num_moe_layers * expert_bytes + info.dense_params * bytes_per_param
