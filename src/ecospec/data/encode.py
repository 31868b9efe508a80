"""Turn a (possibly multi-turn) prompt into the token ids the target model is asked with."""

from __future__ import annotations

from collections.abc import Sequence


def encode_turn(
    tokenizer, turns: Sequence[str], answers: Sequence[str], completion: bool, chat_template: bool = True
) -> list[int]:
    """Token ids for asking ``turns[len(answers)]`` after the earlier turns and the model's answers to them.

    With ``chat_template`` and a tokenizer that has one, the messages [user, assistant, user, ...] go through
    ``apply_chat_template(add_generation_prompt=True)``. Otherwise (and always for ``completion`` prompts, which are
    raw code continuations) the text is plain: bos if the tokenizer has one, then turns and answers joined by "\\n\\n".
    """
    k = len(answers)
    if k >= len(turns):
        raise ValueError(f"{k} answers given for {len(turns)} turns: nothing left to ask")
    texts = [text for pair in zip(turns[:k], answers, strict=True) for text in pair] + [turns[k]]
    if chat_template and not completion and getattr(tokenizer, "chat_template", None):
        roles = ("user", "assistant")
        messages = [{"role": roles[i % 2], "content": text} for i, text in enumerate(texts)]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return bos + tokenizer.encode("\n\n".join(texts), add_special_tokens=False)
