"""vLLM's own routing of the committed sequences, for the routing-overlap analysis (`report.routing`).

A server started with `--enable-return-routed-experts` answers a completion with `routed_experts`: the routed expert
ids of every token it ran through the target, as a base64 `.npy` array [tokens, MoE layers, k], prompt tokens first
(`routed_experts_prompt_start` skips a prefix of them). The sequences are asked for after the timed rounds, one
request at a time, so they cost no TPOT. Asking from the last prompt token gives what our engine's traces give
(`analysis.traces.sequence_routes`): the last prompt token, then each committed token that was run, in order.
"""

from __future__ import annotations

import base64
import io

import numpy as np

from ecospec.vllm_backend.server import Server


def decode_routes(b64: str) -> np.ndarray:
    """The `routed_experts` field of a completion choice as an int64 array [tokens, MoE layers, k]."""
    routes = np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)
    if routes.ndim != 3:
        raise ValueError(f"routed_experts must be [tokens, MoE layers, k], got shape {routes.shape}")
    return routes.astype(np.int64)


def completion_routes(
    server: Server, prompt_ids: list[int], max_tokens: int, temperature: float = 0.0, seed: int = 0
) -> tuple[list[int], np.ndarray]:
    """(generated token ids, routes [tokens, MoE layers, k] from the last prompt token on) of one completion."""
    body = {
        "model": server.model_name,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "ignore_eos": True,
        "return_token_ids": True,
        "routed_experts_prompt_start": max(len(prompt_ids) - 1, 0),
    }
    choice = server.post("/v1/completions", body)["choices"][0]
    if not choice.get("routed_experts"):
        raise ValueError(
            f"the server at {server.url} returned no routed experts (started without "
            f"--enable-return-routed-experts, or the model has no routed MoE layers)"
        )
    return list(choice["token_ids"]), decode_routes(choice["routed_experts"])


def record_routes(
    server: Server, prompts: list[tuple[str, list[int]]], max_tokens: int, temperature: float, seed: int
) -> list[dict]:
    """`record["routes"]` of a vLLM cell: one entry per prompt, {"prompt", "turn", "tokens", "routes"
    ([tokens][MoE layers][k])}, the committed sequence of its first turn."""
    out = []
    for prompt_id, ids in prompts:
        tokens, routes = completion_routes(server, ids, max_tokens, temperature, seed)
        out.append({"prompt": prompt_id, "turn": 0, "tokens": tokens, "routes": routes.tolist()})
    return out
