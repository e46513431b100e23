"""The built-in "search" env: world, BM25, tasks, tools, expert, snapshot/restore."""
from __future__ import annotations

import random
import time

import pytest

from agentrl_cli.envs import ENVS
from agentrl_cli.envs import search as S

from env_checks import (check_deterministic, check_expert_rate, check_expert_recovers,
                        check_expert_solves, check_malformed, check_registered,
                        check_snapshot_restore, expert_rewards_by_hops, random_policy_finals,
                        run_expert, spec_fixture, start_episode)

spec = spec_fixture("search")


def test_registered_and_protocol(spec):
    check_registered("search", spec, S.SearchSpec,
                     {"n_entities": 120, "min_hops": 2, "max_hops": 4, "n_train": 50,
                      "n_eval": 10}, n_train=50, n_eval=10, hops={2, 3, 4}, hops_subset=True)


def test_world_fast_and_cached():
    t0 = time.perf_counter()
    S.SearchWorld(12345, 300)
    assert time.perf_counter() - t0 < 0.5
    a = ENVS.get("search")(seed=7)
    b = ENVS.get("search")(seed=7)
    assert a.world is b.world


def test_determinism_from_seed():
    w1, w2, w3 = S.SearchWorld(5, 300), S.SearchWorld(5, 300), S.SearchWorld(6, 300)
    assert [(d.doc_id, d.text) for d in w1.docs] == [(d.doc_id, d.text) for d in w2.docs]
    assert [d.text for d in w1.docs] != [d.text for d in w3.docs]
    build = S._tasks.__wrapped__
    check_deterministic(lambda seed: build(seed, 300, 2, 3, 300, 50),
                        lambda: (S.SearchWorld(8, 300), build(8, 300, 2, 3, 100, 20)))


def test_corpus_shape(spec):
    w = spec.world
    assert len(w.docs) == 300
    assert [d.doc_id for d in w.docs] == [f"d{i}" for i in range(300)]
    assert len({d.title for d in w.docs}) == 300          # names unique
    kinds = {d.kind for d in w.docs}
    assert kinds == {"person", "company", "city", "country"}
    # many entities have a similar-named distractor with different facts
    assert len(w.partner) >= 150
    for a, b in w.partner.items():
        da, db = w.doc_by_title[a], w.doc_by_title[b]
        assert da.kind == db.kind and set(a.split()) & set(b.split())
        for (r1, v1), (r2, v2) in zip(da.facts, db.facts):
            assert r1 == r2 and v1 != v2
    d = w.docs[0]
    assert d.text.startswith(d.title + ". ")
    for rel, val in d.facts:
        assert f"{rel}: {val}." in d.text
        assert val in w.doc_by_title


def test_tasks_split_disjoint_and_well_formed(spec):
    train, ev = spec.tasks("train"), spec.tasks("eval")
    assert len(train) == 600 and len(ev) == 200
    assert spec.tasks("eval", 10) == ev[:10]
    assert ev[42].task_id == "search-eval-00042" and train[7].task_id == "search-train-00007"
    key = lambda t: (t.meta["start"], tuple(t.meta["relations"]))
    assert not {key(t) for t in train} & {key(t) for t in ev}
    assert len({key(t) for t in train}) == len(train)
    w = spec.world
    hops = set()
    for t in train + ev:
        m = t.meta
        hops.add(m["hops"])
        assert t.prompt == "Question: " + " > ".join([m["start"], *m["relations"]])
        assert len(m["relations"]) == m["hops"] and len(m["chain"]) == m["hops"] + 1
        assert len(set(m["chain"])) == len(m["chain"])      # no loops
        assert w.follow(m["start"], tuple(m["relations"])) == m["chain"]
        assert t.answer == m["chain"][-1]
        assert m["doc_ids"] == [w.doc_by_title[e].doc_id for e in m["chain"]]
    assert hops == {2, 3}


def test_lookup_split_reads_every_fact(spec):
    """`lookup`: one one-hop question per (entity, relation) of the world, solved by the expert;
    the tiny model's warm-up imitates them next to training questions."""
    looks = spec.tasks("lookup")
    w = spec.world
    assert len(looks) == sum(len(d.facts) for d in w.docs)
    assert {(t.meta["start"], t.meta["relations"][0]) for t in looks} == {
        (d.title, r) for d in w.docs for r, _ in d.facts}
    for t in looks[:50]:
        assert t.meta["hops"] == 1 and t.answer == w.doc_by_title[t.meta["start"]].fact(
            t.meta["relations"][0])
        assert t.prompt == f"Question: {t.meta['start']} > {t.meta['relations'][0]}"
    for task, actions, _ in check_expert_solves(spec, looks[:30], random.Random(3)):
        assert len(actions) == 3


def test_perfect_expert_solves_all_eval(spec):
    calls = []
    for task, actions, _ in check_expert_solves(spec, spec.tasks("eval"), random.Random(0)):
        assert len(actions) >= 3 and len(actions) == 2 * task.meta["hops"] + 1
        calls.append(len(actions))
    assert 5 <= sum(calls) / len(calls) <= 7


def test_imperfect_expert_rate(spec):
    rng = random.Random(1)
    check_expert_rate(expert_rewards_by_hops(spec, spec.tasks("train", 1200), rng), tol=0.12)
    # error_rate 1.0 almost never succeeds
    env = spec.make()
    fails = [run_expert(spec, env, t, rng, 1.0)[1][-1].reward for t in spec.tasks("eval", 100)]
    assert sum(fails) / len(fails) < 0.2


def random_action(rng: random.Random, task=None) -> str:
    words = ["search(", "open(", "answer(", ")", "d1", "d999", "Corp", "x", " ", "\n", "(("]
    return "".join(rng.choice(words) for _ in range(rng.randint(0, 6)))


def test_random_policy_never_crashes(spec):
    finals = random_policy_finals(spec, spec.tasks("train", 200), random.Random(2), random_action)
    assert sum(r.reward for r in finals) / len(finals) < 0.05


@pytest.mark.parametrize("action", [
    "", "   ", "hello", "search", "search(x", "look(d1)", "Search(x)",
    "search(a) search(b)", "open(d1)\nanswer(x)", "search(x) and more", "answer(x)(y)",
])
def test_malformed_actions(spec, action):
    check_malformed(spec, action, S.MALFORMED)


def test_tool_observations(spec):
    env, task = start_episode(spec, 3)
    start = task.meta["start"]
    r = env.step(f"  search({start})  ")
    lines = r.observation.split("\n")
    assert 1 <= len(lines) <= 3 and lines[0] == f"{task.meta['doc_ids'][0]} {start}"
    assert r.info == {"tool": "search", "error": False, "steps": 1}
    r = env.step("search(   )")
    assert r.observation.startswith("error:") and r.info["error"] and not r.terminated
    r = env.step("open(d999)")
    assert r.observation == "error: no document d999" and r.info["error"]
    r = env.step(f"open({task.meta['doc_ids'][0]})")
    assert r.observation == spec.world.doc_by_title[start].text and not r.info["error"]
    r = env.step(f"answer(  {task.answer.upper()}. )")
    assert r.terminated and r.reward == 1.0 and r.observation == "" and r.info["success"]
    r = env.step("search(x)")  # after the end: no crash, no reward
    assert r.reward == 0.0 and r.info["error"]
    env.reset(task)
    r = env.step("answer(Nobody)")
    assert r.terminated and r.reward == 0.0 and r.info["success"] is False


def test_truncation_at_max_turns():
    spec = ENVS.get("search")(seed=0, max_turns=3)
    env, task = start_episode(spec)
    r1, r2 = env.step("search(a)"), env.step("bad")
    assert not r1.truncated and not r2.truncated
    r3 = env.step("open(d1)")
    assert r3.truncated and not r3.terminated and r3.reward == 0.0
    assert r3.info["success"] is False
    # answering on the last allowed turn terminates instead
    env.reset(task)
    env.step("search(a)")
    env.step("search(b)")
    r = env.step(f"answer({task.answer})")
    assert r.terminated and not r.truncated and r.reward == 1.0


def test_snapshot_restore(spec):
    check_snapshot_restore(spec, prefix=3, losing="answer(Nobody)")


def test_expert_valid_after_policy_steps_and_restore():
    """The expert picks up from any state, e.g. after junk or partial policy steps."""
    spec20 = ENVS.get("search")(seed=0, max_turns=20)
    junk = ["junk", "search(Corp)", "open(d3)", "open(d999)", "search()"]
    check_expert_recovers(spec20, spec20.tasks("eval", 60), random.Random(4),
                          lambda env, task, rng: rng.choice(junk),
                          check_action=lambda a: S.parse_action(a) is not None)


def test_bm25_ranks_exact_title_first(spec):
    for w in (spec.world, S.SearchWorld(3, 500)):
        hits = sum(w.search(d.title)[0] is d for d in w.docs)
        assert hits / len(w.docs) >= 0.95
        assert all(len(w.search(d.title)) <= 3 for d in w.docs[:50])
    assert spec.world.search("zzzqqq") == []


def test_normalize_and_parse():
    assert S.normalize_answer("  Zorblax   CORP. ") == "zorblax corp"
    assert S.parse_action(" open(d12) ") == ("open", "d12")
    assert S.parse_action('search("Mira Quon")') == ("search", "Mira Quon")
    assert S.parse_action("search(a) search(b)") is None
    assert S.parse_action("answer(x)\n") == ("answer", "x")
