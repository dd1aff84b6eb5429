"""Several evaluations in one engine pass: the strengths of a sweep generate together, each at its own strength.

On a backend whose edits take a strength per row (``row_edits``: vllm), a sweep's evaluations run side by side
(one thread each, through the unchanged evaluate job and scorer), each on a member view of the backend, and
every round of ``generate`` calls -- one from each evaluation still running -- is answered by ONE engine pass.
Unedited rows (identical in every strength) are deduplicated and ride along at strength 0, which the edit never
touches; edited rows keep their own strength in one stacked edit (``BoundEdit.stack``; a different edit gets a
pass of its own). The passes run in the thread that calls :meth:`SharedPass.serve`; a member's other calls go to
the backend one at a time, outside the rounds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from memtoc.backends.base import Generation
from memtoc.core.errors import MemtocError
from memtoc.core.runtime import GenerationConfig


@dataclass
class SharedCall:
    """One caller's generate request waiting for a shared pass, and what it got back."""

    prompts: list[Any]
    config: GenerationConfig
    edit: Any                      # a bound edit of ``prompts`` or None
    result: list[Generation] | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class PassStats:
    """What the shared pass did: engine passes run, rows sent, rows asked for (before deduplication)."""

    passes: int = 0
    rows_sent: int = 0
    rows_asked: int = 0
    rounds: list[int] = field(default_factory=list)   # members answered by each pass


class SharedPass:
    """Rounds of ``generate`` calls from ``n_members`` evaluations, each answered by one engine pass."""

    def __init__(self, backend: Any, n_members: int) -> None:
        self.backend = backend
        self.active = int(n_members)
        self.pending: list[SharedCall] = []
        self.cond = threading.Condition()
        self.lock = threading.RLock()      # the backend is called by one thread at a time
        self.stats = PassStats()
        self.closed = False                # serve_queue stopped: a new call is refused

    def member(self) -> "PassMember":
        return PassMember(self)

    def leave(self) -> None:
        """A member's evaluation ended (done or failed): the rounds no longer wait for it."""
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def submit(self, call: SharedCall) -> list[Generation]:
        """A member's ``generate``: wait for the round's pass and return this call's rows."""
        with self.cond:
            if self.closed:
                raise MemtocError("the server has stopped")
            self.pending.append(call)
            self.cond.notify_all()
            while not call.done:
                self.cond.wait()
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    def serve(self) -> None:
        """Answer rounds until every member left: a round is complete when every active member is waiting."""
        with self.cond:
            while True:
                while self.active > 0 and not (self.pending and len(self.pending) >= self.active):
                    self.cond.wait()
                if self.active <= 0:
                    return
                calls, self.pending = self.pending, []
                try:
                    with self.lock:
                        self._execute(calls)
                except BaseException as exc:  # noqa: BLE001 - handed to every waiting member, re-raised there
                    for c in calls:
                        c.error = exc
                for c in calls:
                    c.done = True
                self.cond.notify_all()

    def serve_queue(self, stop: threading.Event, *, max_calls: int | None = None, isolate: bool = False) -> None:
        """Answer whatever calls are pending, one engine pass after another, until ``stop`` is set (:meth:`stop`).

        The rounds of a server, whose callers come and go: a pass takes every call waiting when it starts (at most
        ``max_calls``); calls arriving meanwhile share the next one. ``isolate``: see :meth:`_answer`."""
        while True:
            with self.cond:
                while not self.pending and not stop.is_set():
                    self.cond.wait()
                if stop.is_set():
                    return
                n = len(self.pending) if max_calls is None else max(1, int(max_calls))
                calls, self.pending = self.pending[:n], self.pending[n:]
            self._answer(calls, isolate=isolate)

    def stop(self, stop: threading.Event) -> None:
        """Set ``stop``, answer the calls still waiting with an error, refuse new ones, and wake
        :meth:`serve_queue` (a pass already running finishes and answers its calls)."""
        with self.cond:
            stop.set()
            self.closed = True
            for c in self.pending:
                c.error, c.done = MemtocError("the server stopped before this request ran"), True
            self.pending = []
            self.cond.notify_all()

    def _answer(self, calls: Sequence[SharedCall], *, isolate: bool = False) -> None:
        """One engine pass over ``calls``; each caller gets its rows, or the pass's error (``isolate``: the calls of
        a failed pass run again one at a time first, so only a call that fails alone gets an error)."""
        try:
            with self.lock:
                self._execute(calls)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting callers, re-raised there
            if isolate and len(calls) > 1:
                for c in calls:
                    self._answer([c])
                return
            for c in calls:
                c.error = exc
        except BaseException as exc:  # an interrupt: the callers get it, and it ends the serving loop too
            for c in calls:
                c.error = exc
            self._done(calls)
            raise
        self._done(calls)

    def _done(self, calls: Sequence[SharedCall]) -> None:
        with self.cond:
            for c in calls:
                c.done = True
            self.cond.notify_all()

    def _execute(self, calls: Sequence[SharedCall]) -> None:
        by_config: dict[GenerationConfig, list[SharedCall]] = {}
        for c in calls:
            by_config.setdefault(c.config, []).append(c)
        for config, group in by_config.items():
            self._execute_group(config, group)

    def _execute_group(self, config: GenerationConfig, calls: Sequence[SharedCall]) -> None:
        backend = self.backend
        # Edits that differ in strength only share a pass; any other edit gets its own.
        families: list[list[SharedCall]] = []
        for c in calls:
            if c.edit is None:
                continue
            for fam in families:
                if fam[0].edit.edit.same_but_strength(c.edit.edit):
                    fam.append(c)
                    break
            else:
                families.append([c])
        plain = [c for c in calls if c.edit is None]
        for i, fam in enumerate(families or [[]]):
            members = [*plain, *fam] if i == 0 else fam
            if not members:
                continue
            keys: dict[str, int] = {}
            prompts: list[Any] = []
            bounds: list[Any] = []
            where: list[list[int]] = []
            proto = fam[0].edit if fam else None
            for c in members:
                idx = []
                if c.edit is None:
                    for p in c.prompts:
                        k = backend.format_prompt(p)
                        if k not in keys:
                            keys[k] = len(prompts)
                            prompts.append(p)
                            if proto is not None:
                                bounds.append(proto.edit.bind([p], None, strengths=[0.0]))
                        idx.append(keys[k])
                else:
                    idx = list(range(len(prompts), len(prompts) + len(c.prompts)))
                    prompts.extend(c.prompts)
                    bounds.append(c.edit)
                where.append(idx)
            edit = type(proto).stack(bounds) if proto is not None else None
            gens = backend.generate(prompts, config, edit=edit)
            self.stats.passes += 1
            self.stats.rows_sent += len(prompts)
            self.stats.rows_asked += sum(len(c.prompts) for c in members)
            self.stats.rounds.append(len(members))
            for c, idx in zip(members, where):
                c.result = [gens[i] for i in idx]


class PassMember:
    """One evaluation's view of the backend: ``generate`` joins the round; everything else is the backend's."""

    def __init__(self, shared: SharedPass) -> None:
        self._shared = shared
        b = shared.backend
        self.name, self.chat, self.tokenizer, self.capabilities = b.name, b.chat, b.tokenizer, b.capabilities

    def generate(self, prompts: Sequence[Any], config: GenerationConfig, *, edit: Any = None) -> list[Generation]:
        if not prompts:
            return []
        return self._shared.submit(SharedCall(list(prompts), config, edit))

    def format_prompt(self, conversation: Any) -> str:
        return self._shared.backend.format_prompt(conversation)

    def provenance(self) -> dict[str, Any]:
        with self._shared.lock:
            return self._shared.backend.provenance()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._shared.backend, name)
        if not callable(attr):
            return attr

        def serial(*args: Any, **kwargs: Any) -> Any:
            with self._shared.lock:
                return attr(*args, **kwargs)
        return serial
