"""Lenses: read the residual stream at a site as a distribution over the vocabulary.

Every lens transports the state ``x_s[T]`` at site ``s`` and position ``T`` to a vector ``t_s`` in the space of
the last block's (pre-norm) output and decodes it with the model's own final norm and head (see
``docs/probes.md``):

- ``logit``     : ``t = x_s[T]`` (identity; the baseline);
- ``jacobian``  : ``t = Jbar_s x_s[T]``, the corpus-averaged Jacobian (fitted once per model, ``probes.fit``;
                  primary);
- ``detached``  : ``t = J^det_s[T,T] x_s[T]``, with frozen norm scales, attention probabilities and MLP gates
                  (exact linear share of the final state; secondary);
- ``jvp``       : ``t = J_s(x)[T,T] x_s[T]``, the plain local Jacobian-vector product (diagnostic only).

At the last site every lens is the identity, i.e. the model's own output.
"""

from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn

from memtoc.backends import hooks as _hooks
from memtoc.backends.hooks import Hook
from memtoc.backends.plans import CapturePlan, HookPlan
from probes.model import LensMismatchError, ModelParts, ProbeError

LENS_FORMAT = "memtoc-jacobian-lens-v1"


# -- the averaged Jacobian lens artifact ---------------------------------------------------------------------

def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 models, float32 otherwise (half-precision states are read in float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def lens_key(site: int) -> str:
    return f"site_{int(site):03d}"


@dataclass
class JacobianLens:
    """Per-site averaged Jacobians ``Jbar_s`` (``[d, d]``, rows = output coordinates) with their provenance."""

    matrices: dict[int, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def sites(self) -> list[int]:
        return sorted(self.matrices)

    def save(self, path: str | Path, *, dtype: torch.dtype = torch.float32) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {lens_key(s): m.to(dtype).contiguous() for s, m in self.matrices.items()}
        meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in self.meta.items()}
        meta["format"] = LENS_FORMAT
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path, *, model: nn.Module | None = None, expect: Mapping[str, Any] | None = None,
             allow_partial: bool = False, parts: ModelParts | None = None) -> "JacobianLens":
        """Read a lens; with ``model`` (or its ``parts``, readout-only ones included) refuse one fitted on another
        model, with ``expect`` on other settings."""
        from safetensors import safe_open

        path = Path(path)
        if not path.exists():
            raise ProbeError(f"lens file {path} not found; fit one with: memtoc lens fit --model MODEL --out {path}")
        with safe_open(str(path), framework="pt") as fh:
            meta = _lens_meta(path, fh.metadata() or {}, allow_partial=allow_partial)
            matrices = {int(k.split("_")[1]): fh.get_tensor(k) for k in fh.keys() if k.startswith("site_")}
        lens = cls(matrices=matrices, meta=meta)
        if parts is not None:
            lens.check_parts(parts, path)
        elif model is not None:
            lens.check_parts(ModelParts.of(model), path)
        for key, want in (expect or {}).items():
            if meta.get(key) != want:
                raise LensMismatchError(f"{path} was fitted with {key}={meta.get(key)!r}, not {want!r}")
        return lens

    def check_parts(self, parts: ModelParts, path: str | Path = "lens") -> None:
        """Refuse a lens fitted on other weights than ``parts``' (the fingerprint, depth and width it recorded)."""
        fp = parts.fingerprint()
        mine = {"model_fingerprint": fp, "n_layers": parts.n_layers, "d_model": parts.d_model}
        theirs = {k: self.meta.get(k) for k in mine}
        if theirs != mine:
            raise LensMismatchError(
                f"{path} was fitted on another model (model {self.meta.get('model')!r}, fingerprint "
                f"{theirs['model_fingerprint']}, {theirs['n_layers']} layers, d_model {theirs['d_model']}); this model "
                f"has fingerprint {fp}, {parts.n_layers} layers, d_model {parts.d_model}. Fit a lens for it: "
                "memtoc lens fit --model MODEL --out LENS.safetensors")

    def transport(self, site: int, x: torch.Tensor, n_layers: int) -> torch.Tensor:
        """``Jbar_s x`` for ``x`` ``[..., d]``; the identity at the last site."""
        if site == n_layers:
            return x
        if site not in self.matrices:
            raise ProbeError(f"the lens has no matrix for site {site}; it covers sites {self.sites}")
        m = self.matrices[site]
        return x @ m.to(device=x.device, dtype=x.dtype).T


def read_safetensors_metadata(path: str | Path) -> dict[str, str]:
    """The ``__metadata__`` block of a safetensors file, read from its JSON header (8-byte length, then JSON)
    without touching a tensor; a file that is not safetensors is one :class:`LensMismatchError` naming it."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            size = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 2 <= size <= 100_000_000:
                raise ValueError("no safetensors header")
            header = json.loads(fh.read(size).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise LensMismatchError(f"{path} is not a safetensors file ({exc}); give a lens written by memtoc lens fit"
                                ) from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return dict(meta) if isinstance(meta, dict) else {}


def check_lens_header(path: str | Path | None, *, n_layers: int | None = None, d_model: int | None = None) -> None:
    """A lens file checked from its header before any model loads: present, a finished memtoc Jacobian lens,
    fitted on a model of this depth and width (when known). The fingerprint is checked after loading."""
    path = Path(str(path))
    if not path.is_file():
        raise ProbeError(f"lens file {path} not found; fit one with: memtoc lens fit --model MODEL --out {path}")
    meta = _lens_meta(path, read_safetensors_metadata(path))
    for key, want in (("n_layers", n_layers), ("d_model", d_model)):
        if want is not None and meta.get(key) not in (None, want):
            raise LensMismatchError(f"{path} was fitted on a model with {key} {meta.get(key)}; this model has "
                                    f"{want}. Fit a lens for it: memtoc lens fit --model MODEL --out LENS.safetensors")


def _lens_meta(path: Path, raw: Mapping[str, str], *, allow_partial: bool = False) -> dict[str, Any]:
    """A lens file's metadata, decoded; refused when it is not a memtoc lens, or unfinished (unless allowed)."""
    if raw.get("format") != LENS_FORMAT:
        raise LensMismatchError(f"{path} is not a memtoc Jacobian lens (format {raw.get('format')!r})")
    meta = {k: _decode_meta(v) for k, v in raw.items()}
    if not allow_partial and not meta.get("complete", False):
        raise LensMismatchError(f"{path} is an unfinished fit ({meta.get('n_sequences')} of "
                                f"{meta.get('n_sequences_planned')} sequences); resume it with memtoc lens fit")
    return meta


def _decode_meta(v: str) -> Any:
    try:
        return json.loads(v)
    except (json.JSONDecodeError, TypeError):
        return v


# -- one forward, everything the cheap lenses need at the final position -----------------------------------

class LensCapture:
    """Capture option of ``Backend.forward``: site states at each row's last position (and detached-lens factors).

    After the forward, ``states[s]`` is ``[B, d]`` for every requested site (float32, or float64 for a float64
    model). With ``detached=True`` it also records per block at the last position the attention probabilities,
    the post-attention residual and the activated MLP gate: the frozen coefficients of the detached network.
    """

    def __init__(self, parts: ModelParts, sites: Sequence[int], *, detached: bool = False) -> None:
        self.parts = parts
        self.sites = sorted(set(int(s) for s in sites))
        self.detached = detached
        self.states: dict[int, torch.Tensor] = {}
        self.factors: dict[int, dict[str, torch.Tensor]] = {}

    @contextmanager
    def attach(self, backend: Any, batch: Mapping[str, torch.Tensor]) -> Iterator["LensCapture"]:
        need, hooks = set(self.sites), []
        if self.detached:
            need |= set(range(min(self.sites), self.parts.n_sites))
            hooks = self._factor_hooks(min(self.sites))
        plan = CapturePlan.last_position(sorted(need), batch, to_host=False, hooks=hooks, eager=self.detached)
        with backend.intervene(batch, plan):
            yield self
        self.states.update({s: x.to(work_dtype(x.dtype)) for s, x in plan.values.items()})

    def _factor_hooks(self, first_site: int) -> list[Hook]:
        """Sub-block hooks (modules from the per-architecture table, ``ModelParts.layout``) recording, per block
        at the last position: attention probabilities, the residual entering the MLP norm, the activated gate,
        and for sandwich-norm blocks the inputs of the output norms."""
        parts, lay = self.parts, self.parts.layout
        hooks: list[Hook] = []

        def grab_pre(slot: dict, key: str):
            def pre(module, args):
                slot[key] = args[0][:, -1].detach().to(work_dtype(args[0].dtype))   # [B, d]
            return pre

        for k in range(first_site, parts.n_layers):
            slot = self.factors.setdefault(k, {})

            def attn_hook(module, args, output, _slot=slot):
                w = output[1] if isinstance(output, tuple) and len(output) > 1 else None
                if w is None:
                    raise ProbeError("the attention module returned no probabilities; eager attention is needed")
                _slot["attn"] = w[:, :, -1, -1].detach().to(work_dtype(w.dtype))   # [B, heads]

            def gate_hook(module, args, output, _slot=slot):
                _slot["gate"] = output[:, -1].detach().to(work_dtype(output.dtype))   # [B, inter]

            hooks.append(Hook(parts.block_part(k, "attn"), "forward", attn_hook))
            hooks.append(Hook(parts.block_part(k, "mlp_norm"), "pre", grab_pre(slot, "h_mid")))
            hooks.append(Hook(getattr(parts.block_part(k, "mlp"), lay.act), "forward", gate_hook))
            if lay.attn_out_norm:
                hooks.append(Hook(parts.block_part(k, "attn_out_norm"), "pre", grab_pre(slot, "attn_out")))
            if lay.mlp_out_norm:
                hooks.append(Hook(parts.block_part(k, "mlp_out_norm"), "pre", grab_pre(slot, "mlp_out")))
        return hooks


def _rms_norm_gain(norm: nn.Module, dtype: torch.dtype = torch.float32, offset: float = 0.0) -> torch.Tensor:
    """The elementwise gain of an RMSNorm: ``offset + weight`` (0 for Llama, 1 for Gemma; the block table's
    ``norm_offset``)."""
    w = norm.weight.detach().to(dtype)
    return w + offset if offset else w


def inv_rms(h: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """``1 / sqrt(mean(h^2) + eps)`` along the last axis (in float32 as the norm computes it; float64 stays)."""
    eps = next((getattr(norm, n) for n in ("variance_epsilon", "eps") if hasattr(norm, n)), None)
    if eps is None:
        raise ProbeError(f"cannot read the epsilon of {type(norm).__name__}")
    h = h.to(work_dtype(h.dtype))
    return torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + float(eps))


def detached_chain(parts: ModelParts, factors: Mapping[int, Mapping[str, torch.Tensor]],
                   block_inputs: Mapping[int, torch.Tensor], site: int, u: torch.Tensor) -> torch.Tensor:
    """``J^det_s[T, T] u``: propagate ``u`` ``[B, d]`` from site ``s`` through blocks ``s .. L-1`` with frozen factors.

    Per block: ``u += W_O concat_h(a_h[T,T] W_V^{kv(h)} (g1 * u * r1))`` then
    ``u += W_down(gate * W_up(g2 * u * r2))`` (``r1``, ``r2``: frozen inverse RMS; only the diagonal attention
    weight enters, as other positions carry no tangent; no biases).
    """
    dt = work_dtype(u.dtype)
    u = u.to(dt)
    lay = parts.layout
    off = lay.norm_offset

    def normed(norm_role: str, k: int, v: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        norm = parts.block_part(k, norm_role)
        return _rms_norm_gain(norm, dt, off) * v * inv_rms(state, norm).to(dt)

    for k in range(site, parts.n_layers):
        attn, mlp, f = parts.block_part(k, "attn"), parts.block_part(k, "mlp"), factors[k]
        wo = getattr(attn, lay.o).weight.detach().to(dt)
        n_heads = f["attn"].shape[1]
        head_dim = wo.shape[1] // n_heads
        x = normed("input_norm", k, u, block_inputs[k])
        v = F.linear(x, getattr(attn, lay.v).weight.detach().to(dt)).view(u.shape[0], -1, head_dim)  # [B, kv, hd]
        v = v.repeat_interleave(n_heads // v.shape[1], dim=1)                                        # [B, heads, hd]
        a = F.linear((f["attn"].to(dt).unsqueeze(-1) * v).reshape(u.shape[0], -1), wo)
        if lay.attn_out_norm:
            a = normed("attn_out_norm", k, a, f["attn_out"])
        u = u + a
        y = normed("mlp_norm", k, u, f["h_mid"])
        up = F.linear(y, getattr(mlp, lay.up).weight.detach().to(dt))
        m = F.linear(f["gate"].to(dt) * up, getattr(mlp, lay.down).weight.detach().to(dt))
        if lay.mlp_out_norm:
            m = normed("mlp_out_norm", k, m, f["mlp_out"])
        u = u + m
    return u


# -- forward-mode routes (tests, the diagnostic local JVP) ---------------------------------------------------

@contextmanager
def detached_mode(parts: ModelParts, first_block: int = 0) -> Iterator[None]:
    """Make blocks ``first_block..L-1`` linear in their input for forward-mode AD (Golden-style detaching):
    RMSNorms use a frozen inverse RMS, and the query / key projections and the MLP's activated gate lose their
    tangent. Primal values are unchanged. Needs eager attention (``ModelParts.eager``).
    """
    lay = parts.layout

    def norm_hook(module, args, output):
        x = args[0]
        primal, tangent = fwAD.unpack_dual(x)
        if tangent is None:
            return None
        r = inv_rms(primal, module)
        out_primal = fwAD.unpack_dual(output).primal
        t = (_rms_norm_gain(module, r.dtype, lay.norm_offset) * tangent.to(r.dtype) * r).to(out_primal.dtype)
        return fwAD.make_dual(out_primal, t)

    def drop_tangent(module, args, output):
        return fwAD.unpack_dual(output).primal

    hooks: list[Hook] = []
    for k in range(first_block, parts.n_layers):
        blk = parts.layers[k]
        attn, mlp = parts.block_part(k, "attn"), parts.block_part(k, "mlp")
        hooks += [Hook(getattr(blk, name), "forward", norm_hook) for name in lay.norms()]
        hooks += [Hook(getattr(attn, lay.q), "forward", drop_tangent),
                  Hook(getattr(attn, lay.k), "forward", drop_tangent),
                  Hook(getattr(mlp, lay.act), "forward", drop_tangent)]
    with _hooks.register(hooks):
        yield


def forward_jvp(parts: ModelParts, batch: Mapping[str, torch.Tensor], site: int, tangent: torch.Tensor, *,
                detached: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward-mode pass: ``(x_L, dx_L)`` where the state at ``site`` carries ``tangent`` (``[B, T, d]``).

    ``x_L`` / ``dx_L`` are the last block's raw output and its tangent ``J_s(x) tangent`` at every position;
    with ``detached`` the Jacobian is that of the detached network. Runs with eager attention.
    """
    L = parts.n_layers
    got: dict[str, torch.Tensor] = {}

    def fn(s: int, h: torch.Tensor) -> torch.Tensor | None:
        if s == site:
            new = fwAD.make_dual(h.detach(), tangent.to(h.dtype))
            if s == L:
                got["out"] = new
            return new
        if s == L:
            got["out"] = h
        return None

    with ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(parts.eager())
        stack.enter_context(fwAD.dual_level())
        if detached:
            stack.enter_context(detached_mode(parts, first_block=site))
        stack.enter_context(parts.intervene(batch, HookPlan(fn, sites=sorted({site, L}))))
        _run_decoder(parts, batch)
        primal, tan = fwAD.unpack_dual(got["out"])
        primal = primal.detach().clone()
        tan = torch.zeros_like(primal) if tan is None else tan.detach().clone()
    return primal, tan


def _run_decoder(parts: ModelParts, batch: Mapping[str, torch.Tensor]) -> Any:
    """The decoder stack over a left-padded batch, position ids following the mask (as the backends run it)."""
    mask = batch["attention_mask"]
    return parts.forward(decoder_only=True, input_ids=batch["input_ids"], attention_mask=mask,
                         position_ids=(mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1))


def local_jvp_vectors(parts: ModelParts, batch: Mapping[str, torch.Tensor], sites: Sequence[int], *,
                      detached: bool = False) -> dict[int, torch.Tensor]:
    """``site -> [B, d]``: ``J_s(x)[T,T] x_s[T]`` at each row's last position (one forward-AD pass per site).

    The tangent is the state itself at the last position and zero elsewhere. ``detached=True`` gives the
    detached self-contribution by the forward-AD route (the reference for ``detached_chain``).
    """
    states: dict[int, torch.Tensor] = {}
    grab = HookPlan(lambda s, h: states.__setitem__(s, h.detach().clone()), sites=sites)
    with torch.no_grad(), parts.intervene(batch, grab):
        _run_decoder(parts, batch)
    out: dict[int, torch.Tensor] = {}
    for s in sites:
        x = states[s]
        if s == parts.n_layers:
            out[s] = x[:, -1].to(work_dtype(x.dtype))
            continue
        tangent = torch.zeros_like(x)
        tangent[:, -1] = x[:, -1]
        _, tan = forward_jvp(parts, batch, s, tangent, detached=detached)
        out[s] = tan[:, -1].to(work_dtype(tan.dtype))
    return out
