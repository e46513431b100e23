"""The built-in "rules" env: rulebooks, cases, answers, tools, expert, snapshot/restore."""
from __future__ import annotations

import random
import re
from collections import Counter, defaultdict

import pytest

from agentrl_cli.envs import ENVS
from agentrl_cli.envs import rules as R

from env_checks import (check_deterministic, check_expert_rate, check_expert_recovers,
                        check_expert_solves, check_malformed, check_registered,
                        check_snapshot_restore, expert_rewards_by_hops, random_policy_finals,
                        spec_fixture, start_episode)

spec = spec_fixture("rules")
wide = spec_fixture("rules", seed=3, min_hops=1, max_hops=4, n_train=300, n_eval=100)


def test_registered_and_protocol(spec):
    check_registered("rules", spec, R.RulesSpec,
                     {"min_hops": 1, "max_hops": 4, "n_train": 60, "n_eval": 10,
                      "n_entities": 100, "relations": "full"},   # generic env-config options
                     n_train=60, n_eval=10, hops={1, 2, 3, 4},
                     bad=({"max_hops": 5}, {"min_hops": 3, "max_hops": 2}, {"n_eval": -1}))


def test_determinism_and_splits(spec):
    build = R._tasks.__wrapped__
    check_deterministic(lambda seed: build(seed, 1, 4, 80, 20), lambda: build(8, 2, 3, 40, 10))
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
    num = lambda title, i=0: int(re.findall(r"(?<![a-z])\d+", text[title])[i])   # not bag1
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
        for task, actions, _ in check_expert_solves(s, s.tasks("train") + s.tasks("eval"), rng):
            assert sum(a.startswith("rule(") for a in actions) == task.meta["hops"]
            assert len(actions) <= 2 * task.meta["hops"] + 2
            assert all(len(a) <= 48 for a in actions)


def test_imperfect_expert_rate(wide):
    check_expert_rate(expert_rewards_by_hops(wide, wide.tasks("train"), random.Random(1)),
                      tol=0.13)


def random_action(rng: random.Random, task=None) -> str:
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
    finals = random_policy_finals(spec, spec.tasks("train", 300), random.Random(2), random_action)
    assert sum(r.reward for r in finals) / len(finals) < 0.05


def test_answer_checking():
    assert R.check_rules_answer(" Yes. ", "yes") and R.check_rules_answer("NO", "no")
    assert not R.check_rules_answer("yes", "no") and not R.check_rules_answer("yes no", "yes")
    assert R.check_rules_answer("$130", "130") and R.check_rules_answer("130.0", "130")
    assert not R.check_rules_answer("131", "130") and not R.check_rules_answer("yes", "130")


@pytest.mark.parametrize("action", ["", "hello", "rule", "rule(R1", "Rule(R1)", "open(R1)",
                                    "rule(R1) rule(R2)", "search(a)\nanswer(b)", "answer(no) ok",
                                    "calc(1))"])
def test_malformed_actions(spec, action):
    check_malformed(spec, action, R.MALFORMED)


def test_tools_and_truncation():
    spec = ENVS.get("rules")(seed=0, max_turns=4)
    env, task = start_episode(spec)
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


def test_snapshot_restore(spec):
    check_snapshot_restore(spec, prefix=3, losing="answer(maybe)")


def test_expert_valid_after_policy_steps():
    def prefix(env, task, rng):
        a = random_action(rng) if rng.random() < 0.5 else spec20.expert(env, rng, 0.5)
        return None if a.startswith("answer(") else a

    spec20 = ENVS.get("rules")(seed=3, min_hops=1, max_hops=4, n_train=300, n_eval=100,
                               max_turns=20)
    check_expert_recovers(spec20, spec20.tasks("eval"), random.Random(4), prefix)


def test_calc_refers_to_the_amounts_of_the_rules_read():
    """A rule names its dollar amounts; calc knows the names of the rules the episode has
    read (an unread one is an error) and the expert's fee expressions use names only."""
    spec = ENVS.get("rules")(seed=0)
    env, task = start_episode(spec)
    book = {line.split(" ", 1)[0]: line for line in task.meta["rules"]}
    bag = next(rid for rid, line in book.items() if " checked bag fee: " in line)
    amounts = R.rule_amounts(book[bag])
    assert set(amounts) == {"bag1", "bag2"}
    r = env.step("calc(bag1+bag2*2)")
    assert r.info["error"] and r.observation.startswith("error: unknown amount bag1")
    snap = env.snapshot()
    env.step(f"rule({bag})")
    r = env.step("calc(bag1+bag2*2+1)")
    assert r.observation == str(amounts["bag1"] + 2 * amounts["bag2"] + 1)
    assert env.step("calc(heavy)").observation.startswith("error: unknown amount heavy")
    env.restore(snap)                                  # before the rule was read
    assert env.step("calc(bag1)").info["error"]
    rng = random.Random(0)
    for task, actions, _ in check_expert_solves(spec, spec.tasks("eval", 100), rng):
        for a in actions:
            if a.startswith("calc("):
                assert re.fullmatch(r"calc\((0|bag1|bag2|heavy|change)"
                                    r"(\+(0|bag1|bag2|heavy|change))*\)", a), a


def test_the_expert_itemises_the_bag_fee_bag_by_bag():
    """One base amount per bag in the case's order (0 while a gold member's bags are free,
    bag1 for the first, bag2 after), `heavy` right after a bag over the limit; the items sum to
    the counted fee and the gold answer."""
    p = {"A": 30, "B": 40, "N": 2, "W": 23, "C": 100}
    assert R.bag_items(p, False, [24, 18, 30]) == ["bag1", "heavy", "bag2", "bag2", "heavy"]
    assert R.bag_items(p, True, [24, 18, 30]) == ["0", "heavy", "0", "bag2", "heavy"]
    assert R.bag_items(p, True, [12]) == ["0"]
    assert R.bag_items({**p, "N": 1}, True, [12, 23]) == ["0", "bag2"]   # 23 is not over 23
    assert R.fee_counts("bag1+heavy+bag2+bag2*2+0+7") == {"bag1": 1, "heavy": 1, "bag2": 3}
    spec = ENVS.get("rules")(seed=0)
    for task in spec.tasks("eval"):
        m = task.meta
        if not m["numeric"]:
            continue
        counted = {e.partition("*")[0]: int(e.partition("*")[2] or 1) for _, e, _ in m["terms"]}
        assert R.fee_counts("+".join(m["items"])) == counted, task.prompt
        assert sum(v for _, _, v in m["terms"]) == int(task.answer)
