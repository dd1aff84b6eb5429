"""The memory answer's token: which token id a lens rank is read for (``docs/probes.md``).

The prompt is formatted as the backend formats it, ``"FINAL: "`` and the closed-book memory span are appended,
and the joint string is tokenized as the backend tokenizes prompts. The answer token is the first token whose
character span covers the answer's first character (with byte-level BPE it carries the leading space: the id
the model emits after ``FINAL:``). ``prompt_prefix_ok`` records whether the prompt's own ids are an exact
prefix of the joint tokenization.

Variants: the answer with and without a leading space and with its first letter upper- or lower-cased; the best
rank over their first tokens. Subtokens (the paper's App. H check): every token of the answer span.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memtoc.backends.chat import add_special_tokens, encode_formatted

ANSWER_PREFIX = "FINAL: "


@dataclass(frozen=True)
class AnswerToken:
    token_id: int | None                      # None: empty answer or no token covers it
    token_str: str
    variants: dict[str, int] = field(default_factory=dict)   # variant label -> first token id
    prompt_prefix_ok: bool = True
    subtoken_ids: list[int] = field(default_factory=list)    # every token of the answer span (all-subtoken check)

    @property
    def variant_ids(self) -> list[int]:
        ids = [] if self.token_id is None else [self.token_id]
        for t in self.variants.values():
            if t not in ids:
                ids.append(t)
        return ids


def _tokens(tokenizer: Any, text: str, *, special: bool) -> list[tuple[int, int, int]]:
    """``(id, start, end)`` of every token of ``text`` (its characters ``[start, end)``)."""
    enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    return [(int(t), int(a), int(b)) for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])]


def _first_covering(tokens: list[tuple[int, int, int]], char: int) -> int | None:
    """The first token whose characters reach past ``char`` (zero-width tokens never do)."""
    return next((t for t, a, b in tokens if b > a and b > char), None)


def content_subtokens(tokenizer: Any, ids: list[int]) -> list[int]:
    """The subtokens that carry part of the answer: those whose text holds a letter or digit. A period or a
    space ranking first at some site is no evidence that the answer is there (the default model's closed-book
    answers are whole sentences, whose "." reached rank 1 almost everywhere). All of ``ids`` when none does."""
    kept = [t for t in ids if any(ch.isalnum() for ch in tokenizer.decode([t]))]
    return kept or list(ids)


def _variants(answer: str) -> dict[str, str]:
    a = answer.strip()
    if not a:
        return {}
    up, low = a[0].upper() + a[1:], a[0].lower() + a[1:]
    return {"space": " " + a, "nospace": a, "space_upper": " " + up, "nospace_upper": up,
            "space_lower": " " + low, "nospace_lower": low}


def answer_token(backend: Any, user_prompt: str, answer: str | None, *, prefix: str = ANSWER_PREFIX) -> AnswerToken:
    """The first token of ``answer`` written after ``prefix`` at the end of the formatted ``user_prompt``."""
    tok = backend.tokenizer
    special = add_special_tokens(backend.chat)
    formatted = backend.format_prompt(user_prompt)
    ans = (answer or "").strip()
    if not ans:
        return AnswerToken(None, "")
    prompt_ids = encode_formatted(tok, [formatted], chat=backend.chat)[0]
    text = formatted + prefix + ans
    start = len(formatted) + len(prefix)
    tokens = _tokens(tok, text, special=special)
    tid = _first_covering(tokens, start)
    # the answer span's distinct subtokens, in order (the paper's "best rank over all subtokens" check)
    subtokens = content_subtokens(tok, list(dict.fromkeys(t for t, a, b in tokens if b > a and b > start)))
    if tid is not None and tid not in subtokens:     # the answer's first token always counts (rank_subtoken <= rank)
        subtokens.insert(0, tid)
    ok = [t for t, _, _ in tokens][:len(prompt_ids)] == list(prompt_ids)
    stem = prefix.rstrip()
    variants: dict[str, int] = {}
    for label, v in _variants(ans).items():
        lead = len(v) - len(v.lstrip())
        vid = _first_covering(_tokens(tok, formatted + stem + v, special=special), len(formatted) + len(stem) + lead)
        if vid is not None:
            variants[label] = vid
    return AnswerToken(tid, tok.convert_ids_to_tokens(tid) if tid is not None else "", variants, ok, subtokens)
