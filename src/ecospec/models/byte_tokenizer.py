"""A byte-level tokenizer that needs no training and no download: ids 0/1/2 are <|pad|>/<|bos|>/<|eos|> (the
tiny presets' pad/bos/eos), ids 3..258 the 256 bytes. Lets random-init tiny models run text benchmarks."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>")
VOCAB_SIZE = len(SPECIALS) + 256


def byte_tokenizer() -> PreTrainedTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIALS)} | {ch: len(SPECIALS) + i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=SPECIALS[0], bos_token=SPECIALS[1], eos_token=SPECIALS[2]
    )
