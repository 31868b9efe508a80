"""How one cell's config travels between `run_cell` and its record: per `ecospec.*` module, the calls that receive
the config (or a view of it) as an argument, and the climbs, calls that go from a lower layer back up into
`ecospec.experiment` (issue 45: the fewer modules a config enters and the fewer climbs, the easier a cell's identity
and run are to follow).

    python benchmarks/config_path.py                  # model=tiny, method=ecospec, 2 prompts x 8 tokens, 1 thread
    python benchmarks/config_path.py method=eagle3    # any run.py overrides

A call receives the config when one of its arguments is the typed cell (`experiment.kinds.Job`, the job as composed
and identified; `experiment.spec.Cell`, the validated cell) or a mapping holding `model` and at least two more of the
cell's identity keys (the composed config, its plain copy, `cell_config` / `job_config` and the AR key); or the
model's own config (a mapping with `name` and `source`): column `model`. Arguments are read as passed, and the
values of `*args` and `**kwargs` one by one; a record that holds the config as data is not the config, nor is the
typed cell's `self` in its own methods. An entry is such a call whose nearest `ecospec` caller
is another module (the calls inside one module are not counted again). A climb is a call into `ecospec.experiment` whose
nearest `ecospec` caller is another package while an `ecospec.experiment` frame sits lower on the stack; only climbs
of calls that receive the config (or the model config) count.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from ecospec import conf_dir
from ecospec.experiment.cell import run_cell
from ecospec.experiment.kinds import Job
from ecospec.experiment.spec import Cell
from ecospec.identity import CELL_KEYS

ROOT = Path(__file__).resolve().parents[1]
FAST = ("model=tiny", "method=ecospec", "num_prompts=2", "max_new_tokens=8", "threads=1", "progress=false")
TOP = "ecospec.experiment"


def carries(value) -> str | None:
    """`cell` for the typed cell, the config or a view of it, `model` for the model's config, else None."""
    if isinstance(value, Job | Cell):
        return "cell"
    if not isinstance(value, Mapping):
        return None
    try:
        keys = set(value.keys())
    except Exception:  # noqa: BLE001 - a mapping-like object that cannot list its keys carries nothing we know
        return None
    if "model" in keys and len(keys & set(CELL_KEYS)) >= 3:
        return "cell"
    if {"name", "source"} <= keys:
        return "model"
    return None


def arguments(frame) -> list:
    """The call's arguments, with the values of its `*args` and `**kwargs` one by one."""
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    out = [frame.f_locals.get(name) for name in code.co_varnames[:n] if name != "self"]  # an object's own method
    if code.co_flags & 0x04:  # *args
        out += list(frame.f_locals.get(code.co_varnames[n]) or ())
        n += 1
    if code.co_flags & 0x08:  # **kwargs
        out += list((frame.f_locals.get(code.co_varnames[n]) or {}).values())
    return out


def module_of(frame) -> str:
    return frame.f_globals.get("__name__", "")


def trace(cfg, cell_dir: Path) -> tuple[Counter, Counter, Counter, Counter]:
    """(cell calls, entries, model calls, climbs) per module while `run_cell(cfg, cell_dir)` runs."""
    cell, entries, model, climbs = Counter(), Counter(), Counter(), Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        name = module_of(frame)
        if not name.startswith("ecospec."):
            return
        kinds = {carries(v) for v in arguments(frame)}
        if "cell" not in kinds and "model" not in kinds:
            return
        caller = frame.f_back
        while caller is not None and not module_of(caller).startswith("ecospec."):
            caller = caller.f_back
        if "cell" in kinds:
            cell[name] += 1
            entries[name] += caller is None or module_of(caller) != name
        else:
            model[name] += 1
        if not name.startswith(TOP) or caller is None or module_of(caller).startswith(TOP):
            return
        below = caller.f_back
        while below is not None and not module_of(below).startswith(TOP):
            below = below.f_back
        if below is not None:
            climbs[f"{module_of(caller)} -> {name}"] += 1

    sys.setprofile(profile)
    try:
        record = run_cell(cfg, cell_dir)
    finally:
        sys.setprofile(None)
    if record["status"] != "ok":
        raise SystemExit(f"the cell failed: {record.get('error')}")
    return cell, entries, model, climbs


def table(cell: Counter, entries: Counter, model: Counter, climbs: Counter) -> str:
    rows = [
        "| module | calls with the cell's config | of them from another module | calls with the model's config |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name in sorted(set(cell) | set(model)):
        rows.append(f"| {name} | {cell[name]} | {entries[name]} | {model[name]} |")
    rows.append(f"| **all** | {sum(cell.values())} | {sum(entries.values())} | {sum(model.values())} |")
    rows.append("")
    rows.append(f"climbs back up into {TOP}: {sum(climbs.values())}")
    rows += [f"- {edge}: {n}" for edge, n in sorted(climbs.items())]
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=[*FAST, *argv])
    with tempfile.TemporaryDirectory() as tmp:
        with open_dict(cfg):
            cfg.out_dir = tmp
        print(table(*trace(cfg, Path(tmp) / "cell")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
