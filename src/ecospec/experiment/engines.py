"""A cell's engine (`engine=eager|compiled`): what `ecospec.generate` gets for each decode of the cell.

`eager` hands "eager" through. `compiled` prepares the target once per block size (1 for AR, γ for SD) and cache
size, before the decode's clock starts, so the warm-up (inductor compiling, or loading its graphs from
`$ECOSPEC_CACHE/inductor`) is never part of a cell's timings: it is summed into `compile_s` (the record's
`env.compile_s`). Cache sizes come in steps of `SLOTS`, so one prepared target serves every prompt of a usual cell;
a longer sequence (a multi-turn prompt) prepares the next size up, and its warm-up is counted too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SLOTS = 512  # cache sizes are multiples of this (one compiled shape per cell in the usual case)


@dataclass
class CellEngine:
    name: str = "eager"
    compile_s: float = 0.0
    prepared: dict = field(default_factory=dict)  # (block, slots, hidden layers) -> CompiledTarget

    def for_decode(self, target, drafter, gamma: int, prompt_len: int, max_new_tokens: int):
        """The `engine=` argument of one decode: "eager", or the compiled target prepared for its length."""
        if self.name == "eager":
            return "eager"
        from ecospec.engine.compiled import prepare, refusal

        reason = refusal(target, drafter)
        if reason:
            raise ValueError(reason)
        block = gamma if drafter is not None else 1  # an AR step verifies one token
        slots = -(-(prompt_len + max_new_tokens + block) // SLOTS) * SLOTS
        hidden = tuple(drafter.hidden_layers) if drafter is not None else ()
        key = (block, slots, hidden)
        if key not in self.prepared:
            self.prepared[key] = prepared = prepare(target, gamma=block, max_len=slots, hidden_layers=hidden)
            self.compile_s += prepared.compile_s
        return self.prepared[key]

    def env(self) -> dict:
        """What the record's `env` says of the engine (nothing for eager: records keep what they held)."""
        if self.name == "eager":
            return {}
        shapes = sorted({(b, s) for b, s, _ in self.prepared})
        return {
            "engine": self.name,
            "compile_s": round(self.compile_s, 2),
            "compiled_shapes": [list(x) for x in shapes],
        }  # (block, cache slots) of each
