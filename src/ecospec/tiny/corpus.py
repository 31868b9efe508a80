"""The embedded corpus (the running interpreter's standard library, Python source) and its tokenizer.

Corpus rule (``stdlib_files``): every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``, sorted by
POSIX relative path, minus

* tests: any directory named ``test``, ``tests`` or ``idle_test`` (``test/``, ``lib2to3/tests``,
  ``idlelib/idle_test``, ``tkinter/test``, ...) and any file named ``test_*.py``;
* installed packages: ``site-packages`` / ``dist-packages``;
* machine-specific files: ``_sysconfigdata*.py``, ``config-*`` directories (build paths, flags);
* data dressed as code: ``encodings/`` (charmap tables) and ``pydoc_data/`` (the help text as a string),

then the longest prefix of that sorted list whose total size stays within ``max_bytes``. Every machine
with the same stdlib (same Python minor version, same distribution) therefore gets the same corpus; the
file count, byte count and a sha256 over (path, content) of every kept file go into the build metadata.

Split: file ``i`` of the kept list is held out (validation) when ``i % val_every == val_every // 2``, so
held-out files come from everywhere in the stdlib; the tokenizer and the target see only the others.

Tokenizer: byte-level BPE (``tokenizers``) trained on the training files, special tokens
``<|pad|>`` = 0, ``<|bos|>`` = 1, ``<|eos|>`` = 2; saved as a ``PreTrainedTokenizerFast`` that prepends
``<|bos|>`` when encoding (documents are ``<|bos|> text <|eos|>`` in training), so
``AutoTokenizer.from_pretrained(dir)(prompt)`` gives the ids the target was trained on.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


_TEST_DIRS = frozenset({"test", "tests", "idle_test"})
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "encodings", "pydoc_data"})


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _excluded(rel: Path) -> bool:
    dirs, name = rel.parts[:-1], rel.name
    if any(d in _TEST_DIRS or d in _SKIP_DIRS or d.startswith("config-") for d in dirs):
        return True
    return name.startswith("test_") or name.startswith("_sysconfigdata")


def stdlib_files(max_bytes: int, root: str | Path | None = None) -> list[tuple[str, int]]:
    """The corpus file list: ``(relative POSIX path, size in bytes)``, sorted by path, tests and the
    other exclusions (module docstring) removed, cut to the longest prefix within ``max_bytes``."""
    root = Path(root) if root is not None else stdlib_root()
    candidates = []
    for here, dirs, names in os.walk(root):  # excluded folders pruned (site-packages alone holds torch & co.)
        dirs[:] = [d for d in dirs if not _excluded(Path(d, "x.py"))]
        for name in names:
            path = Path(here, name)
            rel = path.relative_to(root)
            if name.endswith(".py") and not _excluded(rel) and path.is_file():
                candidates.append((rel.as_posix(), path.stat().st_size))
    candidates.sort()
    kept, total = [], 0
    for rel, size in candidates:
        if total + size > max_bytes:
            break
        kept.append((rel, size))
        total += size
    return kept


@dataclass
class Corpus:
    """Texts of the corpus files and their metadata. ``train``/``val``: lists of texts."""

    root: str
    files: list[str]
    train: list[str]
    val: list[str]
    val_files: list[str]
    num_bytes: int
    sha256: str

    def metadata(self) -> dict:
        return {
            "stdlib": self.root,
            "num_files": len(self.files),
            "num_bytes": self.num_bytes,
            "sha256": self.sha256,
            "num_train_files": len(self.train),
            "num_val_files": len(self.val),
            "train_chars": sum(len(t) for t in self.train),
            "val_chars": sum(len(t) for t in self.val),
        }


def load_corpus(max_bytes: int, val_every: int = 20, root: str | Path | None = None, progress=None) -> Corpus:
    """Read the corpus (``stdlib_files``) and split it. Texts are UTF-8 decoded (invalid bytes replaced)
    with CRLF/CR normalised to LF; the sha256 covers the raw bytes: for each file, its path, a NUL, its
    size as 8 little-endian bytes, its content. ``progress``: optional wrapper (e.g. tqdm) around the
    file iterator."""
    root = Path(root) if root is not None else stdlib_root()
    files = stdlib_files(max_bytes, root)
    digest = hashlib.sha256()
    train, val, val_files = [], [], []
    total = 0
    items: Iterable = files if progress is None else progress(files)
    for i, (rel, _) in enumerate(items):
        raw = (root / rel).read_bytes()
        total += len(raw)
        digest.update(rel.encode() + b"\0" + len(raw).to_bytes(8, "little") + raw)
        text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
        if val_every > 0 and i % val_every == val_every // 2:
            val.append(text)
            val_files.append(rel)
        else:
            train.append(text)
    return Corpus(
        root=str(root),
        files=[rel for rel, _ in files],
        train=train,
        val=val,
        val_files=val_files,
        num_bytes=total,
        sha256=digest.hexdigest(),
    )


def train_tokenizer(texts: Sequence[str], vocab_size: int, min_frequency: int = 2):
    """Byte-level BPE trained on ``texts``, wrapped as a ``PreTrainedTokenizerFast`` (bos prepended on
    encode, ``<|pad|>``/``<|bos|>``/``<|eos|>`` = 0/1/2). Deterministic for the same texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    if ids != [PAD_ID, BOS_ID, EOS_ID]:
        raise RuntimeError(f"special token ids {ids}, expected [0, 1, 2]")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


def encode_documents(tokenizer, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """One uint16 (uint32 for vocabularies over 65536) stream: ``<|bos|> text <|eos|>`` per document."""
    backend = tokenizer.backend_tokenizer
    dtype = np.uint16 if len(tokenizer) <= 65536 else np.uint32
    parts = []
    for start in range(0, len(texts), batch_size):
        for enc in backend.encode_batch(list(texts[start : start + batch_size])):  # bos from the template
            parts.append(np.asarray(enc.ids + [EOS_ID], dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
