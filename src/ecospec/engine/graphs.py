"""What every compiled step shares: compiling one method of a prepared object, and the visibility of a block.

The compiled engine has three kinds of step (the target's, `static_qwen3`; the EAGLE-3 head's, `static_eagle3`; the
expert predictor's, `static_predictor`), each a method over buffers allocated once, compiled by inductor with
`dynamic=False`, one graph per block shape (but the target's verify graph: one for every block size), with
inductor's artefacts under `$ECOSPEC_CACHE/inductor`.
"""

from __future__ import annotations

import itertools
import os
import types

import torch

from ecospec.cache import cache_root, cpu_key

_COUNT = itertools.count()
_INDUCTOR = "TORCHINDUCTOR_CACHE_DIR"


def inductor_key() -> str:
    """The directory under `$ECOSPEC_CACHE/inductor` for this CPU and the instruction set ATen runs at
    (`ATEN_CPU_CAPABILITY`): inductor's graphs are built for both, and a graph one of them built is never read by
    the other (an entry only another instruction set reached once gave every logit wrong)."""
    return f"{cpu_key()}-{torch.backends.cpu.get_cpu_capability().lower()}"


def inductor_cache() -> str:
    """Point inductor's artefacts at `$ECOSPEC_CACHE/inductor` (beside the CPU kernels) unless the user chose a
    directory; returns the one in use. Torch writes its default (under the temporary directory) into the variable the
    first time anything imports `torch._inductor`, so that default counts as not chosen. Its precompiled headers go
    to that default whatever the variable says (a module constant): they follow the chosen directory too, so that a
    machine sharing `$ECOSPEC_CACHE` (a cluster's home directory) or a reboot compiles nothing again."""
    from torch._inductor import codecache
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get(_INDUCTOR)
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ[_INDUCTOR] = str(cache_root() / "inductor" / inductor_key())
    chosen = os.environ[_INDUCTOR]
    if hasattr(codecache, "_HEADER_DIR"):  # torch 2.13's name; elsewhere the headers stay where torch puts them
        codecache._HEADER_DIR = os.path.join(chosen, "precompiled_headers")
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")
    return chosen


def compile_method(obj, fn, options: dict | None = None):
    """`fn` bound to `obj` on a code object of its own, compiled (fullgraph, no dynamic shapes, C++ wrapper).

    The C++ wrapper (a long straight line of calls into torch's C shim, one per op and buffer) is built apart from
    the kernels, at inductor's wrapper level (`aot_inductor.compile_wrapper_opt_level`, -O1) where the kernels keep
    -O3: built together, -O3 over the wrapper is most of a graph's cold start and barely changes the step's speed.
    Nor does the wrapper assert each input's sizes and strides on every call (`size_asserts`): a step's inputs are
    the prepared object's own buffers and weights, fixed when it is prepared, and those checks over some 300 inputs
    were a sizeable share of a small step.

    Dynamo keeps compiled graphs per code object, and the steps skip the guards on module attributes (evaluating
    them costs about as much as a small step), so two prepared objects (another target, other shapes) must never
    share one. A shape is fixed unless an input's dimension is marked dynamic (`torch._dynamo.mark_dynamic`) before
    the first call: the target's verify graph, one for every block size (`compiled.prepare`). `options`: inductor
    options over these (a study's other build)."""
    inductor_cache()
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(_COUNT)}")
    own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return torch.compile(
        types.MethodType(own, obj),
        dynamic=False,
        fullgraph=True,
        options={
            "cpp_wrapper": True,
            "cpp_wrapper_build_separate": True,
            "size_asserts": False,
            "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
            **(options or {}),
        },
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


def weights_key(module) -> tuple:
    """The identity and version of every parameter of `module`, for a prepared form's key: a prepared step holds
    stacked copies of some weights (and inductor's graphs take them when traced), so a model trained further, or
    moved, must be prepared again."""
    return tuple((p.data_ptr(), p._version) for p in module.parameters())


def visible_slots(slot_ids: torch.Tensor, start: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Bool [..., q, slots]: query i sees every cache slot before `start` and the slots start + j for which
    block[..., i, j] is set (block [..., q, W]: the step's window of slots after `start`; start [...], one per
    sequence of a batch). Fixed shapes, no host read."""
    width = block.shape[-1]
    rel = slot_ids - start[..., None, None]  # [..., 1, slots]: a key's slot relative to the window
    inside = (rel >= 0) & (rel < width)
    return (rel < 0) | (inside & block.gather(-1, rel.clamp(0, width - 1).expand(*block.shape[:-1], -1)))
