"""The `vllm` engine on CPU: registered lazily (naming it imports nothing heavy), one-line
errors without vLLM or without CUDA, and its request bookkeeping (`VLLMBatch`,
`VLLMPathExecutor`) driven by a fake turn-level engine backed by the micro model. vLLM itself is
not installed here; `experiments/gpu/check_scale.sh` is the GPU check."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.engines import ENGINES, check_engine
from agentrl_cli.engines import vllm as vllm_mod
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.models.sequences import token_logprobs
from agentrl_cli.rollout.pools import LocalPool
from agentrl_cli.rollout.scheduler import PathRunner
from agentrl_cli.rollout.values import CriticValues
from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext
from agentrl_cli.rollout.runner import run_episodes
from agentrl_cli.rollout.vllm_paths import VLLMPathExecutor

from conftest import MICRO


def test_naming_vllm_imports_neither_vllm_nor_ray():
    code = ("import sys; from agentrl_cli.cli.main import app; from agentrl_cli.engines import ENGINES; "
            "cls = ENGINES.get('vllm'); import agentrl_cli.train.loop; "
            "print(cls.__name__, 'vllm' in sys.modules, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["VLLMEngine", "False", "False"]
    assert "vllm" in ENGINES.names() and config.load(sets=["rollout.engine=vllm"]).rollout.engine == "vllm"


def test_train_with_vllm_here_is_a_one_line_error_exit_2(tmp_path):
    from agentrl_cli.cli.main import app

    res = CliRunner().invoke(app, ["train", "--engine", "vllm", "--out", str(tmp_path / "r"),
                                   *[a for s in MICRO for a in ("--set", s)]])
    assert res.exit_code == 2
    err = res.stderr if res.stderr_bytes is not None else res.output
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "--engine vllm needs" in lines[0]
    if importlib.util.find_spec("vllm") is None:
        assert "not installed" in lines[0] and "docs/scaling.md" in lines[0]


def test_check_engine_names_each_missing_piece(monkeypatch):
    monkeypatch.setattr(vllm_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="vllm package, which is not installed"):
        check_engine("vllm")
    monkeypatch.setattr(vllm_mod.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(vllm_mod.torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        check_engine("vllm")
    check_engine("hf")  # no check, no error


# ----------------------------------------------------------------------------- request bookkeeping


class FakeTurnEngine:
    """vLLM's request interface as `VLLMEngine` uses it, computed with an HF model: each step
    samples one token for every running request (full forward, per-request seeded generator);
    outputs are cumulative; a request ends on a stop token or `max_tokens`."""

    token_level = False
    name = "fake"

    def __init__(self, model):
        self.model, self.live, self.order = model, {}, []

    def sampling(self, params, seed, stop_ids):
        return SimpleNamespace(params=params, seed=seed, stop=set(stop_ids))

    def add_request(self, rid, prompt, sp):
        self.live[rid] = SimpleNamespace(prompt=list(prompt), sp=sp, ids=[], lps=[],
                                         gen=torch.Generator().manual_seed(sp.seed))
        self.order.append(rid)
        return rid

    def abort(self, rids):
        for r in rids:
            self.live.pop(r, None)

    @torch.no_grad()
    def step(self):
        outs = []
        for rid in list(self.order):
            if rid not in self.live:
                continue
            req = self.live[rid]
            logits = self.model(torch.tensor([req.prompt + req.ids])).logits[0, -1].float()
            logp = torch.log_softmax(logits / req.sp.params.temperature, -1)
            t = int(torch.multinomial(logp.exp(), 1, generator=req.gen))
            req.ids.append(t)
            req.lps.append({t: SimpleNamespace(logprob=float(logp[t]))})
            done = t in req.sp.stop or len(req.ids) >= req.sp.params.max_new_tokens
            outs.append(SimpleNamespace(request_id=rid, finished=done, outputs=[
                SimpleNamespace(token_ids=list(req.ids), logprobs=list(req.lps))]))
            if done:
                del self.live[rid]
                self.order.remove(rid)
        return outs

    def generate(self, prompts, params, seeds, stop_ids):
        rids = [f"g{i}" for i in range(len(prompts))]
        for rid, p, s in zip(rids, prompts, seeds):
            self.add_request(rid, p, self.sampling(params, s, stop_ids))
        done = {}
        while self.live:
            for o in self.step():
                if o.finished:
                    c = o.outputs[0]
                    done[o.request_id] = (c.token_ids, vllm_mod.sampled_logprobs(c, c.token_ids))
        return [done[r] for r in rids]

    def new_batch(self, n):
        return vllm_mod.VLLMBatch(self, n)


def _trainer_logprobs(model, ep):
    dev = next(model.parameters()).device
    ids = torch.tensor([ep.token_ids], device=dev)
    with torch.no_grad():
        lp = token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0].float().cpu()
    mask = torch.tensor(ep.response_mask[1:], dtype=torch.bool)
    return lp[mask], torch.tensor(ep.logprobs[1:])[mask]


def test_vllm_path_executor_runs_focus_on_the_virtual_clock(micro_policy):
    model, tok, fmt, spec = micro_policy
    algo = config.load(sets=MICRO + ["algo.focus_roots=1"], method="focus").algo
    tasks = spec.tasks("train", 2)
    params = SamplingParams(max_new_tokens=8)
    results = []
    for ticks in (1, 3):
        ex = VLLMPathExecutor(FakeTurnEngine(model), fmt, spec, params, 512)
        runner = PathRunner(LocalPool(ex), CriticValues(model, None), ticks=ticks)
        ctx = RolloutContext(None, fmt, spec, params, 3, 512, 2, 0, torch.Generator().manual_seed(1),
                             algo=algo)
        results.append(CONTROLLERS.get("focus").run_paths(ctx, tasks, runner))
    a, b = results
    assert a.metrics["focus/continuations"] > 0 and len(a.episodes) == 6
    assert [e.token_ids for e in a.episodes] == [e.token_ids for e in b.episodes]
    assert [t.to_json()["paths"] for t in a.trees] == [t.to_json()["paths"] for t in b.trees]
    for ep in a.episodes:  # token in, token out: the engine's log-probs are the trainer's
        trainer, engine = _trainer_logprobs(model, ep)
        assert len(engine) == ep.generated_tokens > 0
        torch.testing.assert_close(engine, trainer, rtol=0, atol=1e-4)


def test_vllm_batch_drives_the_lock_step_runner_with_per_row_seeds(micro_policy):
    model, tok, fmt, spec = micro_policy
    tasks = spec.tasks("train", 2)
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(2)]
    params = SamplingParams(max_new_tokens=8)

    def gens():
        return [torch.Generator().manual_seed(100 + i) for i in range(len(pairs))]

    whole = run_episodes(FakeTurnEngine(model), fmt, spec, pairs, params, 512, 4, gens())
    halves = run_episodes(FakeTurnEngine(model), fmt, spec, pairs[:2], params, 512, 2, gens()[:2]) + \
        run_episodes(FakeTurnEngine(model), fmt, spec, pairs[2:], params, 512, 2, gens()[2:])
    assert sum(e.num_turns for e in whole) > len(whole)
    assert [e.token_ids for e in whole] == [e.token_ids for e in halves]
    for ep in whole:
        trainer, engine = _trainer_logprobs(model, ep)
        torch.testing.assert_close(engine, trainer, rtol=0, atol=1e-4)


# ----------------------------------------------------------------------------- the real engine (GPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                    reason="needs a CUDA GPU and vLLM (see README: Scaling out)")
def test_real_vllm_engine_logprobs_and_weight_sync(micro_policy):
    """vLLM on the micro model: engine log-probs match the trainer's, and after loading other
    weights they match the new weights, not the old ones."""
    import copy

    model, tok, fmt, spec = micro_policy
    cfg = config.load(sets=MICRO + ["rollout.vllm_gpu_memory=0.2"])
    gpu = copy.deepcopy(model).cuda()
    engine = vllm_mod.VLLMEngine.from_config(cfg, gpu, fmt)
    pairs = [(t, g) for g, t in enumerate(spec.tasks("train", 4)) for _ in range(2)]
    params = SamplingParams(max_new_tokens=8)

    def gap(m, eps):
        parts = [_trainer_logprobs(m, e) for e in eps]
        return float(torch.cat([(a - b).abs() for a, b in parts]).mean())

    eps = run_episodes(engine, fmt, spec, pairs, params, 512, 8, torch.Generator().manual_seed(0))
    assert gap(gpu, eps) < 1e-2
    old = copy.deepcopy(gpu)
    with torch.no_grad():
        for p in gpu.parameters():
            p.add_(torch.randn_like(p) * p.float().std())
    engine.release()
    engine.load_weights(gpu)
    eps = run_episodes(engine, fmt, spec, pairs, params, 512, 8, torch.Generator().manual_seed(0))
    assert gap(gpu, eps) < 1e-2 < gap(old, eps)
