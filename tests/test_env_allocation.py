"""The built-in "allocation" env: a folder walk whose one decisive choice settles the outcome;
its tools, determinism, forking, the scripted expert and the oracle value."""
from __future__ import annotations

import pickle
import random

import pytest

from agentrl_cli.envs import ENVS, TextEnv
from agentrl_cli.envs import allocation as A
from agentrl_cli.envs.checker import check_env
from agentrl_cli.errors import ConfigError

from env_checks import check_deterministic, continue_expert, run_expert


def make(seed: int = 0, **options) -> A.AllocationSpec:
    return ENVS.get("allocation")(seed=seed, **options)


def play(spec, tasks, rng, error_rate=0.0, start=None):
    """The expert's episodes on `tasks` (each first stepped through the messages `start(task)`
    gives, when given): (root oracle values, oracle values where the expert took over,
    successes)."""
    env = spec.make()
    roots, values, wins = [], [], []
    for task in tasks:
        env.reset(task)
        roots.append(env.oracle_value())
        for a in (start(task) if start else ()):
            env.step(a)
        values.append(env.oracle_value())
        _, results = run_expert(spec, env, None, rng, error_rate)
        wins.append(bool(results[-1].info["success"]))
    return roots, values, wins


def wrong_matching(task) -> int:
    return next(c for c in task.meta["matching"] if c != task.meta["gold"])


def wrong_unmatched(task) -> int:
    return next(c for c in range(1, task.meta["width"] + 1) if c not in task.meta["matching"])


def to_decisive(task) -> list[str]:
    """Messages from the root to the decisive decision: cd(1) at every other decision."""
    return ["cd(1)"] * (task.meta["decisive"] - 1)


# ------------------------------------------------------------------------------ the env
def test_registered_options_and_bad_values():
    spec = make()
    assert isinstance(spec, A.AllocationSpec) and spec.name == "allocation"
    assert isinstance(spec.make(), TextEnv) and spec.reward_range == (0.0, 1.0)
    assert len(spec.make().system_prompt.split()) <= 25
    assert set(ENVS.get("allocation").options) == {
        "horizon", "decisive", "width", "ambiguity", "recoverable", "late_noise", "files",
        "n_train", "n_eval", "max_turns", "call_cost", "expert_refs"}
    s2 = make(seed=1, horizon=5, decisive=3, width=3, ambiguity=1, n_train=30, n_eval=7,
              max_turns=9)
    assert len(s2.tasks("train")) == 30 and len(s2.tasks("eval")) == 7
    assert s2.make().max_turns == 9 and s2.tasks("eval", 2) == s2.tasks("eval")[:2]
    assert {t.meta["hops"] for t in s2.tasks("train")} == {5}
    for bad in ({"horizon": 0}, {"horizon": 9}, {"decisive": 5}, {"width": 1}, {"width": 10},
                {"ambiguity": 5}, {"ambiguity": 0}, {"late_noise": 1.0}, {"late_noise": -0.1},
                {"recoverable": "maybe"}, {"max_turns": 4}, {"n_eval": -1}, {"horizon": 2.5},
                {"files": 0}, {"files": 5}):
        with pytest.raises(ConfigError):
            make(**bad)
    with pytest.raises(TypeError):
        make(bogus=1)
    with pytest.raises(ValueError):
        spec.tasks("test")
    assert make(recoverable="true").recoverable is True


def test_tasks_are_well_formed_and_the_splits_disjoint():
    spec = make(horizon=5, decisive=2, width=4, ambiguity=2)
    train, ev = spec.tasks("train"), spec.tasks("eval")
    assert len(train) == 600 and len(ev) == 200
    assert len({t.task_id for t in train + ev}) == 800
    for t in train[:100]:
        m = t.meta
        decisive = m["levels"][m["decisive"] - 1]
        area = m["area"]
        assert [i for i, n in enumerate(decisive, 1)
                if n.rstrip("/").rstrip("0123456789") == area] == m["matching"]
        assert sorted(decisive[i - 1] for i in m["matching"]) == [area + "/", area + "2/"]
        assert len(set(decisive)) == 4 and m["gold"] in m["matching"]
        # the other decisions list the same folders in every task; the file is only in the
        # right leaf
        assert all(lv == A.level_dirs(k, 4) for k, lv in enumerate(m["levels"], 1)
                   if k != m["decisive"])
        assert m["leaf"][int(t.answer) - 1] == m["file"] and m["leaf"].count(m["file"]) == 1
        assert all(w is None or m["file"] not in w for w in m["wrong_leaves"])
        assert t.prompt.startswith(f"Issue: {m['file'][:-3]} fails in {area}.\n")
        assert t.prompt.endswith(A.listing(m["levels"][0]))
    # the splits are other draws: their issues and decisive listings rarely coincide
    worlds = [{(t.prompt, tuple(t.meta["levels"][1]), t.meta["gold"]) for t in ts}
              for ts in (train, ev)]
    assert len(worlds[0] & worlds[1]) < 10


def test_deterministic_from_the_seed():
    build = A._tasks.__wrapped__
    check_deterministic(lambda seed: build(seed, 4, 2, 4, 2, 20, 10),
                        lambda: build(9, 6, 1, 5, 3, 20, 5))

    def trace(spec, seed):
        env, out, rng = spec.make(), [], random.Random(seed)
        for task in spec.tasks("eval")[:30]:
            env.reset(task)
            actions, results = run_expert(spec, env, None, rng, 0.3)
            out.append((actions, [(r.observation, r.reward, r.info) for r in results]))
        return out

    kw = {"recoverable": True, "late_noise": 0.5, "max_turns": 14}
    assert trace(make(**kw), 4) == trace(make(**kw), 4)
    assert trace(make(**kw), 4) != trace(make(seed=1, **kw), 4)


def test_tools_and_error_observations():
    spec = make(horizon=2, decisive=1, late_noise=0.0)
    env = spec.make()
    task = spec.tasks("eval")[0]
    m = task.meta
    assert env.reset(task) == task.prompt
    for action, needle in (("cd(7)", "no entry"), ("cd(x)", "no entry"), ("answer(1)", "folders"),
                           ("back()", "error: use cd(folder) or answer(file)"),
                           ("cd(1) cd(2)", "use")):
        r = env.step(action)
        assert needle in r.observation and r.info["error"] and not r.terminated, action
    r = env.step(f"cd({m['gold']})")
    assert r.observation == A.listing(m["levels"][1]) and not r.info["error"]
    r = env.step("cd(2)")
    assert r.observation == A.listing(m["leaf"]) and env.confirmed
    r = env.step("cd(1)")
    assert "is a file" in r.observation and r.info["error"]
    wrong_file = next(f for f in m["leaf"] if f != m["file"])
    assert env.step(f"cd({wrong_file})").info["error"]
    r = env.step(f"answer({task.answer})")
    assert r.terminated and r.reward == 1.0 and r.info["success"] and r.info["answer"] == m["file"]
    assert env.step("cd(1)").info["error"]                       # after the end
    # with back(): it undoes the last cd, errs at the top; a wrong leaf lacks the file
    rec = make(horizon=2, decisive=1, recoverable=True, late_noise=0.0)
    env = rec.make()
    task = rec.tasks("eval")[0]
    env.reset(task)
    assert "back()" in env.system_prompt and env.step("back()").observation == "error: already at the top"
    c = wrong_matching(task)
    env.step(f"cd({c})")
    r = env.step("cd(3)")
    assert r.observation == A.listing(task.meta["wrong_leaves"][c - 1]) and env.refuted == [c]
    assert env.step("back()").observation == A.listing(task.meta["levels"][1])
    assert env.step("back()").observation == A.listing(task.meta["levels"][0])
    assert env.path == [] and env.route == [f"c{c}", "c3", "b", "b"]
    # a wrong leaf's answer fails; truncation at max_turns
    env.reset(task)
    for a in (f"cd({c})", "cd(1)"):
        env.step(a)
    r = env.step("answer(1)")
    assert r.terminated and r.reward == 0.0 and not r.info["success"] and not r.info["right_file"]
    env.reset(task)
    for _ in range(rec.max_turns):
        r = env.step("cd(9)")
    assert r.truncated and not r.terminated and r.info["success"] is False and env.steps == rec.max_turns


def test_entries_are_named_by_number_or_by_name():
    spec = make(horizon=2, decisive=1, late_noise=0.0)
    task = spec.tasks("eval")[1]
    m = task.meta
    gold = m["levels"][0][m["gold"] - 1]
    by = {}
    for form in ("number", "name"):
        env = spec.make()
        env.reset(task)
        first = str(m["gold"]) if form == "number" else gold.rstrip("/").upper()
        obs = [env.step(f"cd({first})").observation, env.step("cd(2)").observation]
        r = env.step(f"answer({m['file'][:-3] if form == 'name' else task.answer})")
        by[form] = (obs, env.route, r.reward, r.info["answer"])
        assert r.info["success"] and env.path == [m["gold"], 2]
    assert by["number"] == by["name"]
    env = spec.make()
    env.reset(task)
    assert "no entry" in env.step(f"cd({m['file']})").observation     # a file name up here
    assert env.step(f"cd({gold})").observation == A.listing(m["levels"][1])   # with its '/'


def test_call_cost_lowers_the_reward_of_a_late_answer():
    spec = make(horizon=3, late_noise=0.0, ambiguity=1, call_cost=0.1)
    env = spec.make()
    actions, results = run_expert(spec, env, spec.tasks("eval")[0], random.Random(0))
    assert len(actions) == 4 and results[-1].reward == pytest.approx(0.7)


# ------------------------------------------------------------------------------ forking
def test_snapshot_restore_equivalence():
    spec = make(horizon=4, decisive=2, recoverable=True, late_noise=0.5, max_turns=16)
    env = spec.make()
    checked = 0
    for task in spec.tasks("eval")[:12]:
        env.reset(task)
        rng = random.Random(task.task_id)
        while not env.done:
            snap = env.snapshot()
            frozen = pickle.dumps(snap)
            value = env.oracle_value()
            ahead = continue_expert(spec, env, seed=7)
            env.restore(snap)
            assert continue_expert(spec, env, seed=7) == ahead          # again in the same env
            other = spec.make()
            other.restore(pickle.loads(frozen))                        # a fresh env, pickled state
            assert other.snapshot() == snap and other.oracle_value() == value
            assert continue_expert(spec, other, seed=7) == ahead
            assert pickle.dumps(snap) == frozen                        # stepping left it alone
            env.restore(snap)
            env.step(spec.expert(env, rng, 0.3))
            checked += 1
    assert checked > 60
    # a different continuation differs, and restore comes back from it
    env.reset(spec.tasks("eval")[0])
    snap = env.snapshot()
    a = continue_expert(spec, env, seed=7, error_rate=0.0)
    env.restore(snap)
    assert env.step("cd(9)").observation != a[0][1]
    env.restore(snap)
    assert env.steps == 0 and env.path == [] and env.route == []


def test_the_late_noise_is_a_seeded_draw_of_the_route():
    spec = make(horizon=3, decisive=1, ambiguity=1, late_noise=0.3)
    tasks = spec.tasks("train")
    strikes, again = [], []
    for task in tasks:
        for route in (["c1", "c2", "c3"], ["c1", "c1", "c3"]):
            s = A.noise_strikes(task.meta["noise_seed"], route, 0.3)
            strikes.append(s)
            again.append(s == A.noise_strikes(task.meta["noise_seed"], list(route), 0.3))
    assert all(again) and abs(sum(strikes) / len(strikes) - 0.3) < 0.04
    assert not any(A.noise_strikes(t.meta["noise_seed"], ["c1"], 0.0) for t in tasks)
    # two routes to the right file draw independently: they disagree about 2 * 0.3 * 0.7
    pairs = list(zip(strikes[::2], strikes[1::2]))
    assert abs(sum(x != y for x, y in pairs) / len(pairs) - 0.42) < 0.06


# ------------------------------------------------------------------------------ the expert
@pytest.mark.parametrize("noise", [0.0, 0.25])
def test_the_perfect_expert_succeeds_but_for_the_late_noise(noise):
    spec = make(horizon=5, decisive=3, ambiguity=1, late_noise=noise, n_train=1500, n_eval=10)
    _, values, wins = play(spec, spec.tasks("train"), random.Random(0))
    rate = sum(wins) / len(wins)
    assert values == [pytest.approx(1.0 - noise)] * len(wins)
    if noise == 0.0:
        assert all(wins)
    else:
        assert abs(rate - (1.0 - noise)) < 0.035, rate


def test_the_erring_expert_picks_wrong_at_the_decisive_choice():
    spec = make(horizon=3, decisive=2, ambiguity=1, late_noise=0.0, n_train=1000, n_eval=10)
    _, _, wins = play(spec, spec.tasks("train"), random.Random(1), error_rate=0.3)
    assert abs(sum(wins) / len(wins) - 0.7) < 0.05


def test_the_experts_messages_are_short_calls_by_name():
    spec = make(horizon=6, decisive=1, recoverable=True, max_turns=20)
    env = spec.make()
    rng = random.Random(2)
    for task in spec.tasks("eval")[:40]:
        actions, _ = run_expert(spec, env, task, rng, 0.3)
        for a in actions:
            assert a == "back()" or (a.startswith(("cd(", "answer(")) and len(a) <= 20), a
            assert a == "back()" or not a[a.index("(") + 1:-1].isdigit(), a


@pytest.mark.parametrize("setting", [{"horizon": 6, "decisive": 6, "files": 1},
                                     {"horizon": 4, "decisive": 2, "recoverable": True,
                                      "max_turns": 20}])
def test_the_numbered_expert_makes_the_same_moves_by_number(setting):
    """expert_refs=number: every message names its entry by its listed number (`cd(3)`,
    `answer(1)`), and with the same random stream the moves, and so the outcomes, are those of
    the expert that names entries by name."""
    by_name, by_number = make(n_eval=30, **setting), make(n_eval=30, expert_refs="number", **setting)
    env_a, env_b = by_name.make(), by_number.make()
    for task in by_name.tasks("eval"):
        names, res_a = run_expert(by_name, env_a, task, random.Random(7), 0.4)
        numbers, res_b = run_expert(by_number, env_b, task, random.Random(7), 0.4)
        assert len(names) == len(numbers)
        for a, b in zip(names, numbers):
            assert a == b == "back()" or (a[:3] == b[:3] and b[b.index("(") + 1:-1].isdigit()), (a, b)
        assert res_a[-1].info["success"] == res_b[-1].info["success"]
        assert [r.observation for r in res_a] == [r.observation for r in res_b]
    with pytest.raises(ConfigError, match="expert_refs"):
        make(expert_refs="handle")


# ------------------------------------------------------------------------------ the oracle
def test_a_wrong_decisive_choice_dooms_without_recovery_and_not_with_it():
    for rec in (False, True):
        spec = make(horizon=3, decisive=1, ambiguity=2, recoverable=rec, late_noise=0.1,
                    max_turns=12)
        env = spec.make()
        task = spec.tasks("eval")[0]
        env.reset(task)
        assert env.oracle_value() == pytest.approx(0.9 if rec else 0.45)
        for wrong in (wrong_matching(task), wrong_unmatched(task)):
            env.reset(task)
            env.step(f"cd({wrong})")
            # with back(): down to the leaf (if not known wrong), back up, down and answer
            assert env.oracle_value() == (pytest.approx(0.9) if rec else 0.0)
        env.reset(task)
        env.step(f"cd({task.meta['gold']})")
        assert env.oracle_value() == pytest.approx(0.9)
    # recovery needs its turns: horizon 3 from the root, one wrong trial costs 6 more
    spec = make(horizon=3, decisive=1, ambiguity=2, recoverable=True, late_noise=0.1, max_turns=9)
    env = spec.make()
    task = spec.tasks("eval")[0]
    env.reset(task)
    assert env.oracle_value() == pytest.approx(0.45)
    env.step(f"cd({wrong_matching(task)})")
    assert env.oracle_value() == 0.0          # 2 cds to the leaf + 3 backs + 4 = 9 > 8 left
    env.reset(task)
    env.step(f"cd({wrong_unmatched(task)})")  # known wrong at once: 1 back, 7 turns for 2 tries
    assert env.oracle_value() == pytest.approx(0.45)        # of which only the first fits


def test_the_oracle_after_the_end_and_above_the_decisive_choice():
    spec = make(horizon=4, decisive=3, ambiguity=3, width=4, late_noise=0.2)
    env = spec.make()
    task = spec.tasks("eval")[0]
    env.reset(task)
    assert env.oracle_value() == pytest.approx(0.8 / 3) == pytest.approx(spec.root_value())
    env.step("cd(2)")
    assert env.oracle_value() == pytest.approx(0.8 / 3)
    _, results = run_expert(spec, env, None, random.Random(0))
    assert env.oracle_value() == (1.0 if results[-1].info["success"] else 0.0)


SETTINGS = [
    {"horizon": 6, "decisive": 1, "ambiguity": 2, "max_turns": 10},                    # early
    {"horizon": 6, "decisive": 6, "ambiguity": 2, "max_turns": 10},                    # late
    {"horizon": 4, "decisive": 1, "ambiguity": 3, "recoverable": True, "max_turns": 13},  # 1 retry
    {"horizon": 3, "decisive": 2, "ambiguity": 4, "recoverable": True, "max_turns": 30},  # all
]


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_root_value_is_the_success_rate_of_perfect_play(setting):
    spec = make(late_noise=0.15, n_train=2000, n_eval=10, **setting)
    roots, _, wins = play(spec, spec.tasks("train"), random.Random(3))
    value = sum(roots) / len(roots)
    assert value == pytest.approx(spec.root_value())
    assert abs(sum(wins) / len(wins) - value) < 0.035, (sum(wins) / len(wins), value)


def test_the_value_after_a_wrong_choice_is_the_success_rate_of_recovery():
    """After a wrong (matching) decisive pick with back(): the oracle's count of the turns a
    recovery takes matches what the expert then achieves. Two candidates are left; getting
    back above the decisive decision takes 3 turns, trying the candidates 3 and 7: 12 turns
    leave room for both, 11 for the first only, 7 for none."""
    for max_turns, expect in ((12, 0.85), (11, 0.85 / 2), (7, 0.0)):
        spec = make(horizon=3, decisive=2, ambiguity=3, recoverable=True, late_noise=0.15,
                    max_turns=max_turns, n_train=1500, n_eval=10)
        _, values, wins = play(spec, spec.tasks("train"), random.Random(5),
                               start=lambda t: to_decisive(t) + [f"cd({wrong_matching(t)})"])
        assert sum(values) / len(values) == pytest.approx(expect)
        assert abs(sum(wins) / len(wins) - expect) < 0.035, (max_turns, sum(wins) / len(wins))


def test_files_sets_the_leaf_listings_and_leaves_the_default_tasks_as_they_were():
    base = make(horizon=3, decisive=1, n_train=50, n_eval=5)
    same = make(horizon=3, decisive=1, n_train=50, n_eval=5, files=4)
    assert [t.meta for t in base.tasks("train")] == [t.meta for t in same.tasks("train")]
    one = make(horizon=3, decisive=1, n_train=400, n_eval=5, files=1)
    for t in one.tasks("train"):
        m = t.meta
        assert m["leaf"] == [m["file"]] and m["gold_file"] == 1
        assert all(w is None or (len(w) == 1 and w != [m["file"]]) for w in m["wrong_leaves"])
    # the answer needs no reading: a right decisive pick then anything succeeds but for the
    # noise; so picking the decisive entry at random succeeds (1 - noise) / width
    env, rng, wins = one.make(), random.Random(0), []
    for t in one.tasks("train"):
        env.reset(t)
        for _ in range(3):
            env.step(f"cd({rng.randint(1, 4)})")
        wins.append(bool(env.step("answer(1)").info["success"]))
    assert abs(sum(wins) / len(wins) - 0.9 / 4) < 0.05
    roots, _, wins = play(one, one.tasks("train"), random.Random(1))
    assert abs(sum(wins) / len(wins) - one.root_value()) < 0.05


# ------------------------------------------------------------------------------ check-env
@pytest.mark.parametrize("options", [{}, {"recoverable": True, "horizon": 5, "decisive": 2,
                                          "late_noise": 0.5, "max_turns": 16}, {"files": 1},
                                     {"decisive": 4, "files": 1, "expert_refs": "number"}])
def test_check_env_passes(options):
    report = check_env(lambda s: make(seed=s, n_train=40, n_eval=10, **options), seed=0,
                       max_turns=options.get("max_turns", 12))
    assert report.problems == [] and report.fork_states > 20 and report.has_expert
