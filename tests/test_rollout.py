"""Token-in/token-out, masks, KV-cached decoding and log-prob agreement on real multi-turn episodes."""
from __future__ import annotations

import torch

from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.engines.kv_batch import KVBatch
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.models.sequences import pad_episodes, token_logprobs
from agentrl_cli.rollout.runner import run_episodes, run_expert


def _greedy_from_scratch(model, prefix: list[int], max_new: int, stop_ids) -> list[int]:
    ids = list(prefix)
    out = []
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            t = int(logits.argmax())
            out.append(t)
            ids.append(t)
            if t in stop_ids:
                break
    return out


def test_kv_cached_multiturn_greedy_equals_from_scratch(micro_policy):
    model, tok, fmt, spec = micro_policy
    tasks = [(t, i) for i, t in enumerate(spec.tasks("eval", 3))]
    params = SamplingParams(greedy=True, max_new_tokens=6)
    eps = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, tasks, params, 512, batch_size=3)
    checked = 0
    for ep in eps:
        assert ep.num_turns >= 2, "needs a multi-turn episode"
        for turn in ep.turns:
            expect = _greedy_from_scratch(model, ep.token_ids[:turn.start], 6, fmt.stop_ids)
            assert ep.token_ids[turn.start:turn.end] == expect
            checked += 1
    assert checked >= 6


def test_stored_ids_are_exactly_what_the_engine_generated(micro_policy, monkeypatch):
    model, tok, fmt, spec = micro_policy
    generated: list[list[int]] = []
    orig = KVBatch.generate

    def spy(self, rows, params, stop_ids, generator=None):
        ids, lps = orig(self, rows, params, stop_ids, generator)
        generated.extend(ids)
        return ids, lps

    monkeypatch.setattr(KVBatch, "generate", spy)
    tasks = [(t, 0) for t in spec.tasks("eval", 2)]
    eps = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, tasks,
                       SamplingParams(max_new_tokens=8), 512, 2, torch.Generator().manual_seed(0))
    stored = [ep.token_ids[t.start:t.end] for ep in eps for t in ep.turns]
    assert sorted(map(tuple, stored)) == sorted(map(tuple, generated))
    for ep in eps:
        pol = [i for i, m in enumerate(ep.response_mask) if m]
        assert pol == [i for t in ep.turns for i in range(t.start, t.end)]


def test_engine_and_trainer_logprobs_agree(micro_policy):
    model, tok, fmt, spec = micro_policy
    tasks = [(t, 0) for t in spec.tasks("eval", 4)]
    eps = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, tasks,
                       SamplingParams(max_new_tokens=8), 512, 4, torch.Generator().manual_seed(1))
    ids, mask, attn = pad_episodes(eps, fmt.pad_id)
    with torch.no_grad():
        lp = token_logprobs(model, ids, attn)
    for i, ep in enumerate(eps):
        for t, m in enumerate(ep.response_mask):
            if m:
                assert abs(lp[i, t - 1].item() - ep.logprobs[t]) < 1e-4


def test_only_policy_tokens_carry_loss_on_a_real_multiturn_episode(micro_policy):
    model, tok, fmt, _ = micro_policy
    from agentrl_cli.envs import ENVS
    spec = ENVS.get("search")(seed=0)  # default turn limit: the expert needs 5-7 turns
    task = spec.tasks("eval", 1)[0]
    [ep] = run_expert(fmt, spec, [(task, 0)], 1024)
    assert ep.success and ep.num_tool_calls >= 3
    for turn in ep.turns:
        pol = ep.token_ids[turn.start:turn.end]
        assert tok.decode(pol) == turn.action + "<|im_end|>"
        assert all(ep.response_mask[i] == 1 for i in range(turn.start, turn.end))
        if turn.obs_start >= 0:
            assert all(ep.response_mask[i] == 0 for i in range(turn.obs_start, turn.obs_end))
            assert turn.observation in tok.decode(ep.token_ids[turn.obs_start:turn.obs_end])
    # the prompt (system + question) carries no loss, and masked tokens are exactly the rest
    first = ep.turns[0].start
    assert sum(ep.response_mask[:first]) == 0
    assert sum(ep.response_mask) == sum(t.end - t.start for t in ep.turns)
    # gradient check: the loss's gradient w.r.t. log-probs is zero outside policy tokens
    ids, mask, attn = pad_episodes([ep], fmt.pad_id)
    lp = token_logprobs(model, ids, attn).detach().requires_grad_(True)
    from agentrl_cli import losses
    loss, _ = losses.ppo_clip_loss(lp, lp.detach(), torch.ones_like(lp), mask[:, 1:])
    (g,) = torch.autograd.grad(loss, lp)
    assert torch.all(g[mask[:, 1:] == 0] == 0) and torch.all(g[mask[:, 1:] == 1] != 0)


def test_random_policy_and_broken_env_never_crash(micro_policy):
    model, tok, fmt, spec = micro_policy

    class Boom:
        def __init__(self, inner):
            self.inner, self.system_prompt = inner, inner.system_prompt

        def reset(self, task):
            return self.inner.reset(task)

        def step(self, action):
            raise RuntimeError("backend down")

    class BoomSpec:
        def make(self):
            return Boom(spec.make())

    tasks = [(t, 0) for t in spec.tasks("eval", 2)]
    eps = run_episodes(HFEngine(model, fmt.pad_id), fmt, BoomSpec(), tasks,
                       SamplingParams(temperature=2.0, max_new_tokens=8), 512, 2,
                       torch.Generator().manual_seed(0))
    assert all(e.finish == "env_error" and e.reward == 0.0 for e in eps)
    # random weights at a high temperature: garbage actions become error observations
    eps = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, tasks,
                       SamplingParams(temperature=3.0, max_new_tokens=8), 512, 2,
                       torch.Generator().manual_seed(0))
    assert all(e.finish in ("max_turns", "answer", "max_tokens") for e in eps)


def test_cache_keyword_follows_the_model_signature():
    """transformers before 5.2x names the KV cache `past_key_values` and swallows an unknown
    `cache=` in **kwargs (each decode step then sees only its new token): pick by signature."""
    from agentrl_cli.engines.kv_cache import cache_arg

    class Old:
        def forward(self, input_ids=None, past_key_values=None, **kwargs): ...

    class New:
        def forward(self, input_ids=None, cache=None, **kwargs): ...

    assert cache_arg(Old(), "C") == {"past_key_values": "C"}
    assert cache_arg(New(), "C") == {"cache": "C"}
