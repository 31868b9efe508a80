"""Run one cell: validate, load prompts and components, hand every prompt (or batch) to each of its decoders in turn
(`experiment.contenders`: its method, the methods interleaved beside it, AR; checkpointed), measure or reuse the AR
baseline, and write `result.json`. A failure becomes a `failed` record; it never raises, so the other cells of a
sweep go on, and it never overwrites an ok record.

`interleave=[eagle3,oracle]` decodes listed methods beside the cell's own, prompt by prompt, sharing its target:
each gets the record it would have had run alone, in its own cell directory, and every record of the group carries
`summary.intervals.run`, by which the reports know their ratios are paired (`report.compare`). A listed method whose
ok record stands is kept, not rerun (force=true reruns it)."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ecospec.analysis.weight_bytes import loaded_formats, model_cost, verify_hbm_bytes
from ecospec.cache import digest
from ecospec.data import load_mix, load_prompts
from ecospec.experiment.clock import pick_clock
from ecospec.experiment.components import CellComponents, load_components
from ecospec.experiment.config import MIX
from ecospec.experiment.contenders import Decoder, HfPeer
from ecospec.experiment.intervals import cell_intervals
from ecospec.experiment.job import finish_record, kept, record_head, run_job
from ecospec.experiment.metrics import (
    expert_load,
    hf_seconds,
    public_row,
    quality_summary,
    step_traces,
    summarize,
)
from ecospec.experiment.records import SCHEMA, Progress, now, read_record, write_json_atomic
from ecospec.experiment.spec import AR, Cell
from ecospec.identity import ar_key
from ecospec.models import moe_info
from ecospec.models.storage import loaded_storage
from ecospec.parallel import env_rank

AR_CACHE = "ar_cache"
# what an AR prompt row keeps in the AR cache and in a record's `ar_prompts` (the speedup's resampling needs it)
TIMING = ("id", "turn", "batch", "n_tokens", "seconds", "cpu_seconds", "hf_tokens", "hf_seconds", "hf_cpu_seconds")


def batch_schedule(prompts, size: int):
    """The cell's batches: lists of (prompt index, turn) of at most `size`, first turns in dataset order. A
    multi-turn prompt's next turn needs its own answer, so it joins the queue's end once its batch is done (a
    generator: advance it after decoding each batch); only the last batch may be smaller."""
    queue = deque((i, 0) for i in range(len(prompts)))
    while queue:
        batch = [queue.popleft() for _ in range(min(size, len(queue)))]
        yield batch
        queue.extend((i, t + 1) for i, t in batch if t + 1 < len(prompts[i].turns))


def _decode(prompts, cell: Cell, progress: Progress, decoders: list[Decoder], peer: HfPeer | None = None):
    """({decoder: its rows}, {decoder: its batch rows} or None at batch 1): every prompt (batch 1) or batch of the
    schedule decoded by each decoder in turn, `peer` right after the AR decoder it times. Rows come back in dataset
    order (prompt, then turn)."""
    size = cell.decoding.batch_size
    rows: dict[str, list[dict]] = {x.name: [] for x in decoders}
    batches: dict[str, list[dict]] | None = {x.name: [] for x in decoders} if size > 1 else None
    desc = " + ".join(x.name for x in decoders) + f" {cell.dataset.name}" + (f" B={size}" if size > 1 else "")
    total = sum(len(p.turns) for p in prompts) if size > 1 else len(prompts)
    bar = tqdm(total=total, desc=desc, unit="prompt", disable=not cell.progress)
    if size > 1:
        for n, batch in enumerate(batch_schedule(prompts, size)):
            for x in decoders:
                new, brow = x.batch(prompts, batch, n, progress)
                rows[x.name] += new
                batches[x.name].append(brow)
            bar.update(len(batch))
        order = {p.id: i for i, p in enumerate(prompts)}
        rows = {k: sorted(v, key=lambda r: (order[r["id"]], r["turn"])) for k, v in rows.items()}
    else:
        for i, p in enumerate(prompts):
            for x in decoders:
                new = x.prompt(i, p, progress)
                rows[x.name] += new
                if peer is not None and peer.ar is x:
                    peer.prompt(i, p, progress, new)
            bar.update(1)
    bar.close()
    return rows, batches


def _ar(comp: CellComponents, cell: Cell) -> Decoder:
    """The AR decoder of the cell's target."""
    return Decoder(AR, comp, cell.decoding, cell.chat)


def _ar_baseline(comp, prompts, cell: Cell, progress, hardware: str, own_rows, own_batches, clock: str) -> dict:
    """The AR record of this cell's key: from the cache, or measured now (and cached); `timing` keeps its
    per-prompt rows, so that a cell that reuses it still has an (weakly paired) interval."""
    key = ar_key(cell.job.config, hardware, clock)
    path = Path(cell.out_dir) / AR_CACHE / f"{digest(key, 16)}.json"
    if own_rows is None and path.exists():
        cached = read_record(path)
        if cached and cached.get("key") == key:
            return cached
    rows, batches = own_rows, own_batches
    if rows is None:
        ar = _ar(comp, cell)
        by_name, by_batch = _decode(prompts, cell, progress, [ar], HfPeer(ar) if cell.hf_peer else None)
        rows, batches = by_name[ar.name], by_batch and by_batch[ar.name]
    summary = summarize(rows, batches, clock)
    ours = summary["tokens_per_s"]
    timed = [r for r in rows if "hf_seconds" in r]
    hf = sum(r["hf_tokens"] for r in timed) / sum(hf_seconds(r, clock) for r in timed) if timed else None
    source = "hf_generate" if hf and ours and hf > ours else "ecospec"
    ar = {
        "schema": SCHEMA,
        "status": "ok",
        "key": key,
        "created": now(),
        # the denominator: the faster AR (our loop's step times and E stay ours, for rho and Table 8)
        "tokens_per_s": hf if source == "hf_generate" else ours,
        "source": source,
        "ecospec_tokens_per_s": ours,
        "hf_tokens_per_s": hf,
        "hf_same": sum(r["hf_same"] for r in timed) / len(timed) if timed and cell.decoding.temperature == 0 else None,
        "t_step_s": summary["t_step_s"],
        "tpot_s": summary["tpot_s"],
        "experts_per_layer": summary["experts_per_layer"],  # AR's E: top-k at B = 1, the batch's union at B > 1
        "loglik": {f"{r['id']}/{r['turn']}": r["loglik"] for r in rows if "loglik" in r},  # budgeted cells
        "outputs": {f"{r['id']}/{r['turn']}": r["tokens"] for r in rows},
        "clock": clock,
        "timing": [{k: r[k] for k in TIMING if k in r} for r in rows],
    }
    if env_rank() == 0:  # one writer: the other ranks computed the same record
        write_json_atomic(path, ar)
    return ar


def _summary(
    comp: CellComponents,
    cell: Cell,
    rows: list[dict],
    batches: list[dict] | None,
    ar: dict,
    storage: dict,
    clock: str,
    pairing: str,
) -> dict:
    s = summarize(rows, batches, clock)
    s["ar_tokens_per_s"] = ar["tokens_per_s"]
    s["ar_source"] = ar.get("source", "ecospec")
    s["ar_ecospec_tokens_per_s"] = ar.get("ecospec_tokens_per_s", ar["tokens_per_s"])
    s["ar_hf_tokens_per_s"] = ar.get("hf_tokens_per_s")  # None: not timed (batch > 1, ar_peer=none)
    s["ar_hf_same"] = ar.get("hf_same")  # greedy: share of prompts whose HF output equals our AR's (1.0 expected)
    s["ar_t_step_s"] = ar["t_step_s"]
    s["ar_tpot_s"] = ar.get("tpot_s")  # None: an AR record cached before TPOT was kept
    s["ar_experts_per_layer"] = ar.get("experts_per_layer")
    s["speedup"] = s["tokens_per_s"] / ar["tokens_per_s"] if s["tokens_per_s"] and ar["tokens_per_s"] else None
    # paper Table 8: AR step time / verify-pass time at the same batch size
    s["rho"] = ar["t_step_s"] / s["t_verify_s"] if ar.get("t_step_s") and s.get("t_verify_s") else None
    if cell.decoding.expert_budget is not None:
        s.update(quality_summary(rows, ar, cell.decoding.temperature))
    if cell.decoding.temperature == 0:
        same = [r["tokens"] == ar["outputs"].get(f"{r['id']}/{r['turn']}") for r in rows]
        s["matches_ar"] = sum(same) / len(same)
        for r, m in zip(rows, same, strict=True):
            r["matches_ar"] = m
    else:
        s["matches_ar"] = None
    info = moe_info(comp.target)
    # bytes of the weights as loaded (env.storage), not as the checkpoint stores them
    cost = model_cost(cell.model, loaded_formats(storage))
    s["hbm_bytes_per_verify"] = verify_hbm_bytes(cost, s["experts_per_layer"] or 0.0)
    s["predictor_accuracy"] = comp.predictor_accuracy
    s["top_k"] = info.top_k
    s["num_experts"] = info.num_experts
    s["num_moe_layers"] = info.num_moe_layers
    s["batch_size"] = cell.decoding.batch_size
    s["intervals"] = cell_intervals(rows, ar.get("timing"), batches, clock, pairing, seed=cell.decoding.seed)
    return s


def cell_prompts(cell: Cell):
    """The cell's prompts, counted within its split (heldout: the 20 % no predictor trained on); fails fast, before
    any model loads."""
    ds, split = cell.dataset, cell.split
    if ds.name == MIX:
        return load_mix(
            list(ds.members),
            ds.instances,
            ds.seed,
            cell.num_prompts,
            split=split,
            per_member=ds.per_member,
            turns=ds.turns,
        )
    return load_prompts(ds.name, cell.num_prompts, ds.source, split=split)


def companions(
    cell: Cell, cell_dir: Path, device: torch.device, comp: CellComponents, record: dict
) -> list[tuple[Cell, CellComponents, Path]]:
    """(cell, components, cell directory) of each method `interleave=` lists, to decode beside the cell's own and
    sharing its target; a listed method whose ok record stands is kept, not rerun (`record["_kept"]` names them)."""
    out = []
    for c in cell.interleave:
        cdir = cell_dir.parent / c.name
        if kept(cdir, c.job) is not None:
            record.setdefault("_kept", []).append(c.method.name)
            continue
        out.append((c, load_components(c.model, c.method, c.engine, device, loaded=comp), cdir))
    return out


def _decode_cell(cell: Cell, cell_dir: Path, device: torch.device, record: dict) -> None:
    """The cell's work: prompts, components, every prompt decoded (checkpointed), the AR baseline, the summary."""
    prompts = cell_prompts(cell)
    record["data_source"] = prompts.source  # hub:, hf-cache:, vendored:, local: or package:
    comp = load_components(cell.model, cell.method, cell.engine, device)
    # what runs, as loaded (the format may not be the checkpoint's: transformers dequantizes without its kernels)
    record["env"]["storage"] = {**(record["env"].get("storage") or {}), **loaded_storage(comp.target)}
    progress = Progress(cell_dir, record["cell_id"], fresh=cell.force, write=env_rank() == 0)
    clock, why = pick_clock(cell.clock, device)  # what tokens/s and the speedup divide by (experiment.clock)
    # the AR baseline: measured here, prompt by prompt beside the method (CPU: noisy, shared machines), or taken
    # from the AR cache (GPU: stable, and AR is the most expensive decoder)
    mode = cell.ar_baseline
    speculative = cell.method.speculative  # AR's own cell is its baseline
    interleave = speculative and (mode == "interleaved" or (mode == "auto" and device.type == "cpu"))
    others = companions(cell, cell_dir, device, comp, record)  # the methods decoded beside this one
    trace = cell.trace_steps
    own = Decoder(cell.method, comp, cell.decoding, cell.chat, trace if speculative else 0)
    decoders = [own, *(Decoder(c.method, ccomp, cell.decoding, cell.chat, trace) for c, ccomp, _ in others)]
    ar_decoder = None  # AR decoded here: the cell's own decoder when it is AR, else beside it when interleaved
    if not speculative:
        ar_decoder = own
    elif interleave:
        ar_decoder = _ar(comp, cell)
        decoders.append(ar_decoder)
    peer = HfPeer(ar_decoder) if ar_decoder is not None and cell.hf_peer else None
    by_name, by_batch = _decode(prompts, cell, progress, decoders, peer)
    rows, batches = by_name[own.name], by_batch and by_batch[own.name]
    ar_rows = None if ar_decoder is None else by_name[ar_decoder.name]
    ar_batches = None if ar_decoder is None or by_batch is None else by_batch[ar_decoder.name]
    ar = _ar_baseline(comp, prompts, cell, progress, record["env"]["hardware"], ar_rows, ar_batches, clock)
    pairing = "paired" if ar_rows is not None else ("weakly paired" if ar.get("timing") else "none")
    record["env"].update(comp.engine.env())  # engine, compile_s (the warm-up, outside every timing)
    _fill(record, comp, cell, rows, batches, ar, clock, why, pairing)
    kept_names = record.pop("_kept", [])
    if kept_names:
        record["interleaved"] = {"run": None, "methods": [cell.method.name], "kept": kept_names}
    if others:  # one run id for the group: its method-against-method ratios are paired (report.compare)
        run = digest({"cell": record["cell_id"], "started": record["started"]}, 16)
        group = [cell.method.name, *(c.method.name for c, _, _ in others)]
        record["summary"]["intervals"]["run"] = run
        record["interleaved"] = {"run": run, "methods": group, "kept": kept_names}
        for c, ccomp, cdir in others:
            rec = {**record_head(c.job), "env": record["env"], "data_source": record["data_source"]}
            _fill(rec, ccomp, c, by_name[c.method.name], None, ar, clock, why, pairing)
            rec["summary"]["intervals"]["run"] = run
            rec["interleaved"] = {**record["interleaved"], "in": record["cell"]}
            rec.update(status="ok", finished=now())
            cdir.mkdir(parents=True, exist_ok=True)
            finish_record(cdir, c.job, rec)
    progress.clear()


def _fill(record: dict, comp: CellComponents, cell: Cell, rows, batches, ar: dict, clock: str, why, pairing) -> None:
    """A cell record's summary and per-prompt parts from its rows and its AR."""
    record["summary"] = _summary(comp, cell, rows, batches, ar, record["env"]["storage"], clock, pairing)
    if comp.profile_ref:  # the profile the method priced its passes with (no part of the cell's identity)
        record["profile"] = comp.profile_ref
    if why:
        record["summary"]["clock_note"] = why
    record["ar_prompts"] = ar.get("timing") or []
    if batches:
        record["batches"] = [{k: v for k, v in b.items() if k != "keys"} for b in batches]
    record["prompts"] = [public_row(r) for r in rows]
    record["expert_load"] = expert_load(rows)
    if cell.trace_steps:
        record["trace"] = step_traces(rows)


def run_cell(cfg, cell_dir: str | Path) -> dict:
    """Run (or skip) one cell and return its record."""
    return run_job(cfg, cell_dir, _decode_cell)
