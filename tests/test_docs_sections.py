"""Every command the docs show that needs real checkpoints or GPUs, decided from its own composed config
(`docs_commands.needs`), sits in a GPU or cluster section; a laptop or CPU section shows none. The innermost heading
that names a place decides (a table row's own text counts as one more heading)."""

import re

import pytest
from docs_commands import needs
from docs_pages import DOCS, Shown, shown
from hydra.errors import HydraException

from ecospec import conf_dir

GPU = re.compile(r"\b(GPUs?|clusters?)\b", re.I)
LAPTOP = re.compile(r"\b(laptops?|CPUs?)\b", re.I)
CLASSIFIED = ("python run.py", "python -m ecospec.experiment.paper", "make ", "python -m ecospec.", "python src/")


@pytest.fixture(scope="module", autouse=True)
def hydra():
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        yield


def section(s: Shown) -> str | None:
    """ "gpu" or "laptop" by the innermost heading that names one (GPU or cluster wins a heading naming both)."""
    for heading in reversed(s.headings):
        if GPU.search(heading):
            return "gpu"
        if LAPTOP.search(heading):
            return "laptop"
    return None


def offenders(lines: list[Shown]) -> list[str]:
    """Every shown command that needs checkpoints or GPUs outside a GPU section."""
    out = []
    for s in lines:
        if not s.command.startswith(CLASSIFIED):
            continue
        try:
            found = needs(s.command)
        except HydraException:  # a line that does not compose: test_every_run_py_line_composes names it
            continue
        if found and section(s) != "gpu":
            where = f"under {s.headings[-1]!r}" if s.headings else "under no heading"
            out.append(f"{s.page}:{s.line}: {s.command!r} needs {found.why()}, {where}")
    return out


def test_commands_that_need_gpus_or_checkpoints_sit_in_gpu_sections(capsys):
    lines = [s for page in DOCS for s in shown(page)]
    checked = [s for s in lines if s.command.startswith(CLASSIFIED)]
    with capsys.disabled():
        print(f"\n{len(checked)} commands classified")
    assert len(checked) >= 172  # a floor: what the pages showed when it was set; raise it with them
    bad = offenders(lines)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("command", "checkpoints", "gpus"),
    [
        ("python run.py method=eagle3 dataset=gsm8k gamma=5", False, False),
        ("python run.py model=tiny_random model.parallel=tp ranks=2", False, False),
        ("python run.py model=qwen3", True, False),
        ("python run.py -m model=tiny,gptoss method=eagle3,ecospec", True, False),
        ("python run.py -m experiment=table1", True, False),  # the preset's grid holds qwen3, gptoss, deepseek
        ("python run.py -m experiment=table1 model=tiny", False, False),  # the command line wins over the grid
        ("python run.py -m model=tiny_random cluster=slurm", False, False),  # the CPU test profile
        ("python run.py -m model=tiny cluster=slurm_gpu", False, True),
        ("python run.py model=tiny_random device=cuda", False, True),
        ("make demo", False, False),
        ("make test", False, False),
        ("make paper MODEL=qwen3", True, True),
        ("make paper MODEL=gptoss CLUSTER=local", True, False),
        ("python -m ecospec.experiment.paper --model deepseek --cluster local", True, False),
        ("python -m ecospec.bench.gpu_check --device cuda --out /tmp/gpu_check", False, True),
        ("python -m ecospec.bench.gpu_check --device cpu", False, False),
    ],
)
def test_a_command_is_classified_from_its_config(command, checkpoints, gpus):
    found = needs(command)
    assert (bool(found.checkpoints), bool(found.gpus)) == (checkpoints, gpus), found


def test_the_innermost_heading_decides(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# On a cluster\n\n```bash\npython run.py model=qwen3\n```\n\n## On your laptop (CPU)\n\n"
        "`python run.py model=qwen3` and `python run.py model=tiny`\n\n### One GPU\n\n`make paper MODEL=gptoss`\n\n"
        "# Elsewhere\n\n| one GPU | `python run.py model=qwen3` |\n|---|---|\n"
        "| laptop | `python run.py model=gptoss` |\n"
    )
    assert [(s.line, section(s)) for s in shown(page)] == [
        (4, "gpu"),
        (9, "laptop"),
        (9, "laptop"),
        (13, "gpu"),
        (17, "gpu"),
        (19, "laptop"),
    ]
    assert [o.split(":")[1] for o in offenders(shown(page))] == ["9", "19"]


def test_a_local_checkpoint_directory_needs_no_download(tmp_path):
    assert needs("python run.py model=qwen3").checkpoints
    assert not needs(f"python run.py model=qwen3 model.target={tmp_path}").checkpoints
