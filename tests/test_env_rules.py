"""The built-in "rules" env: rulebooks, cases, answers, tools, expert, snapshot/restore."""
from __future__ import annotations

import pickle
import random
import re
from collections import Counter, defaultdict

import pytest

from agentrl_cli.config import ConfigError

from agentrl_cli.envs import ENVS, StepResult, TextEnv
from agentrl_cli.envs import rules as R


@pytest.fixture(scope="module")
def spec() -> R.RulesSpec:
    return ENVS.get("rules")(seed=0)


@pytest.fixture(scope="module")
def wide() -> R.RulesSpec:
    return ENVS.get("rules")(seed=3, min_hops=1, max_hops=4, n_train=300, n_eval=100)


def run_expert(spec, env, task, rng, error_rate=0.0):
    env.reset(task)
    actions, results = [], []
    while True:
        a = spec.expert(env, rng, error_rate)
        r = env.step(a)
        actions.append(a)
        results.append(r)
        if r.terminated or r.truncated:
            return actions, results


def test_registered_and_protocol(spec):
    assert "rules" in ENVS
    assert isinstance(spec, R.RulesSpec) and spec.name == "rules"
    env = spec.make()
    assert isinstance(env, TextEnv)
    assert len(env.system_prompt.split()) <= 25
    s2 = ENVS.get("rules")(seed=1, min_hops=1, max_hops=4, n_train=60, n_eval=10, max_turns=9,
                           n_entities=100, relations="full")   # generic env-config options
    assert len(s2.tasks("train")) == 60 and len(s2.tasks("eval")) == 10
    assert s2.make().max_turns == 9
    assert {t.meta["hops"] for t in s2.tasks("train")} == {1, 2, 3, 4}
    with pytest.raises(TypeError):
        ENVS.get("rules")(seed=0, bogus=1)
    with pytest.raises(ValueError):
        spec.tasks("test")
    for bad in ({"max_hops": 5}, {"min_hops": 3, "max_hops": 2}, {"n_eval": -1}):
        with pytest.raises(ConfigError):   # a user error: one line and exit code 2 in the CLI
            ENVS.get("rules")(seed=0, **bad)


def test_determinism_and_splits(spec):
    build = R._tasks.__wrapped__
    a, b, c = build(5, 1, 4, 80, 20), build(5, 1, 4, 80, 20), build(6, 1, 4, 80, 20)
    key = lambda ts: [(t.task_id, t.prompt, t.answer, t.meta) for t in ts]
    for split in ("train", "eval"):
        assert key(a[split]) == key(b[split]) and key(a[split]) != key(c[split])
    random.seed(0)
    x = random.random()
    random.seed(0)
    build(8, 2, 3, 40, 10)
    assert random.random() == x
    train, ev = spec.tasks("train"), spec.tasks("eval")
    assert len(train) == 600 and len(ev) == 200 and spec.tasks("eval", 4) == ev[:4]
    k = lambda t: (t.prompt, tuple(t.meta["rules"]))
    assert not {k(t) for t in train} & {k(t) for t in ev}
    assert ev[3].task_id == "rules-eval-00003"
    assert {t.meta["hops"] for t in train} == {2, 3}


def _solve(task) -> str:
    """An independent solver: parses the case facts and the rule texts, applies the rules."""
    m = re.match(r"Case: (\w+), (gold member|silver member|no status), (economy|business), "
                 r"(basic|standard|flex) fare, (\d+) miles, booked (\d+) h ago, bags: ([\d, ]+) kg\. "
                 r"Question: (.*)$", task.prompt)
    assert m, task.prompt
    _, tier, cabin, fare, miles, booked, bags, q = m.groups()
    miles, booked = int(miles), int(booked)
    bags = [int(x) for x in bags.split(", ")]
    text = {line.split(": ", 1)[0].split(" ", 1)[1]: line.split(": ", 1)[1]
            for line in task.meta["rules"]}
    num = lambda title, i=0: int(re.findall(r"\d+", text[title])[i])
    lounge = cabin == "business" or miles >= num("lounge access")
    upgrade = miles >= num("upgrades") and fare != "basic"
    change = 0 if fare == "flex" else num("change fee")
    yn = lambda b: "yes" if b else "no"
    if q.endswith("lounge access and an upgrade?"):
        return yn(lounge and upgrade)
    if q.endswith("lounge access?"):
        return yn(lounge)
    if q.endswith("an upgrade?"):
        return yn(upgrade)
    if q.endswith("a refund?"):
        return yn(fare == "flex" or booked <= num("refunds"))
    if "to change the flight" in q:
        return str(change)
    free = num("gold member bags") if tier == "gold member" else 0
    fee = sum(0 if i < free else num("checked bag fee", 0 if i == 0 else 1)
              for i in range(len(bags)))
    fee += num("overweight bags", 1) * sum(w > num("overweight bags") for w in bags)
    if "change fees in total" in q:
        fee += change
    return str(fee)


def test_cases_follow_their_rulebook(wide):
    kinds, ids = Counter(), defaultdict(set)
    answers = Counter()
    for t in wide.tasks("train") + wide.tasks("eval"):
        assert t.answer == _solve(t), t
        kinds[t.meta["kind"]] += 1
        assert len(t.meta["rules"]) == 9 and len(t.meta["needed"]) == t.meta["hops"]
        for line in t.meta["rules"]:
            ids[line.split(": ")[0].split(" ", 1)[1]].add(line.split(" ")[0])
        if not t.meta["numeric"]:
            answers[t.answer] += 1
        assert len(t.prompt.split()) <= 40
    assert set(kinds) == {"change", "lounge", "upgrade", "refund", "bags", "lounge_upgrade",
                          "bags_change"}
    assert all(len(v) >= 6 for v in ids.values())          # rule ids differ from task to task
    assert abs(answers["yes"] - answers["no"]) < 0.2 * sum(answers.values())


def test_search_finds_each_needed_rule(wide):
    for t in wide.tasks("eval"):
        env = wide.make()
        env.reset(t)
        for rid, query in zip(t.meta["needed"], t.meta["queries"]):
            assert rid in [r.rule_id for r in R.search_rules(env.book, query)]
        assert R.search_rules(env.book, "zzz qqq") == []


def test_expert_solves_both_splits(spec, wide):
    rng = random.Random(0)
    for s in (spec, wide):
        env = s.make()
        for task in s.tasks("train") + s.tasks("eval"):
            actions, results = run_expert(s, env, task, rng)
            assert results[-1].terminated and results[-1].reward == 1.0, (task, actions)
            assert results[-1].info["success"] is True
            assert all(r.reward == 0.0 and not r.info["error"] for r in results[:-1])
            assert sum(a.startswith("rule(") for a in actions) == task.meta["hops"]
            assert len(actions) <= 2 * task.meta["hops"] + 2
            assert all(len(a) <= 40 for a in actions)


def test_imperfect_expert_rate(wide):
    rng = random.Random(1)
    env = wide.make()
    by_hops = defaultdict(list)
    for task in wide.tasks("train"):
        _, results = run_expert(wide, env, task, rng, error_rate=0.3)
        assert results[-1].terminated
        by_hops[task.meta["hops"]].append(results[-1].reward)
    for h, rs in by_hops.items():
        assert abs(sum(rs) / len(rs) - 0.7 ** h) < 0.13, (h, sum(rs) / len(rs))


def random_action(rng: random.Random) -> str:
    words = ["search(", "rule(", "calc(", "answer(", ")", "(", "R3", "bag", "fee", "1+2", " ",
             "\n", "yes"]
    if rng.random() < 0.4:
        return "".join(rng.choice(words) for _ in range(rng.randint(0, 6)))
    tool = rng.choice(R.TOOLS)
    arg = {"search": lambda: rng.choice(["bag", "lounge", "fee", "x", ""]),
           "rule": lambda: f"R{rng.randint(0, 11)}",
           "calc": lambda: f"{rng.randint(0, 99)}{rng.choice('+-*/')}{rng.randint(0, 9)}",
           "answer": lambda: rng.choice(["maybe", "R1", "ok", str(rng.randint(0, 400)), "fee"])}[tool]()
    return f"{tool}({arg})"


def test_random_policy_never_crashes(spec):
    rng = random.Random(2)
    env = spec.make()
    total = 0.0
    tasks = spec.tasks("train", 300)
    for task in tasks:
        env.reset(task)
        for _ in range(30):
            r = env.step(random_action(rng))
            assert isinstance(r, StepResult) and isinstance(r.observation, str)
            if r.terminated or r.truncated:
                break
        total += r.reward
    assert total / len(tasks) < 0.05


def test_answer_checking():
    assert R.check_rules_answer(" Yes. ", "yes") and R.check_rules_answer("NO", "no")
    assert not R.check_rules_answer("yes", "no") and not R.check_rules_answer("yes no", "yes")
    assert R.check_rules_answer("$130", "130") and R.check_rules_answer("130.0", "130")
    assert not R.check_rules_answer("131", "130") and not R.check_rules_answer("yes", "130")


@pytest.mark.parametrize("action", ["", "hello", "rule", "rule(R1", "Rule(R1)", "open(R1)",
                                    "rule(R1) rule(R2)", "search(a)\nanswer(b)", "answer(no) ok",
                                    "calc(1))"])
def test_malformed_actions(spec, action):
    env = spec.make()
    env.reset(spec.tasks("eval")[0])
    r = env.step(action)
    assert r.observation == R.MALFORMED and r.info["tool"] is None and r.info["error"]
    assert r.reward == 0.0 and not r.terminated and not r.truncated


def test_tools_and_truncation():
    spec = ENVS.get("rules")(seed=0, max_turns=4)
    env = spec.make()
    task = spec.tasks("eval")[0]
    env.reset(task)
    r = env.step("search(overweight)")
    first = r.observation.split("\n")[0]
    assert first.endswith("overweight bags") and r.info == {"tool": "search", "error": False,
                                                            "steps": 1}
    rid = first.split(" ")[0]
    r = env.step(f"rule({rid.lower()})")
    assert r.observation.startswith(f"{rid} overweight bags: each bag over ")
    assert r.observation in task.meta["rules"]
    assert env.step("rule(R99)").observation == "error: no rule R99"
    r = env.step("calc(60*2+35)")
    assert r.observation == "155" and r.truncated and r.info["success"] is False
    env.reset(task)
    assert env.step("search(  )").info["error"] and env.step("calc(1/0)").info["error"]
    r = env.step(f"answer({task.answer})")
    assert r.terminated and r.reward == 1.0 and r.observation == ""
    assert env.step("rule(R1)").info["error"]


def _continue(spec, env, seed, k=20, error_rate=0.3):
    rng = random.Random(seed)
    out = []
    for _ in range(k):
        a = spec.expert(env, rng, error_rate)
        r = env.step(a)
        out.append((a, r.observation, r.reward, r.terminated, r.truncated))
        if r.terminated or r.truncated:
            break
    return out


def test_snapshot_restore(spec):
    env = spec.make()
    task = next(t for t in spec.tasks("eval") if t.meta["hops"] == 3)
    env.reset(task)
    rng = random.Random(3)
    for _ in range(3):
        env.step(spec.expert(env, rng))
    snap = env.snapshot()
    snap_bytes = pickle.dumps(snap)
    a = _continue(spec, env, seed=11)
    env.restore(snap)
    assert _continue(spec, env, seed=11) == a and a[-1][3]
    env.restore(snap)
    other = spec.make()
    other.restore(pickle.loads(snap_bytes))
    assert _continue(spec, env, seed=5) == _continue(spec, other, seed=5)
    assert pickle.dumps(snap) == snap_bytes
    env.restore(snap)
    env.step("answer(maybe)")
    env.restore(snap)
    assert env.steps == 3 and not env.terminated and len(env.history) == 3


def test_expert_valid_after_policy_steps(wide):
    rng = random.Random(4)
    spec20 = ENVS.get("rules")(seed=3, min_hops=1, max_hops=4, n_train=300, n_eval=100,
                               max_turns=20)
    env = spec20.make()
    for task in spec20.tasks("eval"):
        env.reset(task)
        for _ in range(rng.randint(0, 4)):
            a = random_action(rng) if rng.random() < 0.5 else spec20.expert(env, rng, 0.5)
            if not a.startswith("answer("):
                env.step(a)
        clone = spec20.make()
        clone.restore(env.snapshot())
        while True:
            r = clone.step(spec20.expert(clone, rng, 0.0))
            if r.terminated or r.truncated:
                break
        assert r.terminated and r.reward == 1.0, task
