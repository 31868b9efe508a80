"""Phase timings go through one timer: on a GPU it records events and reads them once a step. Here on the CPU the
same code path runs with stand-in events, and a decode synchronises exactly once per step (and once for the
prefill), whatever the number of phases."""

import time

import torch

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.engine import loop
from ecospec.engine.timer import StepTimer
from ecospec.models import perturbed_copy, tiny_model


class FakeEvent:
    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3  # milliseconds, as CUDA events report


def test_a_step_synchronises_once(monkeypatch):
    syncs = []

    class CountingTimer(StepTimer):
        def __init__(self, device):
            super().__init__(torch.device("cuda"), event=FakeEvent, synchronize=lambda: syncs.append(1))

    monkeypatch.setattr(loop, "StepTimer", CountingTimer)
    target = tiny_model("qwen3_moe-a", seed=0)
    drafter = DraftModelDrafter(perturbed_copy(target, 0.1, seed=1))
    ids = torch.randint(3, target.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    res = ecospec.generate(target, ids, drafter=drafter, gamma=4, max_new_tokens=12, eos_token_id=[])
    assert len(res.steps) > 2 and len(syncs) == len(res.steps) + 1  # one per step, one for the prefill
    for st in res.steps:
        parts = st.t_draft + st.t_pred + st.t_select + st.t_verify
        assert st.t_total > 0 and abs(parts - st.t_total) < 1e-6  # the phases add up to the step


def test_the_cpu_timer_reads_no_device():
    t = StepTimer(torch.device("cpu"))
    t.start()
    t.mark("a")
    t.mark("b")
    out = t.stop()
    assert set(out) == {"a", "b", "total", "cpu"} and out["total"] >= out["a"] >= 0
