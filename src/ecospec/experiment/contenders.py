"""The decoders a cell times, one object each: its method, the methods interleaved beside it, AR, and transformers'
own `generate` as AR's peer. The cell hands every prompt (batch 1) or batch (B > 1) to each in turn, so a machine
that slows down slows them all alike and every ratio is one run's. Each keeps its own answers (a multi-turn
prompt's next turn reads its own) and writes its rows to the cell's progress, so a killed cell resumes where it
stopped."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field

import torch

import ecospec
from ecospec.data import encode_turn
from ecospec.experiment.clock import now as clock_now
from ecospec.experiment.components import CellComponents
from ecospec.experiment.hf_peer import hf_generate
from ecospec.experiment.metrics import batch_row, prompt_row, replay_quality
from ecospec.experiment.records import Progress
from ecospec.experiment.spec import Decoding, Method
from ecospec.methods import method as method_spec
from ecospec.methods import needing_experts


@dataclass
class Decoder:
    """A method and its components, or AR (a method without a drafter: no predictor, no profile, no traces), with
    the cell's decoding settings. `chat`: prompts go through the chat template; `trace_left`: the verify passes
    whose traces it may still keep."""

    method: Method
    comp: CellComponents
    decoding: Decoding
    chat: bool = True
    trace_left: int = 0
    answers: dict = field(default_factory=lambda: defaultdict(list))  # prompt index -> its answers so far

    @property
    def name(self) -> str:
        return self.method.name

    @property
    def speculative(self) -> bool:
        return self.method.speculative

    def ids(self, p, i: int, turn: int) -> list[int]:
        """Turn `turn` of prompt `p` (index `i`) after this decoder's own answers to the turns before it."""
        return encode_turn(self.comp.tokenizer, p.turns, self.answers[i][:turn], p.completion, self.chat)

    def _engine(self, lengths: int, rows: int = 1):
        """The engine prepared for this decode before the clock starts (a compiled warm-up is env.compile_s, never
        a timing); at B > 1 for the cell's batch size, a smaller last batch running in its rows."""
        comp, dec = self.comp, self.decoding
        session = method_spec(self.method.selector).open(dec.gamma, dec.depth, dec.topk, comp.profile)
        depth, topk = session.draft_shape
        needs = self.speculative and self.method.selector in needing_experts()
        kw = {"rows": rows} if rows > 1 else {}
        return comp.engine.for_decode(
            comp.target,
            self._drafter,
            dec.gamma,
            lengths,
            dec.max_new_tokens,
            predictor=comp.predictor if needs else None,
            depth=depth,
            topk=topk,
            depths=session.draft_depths,
            **kw,
        )

    @property
    def _drafter(self):
        return self.comp.drafter if self.speculative else None

    def _args(self) -> dict:
        comp = self.comp
        return dict(
            drafter=self._drafter,
            selector=self.method.selector,
            predictor=comp.predictor if self.speculative else None,
            trace=self.speculative and self.trace_left > 0,
            profile=comp.profile if self.speculative else None,
            **self.decoding.generate_args(self.method),
        )

    def _finish(self, row: dict, ids: list[int], res) -> None:
        if self.decoding.expert_budget is not None:  # a lossy method's cell: judged against the full target
            row.update(replay_quality(self.comp.target, ids, row["tokens"]))
        if self.speculative and self.trace_left > 0:
            row["trace"] = [asdict(st.trace) for st in res.steps[: self.trace_left]]
            self.trace_left -= len(row["trace"])

    def prompt(self, i: int, p, progress: Progress) -> list[dict]:
        """Every turn of prompt `p` (index `i`), one `generate` each; rows already in `progress` are reused."""
        rows = []
        for turn in range(len(p.turns)):
            key = f"{self.name}/{p.id}/{turn}"
            row = progress.rows.get(key)
            if row is None:
                ids = self.ids(p, i, turn)
                engine = self._engine(len(ids))
                t0, c0 = clock_now()
                res = ecospec.generate(self.comp.target, torch.tensor([ids]), engine=engine, **self._args())
                t1, c1 = clock_now()
                oracle = self.speculative and self.comp.predictor == "oracle"
                row = prompt_row(p.id, turn, len(ids), res, t1 - t0, oracle, c1 - c0)
                self._finish(row, ids, res)
                progress.add(key, row)
            else:
                self.trace_left -= len(row.get("trace", ()))
            rows.append(row)
            self.answers[i].append(self.comp.tokenizer.decode(row["tokens"], skip_special_tokens=True))
        return rows

    def batch(self, prompts, batch, n: int, progress: Progress) -> tuple[list[dict], dict]:
        """Batch `n` of the schedule (`batch`: (prompt index, turn) pairs) decoded together by `generate_batch`, or
        its rows from `progress`: (rows, batch row). Each prompt row gets an equal share of the batch's time (so a
        cell's seconds count every batch once); the batch row holds what the batched verify passes did."""
        keys = [f"{self.name}/{prompts[i].id}/{t}" for i, t in batch]
        bkey = f"{self.name}/batch/{n}"
        if bkey in progress.rows and all(k in progress.rows for k in keys):
            rows, brow = [progress.rows[k] for k in keys], progress.rows[bkey]
            self.trace_left -= sum(len(r.get("trace", ())) for r in rows)
        else:
            ids = [self.ids(prompts[i], i, t) for i, t in batch]
            engine = self._engine(max(map(len, ids)), rows=self.decoding.batch_size)
            batch_buffer = self.decoding.batch_buffer
            t0, c0 = clock_now()
            target, args = self.comp.target, self._args()
            res = ecospec.generate_batch(target, ids, engine=engine, batch_buffer=batch_buffer, **args)
            t1, c1 = clock_now()
            oracle = self.speculative and self.comp.predictor == "oracle"
            brow = batch_row(n, keys, res, t1 - t0, oracle, c1 - c0)
            rows = []
            for (i, t), key, seq_ids, r in zip(batch, keys, ids, res.results, strict=True):
                share = brow["seconds"] / len(batch), brow["cpu_seconds"] / len(batch)
                row = prompt_row(prompts[i].id, t, len(seq_ids), r, share[0], False, share[1])
                row.update(batch=n, batch_size=len(batch))
                self._finish(row, seq_ids, r)
                progress.add(key, row)
                rows.append(row)
            progress.add(bkey, brow)  # last: a batch counts as done once its batch row is written
        for (i, _), row in zip(batch, rows, strict=True):
            self.answers[i].append(self.comp.tokenizer.decode(row["tokens"], skip_special_tokens=True))
        return rows, brow


@dataclass
class HfPeer:
    """transformers' `generate` on AR's prompts, each turn right after AR's (batch 1): the AR users have. Its
    tokens and times join AR's rows (`hf_tokens`, `hf_seconds`, `hf_cpu_seconds`, `hf_same`)."""

    ar: Decoder

    def prompt(self, i: int, p, progress: Progress, ar_rows: list[dict]) -> None:
        dec = self.ar.decoding
        for turn, row in enumerate(ar_rows):
            if "hf_seconds" in row:
                continue
            ids = self.ar.ids(p, i, turn)
            tokens, seconds, cpu = hf_generate(
                self.ar.comp.target, torch.tensor([ids]), dec.temperature, dec.top_p, dec.max_new_tokens, dec.seed
            )
            row.update(hf_tokens=len(tokens), hf_seconds=seconds, hf_cpu_seconds=cpu, hf_same=tokens == row["tokens"])
            progress.add(f"{self.ar.name}/{p.id}/{turn}", row)
