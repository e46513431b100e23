"""Paths on the vLLM engine for the path scheduler (`rollout/scheduler.py`): the engine generates
tokens; driving it one request per turn (continuous batching) is rollout's business, so it
lives here, not in `engines/`."""
from __future__ import annotations

from typing import Any

from ..engines.vllm import VLLMEngine, sampled_logprobs, seed_from
from .executors import PathExecutor, Report


class VLLMPathExecutor(PathExecutor):
    """Paths on vLLM for the path scheduler: one request per turn, submitted when the path's
    previous turn has finished and its env stepped. A path's token k gets virtual tick
    start_tick + k - 1 (see `rollout/scheduler.py`); progress is read from the engine's
    cumulative outputs after every engine step."""

    def __init__(self, engine: VLLMEngine, fmt, spec, params, max_tokens):
        super().__init__(fmt, spec, params, max_tokens)
        self.engine = engine
        self.inflight: dict[str, Any] = {}
        self.counter = 0

    def reset(self) -> None:
        if getattr(self, "inflight", None):
            self.engine.abort(list(self.inflight))
        super().reset()
        self.inflight = {}

    def _submit(self, run) -> None:
        rid = f"agentrl-{id(self)}-{self.counter}"
        self.counter += 1
        sp = self.engine.sampling(self.params, seed_from(run.gen), self.fmt.stop_ids)
        run.request, run.turn_ids = rid, []
        run.turn_base = run.tick
        rid = self.engine.add_request(rid, run.live.ep.token_ids, sp)
        run.request = rid
        self.inflight[rid] = run

    def _owner(self, request_id: str):
        """The path of an output (ours, or ours with a suffix vLLM appended)."""
        run = self.inflight.get(request_id)
        if run is None:
            run = next((r for k, r in self.inflight.items()
                        if request_id.startswith(k + "-")), None)
        return run

    def _start(self, job, run):
        self._submit(run)
        return run

    def advance(self, ticks: int):
        events, touched, sampled = [], {}, 0
        for _ in range(ticks):
            if not self.inflight:
                break
            for out in self.engine.step():
                run = self._owner(out.request_id)
                if run is None:
                    continue
                comp = out.outputs[0]
                n = len(comp.token_ids)
                sampled += n - (run.tick - run.turn_base)
                run.tick = run.turn_base + n
                touched[run.pid] = run
                if not out.finished:
                    continue
                del self.inflight[run.request]
                ids = list(comp.token_ids)
                ev = self.end_turn(run, ids, sampled_logprobs(comp, ids))
                events.append(ev)
                if ev.kind == "finish":
                    self.active.remove(run)
                else:
                    self._submit(run)
        return Report(events, {pid: r.tick for pid, r in touched.items()}, sampled)
