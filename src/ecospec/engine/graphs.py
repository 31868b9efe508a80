"""What every compiled step shares: compiling one method of a prepared object, and the visibility of a block.

The compiled engine has three kinds of step (the target's, `static_qwen3`; the EAGLE-3 head's, `static_eagle3`; the
expert predictor's, `static_predictor`), each a method over buffers allocated once, compiled by inductor with
`dynamic=False`, one graph per block shape, with inductor's artefacts under `$ECOSPEC_CACHE/inductor`.
"""

from __future__ import annotations

import itertools
import os
import types

import torch

from ecospec.cache import cache_root

_COUNT = itertools.count()


def compile_method(obj, fn):
    """`fn` bound to `obj` on a code object of its own, compiled (fullgraph, no dynamic shapes, C++ wrapper).

    Dynamo keeps compiled graphs per code object, and the steps skip the guards on module attributes (evaluating
    them costs about as much as a small step), so two prepared objects (another target, other shapes) must never
    share one."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(_COUNT)}")
    own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return torch.compile(
        types.MethodType(own, obj),
        dynamic=False,
        fullgraph=True,
        options={"cpp_wrapper": True, "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe},
    )


class _Prepared(dict):
    """Compiled forms of one object; a copy of the object (a perturbed draft model, a pickled one) starts empty."""

    def __deepcopy__(self, memo):
        return _Prepared()

    def __reduce__(self):
        return (_Prepared, ())


def prepared_on(obj) -> dict:
    """The compiled forms prepared for `obj` (a target, a drafter, a predictor), kept on the object itself: they
    live as long as it does (a module-level cache keyed by `id()` kept every model of a process alive)."""
    return obj.__dict__.setdefault("_ecospec_prepared", _Prepared())


def visible_slots(slot_ids: torch.Tensor, start: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Bool [q, slots]: query i sees every cache slot before `start` and the slots start + j for which block[i, j]
    is set (block [q, W]: the step's window of slots after `start`). Fixed shapes, no host read."""
    q, width = block.shape
    rel = slot_ids[None, :] - start  # [1, slots]: a key's slot relative to the window
    inside = (rel >= 0) & (rel < width)
    return (rel < 0) | (inside & block.gather(1, rel.clamp(0, width - 1).expand(q, -1)))
