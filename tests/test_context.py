"""Context operators (docs/methods.md): workspace tools, compaction at the threshold, windows and
segments, trainer-vs-engine log-probs on reset contexts, FOCUS/vine on windows, `none`
unchanged, and end-to-end training with focus and grpo."""
from __future__ import annotations

import json
import random

import pytest
import torch

from agentrl_cli import config
from agentrl_cli.config import ContextConfig
from agentrl_cli.errors import ConfigError
from agentrl_cli.context import ContextSpec, visible_ids, visible_len, window_index, wrap_spec
from agentrl_cli.context.operators import AFTER_SUMMARY, FREE, STRUCTURED
from agentrl_cli.context.windows import window_of
from agentrl_cli.context.workspace import MAX_KEYS, WorkspaceEnv
from agentrl_cli.credit.estimators import SegmentValues
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.envs.search import SearchSpec
from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext
from agentrl_cli.rollout.runner import run_episodes
from agentrl_cli import context as context_mod
from agentrl_cli.train import loop
from agentrl_cli.train.batch import collate, forward

from conftest import MICRO
from agentrl_cli.app.train import train as checked_train

MAX_TOKENS = 512
PARAMS = SamplingParams(max_new_tokens=8)


def _spec(operator: str, threshold: int, style: str = "free", max_turns: int = 6):
    cfg = config.load(sets=MICRO + [f"env.max_turns={max_turns}", f"context.operator={operator}",
                                    f"context.threshold_tokens={threshold}", f"context.style={style}"])
    return context_mod.make_spec(cfg)


def _rollout(micro_policy, spec, n=4, seed=0):
    model, _, fmt, _ = micro_policy
    tasks = [(t, i) for i, t in enumerate(spec.tasks("train", n))]
    return run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, tasks, PARAMS, MAX_TOKENS, n,
                        torch.Generator().manual_seed(seed))


def _trainer_gap(model, fmt, eps, windows=True) -> float:
    batch = collate(eps, fmt.pad_id)
    if not windows:
        batch.window_index = None
    with torch.no_grad():
        lp, _ = forward(model, None, batch, 1.0)
    m = batch.response_mask.bool()
    return float((lp - batch.engine_logprobs)[m].abs().max())


@pytest.fixture(scope="module")
def compacted(micro_policy):
    spec = _spec("compaction", 110)
    return spec, _rollout(micro_policy, spec)


# ----------------------------------------------------------------------------- workspace


def test_workspace_tools_snapshot_and_turn_limit(micro_policy):
    spec = _spec("workspace", 300, max_turns=10)
    env = spec.make()
    assert isinstance(env, WorkspaceEnv) and env.context_operator.name == "workspace"
    assert "put(key, value)" in env.system_prompt and "search(query)" in env.system_prompt
    task = spec.tasks("train", 1)[0]
    assert env.reset(task) == task.prompt
    r = env.step("put(city, Port Zorb, near the bay)")
    assert (r.observation, r.info["tool"], r.info["error"]) == ("stored city", "put", False)
    assert env.step("get(city)").observation == "Port Zorb, near the bay"
    env.step("put('cite', x)")
    assert env.step("scan(cit)").observation == "cite, city"
    assert env.step("scan()").observation == "cite, city"
    assert env.step("get(nope)").info["error"] and env.step("put(k)").info["error"]
    r = env.step(f"search({task.meta['start']})")       # not a workspace call: the inner env's
    assert r.info["tool"] == "search" and task.meta["doc_ids"][0] in r.observation
    snap = env.snapshot()
    assert env.step("delete(city)").observation == "deleted city"
    assert env.step("scan(c)").observation == "cite"
    after_a = env.step("get(city)").observation
    env.restore(snap)
    assert env.store == {"city": "Port Zorb, near the bay", "cite": "x"} and env.steps == 8
    other = spec.make()
    other.restore(snap)
    assert other.step("get(city)").observation == "Port Zorb, near the bay"
    r = other.step("delete(city)")               # the 10th turn: env.max_turns=10 reached
    assert r.observation == "deleted city" and r.truncated and not r.terminated and r.info["success"] is False
    assert after_a == "error: no entry city"
    env.reset(task)
    for i in range(MAX_KEYS):
        env.store[f"k{i}"] = "v"
    assert env.step("put(extra, v)").info["error"]
    assert spec.expert(env, random.Random(0)).startswith("search(")


# ----------------------------------------------------------------------------- compaction


def test_compaction_triggers_at_the_threshold_and_the_summary_is_a_policy_turn(micro_policy, compacted):
    _, _, fmt, _ = micro_policy
    spec, eps = compacted
    assert isinstance(spec, ContextSpec)
    asked = summaries = 0
    for ep in eps:
        assert ep.context == "compaction" and ep.window_prefix == ep.turns[0].start
        summary_turns = ep.meta.summary_turns or []
        for k, turn in enumerate(ep.turns):
            if k in summary_turns:
                # a policy turn the env never saw, followed by a copy of itself and the note
                summaries += 1
                assert all(ep.response_mask[turn.start:turn.end]) and turn.tool is None
                assert set(ep.turn_index[turn.start:turn.end]) == {k}
                assert any(lp != 0.0 for lp in ep.logprobs[turn.start:turn.end])
                assert turn.end in ep.window_starts
                ids = ep.token_ids[turn.start:turn.end]
                assert ep.token_ids[turn.end:turn.end + len(ids)] == ids
                assert turn.observation == AFTER_SUMMARY
                continue
            if turn.obs_start < 0:
                continue
            plain = fmt.observation_ids(turn.observation)
            fed = ep.token_ids[turn.obs_start:turn.obs_end]
            crossed = visible_len(ep, turn.obs_start) + len(plain) > 110
            assert (fed != plain) == crossed
            if crossed:
                asked += 1
                assert fed == fmt.observation_ids(turn.observation + "\n\n" + FREE)
                assert k + 1 in summary_turns
    assert asked >= 2 and summaries >= 2
    assert sum(len(ep.window_starts) for ep in eps) >= 2
    assert sum(1 for ep in eps if ep.window_starts and ep.num_turns > 2) >= 1


def test_segments_follow_windows(compacted):
    _, eps = compacted
    for ep in eps:
        windows = window_index(ep)
        assert len(windows) == len(ep.token_ids) or not ep.window_starts
        pol = [i for i, m in enumerate(ep.response_mask) if m]
        assert [ep.segment_index[i] for i in pol] == [window_of(ep, i) for i in pol]
        firsts = {}
        for i in pol:
            firsts.setdefault(window_of(ep, i), i)
        assert ep.segment_starts == [firsts[w] for w in sorted(firsts)]
        assert len(ep.segment_starts) == len(ep.window_starts) + 1
        for i in range(len(ep.token_ids)):
            w = window_of(ep, i)
            if ep.window_starts:
                assert windows[i] == (-1 if i < ep.window_prefix else w)
            # what the token saw: the prompt, then its own window only
            vis = visible_ids(ep, i)
            start = ep.window_starts[w - 1] if w else 0
            expect = ep.token_ids[:i] if w == 0 else ep.token_ids[:ep.window_prefix] + ep.token_ids[start:i]
            assert vis == expect


def test_structured_style_asks_for_four_sections(micro_policy):
    spec = _spec("compaction", 110, style="structured")
    assert spec.operator.request == STRUCTURED
    for section in ("Goal:", "Facts found:", "Open leads:", "Next step:"):
        assert section in STRUCTURED
    eps = _rollout(micro_policy, spec, n=2)
    _, _, fmt, _ = micro_policy
    assert any(ep.token_ids[t.obs_start:t.obs_end] == fmt.observation_ids(t.observation + "\n\n" + STRUCTURED)
               for ep in eps for t in ep.turns if t.obs_start >= 0)


def test_trainer_logprobs_equal_engine_and_visible_context(micro_policy, compacted):
    model, _, fmt, _ = micro_policy
    _, eps = compacted
    assert _trainer_gap(model, fmt, eps) < 1e-4
    # the window mask matters: scoring the whole stored sequence causally is far off
    assert _trainer_gap(model, fmt, eps, windows=False) > 1e-2
    checked = 0
    with torch.no_grad():
        for ep in eps:
            for turn in ep.turns:
                ctx = visible_ids(ep, turn.start)
                ids = ctx + ep.token_ids[turn.start:turn.end]
                logp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
                ref = logp[len(ctx) - 1:-1].gather(-1, torch.tensor(ids[len(ctx):])[:, None])[:, 0]
                got = torch.tensor(ep.logprobs[turn.start:turn.end])
                torch.testing.assert_close(got, ref, rtol=0, atol=1e-4)
                checked += window_of(ep, turn.start) > 0
    assert checked >= 2


@pytest.mark.parametrize("attention", ["eager", "sink_sdpa"])
def test_window_mask_with_other_attentions(micro_policy, compacted, attention):
    """eager gets an additive float mask, sink_sdpa the boolean one; same log-probs as the engine."""
    from agentrl_cli.models.loading import load_policy

    _, _, fmt, _ = micro_policy
    model, *_ = load_policy(config.load(sets=MICRO + [f"model.attention={attention}"]),
                            log=lambda s: None)
    assert _trainer_gap(model, fmt, compacted[1]) < 1e-4


def test_truncated_row_equals_a_fresh_prefill(micro_policy):
    model, _, fmt, _ = micro_policy
    kv = HFEngine(model, fmt.pad_id).new_batch(2)
    a, b = list(range(5, 25)), list(range(30, 37))
    kv.extend([a, b])
    kv.truncate(0, 8)
    kv.extend([[40, 41, 42], [50]])
    fresh = HFEngine(model, fmt.pad_id).new_batch(1)
    fresh.extend([a[:8] + [40, 41, 42]])
    torch.testing.assert_close(kv.last_logits[0], fresh.last_logits[0], rtol=0, atol=1e-5)
    assert kv.tokens[0] == a[:8] + [40, 41, 42] and int(kv.lengths[0]) == 11
    with pytest.raises(ValueError):
        kv.truncate(1, 0)


# ----------------------------------------------------------------------------- none


def test_none_is_unchanged_and_an_unreached_threshold_changes_no_token(micro_policy):
    model, _, fmt, spec = micro_policy
    built = context_mod.make_spec(config.load(sets=MICRO))     # only the step checks around it
    assert not isinstance(built, ContextSpec) and isinstance(built.inner, SearchSpec)
    assert wrap_spec(spec, ContextConfig()) is spec
    plain = _rollout(micro_policy, spec, n=3)
    assert all(ep.context == "" and not ep.window_starts for ep in plain)
    assert collate(plain, fmt.pad_id).window_index is None
    assert all(ep.segment_starts == [t.start for t in ep.turns] for ep in plain)
    never = _rollout(micro_policy, wrap_spec(spec, ContextConfig("compaction", MAX_TOKENS - 1)), n=3)
    for a, b in zip(plain, never):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs and a.reward == b.reward
        assert not b.window_starts and {s for s in b.segment_index if s >= 0} == {0}
        assert len(b.segment_starts) == 1


def test_config_validation():
    with pytest.raises(ConfigError, match="threshold_tokens"):
        config.load(sets=["context.operator=compaction", "context.threshold_tokens=800"])
    with pytest.raises(ConfigError, match="in-process hf engine"):
        config.load(sets=["context.operator=workspace", "rollout.workers=2"])
    with pytest.raises(ConfigError, match="model.attention must be"):
        config.load(sets=["context.operator=compaction", "model.attention=flex_attention"])
    with pytest.raises(ConfigError, match="context.style"):
        config.load(sets=["context.style=bullet"])
    from agentrl_cli.app.preflight import check_names

    bad = config.load(sets=["context.operator=compact"])   # a value: config does not know plugins
    with pytest.raises(Exception, match="unknown context operator 'compact'"):
        check_names(bad)
    assert config.load(sets=["context.threshold_tokens=9999"]).context.operator == "none"


# ----------------------------------------------------------------------------- controllers


def _ctx(micro_policy, spec, method, budget=0, max_tokens=MAX_TOKENS, **algo):
    model, _, fmt, _ = micro_policy
    a = config.load(sets=MICRO + [f"algo.{k}={v}" for k, v in algo.items()], method=method).algo
    return RolloutContext(HFEngine(model, fmt.pad_id), fmt, spec, PARAMS, 2, max_tokens, 4, budget,
                          torch.Generator().manual_seed(1), algo=a)


def test_focus_nodes_are_compaction_boundaries_and_continuations_resume_the_window(
        micro_policy, monkeypatch):
    model, _, fmt, _ = micro_policy
    spec = _spec("compaction", 110)
    launched = {"fork": 0, "prefill": 0}
    batch_cls = type(HFEngine(model, fmt.pad_id).new_batch(0))     # the layout the engine picks
    real_fork, real_add = batch_cls.fork, batch_cls.add_row

    def count_fork(self, *a):
        launched["fork"] += 1
        return real_fork(self, *a)

    def count_add(self, *a):
        launched["prefill"] += 1
        return real_add(self, *a)

    monkeypatch.setattr(batch_cls, "fork", count_fork)
    monkeypatch.setattr(batch_cls, "add_row", count_add)
    # long enough for three resets per episode, so that rows move on to later windows after
    # the nodes they created (a fork from such a row would see the wrong context)
    res = CONTROLLERS.get("focus").run(_ctx(micro_policy, spec, "focus", budget=420, max_tokens=900,
                                        focus_allocator="uniform"), spec.tasks("train", 2))
    from agentrl_cli.credit.focus_credit import path_values, refine_tree

    eps = res.episodes
    for tree in res.trees:
        arr = tree.arrays()
        vals = refine_tree(arr, 1.0, 1.0)
        for pid, node_ids in tree.paths.items():
            ep, inner = eps[pid], [tree.nodes[i] for i in node_ids[:-1]]
            # one node per segment, at the segment's start: the root, then each context reset
            assert [nd.position for nd in inner] == ep.segment_starts
            assert len(path_values(arr, vals, pid)) == len(inner) == len(ep.window_starts) + 1
            for k, nd in enumerate(inner[1:], start=1):
                assert window_of(ep, nd.position) == k
                summary = ep.turns[nd.depth - 1]
                assert summary.end == ep.window_starts[k - 1]
                assert visible_ids(ep, nd.position) == (ep.token_ids[:ep.window_prefix]
                                                       + ep.token_ids[summary.end:nd.position])
    assert all(len(ep.window_starts) >= 2 for ep in eps)
    for ep in eps:       # continuations inherit the source's resets and summaries before the node
        assert ep.meta.context_resets == len(ep.window_starts)
        reset = [ep.turns[k].end for k in ep.meta.summary_turns if ep.turns[k].obs_start >= 0]
        assert reset == ep.window_starts     # (a last summary may not fit: no reset after it)
    conts = [ep for ep in eps if ep.meta.focus_origin != 0]
    assert conts, "needs a continuation launched inside a later window"
    n_cont = res.metrics["focus/continuations"]
    # a continuation forks a row still in the node's window, else prefills the visible context
    assert launched["fork"] + launched["prefill"] == len(eps)
    assert launched["fork"] >= 1
    assert launched["prefill"] > len(eps) - n_cont    # some rows had moved on to later windows
    for ep in conts:
        pos = next(i for i, m in enumerate(ep.response_mask) if m)
        assert window_of(ep, pos) >= 1 and ep.segment_index[pos] == window_of(ep, pos)
    # continuations were generated from the node's visible context (forked or prefilled)
    assert _trainer_gap(model, fmt, conts) < 1e-4
    assert _trainer_gap(model, fmt, eps) < 1e-4


def test_vine_states_are_window_starts(micro_policy):
    spec = _spec("compaction", 110, max_turns=4)
    res = CONTROLLERS.get("vine").run(_ctx(micro_policy, spec, "vineppo", vine_k=1), spec.tasks("train", 1))
    eps = res.episodes
    assert [len(v) for v in res.payload.get(SegmentValues).values] == [len(ep.segment_starts) for ep in eps]
    assert any(len(ep.segment_starts) > 1 for ep in eps)
    for c in res.continuations:
        src = eps[c.meta.source]
        prefix = visible_ids(src, src.segment_starts[c.meta.boundary])
        assert c.token_ids[:len(prefix)] == prefix and c.window_prefix == src.window_prefix


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("method", ["focus", "grpo"])
@pytest.mark.parametrize("operator", ["compaction", "workspace"])
def test_train_end_to_end(tmp_path, method, operator):
    threshold = 110 if operator == "compaction" else 200
    cfg = config.load(method=method, sets=MICRO + [
        "train.steps=1", "train.eval_tasks=1", "env.max_turns=4", "rollout.max_tokens=400",
        f"context.operator={operator}", f"context.threshold_tokens={threshold}"])
    checked_train(cfg, tmp_path, log=lambda s: None)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = rows[-1]
    assert step["step"] == 1 and step["rollout/context_resets"] > 0
    assert step["rollout/logprob_gap"] < 1e-4
    assert all(torch.isfinite(torch.tensor(float(v))) for k, v in step.items()
               if k.startswith(("loss/", "adv/")))
    assert json.loads((tmp_path / "config.json").read_text())["context"]["operator"] == operator


def test_cli_one_line_error_for_an_unreachable_threshold():
    from typer.testing import CliRunner

    from agentrl_cli.cli.main import app

    res = CliRunner().invoke(app, ["train", "--method", "focus", "--set", "context.operator=compaction",
                                   "--set", "context.threshold_tokens=2000"])
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "context.threshold_tokens" in lines[0]


@pytest.mark.parametrize("operator", ["compaction", "workspace"])
def test_focus_continuations_after_context_resets(tmp_path, operator):
    """Regression: with a token budget FOCUS launches several continuations from one node in a
    single fill; when the node's original path has reset its context since, the next path
    through the node may be a just-launched continuation whose row is not fed yet, and forking
    from it failed ("fork: prefix_len ... outside [0, 0]"). Such rows must be passed over."""
    threshold = 120 if operator == "compaction" else 200
    cfg = config.load(method="focus", sets=MICRO + [
        "train.steps=1", "train.eval_tasks=1", "env.max_turns=4", "rollout.max_tokens=400",
        "rollout.budget_tokens=200", f"context.operator={operator}",
        f"context.threshold_tokens={threshold}"])
    checked_train(cfg, tmp_path, log=lambda s: None)
    step = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["step"] == 1 and step["rollout/logprob_gap"] < 1e-4
