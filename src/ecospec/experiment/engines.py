"""A cell's engine (`engine=eager|compiled`): what `ecospec.generate` gets for each decode of the cell.

`eager` hands "eager" through. `compiled` prepares the target once per γ and cache size, before the decode's clock
starts (an AR decode runs the AR graph of the speculative target prepared for its length, where there is one: a cell
compiles one AR graph, not two), so the warm-up (inductor compiling, or loading its graphs from
`$ECOSPEC_CACHE/inductor`) is never part of a cell's timings: it is summed into `compile_s` (the record's
`env.compile_s`); `env.compiled_parts` says what ran compiled (the target, an EAGLE-3 head's draft steps, the
expert predictor's pass; a draft model and the oracle's look-up pass stay eager), `env.native_parts` which of them
ran as one native call a pass (on the CPU: nothing for inductor to compile). Cache sizes come in steps of
`engine.scope.SLOTS`, so one prepared target serves every prompt of a usual cell; a longer sequence (a multi-turn
prompt) prepares the next size up, and its warm-up is counted too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ecospec.engine.scope import slots


@dataclass
class CellEngine:
    name: str = "eager"
    compile_s: float = 0.0
    prepared: dict = field(default_factory=dict)  # (block, slots, hidden layers, rows) -> CompiledTarget
    parts: set = field(default_factory=set)  # what ran compiled: target, eagle3_head, predictor
    native: set = field(default_factory=set)  # of those, what ran as one native call a pass (the CPU's engine)
    _counted: set = field(default_factory=set)  # the compiled drafters and predictors whose warm-up is counted

    def for_decode(
        self,
        target,
        drafter,
        gamma: int,
        prompt_len: int,
        max_new_tokens: int,
        predictor=None,
        depth: int = 3,
        topk: int = 2,
        depths: tuple = (),
        rows: int = 1,
    ):
        """The `engine=` argument of one decode: "eager", or the compiled target prepared for its length and
        `rows` sequences (with the EAGLE-3 head's draft steps for each of `depths` and the predictor's pass prepared
        too: `ecospec.generate` finds them ready)."""
        if self.name == "eager":
            return "eager"
        from ecospec.engine.compiled import prepare, refusal

        reason = refusal(target, drafter, batch_size=rows)
        if reason:
            raise ValueError(reason)
        block = gamma if drafter is not None else 1  # an AR step verifies one token
        size = slots(prompt_len + max_new_tokens + block)
        hidden = tuple(drafter.hidden_layers) if drafter is not None else ()
        key = (block, size, hidden, rows)
        if drafter is None:  # AR: the smallest speculative target prepared with room for it, if any
            roomy = sorted((k for k in self.prepared if k[0] > 1 and k[1] >= size and k[3] == rows), key=lambda k: k[1])
            key = roomy[0] if roomy else key
        if key not in self.prepared:
            self.prepared[key] = prepared = prepare(target, gamma=block, max_len=size, hidden_layers=hidden, rows=rows)
            self.compile_s += prepared.compile_s
            self.parts.add("target")
            if prepared.static.native:
                self.native.add("target")
        if drafter is not None:  # what the prepared target compiles of them (a batch: neither, `prepare_parts`)
            made = self.prepared[key].prepare_parts(
                drafter,
                predictor,
                gamma=gamma,
                depth=depth,
                topk=topk,
                predicted=predictor is not None,
                depths=depths,
            )
            for part, obj, got in zip(("eagle3_head", "predictor"), (drafter, predictor), made, strict=True):
                if got is not obj and id(got) not in self._counted:  # compiled here: its warm-up is counted once
                    self._counted.add(id(got))
                    self.compile_s += got.compile_s
                    self.parts.add(part)
                    if got.static.native:
                        self.native.add(part)
        return self.prepared[key]

    def env(self) -> dict:
        """What the record's `env` says of the engine (nothing for eager: records keep what they held)."""
        if self.name == "eager":
            return {}
        shapes = sorted({(b, s) for b, s, *_ in self.prepared})
        return {
            "engine": self.name,
            "compile_s": round(self.compile_s, 2),
            "compiled_shapes": [list(x) for x in shapes],
            "compiled_parts": sorted(self.parts),
            "native_parts": sorted(self.native),
        }  # (block, cache slots) of each
