"""``mt.trace``: activations and logits for your own prompts (the ``run_with_cache`` / ``model.trace()`` job).

Arbitrary text or token ids go through the backend seam (``InspectableBackend.forward``) with a capture that
reads named hook points through the one registrar (``memtoc.backends.hooks.named_hooks``), so the edits, hooks
and site numbering are those of every other job. Names are TransformerLens hook names
(``blocks.L.hook_resid_post``, ``blocks.L.hook_attn_out``, ...); each also has its nnsight module path
(:attr:`Trace.paths`). Raw text is the default: the chat template is applied only when ``chat_template=True``
(a benchmark prompt is not; a string is not silently wrapped in a system prompt). A string that already starts
with the tokenizer's BOS (a rendered template, as the evaluator formats it) is tokenized without a second BOS.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from memtoc.backends.parts import FINAL_NORM_HOOK, hook_point, hook_point_names, n_sites, site_hook_name
from memtoc.core.errors import MemtocError


class TraceError(MemtocError):
    """A trace request that cannot be run (bad sites, positions or prompts); the message names the value."""


@dataclass
class Trace:
    """What one traced forward read.

    ``activations[name]``: ``[batch, positions, d_model]`` (float32, host) at the selected positions;
    ``logits``: ``[batch, positions, vocab]`` next-token logits at the same positions; ``tokens``: each row's
    token ids (unpadded); ``columns``: the padded batch column of each selected position per row (left padding);
    ``paths[name]``: the module path an nnsight user writes for the same value (``model.layers.3.output``).
    """

    names: tuple[str, ...]
    activations: dict[str, torch.Tensor]
    logits: torch.Tensor
    tokens: list[list[int]]
    texts: list[str]
    columns: np.ndarray
    paths: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.activations:
            raise KeyError(f"{name!r} was not traced; traced: {', '.join(self.names)}")
        return self.activations[name]

    def __contains__(self, name: object) -> bool:
        return name in self.activations

    def keys(self) -> list[str]:
        return list(self.names)

    def to_pandas(self) -> Any:
        """One row per traced name: the TransformerLens name, the nnsight path and the shape."""
        import pandas as pd

        return pd.DataFrame([{"name": n, "nnsight": self.paths.get(n), "shape": tuple(self.activations[n].shape)}
                             for n in self.names])


_SITES = "'all', 'all+parts', a site number, a hook name or a list of site numbers and hook names"
_POSITIONS = "'all', 'last', a token index or a list of token indices"


def _names(model: torch.nn.Module, sites: Any) -> list[str]:
    """``sites``: "all" (every residual site), "all+parts" (also attention / MLP outputs), an int site, a hook
    name, or a list of those."""
    if sites is None or sites == "all":
        return hook_point_names(model, parts=False)
    if sites == "all+parts":
        return hook_point_names(model, parts=True)
    items = [sites] if isinstance(sites, (str, int, np.integer)) else _items(sites, "sites", _SITES)
    out = []
    for s in items:
        if isinstance(s, str) and s.strip().isdigit():
            s = int(s)
        if isinstance(s, bool) or not isinstance(s, (str, int, np.integer)):
            raise TraceError(f"sites: {s!r} is not {_SITES}")
        if not isinstance(s, str):
            count = n_sites(model)
            if not 0 <= s < count:
                raise TraceError(f"site {s}: this model has sites 0..{count - 1} (0 = embedding output)")
            s = site_hook_name(int(s))
        out.append(s)
    for n in out:
        try:
            hook_point(model, n)
        except MemtocError as exc:
            raise TraceError(str(exc)) from exc
    return list(dict.fromkeys(out))


def _is_conversation(x: Any) -> bool:
    """A list of message dicts (one prompt for ``chat_template=True``)."""
    return isinstance(x, Sequence) and not isinstance(x, str) and bool(x) and all(isinstance(m, dict) for m in x)


def _items(values: Any, what: str, accepted: str) -> list[Any]:
    """``values`` as a non-empty list; anything else is one :class:`TraceError` naming ``what``."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TraceError(f"{what}: {values!r} is not {accepted}")
    if len(values) == 0:
        raise TraceError(f"{what} is empty")
    return list(values)


def _columns(rows: Sequence[Sequence[int]], width: int, positions: Any) -> np.ndarray:
    """``[batch, P]`` padded columns of the selected token indices (negative: from the end of each row)."""
    if positions is None or positions == "all":
        lengths = {len(r) for r in rows}
        if len(lengths) > 1:
            return np.tile(np.arange(width), (len(rows), 1))  # all columns; padding included (see attention mask)
        idx = list(range(width))
    elif positions == "last":
        idx = [-1]
    else:
        idx = [positions] if isinstance(positions, (int, np.integer)) else _items(positions, "positions", _POSITIONS)
        bad = [p for p in idx if isinstance(p, bool) or not isinstance(p, (int, np.integer))]
        if bad:
            raise TraceError(f"positions: {bad[0]!r} is not {_POSITIONS}")
    cols = np.empty((len(rows), len(idx)), dtype=np.int64)
    for i, r in enumerate(rows):
        n, pad = len(r), width - len(r)
        for j, p in enumerate(idx):
            if not -n <= p < n:
                raise TraceError(f"position {p} is outside row {i} ({n} tokens)")
            cols[i, j] = pad + (p % n)
    return cols


def _batch(backend: Any, prompts: Any, chat_template: bool) -> Any:
    """The one left-padded ``TokenBatch`` of the prompts: raw text with the tokenizer's own special tokens, text
    through the chat template when asked, or token ids as given."""
    from memtoc.backends.chat import format_conversation
    from memtoc.backends.tokens import TokenBatch, encode_texts, left_pad

    tok = backend.tokenizer
    if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], dict)):
        prompts = [prompts]
    if torch.is_tensor(prompts):
        if prompts.is_floating_point() or prompts.is_complex() or prompts.dim() not in (1, 2):
            raise TraceError(f"prompts: a tensor of token ids is an integer [batch, pos] or [pos] tensor, got "
                             f"{prompts.dtype} of shape {tuple(prompts.shape)}")
        prompts = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
    if isinstance(prompts, (bytes, Mapping)) or not isinstance(prompts, (Sequence, np.ndarray)):
        raise TraceError(f"prompts: give a string, a list of strings, token ids or conversations; got "
                         f"{type(prompts).__name__} {prompts!r:.60}")
    prompts = list(prompts)
    if prompts and all(isinstance(t, (int, np.integer)) for t in prompts):
        prompts = [prompts]                        # one prompt's token ids
    if not prompts:
        raise TraceError("trace needs at least one prompt")
    if all(isinstance(p, (list, tuple)) and p and all(isinstance(t, (int, np.integer)) for t in p)
           for p in prompts):
        rows = tuple(tuple(int(t) for t in p) for p in prompts)
        vocab = backend.parts.n_vocab
        for i, r in enumerate(rows):
            out = [t for t in r if not 0 <= t < vocab]
            if out:
                raise TraceError(f"prompt {i}: token id {out[0]} is outside the vocabulary (0..{vocab - 1})")
        texts = tuple(tok.decode(list(r)) for r in rows)
        pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        ids, mask = left_pad(rows, pad_id, backend.device)
        return TokenBatch(texts=texts, input_ids=ids, attention_mask=mask,
                          offsets=tuple(np.zeros((len(r), 2), dtype=np.int64) for r in rows),
                          n_prompt=tuple(len(r) for r in rows), rows=rows, pad_id=pad_id)
    if chat_template:
        if not getattr(tok, "chat_template", None):
            raise TraceError("chat_template=True, but this tokenizer has no chat template")
        return encode_texts(tok, [format_conversation(tok, p, chat=True) for p in prompts], chat=True,
                            device=backend.device)
    bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
    if bad:
        p = prompts[bad[0]]
        if _is_conversation(p):
            raise TraceError(f"prompt {bad[0]} is a conversation: pass chat_template=True to render it, or a string")
        raise TraceError(f"prompt {bad[0]}: {p!r:.60} is neither a string, token ids nor a conversation")
    return _raw_texts(tok, prompts, backend.device)


def _formatted(tokenizer: Any, text: str) -> bool:
    """True for text that already begins with the tokenizer's BOS (a rendered chat template, e.g. a prompt from
    ``backend.format_prompt``): it is tokenized as the evaluator tokenizes templated text, without a second BOS."""
    bos = getattr(tokenizer, "bos_token", None)
    return bool(bos) and text.startswith(bos)


def _raw_texts(tokenizer: Any, texts: Sequence[str], device: Any) -> Any:
    """One left-padded batch of strings: raw text with the tokenizer's own special tokens, already formatted
    text (:func:`_formatted`) without them, decided row by row."""
    from memtoc.backends.tokens import TokenBatch, encode_texts, left_pad

    one = [encode_texts(tokenizer, [t], chat=_formatted(tokenizer, t)) for t in texts]
    empty = [i for i, b in enumerate(one) if not b.rows[0]]
    if empty:
        raise TraceError(f"prompt {empty[0]} ({texts[empty[0]]!r}) has no tokens")
    rows = tuple(b.rows[0] for b in one)
    ids, mask = left_pad(rows, one[0].pad_id, device)
    return TokenBatch(texts=tuple(texts), input_ids=ids, attention_mask=mask, offsets=tuple(b.offsets[0] for b in one),
                      n_prompt=tuple(len(r) for r in rows), rows=rows, pad_id=one[0].pad_id)


def prompt_tokens(model: Any, prompt: Any) -> list[int]:
    """The token ids the evaluator runs for ``prompt`` (a benchmark prompt: a string or a conversation): the
    model's own formatting (``backend.format_prompt``: chat template and generation prompt) and tokenization
    (``backend.encode``). ``mt.trace(model, backend.format_prompt(prompt))`` runs exactly these ids."""
    from memtoc.api.interop import as_backend

    if not (isinstance(prompt, str) or _is_conversation(prompt)):
        raise TraceError(f"prompt_tokens: a prompt is a string or a conversation (a list of messages), got "
                         f"{type(prompt).__name__} {prompt!r:.60}")
    return list(as_backend(model).encode([prompt]).rows[0])


class _NamedCapture:
    """Capture option of ``forward``: the named hook points at the selected columns, copied to the host."""

    def __init__(self, names: Sequence[str], columns: np.ndarray) -> None:
        self.names = list(names)
        self.columns = columns
        self.values: dict[str, torch.Tensor] = {}

    @contextmanager
    def attach(self, backend: Any, batch: Mapping[str, torch.Tensor]) -> Iterator["_NamedCapture"]:
        from memtoc.backends.hooks import named_hooks

        rows = torch.arange(self.columns.shape[0])[:, None]
        cols = torch.as_tensor(self.columns)

        def fn(name: str, value: torch.Tensor) -> None:
            v = value.detach()
            if name.endswith(".attn.hook_pattern"):       # [B, H, q, k]: select query positions, keep [B, H, P, k]
                v = v.transpose(1, 2)[rows.to(v.device), cols.to(v.device)].transpose(1, 2)
            else:
                v = v[rows.to(v.device), cols.to(v.device)]
            self.values[name] = v.to("cpu")

        with named_hooks(backend.parts.model, self.names, fn):
            yield self


def trace(model: Any, prompts: Any, *, sites: Any = "all", positions: Any = "all", edit: Any = None,
          chat_template: bool = False) -> Trace:
    """Activations and logits of ``model`` on ``prompts``: the forward a TransformerLens ``run_with_cache`` or an
    nnsight ``model.trace()`` gives, through this toolkit's seam (capture and edits are ``forward`` options).

    ``model``: a loaded backend, a spec string (``"default"``) or any object :func:`memtoc.load_backend` takes
    (a transformers model with ``tokenizer=``, a ``HookedTransformer``, an nnsight ``LanguageModel``).
    ``prompts``: a string, a list of strings, token ids (a list of lists or a ``[batch, pos]`` tensor), or
    conversations with ``chat_template=True``. Strings are raw text (the tokenizer's own special tokens, no
    template) unless ``chat_template=True``; a string that already begins with the tokenizer's BOS (the
    evaluator's formatted prompt, ``backend.format_prompt``) gets no second one: it runs the ids
    :func:`prompt_tokens` gives. ``sites``: "all" (every residual site), "all+parts" (also
    ``hook_attn_out`` / ``hook_mlp_out``), a site number (0 = embedding output, s = output of block s-1), a
    TransformerLens hook name or a list of those. ``positions``: "all", "last", a token index or a list
    (negative indices count from each row's end). ``edit``: an edit object (``mt.function_edit``,
    ``mt.vector_edit``, a Direction's ``.edit``) or a spec path, applied in the same forward (no ``bind``).
    """
    from memtoc.api.interop import as_backend

    if not isinstance(chat_template, bool):
        raise TraceError(f"chat_template must be True or False, got {chat_template!r}")
    backend = as_backend(model)
    from memtoc.backends.base import InspectableBackend

    if not isinstance(backend, InspectableBackend):
        raise TraceError(f"trace needs an inspectable backend (forward with hooks); {backend.name!r} is not")
    from memtoc.api.jobs import resolve_edit

    edit, spec = resolve_edit(edit)
    if spec is not None:
        from steering import load_edit

        edit = load_edit(spec)
    parts = backend.parts
    names = _names(parts.model, sites)
    batch = _batch(backend, prompts, chat_template)
    cols = _columns(batch.rows, int(batch.input_ids.shape[1]), positions)
    last = site_hook_name(parts.n_sites - 1)
    capture = _NamedCapture([*names, last] if last not in names else names, cols)
    view = backend.preformatted()        # conditions on the batch exactly (raw text, template or token ids)
    view.encode = lambda prompts: batch
    view.forward(list(batch.texts), capture=capture, edit=edit)
    missing = [n for n in capture.names if n not in capture.values]
    if missing:
        raise TraceError(f"hooks did not fire for {', '.join(missing)}")
    with torch.inference_mode():
        logits = parts.unembed(capture.values[last].to(parts.device)).float().cpu()
    paths = {n: _path(parts.model, n) for n in names}
    acts = {n: capture.values[n].float() for n in names}
    return Trace(names=tuple(names), activations=acts, logits=logits, tokens=[list(r) for r in batch.rows],
                 texts=list(batch.texts), columns=cols, paths=paths)


def _path(model: torch.nn.Module, name: str) -> str:
    """The nnsight spelling of a hook name in this model: ``model.layers.3.output`` (``.input`` for a pre)."""
    p = hook_point(model, name)
    if name == FINAL_NORM_HOOK or p.kind == "forward":
        return f"{p.path}.output"
    return f"{p.path}.input"


def hook_names(model: Any, *, parts: bool = True) -> Any:
    """The name table of a model: TransformerLens hook name, residual site (None for attention / MLP), nnsight
    module path. A DataFrame."""
    import pandas as pd

    from memtoc.api.interop import as_backend
    from memtoc.backends.parts import hook_point_site

    m = as_backend(model).parts.model
    names = hook_point_names(m, parts=parts) + [FINAL_NORM_HOOK]
    frame = pd.DataFrame([{"name": n, "site": hook_point_site(n), "nnsight": _path(m, n)} for n in names])
    return frame.astype({"site": "Int64"})

