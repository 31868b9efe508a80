"""docs/grids.md's preset tables count each preset's cells from its config: the counts must be what the preset
composes to now (every grid expanded; the methods a job interleaves are cells of their own; a cell two grids share
counts once; the laptop table also without the benchmarks only the Hub has)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ecospec import conf_dir
from ecospec.identity import cell_id

PAGE = Path(__file__).resolve().parents[1] / "docs" / "grids.md"
HUB_ONLY = {"aime25", "amc", "mmstar"}  # no offline copy (docs/benchmarks.md)


def section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"### {title}")
    end = text.find("\n#", start + 1)
    return text[start : end if end > 0 else None]


def rows(title: str) -> dict[str, str]:
    """preset -> its cells column, from the table under the heading `title` (one row may name several presets)."""
    out = {}
    for line in section(title).splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        presets = re.findall(r"`(\w+)`", cols[0]) if line.startswith("| `") else []
        for i, preset in enumerate(presets):
            counts = cols[2 if title.startswith("GPU") else 1]
            numbers = re.findall(r"\d+", counts)
            out[preset] = numbers[i] if len(presets) > 1 else counts
    return out


def sweep(preset: str, *extra: str):
    """The preset's config and its jobs' override lists, as the grid sweeper expands them."""
    cfg = compose("config", overrides=[f"experiment={preset}", *extra], return_hydra_config=True)
    from hydra_plugins.ecospec_grid_sweeper import GridSweeper  # Hydra has loaded the plugin by now

    sw = OmegaConf.to_container(cfg.hydra.sweeper, resolve=False)
    return cfg, GridSweeper(grids=sw.get("grids"), params=sw.get("params")).jobs(list(extra))


def cells(preset: str, *extra: str) -> tuple[int, int, int]:
    """(cells, cells without the Hub-only benchmarks, jobs without them) of a preset."""
    _, jobs = sweep(preset, *extra)
    every, local, local_jobs = set(), set(), 0
    for job in jobs:
        cfg = compose("config", overrides=[f"experiment={preset}", *extra, *job])
        rest = [o for o in job if not o.startswith(("method=", "interleave="))]
        ids = {cell_id(cfg)} | {
            cell_id(
                compose("config", overrides=[f"experiment={preset}", *extra, *rest, f"method={m}", "interleave=[]"])
            )
            for m in cfg.get("interleave") or []
        }
        every |= ids
        if cfg.dataset.name not in HUB_ONLY:
            local |= ids
            local_jobs += 1
    return len(every), len(local), local_jobs


@pytest.mark.slow  # about a minute: every job of the laptop presets composed
def test_laptop_preset_counts_are_the_configs():
    table = rows("Laptop presets")
    assert {"tiny_repro", "gamma_protocol", "moe_methods"} <= set(table)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        for preset, said in table.items():
            extra = ("model=tiny",) if preset == "gamma_protocol" else ()
            every, local, jobs = cells(preset, *extra)
            numbers = [int(n) for n in re.findall(r"(?<!\w)\d+(?!\w)", said)]  # not the 25 of AIME25
            want = [local, jobs] + ([every] if every != local else [])
            assert numbers == want, f"{preset}: the page says {said!r}, the config composes to {want}"


def test_cluster_preset_counts_are_the_configs():
    """No cluster preset interleaves methods or shares a cell between grids, so its cells are its jobs."""
    table = rows("GPU cluster presets")
    assert "table1" in table
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        for preset, said in table.items():
            if preset in ("traces", "predictor", "gto"):
                continue  # jobs per model, not cells
            cfg, jobs = sweep(preset)
            assert not cfg.get("interleave") and not any(o.startswith("interleave=") for j in jobs for o in j)
            assert int(re.findall(r"\d+", said)[0]) == len(jobs), f"{preset}: page {said!r}, config {len(jobs)} jobs"
