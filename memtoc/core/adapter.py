"""A saved adapter: peft's files plus ``memtoc_adapter.json``, its hash, and applying it to a loaded model.

An adapter directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` (written by peft's
``save_pretrained``) and ``memtoc_adapter.json`` (ours: base model and its weight hash, LoRA settings,
hyper-parameters, objective, training questions, the data hash, losses). The adapter's identity hash covers
only peft's two files — the weights and the configuration that decides how they apply — so a run made with
the adapter is tied to exactly those bytes, whatever else is logged beside them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from memtoc.core.errors import MemtocError

META_FILE = "memtoc_adapter.json"
ADAPTER_CONFIG = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def adapter_dir(path: str | Path) -> Path:
    """``path`` as an adapter directory (one holding peft's config), else a one-line refusal."""
    p = Path(path)
    if not (p / ADAPTER_CONFIG).exists():
        raise MemtocError(f"{p} is not an adapter directory (no {ADAPTER_CONFIG}); pass the folder written by "
                          "memtoc finetune train")
    return p


def adapter_weight_file(path: str | Path) -> Path:
    p = adapter_dir(path)
    for name in WEIGHT_FILES:
        if (p / name).exists():
            return p / name
    raise MemtocError(f"{p}: no adapter weights ({' or '.join(WEIGHT_FILES)})")


def _canonical_config(path: Path) -> bytes:
    """peft's config as canonical JSON: sorted keys, and ``target_modules`` sorted (peft stores a set, whose
    list order follows Python's per-process string hashing, so the raw file differs between identical runs)."""
    cfg = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
    return json.dumps(cfg, sort_keys=True, ensure_ascii=False).encode("utf-8")


def adapter_sha256(path: str | Path) -> str:
    """sha256 over peft's config (canonical) and weight file, name-prefixed: the adapter's identity in run.json."""
    p = adapter_dir(path)
    h = hashlib.sha256()
    h.update(ADAPTER_CONFIG.encode())
    h.update(_canonical_config(p / ADAPTER_CONFIG))
    weights = adapter_weight_file(p)
    h.update(weights.name.encode())
    h.update(weights.read_bytes())
    return h.hexdigest()


def read_adapter_meta(path: str | Path) -> dict[str, Any]:
    """``memtoc_adapter.json`` of an adapter directory ({} for a foreign peft adapter)."""
    p = adapter_dir(path) / META_FILE
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


def apply_adapter(model: Any, path: str | Path, *, merge: bool = True) -> Any:
    """Wrap ``model`` with the LoRA adapter at ``path`` (``peft.PeftModel.from_pretrained``), merged by default.

    Merging folds B·A into the base weights and returns the plain transformers model, so generation runs at
    base speed and the decoder-block hooks of capture/steering find the usual module tree. ``model`` is
    modified in place (pass a copy to keep the base).
    """
    try:
        from peft import PeftModel
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MemtocError("--adapter needs peft: pip install 'peft>=0.17' (or the interp extra)") from exc
    import warnings

    p = adapter_dir(path)
    with warnings.catch_warnings():  # peft asks the model an attribute transformers 5 renamed (FutureWarning)
        warnings.simplefilter("ignore", FutureWarning)
        peft_model = PeftModel.from_pretrained(model, str(p), is_trainable=False)
    out = peft_model.merge_and_unload() if merge else peft_model
    return out.eval()
