"""``mt.load_backend`` for spec strings and for existing model objects (``memtoc.backends.interop``).

A spec string (``"default"``, a path, a hub id) goes to the one factory, as ``--model`` does; a transformers model
(with ``tokenizer=``), a TransformerLens ``HookedTransformer`` or an nnsight ``LanguageModel`` is wrapped as it
is, its provenance ``in-memory`` with a sha256 of its weights.
"""

from __future__ import annotations

from typing import Any


def load_backend(model: Any = "default", tokenizer: Any = None, *, chat_template: bool | None = None,
                 **options: Any) -> Any:
    """The backend of ``model``: a spec string (options as ``memtoc evaluate``: ``backend``, ``device``,
    ``dtype``, ``adapter``, ...) or a model object (``tokenizer`` for a transformers model; ``chat_template``
    None = use the tokenizer's template when it has one, as ``--chat-template auto``)."""
    if isinstance(model, str):
        if tokenizer is not None:
            from memtoc.api.errors import APIError

            raise APIError("tokenizer= goes with a model object; a spec string loads its own tokenizer")
        from memtoc.api.jobs import load_backend as load_spec

        if chat_template is not None:           # in the spec, as --chat-template on|off (a kept model is shared)
            options["chat_template"] = "on" if chat_template else "off"
        return load_spec(model, **options)
    if options:
        from memtoc.api.errors import APIError

        raise APIError(f"a model object takes no option(s) {', '.join(sorted(options))} (it is already loaded)")
    from memtoc.backends.interop import backend_from_object

    return backend_from_object(model, tokenizer, chat=chat_template)


def as_backend(model: Any) -> Any:
    """``model`` if it is already a backend, else :func:`load_backend` of it."""
    from memtoc.backends.base import TextBackend

    if isinstance(model, TextBackend):
        return model
    return load_backend(model)


def _signature() -> Any:
    """``load_backend``'s signature: the model, ``tokenizer``, ``chat_template`` and every option of a spec string
    (those of :func:`memtoc.api.jobs.load_backend`), so a notebook sees them all."""
    import inspect

    from memtoc.api.jobs import load_backend as load_spec

    spec = inspect.signature(load_spec)
    params = list(spec.parameters.values())
    head = [params[0].replace(annotation=Any),
            inspect.Parameter("tokenizer", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=Any),
            inspect.Parameter("chat_template", inspect.Parameter.KEYWORD_ONLY, default=None,
                              annotation="bool | None")]
    rest = [p for p in params[1:] if p.name != "chat_template"]    # the spec's --chat-template: the one above
    return spec.replace(parameters=head + rest, return_annotation=Any)


load_backend.__signature__ = _signature()
