"""What a command the docs show needs, read from its own config: real checkpoints (a target by HF id) or GPUs (a
cluster profile that requests them, or a CUDA device). A `python run.py` line is composed with Hydra (every cell of
a sweep, the preset's grids included); a `make` target by the run.py lines its recipe runs; `make paper` and
`python -m ecospec.experiment.paper` by the stages their dry run prints. Nothing runs."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose
from omegaconf import OmegaConf

from ecospec.analysis.sizing import local_weight_bytes
from ecospec.experiment import paper

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ("-m", "--multirun")
SWEEPER = re.compile(r"^[+~]*(experiment|hydra\.sweeper\..*)=")  # what sets a sweep's grids
# The overrides that decide what a cell needs (what `cell_needs` reads); the rest (dataset, method, ...) never do.
DECIDING = re.compile(
    r"^[+~]*(model|model\.source|model\.target|cluster|device|experiment|backend|hydra\.launcher\.gpus_per_node)="
)


@dataclass
class Needs:
    """What a command needs, and which of its cells says so."""

    checkpoints: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.checkpoints or self.gpus)

    def add(self, other: Needs) -> None:
        self.checkpoints += other.checkpoints
        self.gpus += other.gpus

    def why(self) -> str:
        parts = [f"real checkpoints ({', '.join(sorted(set(self.checkpoints)))})"] if self.checkpoints else []
        parts += [f"GPUs ({', '.join(sorted(set(self.gpus)))})"] if self.gpus else []
        return " and ".join(parts)


def run_py_args(line: str) -> tuple[bool, list[str]]:
    """(a sweep?, the overrides) of a shown `python run.py ...` line, placeholders (<...>, ..., model=M) left out."""
    words = shlex.split(line)[2:]
    args = [a for a in words if a not in SWEEP and "<" not in a and "=" in a]
    args = [a for a in args if "..." not in a and "…" not in a]
    args = [a for a in args if not re.fullmatch(r"[A-Z_]+", a.split("=", 1)[1])]  # a placeholder: model=M
    return any(a in SWEEP for a in words), args


def first_values(args: list[str]) -> list[str]:
    """A sweep's overrides with each swept key at its first value (what a single compose takes)."""
    return [re.sub(r"=([^,\[]*),.*$", r"=\1", a) if "[" not in a else a for a in args]


@functools.cache
def sweeper_grids(overrides: tuple[str, ...]) -> tuple[list | None, dict | None]:
    """The sweeper's grids and params as a preset (and any hydra.sweeper override) sets them."""
    s = compose(config_name="config", overrides=list(overrides), return_hydra_config=True).hydra.sweeper
    grids = OmegaConf.to_container(s.grids, resolve=False) if s.get("grids") else None
    return grids, OmegaConf.to_container(s.params, resolve=False) if s.get("params") else None


def cells(sweep: bool, args: list[str]) -> list[list[str]]:
    """The cells' deciding overrides: a sweep expanded by the project's own sweeper over the preset's grids."""
    if not sweep:
        return [list(deciding(args))]
    from hydra_plugins.ecospec_grid_sweeper import GridSweeper  # after Hydra's plugin scan, which reloads its base

    grids, params = sweeper_grids(tuple(a for a in first_values(args) if SWEEPER.match(a)))
    jobs = GridSweeper(grids=grids, params=params).jobs(args)
    return [list(k) for k in dict.fromkeys(deciding(job) for job in jobs)]


def deciding(job: list[str]) -> tuple[str, ...]:
    """A cell's deciding overrides, sorted; a preset is left out where the cell names its model (a preset picks a
    model, never a device, a cluster or a launcher), so cells that differ only in their preset compose once."""
    keep = sorted(a for a in job if DECIDING.match(a))
    if any(a.startswith("model=") for a in keep):
        keep = [a for a in keep if not a.startswith("experiment=")]
    return tuple(keep)


@functools.cache
def cell_needs(overrides: tuple[str, ...]) -> Needs:
    """What one composed cell needs: a target by Hub id (not a local directory, not tiny or random), GPUs by its
    device or its Slurm profile's gpus_per_node."""
    cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    model = cfg.model
    label = " ".join(overrides) or "defaults"
    found = Needs()
    # a real target, as the loader and the memory check tell it (source hf: a Hub id, or a local checkpoint
    # directory, which needs no download; experiment.job.check_memory, analysis.sizing.memory_problem)
    if model.get("source") == "hf" and local_weight_bytes(model.get("target")) is None:
        found.checkpoints.append(f"model={model.name}: {model.target}")
    device = str(cfg.get("device") or "")
    gpus = OmegaConf.select(cfg, "hydra.launcher.gpus_per_node", default=None)
    if device.startswith("cuda"):
        found.gpus.append(f"device={device}")
    if gpus:
        found.gpus.append(f"{label}: gpus_per_node={gpus}")
    return found


def run_py_needs(line: str) -> Needs:
    """What the cells of a shown run.py line need, together."""
    sweep, args = run_py_args(line)
    found = Needs()
    for overrides in cells(sweep, args):
        found.add(cell_needs(tuple(overrides)))
    return found


def paper_run_py_lines(argv: list[str]) -> list[str]:
    """The run.py lines `python -m ecospec.experiment.paper ARGV --dry-run` prints (it runs nothing; it is run in
    a scratch directory, where its Slurm path clears a stale submitted.json)."""
    out = io.StringIO()
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch), contextlib.redirect_stdout(out):
        with contextlib.suppress(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            paper.main([*argv, "--dry-run"])  # a line it refuses (exit 2) runs no stage: it needs nothing
    lines = [x.removeprefix("+ ") for x in out.getvalue().splitlines() if x.startswith("+ ") and "run.py" in x]
    return ["python run.py " + x.split("run.py", 1)[1].strip() for x in lines]


def makefile() -> tuple[dict[str, str], dict[str, list[str]]]:
    """The Makefile's variables (`X ?= v`, `X = v`) and each target's recipe lines (continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Makefile").read_text())
    variables, recipes, target = {}, {}, None
    for line in text.splitlines():
        if m := re.match(r"^([A-Za-z_]+)\s*\??=\s*(.*)$", line):
            variables[m.group(1)] = m.group(2).strip()
        elif m := re.match(r"^([a-z][a-z-]*):", line):
            target = m.group(1)
            recipes[target] = []
        elif line.startswith("\t") and target:
            recipes[target].append(line.strip())
        elif not line.startswith("#"):
            target = None
    return variables, recipes


def make_lines(line: str) -> list[str]:
    """The commands `make TARGET VAR=value ...` runs, its variables substituted (the docs line's over the
    Makefile's defaults); unknown targets and placeholders give none."""
    try:
        words = shlex.split(line)[1:]
    except ValueError:
        return []
    variables, recipes = makefile()
    variables["PYTHON"] = "python"
    for w in words:
        if "=" in w and not w.startswith("[") and "..." not in w:
            key, value = w.split("=", 1)
            variables[key] = value
    out = []
    for target in (w for w in words if "=" not in w and not w.startswith("[")):
        for recipe in recipes.get(target, []):
            text = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), ""), recipe.lstrip("@"))
            out += [c for c in re.split(r"\s*(?:&&|;)\s*", text.replace("$$", "$")) if c]
    return out


@functools.cache
def needs(command: str) -> Needs:
    """What a shown command needs (`python run.py`, `python -m ecospec.experiment.paper`, `make`); another command
    needs GPUs where it asks for a CUDA device (`--device cuda`), else nothing this test knows of."""
    if command.startswith("python run.py"):
        return run_py_needs(command)  # cached, as each cell's: a command read again costs nothing
    if command.startswith("python -m ecospec.experiment.paper"):
        try:
            argv = shlex.split(command)[3:]
        except ValueError:
            return Needs()
        if any(a.startswith(("[", "<")) or "..." in a for a in argv):
            return Needs()
        found = Needs()
        for line in paper_run_py_lines(argv):
            found.add(run_py_needs(line))
        return found
    if command.startswith("make "):
        found = Needs()
        for line in make_lines(command):
            line = re.sub(r"^\S*python\S*", "python", line)
            if line.startswith(("python run.py", "python -m ecospec.experiment.paper")):
                found.add(needs(line))
        return found
    device = re.search(r"--device[= ](cuda\S*)", command)  # a module's own flag (ecospec.bench.gpu_check, ...)
    return Needs(gpus=[f"--device {device.group(1)}"]) if device else Needs()
