"""Run one cell: validate, load prompts and components, decode every prompt (checkpointed), measure or reuse
the AR baseline, and write `result.json`. A failure becomes a `failed` record; it never raises, so the
other cells of a sweep go on, and it never overwrites an ok record."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

import ecospec
from ecospec.analysis.weight_bytes import loaded_formats, model_cost, verify_hbm_bytes
from ecospec.cache import digest
from ecospec.data import encode_turn, load_mix, load_prompts
from ecospec.experiment.clock import now as clock_now
from ecospec.experiment.clock import pick_clock
from ecospec.experiment.components import CellComponents, load_components
from ecospec.experiment.hf_peer import hf_generate
from ecospec.experiment.interleave import companions
from ecospec.experiment.intervals import cell_intervals
from ecospec.experiment.job import finish_record, record_head, run_job
from ecospec.experiment.metrics import (
    batch_row,
    expert_load,
    hf_seconds,
    prompt_row,
    public_row,
    quality_summary,
    replay_quality,
    step_traces,
    summarize,
)
from ecospec.experiment.records import SCHEMA, Progress, now, read_record, write_json_atomic
from ecospec.identity import ar_key, times_hf_peer
from ecospec.methods import method as method_spec
from ecospec.methods import needing_experts
from ecospec.models import moe_info
from ecospec.models.storage import loaded_storage
from ecospec.parallel import env_rank

AR_CACHE = "ar_cache"


AR_METHOD = {"name": "ar", "selector": "confidence"}
# what an AR prompt row keeps in the AR cache and in a record's `ar_prompts` (the speedup's resampling needs it)
TIMING = ("id", "turn", "batch", "n_tokens", "seconds", "cpu_seconds", "hf_tokens", "hf_seconds", "hf_cpu_seconds")


def _decode_prompt(comp: CellComponents, p, cfg: dict, progress: Progress, method: dict, trace_left: int) -> list[dict]:
    """Every turn of prompt `p` with `method`'s drafter/selector/predictor (AR when its name is 'ar'); rows
    already in `progress` are reused. `trace_left`: verify passes whose traces may still be kept."""
    ar = method["name"] == "ar"
    rows, answers = [], []
    for turn in range(len(p.turns)):
        key = f"{method['name']}/{p.id}/{turn}"
        row = progress.rows.get(key)
        if row is None:
            ids = encode_turn(comp.tokenizer, p.turns, answers, p.completion, cfg["model"].get("chat_template", True))
            drafter = None if ar else comp.drafter
            # prepared before the clock starts: a compiled engine's warm-up is env.compile_s, never a timing
            predictor = None if ar else comp.predictor
            session = method_spec(method["selector"]).open(cfg["gamma"], cfg["depth"], cfg["topk"], comp.profile)
            depth, topk = session.draft_shape
            engine = comp.engine.for_decode(
                comp.target,
                drafter,
                cfg["gamma"],
                len(ids),
                cfg["max_new_tokens"],
                predictor=predictor if method["selector"] in needing_experts() else None,
                depth=depth,
                topk=topk,
                depths=session.draft_depths,
            )
            t0, c0 = clock_now()
            res = ecospec.generate(
                comp.target,
                torch.tensor([ids]),
                drafter=drafter,
                engine=engine,
                selector=method["selector"],
                predictor=predictor,
                trace=not ar and trace_left > 0,
                profile=None if ar else comp.profile,
                **_decoding(cfg, method),
            )
            t1, c1 = clock_now()
            row = prompt_row(p.id, turn, len(ids), res, t1 - t0, not ar and comp.predictor == "oracle", c1 - c0)
            if ar and times_hf_peer(cfg):  # the AR users have, on the same prompt right after ours
                hf_tokens, hf_seconds, hf_cpu = hf_generate(
                    comp.target,
                    torch.tensor([ids]),
                    cfg["temperature"],
                    cfg["top_p"],
                    cfg["max_new_tokens"],
                    cfg["seed"],
                )
                row.update(
                    hf_tokens=len(hf_tokens),
                    hf_seconds=hf_seconds,
                    hf_cpu_seconds=hf_cpu,
                    hf_same=hf_tokens == row["tokens"],
                )
            if cfg.get("expert_budget") is not None:  # a lossy method's cell: judged against the full target
                row.update(replay_quality(comp.target, ids, row["tokens"]))
            if not ar and trace_left > 0:
                row["trace"] = [asdict(st.trace) for st in res.steps[:trace_left]]
            progress.add(key, row)
        rows.append(row)
        trace_left -= len(row.get("trace", ()))
        answers.append(comp.tokenizer.decode(row["tokens"], skip_special_tokens=True))
    return rows


def _decode_prompts(
    comp: CellComponents, prompts, cfg: dict, progress: Progress, interleave_ar: bool, others: tuple = ()
) -> tuple[dict[str, list[dict]], list[dict] | None]:
    """({method name: its rows}, AR's rows or None): every prompt with the cell's method, then each of `others`
    ((method, components) of `experiment.interleave`), then, when `interleave_ar`, AR (so a machine that slows
    down slows them all alike: every speedup and every method-against-method ratio is a ratio of one run)."""
    runs = [(cfg["method"], comp), *others]
    # the verify passes whose routes each method may still keep, over the whole cell
    trace_left = {m["name"]: 0 if m["name"] == "ar" else int(cfg.get("trace_steps") or 0) for m, _ in runs}
    rows: dict[str, list[dict]] = {m["name"]: [] for m, _ in runs}
    ar_rows = [] if interleave_ar else None
    name = " + ".join(m["name"] for m, _ in runs) + (" + ar" if interleave_ar else "")
    bar = tqdm(prompts, desc=f"{name} {cfg['dataset']['name']}", unit="prompt", disable=not cfg.get("progress", True))
    for p in bar:
        for method, c in runs:
            new = _decode_prompt(c, p, cfg, progress, method, trace_left[method["name"]])
            trace_left[method["name"]] -= sum(len(r.get("trace", ())) for r in new)
            rows[method["name"]] += new
        if interleave_ar:
            ar_rows += _decode_prompt(comp, p, cfg, progress, AR_METHOD, 0)
    return rows, ar_rows


DECODING = ("gamma", "depth", "topk", "temperature", "top_p", "max_new_tokens", "seed")  # the cell's, as generate takes


def _decoding(cfg: dict, method: dict) -> dict:
    """generate()'s and generate_batch()'s decoding arguments from the cell's config, with the expert budget of
    MoE-Spec's methods (never AR, the full target)."""
    out = {k: cfg[k] for k in DECODING}
    if method.get("budgeted"):
        out.update(expert_budget=cfg["expert_budget"], budget_policy=cfg.get("budget_policy") or "truncate")
    return out


def batch_schedule(prompts, size: int):
    """The cell's batches: lists of (prompt index, turn) of at most `size`, first turns in dataset order. A
    multi-turn prompt's next turn needs its own answer, so it joins the queue's end once its batch is done (a
    generator: advance it after decoding each batch); only the last batch may be smaller."""
    queue = deque((i, 0) for i in range(len(prompts)))
    while queue:
        batch = [queue.popleft() for _ in range(min(size, len(queue)))]
        yield batch
        queue.extend((i, t + 1) for i, t in batch if t + 1 < len(prompts[i].turns))


def _decode_batch(
    comp: CellComponents,
    prompts,
    batch,
    n: int,
    cfg: dict,
    progress: Progress,
    method: dict,
    answers: dict,
    trace_left: int,
) -> tuple[list[dict], dict]:
    """Batch `n` of the schedule (`batch`: (prompt index, turn) pairs) decoded together by `generate_batch`, or its
    rows from `progress`: (rows, batch row). Each prompt row gets an equal share of the batch's wall time (so a
    cell's seconds count every batch once); the batch row holds what the batched verify passes did."""
    ar = method["name"] == "ar"
    keys = [f"{method['name']}/{prompts[i].id}/{t}" for i, t in batch]
    bkey = f"{method['name']}/batch/{n}"
    if bkey in progress.rows and all(k in progress.rows for k in keys):
        return [progress.rows[k] for k in keys], progress.rows[bkey]
    chat = cfg["model"].get("chat_template", True)
    ids = [encode_turn(comp.tokenizer, prompts[i].turns, answers[i][:t], prompts[i].completion, chat) for i, t in batch]
    drafter = None if ar else comp.drafter
    # prepared before the clock starts (the head and predictor too), for the cell's batch size: a smaller last
    # batch runs in its rows
    session = method_spec(method["selector"]).open(cfg["gamma"], cfg["depth"], cfg["topk"], comp.profile)
    engine = comp.engine.for_decode(
        comp.target,
        drafter,
        cfg["gamma"],
        max(map(len, ids)),
        cfg["max_new_tokens"],
        predictor=None if ar or method["selector"] not in needing_experts() else comp.predictor,
        depth=session.draft_shape[0],
        topk=session.draft_shape[1],
        depths=session.draft_depths,
        rows=cfg["batch_size"],
    )
    t0, c0 = clock_now()
    res = ecospec.generate_batch(
        comp.target,
        ids,
        engine=engine,
        drafter=drafter,
        selector=method["selector"],
        predictor=None if ar else comp.predictor,
        trace=not ar and trace_left > 0,
        batch_buffer=cfg.get("batch_buffer") or "sequence",
        profile=None if ar else comp.profile,
        **_decoding(cfg, method),
    )
    t1, c1 = clock_now()
    brow = batch_row(n, keys, res, t1 - t0, not ar and comp.predictor == "oracle", c1 - c0)
    rows = []
    for (i, t), key, r in zip(batch, keys, res.results, strict=True):
        share = brow["seconds"] / len(batch), brow["cpu_seconds"] / len(batch)
        row = prompt_row(prompts[i].id, t, len(ids[len(rows)]), r, share[0], False, share[1])
        row.update(batch=n, batch_size=len(batch))
        if cfg.get("expert_budget") is not None:
            row.update(replay_quality(comp.target, ids[len(rows)], row["tokens"]))
        if not ar and trace_left > 0:
            row["trace"] = [asdict(st.trace) for st in r.steps[:trace_left]]
            trace_left -= len(row["trace"])
        progress.add(key, row)
        rows.append(row)
    progress.add(bkey, brow)  # last: a batch counts as done once its batch row is written
    return rows, brow


def _decode_batched(comp: CellComponents, prompts, cfg: dict, progress: Progress, interleave_ar: bool):
    """`_decode_prompts` at batch_size > 1: (rows, batch rows, AR rows, AR batch rows), AR decoding each batch right
    after the method when `interleave_ar`. Rows come back in dataset order (prompt, then turn)."""
    method = cfg["method"]
    trace_left = 0 if method["name"] == "ar" else int(cfg.get("trace_steps") or 0)
    answers = {m["name"]: {i: [] for i in range(len(prompts))} for m in (method, AR_METHOD)}  # each its own answers
    rows, batches, ar_rows, ar_batches = [], [], [], []
    name = method["name"] + (" + ar" if interleave_ar else "")
    bar = tqdm(
        total=sum(len(p.turns) for p in prompts),
        desc=f"{name} {cfg['dataset']['name']} B={cfg['batch_size']}",
        unit="prompt",
        disable=not cfg.get("progress", True),
    )
    for n, batch in enumerate(batch_schedule(prompts, cfg["batch_size"])):
        new, brow = _decode_batch(comp, prompts, batch, n, cfg, progress, method, answers[method["name"]], trace_left)
        trace_left -= sum(len(r.get("trace", ())) for r in new)
        rows += new
        batches.append(brow)
        if interleave_ar:
            new_ar, brow_ar = _decode_batch(comp, prompts, batch, n, cfg, progress, AR_METHOD, answers["ar"], 0)
            ar_rows += new_ar
            ar_batches.append(brow_ar)
        done = [(method["name"], new)] + ([("ar", new_ar)] if interleave_ar else [])
        for name_, got in done:
            for (i, _), row in zip(batch, got, strict=True):
                answers[name_][i].append(comp.tokenizer.decode(row["tokens"], skip_special_tokens=True))
        bar.update(len(batch))
    bar.close()
    order = {p.id: i for i, p in enumerate(prompts)}
    by_prompt = lambda r: (order[r["id"]], r["turn"])
    return sorted(rows, key=by_prompt), batches, sorted(ar_rows, key=by_prompt) if interleave_ar else None, ar_batches


def _ar_baseline(comp, prompts, cfg, progress, hardware: str, own_rows, own_batches, clock: str) -> dict:
    """The AR record of this cell's key: from the cache, or measured now (and cached); `timing` keeps its
    per-prompt rows, so that a cell that reuses it still has an (weakly paired) interval."""
    key = ar_key(cfg, hardware, clock)
    path = Path(cfg["out_dir"]) / AR_CACHE / f"{digest(key, 16)}.json"
    if own_rows is None and path.exists():
        cached = read_record(path)
        if cached and cached.get("key") == key:
            return cached
    rows, batches = own_rows, own_batches
    if rows is None:
        ar_cfg = {**cfg, "method": AR_METHOD}
        if cfg["batch_size"] > 1:
            rows, batches, _, _ = _decode_batched(comp, prompts, ar_cfg, progress, False)
        else:
            rows = [r for p in prompts for r in _decode_prompt(comp, p, ar_cfg, progress, AR_METHOD, 0)]
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
        "hf_same": sum(r["hf_same"] for r in timed) / len(timed) if timed and cfg["temperature"] == 0 else None,
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
    cfg: dict,
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
    if cfg.get("expert_budget") is not None:
        s.update(quality_summary(rows, ar, cfg["temperature"]))
    if cfg["temperature"] == 0:
        same = [r["tokens"] == ar["outputs"].get(f"{r['id']}/{r['turn']}") for r in rows]
        s["matches_ar"] = sum(same) / len(same)
        for r, m in zip(rows, same, strict=True):
            r["matches_ar"] = m
    else:
        s["matches_ar"] = None
    info = moe_info(comp.target)
    # bytes of the weights as loaded (env.storage), not as the checkpoint stores them
    cost = model_cost(cfg["model"], loaded_formats(storage))
    s["hbm_bytes_per_verify"] = verify_hbm_bytes(cost, s["experts_per_layer"] or 0.0)
    s["predictor_accuracy"] = comp.predictor_accuracy
    s["top_k"] = info.top_k
    s["num_experts"] = info.num_experts
    s["num_moe_layers"] = info.num_moe_layers
    s["batch_size"] = cfg["batch_size"]
    s["intervals"] = cell_intervals(rows, ar.get("timing"), batches, clock, pairing, seed=cfg["seed"])
    return s


def cell_prompts(d: dict):
    """The cell's prompts, counted within its split (heldout: the 20 % no predictor trained on); fails fast, before
    any model loads."""
    ds, split = d["dataset"], d.get("split", "heldout")
    if ds["name"] == "mix":
        return load_mix(
            ds["members"],
            ds["instances"],
            ds["seed"],
            d["num_prompts"],
            split=split,
            per_member=ds.get("per_member"),
            turns=ds.get("turns"),
        )
    return load_prompts(ds["name"], d["num_prompts"], ds.get("source"), split=split)


def _decode_cell(d: dict, cell_dir: Path, device: torch.device, record: dict) -> None:
    """The cell's work: prompts, components, every prompt decoded (checkpointed), the AR baseline, the summary."""
    prompts = cell_prompts(d)
    record["data_source"] = prompts.source  # hub:, hf-cache:, vendored:, local: or package:
    comp = load_components(d, device)
    # what runs, as loaded (the format may not be the checkpoint's: transformers dequantizes without its kernels)
    record["env"]["storage"] = {**(record["env"].get("storage") or {}), **loaded_storage(comp.target)}
    progress = Progress(cell_dir, record["cell_id"], fresh=bool(d.get("force")), write=env_rank() == 0)
    clock, why = pick_clock(d.get("clock"), device)  # what tokens/s and the speedup divide by (experiment.clock)
    # the AR baseline: measured here, prompt by prompt beside the method (CPU: noisy, shared machines), or taken
    # from the AR cache (GPU: stable, and AR is the most expensive decoder)
    mode = d.get("ar_baseline") or "auto"
    interleave = d["method"]["name"] != "ar" and (mode == "interleaved" or (mode == "auto" and device.type == "cpu"))
    others = companions(d, cell_dir, device, comp, record)  # the methods decoded beside this one (interleave=...)
    if d["batch_size"] > 1:
        rows, batches, ar_rows, ar_batches = _decode_batched(comp, prompts, d, progress, interleave)
    else:
        by_method, ar_rows = _decode_prompts(
            comp, prompts, d, progress, interleave, [(o[0]["method"], o[1]) for o in others]
        )
        rows, batches, ar_batches = by_method[d["method"]["name"]], None, None
    is_ar = d["method"]["name"] == "ar"
    own, own_batches = (rows, batches) if is_ar else (ar_rows, ar_batches)
    ar = _ar_baseline(comp, prompts, d, progress, record["env"]["hardware"], own, own_batches, clock)
    pairing = "paired" if own is not None else ("weakly paired" if ar.get("timing") else "none")
    record["env"].update(comp.engine.env())  # engine, compile_s (the warm-up, outside every timing)
    _fill(record, comp, d, rows, batches, ar, clock, why, pairing)
    kept_names = record.pop("_kept", [])
    if kept_names:
        record["interleaved"] = {"run": None, "methods": [d["method"]["name"]], "kept": kept_names}
    if others:  # one run id for the group: its method-against-method ratios are paired (report.compare)
        run = digest({"cell": record["cell_id"], "started": record["started"]}, 16)
        group = [d["method"]["name"], *(o[0]["method"]["name"] for o in others)]
        record["summary"]["intervals"]["run"] = run
        record["interleaved"] = {"run": run, "methods": group, "kept": kept_names}
        for cd, ccomp, cdir in others:
            rec = {**record_head(cd), "env": record["env"], "data_source": record["data_source"]}
            _fill(rec, ccomp, cd, by_method[cd["method"]["name"]], None, ar, clock, why, pairing)
            rec["summary"]["intervals"]["run"] = run
            rec["interleaved"] = {**record["interleaved"], "in": record["cell"]}
            rec.update(status="ok", finished=now())
            cdir.mkdir(parents=True, exist_ok=True)
            finish_record(cdir, cd, rec)
    progress.clear()


def _fill(record: dict, comp: CellComponents, d: dict, rows, batches, ar: dict, clock: str, why, pairing: str) -> None:
    """A cell record's summary and per-prompt parts from its rows and its AR."""
    record["summary"] = _summary(comp, d, rows, batches, ar, record["env"]["storage"], clock, pairing)
    if comp.profile_ref:  # the profile the method priced its passes with (no part of the cell's identity)
        record["profile"] = comp.profile_ref
    if why:
        record["summary"]["clock_note"] = why
    record["ar_prompts"] = ar.get("timing") or []
    if batches:
        record["batches"] = [{k: v for k, v in b.items() if k != "keys"} for b in batches]
    record["prompts"] = [public_row(r) for r in rows]
    record["expert_load"] = expert_load(rows)
    if d.get("trace_steps"):
        record["trace"] = step_traces(rows)


def run_cell(cfg, cell_dir: str | Path) -> dict:
    """Run (or skip) one cell and return its record."""
    return run_job(cfg, cell_dir, _decode_cell)


def one_line(record: dict) -> str:
    """α, E, speedup vs AR and estimated HBM per verify pass of a cell's record (what a traces or predictor job
    made), or its error."""
    if record["status"] != "ok":
        return f"{record['cell']}: FAILED {record.get('error', '')}"
    s = record["summary"]
    skipped = " (existing record)" if record.get("skipped") else ""
    if record.get("kind") == "traces":
        return f"{record['cell']}{skipped}: {s['samples']} samples, {s['tokens']:,} tokens traced -> {s['trace_dir']}"
    if record.get("kind") == "fig1a":
        return f"{record['cell']}{skipped}: {s['points']} verify-latency points ({', '.join(s['impls'])}) -> {s['out']}"
    if record.get("kind") == "predictor":
        return (
            f"{record['cell']}{skipped}: held-out top-k accuracy {s['final_accuracy']:.3f} (chance {s['chance']:.3f}); "
            f"published {', '.join(s['published'])} -> {s['store']}"
        )
    cpu = record.get("env", {}).get("device") == "cpu"
    clock = {"thread_cpu": " (CPU time)", "wall": " (CPU wall clock)"}.get(s.get("clock", "wall"), "") if cpu else ""
    if ((record.get("config") or {}).get("backend") or {}).get("name") == "vllm":  # vLLM reports no experts
        return (
            f"{record['cell']}{skipped}: alpha {s['alpha']:.2f}  TPOT {1e3 * s['tpot_s']:.2f} ms vs AR "
            f"{1e3 * s['ar_tpot_s']:.2f} ms  speedup {s['speedup']:.2f}x (vLLM{', CPU wall clock' if clock else ''})"
        )
    iv = (s.get("intervals") or {}).get("speedup")
    band = f" [{iv['low']:.2f}, {iv['high']:.2f}]" if iv else ""
    env = record.get("env") or {}
    warm = f"  compiled, warm-up {env['compile_s']:.1f} s (untimed)" if env.get("engine") == "compiled" else ""
    return (
        f"{record['cell']}{skipped}: alpha {s['alpha']:.2f}  E {s['experts_per_layer']:.2f}  "
        f"speedup {s['speedup']:.2f}x{band} vs AR{clock}  HBM per verify pass {s['hbm_bytes_per_verify'] / 1e6:.2f} MB "
        f"(est.){warm}"
    )
