"""Mirror one cell's result record into one W&B run for browsing; the record stays the source of truth.

One run per cell, with a deterministic id (`<experiment>-<cell_id>`) and `resume="allow"`: rerunning a cell
(say after a failure) continues the same run, overwriting its summary and logging a newer table and heat
map, instead of adding a duplicate. Offline runs land in `<dir>/wandb/offline-run-*`; `make sync` uploads them.
Nothing here prompts or raises W&B errors into the caller: a failed online start falls back to offline once
per process, any other W&B failure is logged as a warning and the cell goes on.
"""

from __future__ import annotations

import configparser
import io
import logging
import netrc
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import PIL.Image
import wandb
from matplotlib.figure import Figure

from ecospec.experiment.heatmap import expert_load_figure

log = logging.getLogger(__name__)

# Hosts a default install logs in to: W&B's SaaS API and the CoreWeave proxy in front of it (wandb >= 0.31).
_DEFAULT_HOSTS = ("api.wandb.ai", "api.forge.coreweave.com")
_MODE_ALIASES = {"dryrun": "offline", "run": "online"}
# Online W&B is given up for the rest of the process after one failure, so a sweep pays the timeout once.
_offline_reason: str | None = None


def wandb_mode(requested: str | None = None) -> str:
    """The W&B mode to use: `requested`, else WANDB_MODE, else a `mode` in wandb's settings files (written
    by `wandb offline`/`wandb disabled`), else "online" when credentials are configured, else "offline"."""
    settings = _settings_files()
    mode = requested or os.environ.get("WANDB_MODE") or settings.get("mode")
    if mode:
        return _MODE_ALIASES.get(mode, mode)
    return "online" if _has_credentials(settings) else "offline"


def log_cell(record: Mapping[str, Any], logger_cfg: Mapping[str, Any], run_dir: str | Path) -> str | None:
    """Mirror one result record into one W&B run; return the run's local directory.

    Returns None when the logger is "none", the mode is "disabled", or W&B failed (warned, never raised).
    `logger_cfg`: name ("wandb" | "none"), project, entity, mode (None = `wandb_mode` decides), dir (the
    parent of the `wandb/` folder; default `run_dir`, the cell's output directory), init_timeout (s, default 20).
    """
    name = logger_cfg.get("name", "none")
    if name == "none":
        return None
    if name != "wandb":
        raise ValueError(f"unknown logger {name!r}; expected 'wandb' or 'none'")
    try:
        run = _start_run(record, logger_cfg, Path(logger_cfg.get("dir") or run_dir))
        directory = None if run.disabled else str(run.settings.sync_dir)
        try:
            _log_record(run, record)
        finally:
            run.finish(exit_code=0 if record["status"] == "ok" else 1)
        return directory
    except Exception as err:  # W&B only mirrors the record: the cell must not fail because of it
        log.warning("W&B logging of cell %s failed: %s", record.get("cell"), err)
        return None


def _start_run(record: Mapping[str, Any], logger_cfg: Mapping[str, Any], wandb_dir: Path):
    """`wandb.init` for this cell: online when possible, else offline (warned once per process)."""
    config = record["config"]
    return start_run(
        logger_cfg,
        wandb_dir,
        id=re.sub(r"[^\w.-]", "-", f"{record['experiment']}-{record['cell_id']}"),
        name=record["cell"],
        group=record["experiment"],
        job_type=config["method"]["name"],
        tags=[config[key]["name"] for key in ("model", "method", "dataset")],
        config=dict(config),
    )


def start_run(logger_cfg: Mapping[str, Any], wandb_dir: Path, **run: Any):
    """`wandb.init` of one run (`run`: its id, name, group, job_type, tags, config) in the logger's project, its
    files under `wandb_dir`: online when possible, else offline (warned once per process)."""
    wandb_dir.mkdir(parents=True, exist_ok=True)
    init = dict(
        project=logger_cfg.get("project") or "ecospec",
        entity=logger_cfg.get("entity"),
        dir=str(wandb_dir),
        resume="allow",
        allow_val_change=True,
        reinit="finish_previous",
        settings=wandb.Settings(
            silent=True,
            console="off",  # no stdout/stderr capture: the caller's own logs stay untouched
            init_timeout=float(logger_cfg.get("init_timeout", 20)),
            x_disable_stats=True,  # the work has already run; sampling the machine now says nothing
            save_code=False,
        ),
        **run,
    )
    mode = wandb_mode(logger_cfg.get("mode"))
    if mode == "online" and _offline_reason is None:
        if not _has_credentials(_settings_files()):  # wandb would prompt for a key
            _go_offline("no W&B credentials found (WANDB_API_KEY, ~/.netrc or `wandb login`)")
        else:
            try:
                return wandb.init(mode="online", **init)
            except Exception as err:  # no network, server errors, timeouts: all end up offline
                _go_offline(f"wandb.init online failed: {err}")
                wandb.teardown()  # the failed run's stream keeps its id busy in the W&B service
    return wandb.init(mode="offline" if mode == "online" else mode, **init)


def _go_offline(reason: str) -> None:
    global _offline_reason
    _offline_reason = reason
    log.warning("%s; W&B runs of this process are written offline, upload them with `make sync`", reason)


def _log_record(run, record: Mapping[str, Any]) -> None:
    """Scalar summary metrics, status and error into the run summary; prompt table and heat map as media."""
    run.summary.update(
        {
            **_scalars(record.get("summary") or {}),
            **_scalars({"env": record.get("env") or {}}),
            "cell_id": record["cell_id"],
            "status": record["status"],
            "error": record.get("error"),  # None on success clears the error of a resumed failed run
        }
    )
    media = {}
    if record.get("prompts"):
        media["prompts"] = _prompt_table(record["prompts"])
    if record.get("expert_load"):
        media["expert_load"] = _png(expert_load_figure(record["expert_load"], record["cell"]))
    if media:
        run.log(media)


def _png(figure: Figure) -> wandb.Image:
    """The figure rendered by its own Agg canvas (wandb would go through pyplot for a Figure)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return wandb.Image(PIL.Image.open(buffer))


def _scalars(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The scalar entries of a (nested) mapping, nested keys joined with "/"; lists are left to the files."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.update(_scalars(value, f"{prefix}{key}/"))
        elif isinstance(value, bool | int | float | str):
            flat[f"{prefix}{key}"] = value
    return flat


def _prompt_table(prompts: list[Mapping[str, Any]]) -> wandb.Table:
    """One row per prompt, without the generated token ids (they are in the record); lists become text."""
    columns = list(dict.fromkeys(key for row in prompts for key in row if key != "tokens"))
    rows = [[_cell_value(row.get(key)) for key in columns] for row in prompts]
    return wandb.Table(columns=columns, data=rows)


def _cell_value(value: Any) -> Any:
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


def _settings_files() -> dict[str, str]:
    """The [default] section of wandb's global settings file, overridden by the workspace one (./wandb/)."""
    config_dir = Path(os.environ.get("WANDB_CONFIG_DIR") or Path.home() / ".config" / "wandb")
    parser = configparser.ConfigParser()
    try:
        parser.read([config_dir / "settings", Path("wandb") / "settings"])
    except configparser.Error:
        return {}
    return dict(parser["default"]) if parser.has_section("default") else {}


def _has_credentials(settings: Mapping[str, str]) -> bool:
    """Whether wandb would find credentials: WANDB_API_KEY or an identity token file in the environment,
    an api_key in its settings files, or a netrc entry (NETRC or ~/.netrc) for the W&B host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE") or settings.get("api_key"):
        return True
    base_url = os.environ.get("WANDB_BASE_URL") or settings.get("base_url")
    hosts = [urlsplit(base_url).hostname] if base_url else _DEFAULT_HOSTS
    try:
        # an explicit path, as wandb reads it: netrc's own default refuses a world-readable ~/.netrc
        entries = netrc.netrc(os.environ.get("NETRC") or Path.home() / ".netrc").hosts
    except (OSError, netrc.NetrcParseError):
        return False
    return any(entries.get(host, (None, None, None))[2] for host in hosts)
