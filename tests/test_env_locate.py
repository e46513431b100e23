"""The built-in "locate" env: repositories, tools, path confinement, Acc@k, expert, forking."""
from __future__ import annotations

import pickle
import random
from collections import defaultdict

import pytest

from agentrl_cli.config import ConfigError

from agentrl_cli.envs import ENVS, StepResult, TextEnv
from agentrl_cli.envs import locate as L


@pytest.fixture(scope="module")
def spec() -> L.LocateSpec:
    return ENVS.get("locate")(seed=0)


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
    assert "locate" in ENVS
    assert isinstance(spec, L.LocateSpec) and spec.name == "locate" and spec.n_files == 48
    env = spec.make()
    assert isinstance(env, TextEnv)
    assert len(env.system_prompt.split()) <= 25
    s2 = ENVS.get("locate")(seed=1, min_hops=1, max_hops=5, n_train=40, n_eval=10, max_turns=9,
                            n_entities=100, relations="full")    # the generic env-config options
    assert s2.n_files == 100 and len(s2.tasks("train")) == 40 and len(s2.tasks("eval")) == 10
    assert s2.make().max_turns == 9
    assert {t.meta["hops"] for t in s2.tasks("train")} == {1, 2, 3, 4, 5}
    assert ENVS.get("locate")(seed=0, n_files=20, n_entities=100).n_files == 20
    with pytest.raises(TypeError):
        ENVS.get("locate")(seed=0, bogus=1)
    with pytest.raises(ValueError):
        spec.tasks("test")
    for bad in ({"max_hops": 6}, {"n_files": 4}, {"n_entities": 500}, {"min_hops": 0},
                {"n_train": -1}):
        with pytest.raises(ConfigError):   # a user error: one line and exit code 2 in the CLI
            ENVS.get("locate")(seed=0, **bad)


def test_repository_shape():
    repo = L.make_repo("t", 60)
    assert len(repo.files) == 60
    assert all(len(p.split("/")) == 3 and p.endswith(".py") for p in repo.files)
    assert repo.dirs[""] and all(e.endswith("/") for e in repo.dirs[""])
    for p, text in repo.files.items():
        folder, name = p.rsplit("/", 1)
        assert name in repo.dirs[folder]
        assert 2 <= text.count("def ") <= 3
    assert len(repo.defined_in) == len(set(repo.defined_in))           # function names unique
    for fn, p in repo.defined_in.items():
        assert f"def {fn}(x):" in repo.files[p]
        chain = repo.chain(fn)
        assert len(chain) == repo.depth[fn] and len(set(chain)) == len(chain)
        assert repo.callee[chain[-1]] is None and chain[-1] in repo.message
    # every message is raised in more than one place: grepping it alone is ambiguous
    raised = defaultdict(set)
    for fn, m in repo.message.items():
        raised[m].add(fn)
    assert all(len(v) >= 2 for v in raised.values())
    assert {d for d in repo.depth.values()} == {1, 2, 3, 4, 5}
    a, b = L.make_repo("t", 60), L.make_repo("u", 60)
    assert a.files == repo.files and a.files != b.files


def test_tasks_deterministic_disjoint_well_formed(spec):
    build = L._tasks.__wrapped__
    t1, t2, t3 = build(5, 30, 2, 3, 30, 10), build(5, 30, 2, 3, 30, 10), build(6, 30, 2, 3, 30, 10)
    key = lambda ts: [(t.task_id, t.prompt, t.answer, t.meta) for t in ts]
    for split in ("train", "eval"):
        assert key(t1[split]) == key(t2[split]) and key(t1[split]) != key(t3[split])
    random.seed(0)
    x = random.random()
    random.seed(0)
    build(9, 30, 1, 4, 20, 5)
    assert random.random() == x
    train, ev = spec.tasks("train"), spec.tasks("eval")
    assert len(train) == 600 and len(ev) == 200 and spec.tasks("eval", 3) == ev[:3]
    assert not {t.meta["repo"] for t in train} & {t.meta["repo"] for t in ev}
    assert ev[4].task_id == "locate-eval-00004"
    hops = set()
    for t in train + ev:
        m = t.meta
        repo = L._repo(m["repo"], m["n_files"])
        hops.add(m["hops"])
        assert len(m["chain"]) == m["hops"] and repo.chain(m["chain"][0]) == m["chain"]
        assert t.answer == repo.defined_in[m["chain"][-1]] == m["chain_files"][-1]
        assert t.prompt == f'Issue: {m["chain"][0]} fails with "{m["message"]}".'
        assert t.answer in m["raised_in"] and len(m["raised_in"]) >= 2
    assert hops == {2, 3}


def test_expert_solves_both_splits(spec):
    rng = random.Random(0)
    env = spec.make()
    for task in spec.tasks("train") + spec.tasks("eval"):
        actions, results = run_expert(spec, env, task, rng)
        last = results[-1]
        assert last.terminated and last.reward == 1.0, (task, actions)
        assert last.info["success"] is True and last.info["acc@1"] == last.info["acc@5"] == 1.0
        assert all(r.reward == 0.0 and not r.info["error"] for r in results[:-1])
        assert len(actions) <= 2 * task.meta["hops"] + 1 and actions[-1] == f"answer({task.answer})"
        assert all(len(a) <= 48 for a in actions)


def test_imperfect_expert_acc1_below_acc5(spec):
    rng = random.Random(1)
    env = spec.make()
    acc1, acc5 = [], []
    for task in spec.tasks("train"):
        _, results = run_expert(spec, env, task, rng, error_rate=0.3)
        assert results[-1].terminated
        acc1.append(results[-1].info["acc@1"])
        acc5.append(results[-1].info["acc@5"])
    a1, a5 = sum(acc1) / len(acc1), sum(acc5) / len(acc5)
    assert 0.5 < a1 < 0.8 and a5 == 1.0, (a1, a5)


def random_action(rng: random.Random, task) -> str:
    words = ["ls(", "grep(", "open(", "answer(", ")", "(", ".", "/", "..", "def", "x", " ", "\n"]
    if rng.random() < 0.4:
        return "".join(rng.choice(words) for _ in range(rng.randint(0, 6)))
    repo = L._repo(task.meta["repo"], task.meta["n_files"])
    files = sorted(repo.files)
    args = [rng.choice(files), rng.choice(files).rsplit("/", 1)[0], ".", "../x", "/etc",
            rng.choice(sorted(repo.defined_in)), "def", "raise", "nope"]
    tool = rng.choice(L.TOOLS)
    arg = rng.choice(args) if tool != "answer" else ", ".join(rng.sample(files, rng.randint(1, 2)))
    return f"{tool}({arg})"


def test_random_policy_near_zero_never_crashes(spec):
    rng = random.Random(2)
    env = spec.make()
    acc1, acc5 = 0.0, 0.0
    tasks = spec.tasks("train", 300)
    for task in tasks:
        env.reset(task)
        for _ in range(30):
            r = env.step(random_action(rng, task))
            assert isinstance(r, StepResult) and isinstance(r.observation, str)
            if r.terminated or r.truncated:
                break
        acc1 += r.info["acc@1"]
        acc5 += r.info["acc@5"]
    assert acc1 / len(tasks) < 0.05 and acc5 / len(tasks) < 0.1


@pytest.mark.parametrize("path", ["/", "/etc/passwd", "../x", "..", "a/../../b", "db/../..",
                                  "~/x", "C:/x", "a\\b", "./../x"])
def test_path_traversal_refused(spec, path):
    env = spec.make()
    env.reset(spec.tasks("eval")[0])
    for tool in ("ls", "open"):
        r = env.step(f"{tool}({path})")
        assert r.observation == L.OUTSIDE and r.info["error"] and not r.terminated
    assert L.resolve_path(path) is None


def test_tools(spec):
    env = spec.make()
    task = spec.tasks("eval")[1]
    env.reset(task)
    repo = env.repo
    r = env.step("ls(.)")
    assert r.observation == " ".join(repo.dirs[""]) and r.info == {"tool": "ls", "error": False,
                                                                   "steps": 1}
    assert env.step("ls()").observation == r.observation
    pkg = repo.dirs[""][0]
    assert env.step(f"ls({pkg})").observation == " ".join(repo.dirs[pkg.rstrip("/")])
    gold = task.answer
    assert env.step(f"ls(./{gold})").observation == gold
    assert env.step("ls(nope)").observation == "error: no such path nope"
    r = env.step(f"open({gold})")
    assert r.observation == repo.files[gold] and f'raise ValueError("{task.meta["message"]}")' \
        in r.observation
    assert env.step(f"open({pkg})").observation == f"error: {pkg} is a folder"
    assert env.step("open(a/b.py)").observation == "error: no file a/b.py"
    r = env.step(f"grep({task.meta['message'].upper()})")      # case-insensitive literal
    lines = r.observation.split("\n")
    assert len(lines) == len(task.meta["raised_in"]) and all("raise ValueError" in x for x in lines)
    assert {x.split(": ")[0] for x in lines} == set(task.meta["raised_in"])
    r = env.step("grep(def )")
    assert len(r.observation.split("\n")) == L.GREP_HITS + 1 and r.observation.endswith("more)")
    assert env.step("grep(.*)").observation == "no matches"          # not a regex
    assert env.step("grep()").info["error"]


def test_answer_ranking_acc_at_k(spec):
    env = spec.make()
    task = spec.tasks("eval")[2]
    gold, others = task.answer, [p for p in sorted(L._repo(task.meta["repo"], 48).files)
                                 if p != task.answer]
    cases = [(f"{gold}", 1.0, 1.0), (f"./{gold}, {others[0]}", 1.0, 1.0),
             (f"{others[0]}, {gold}", 0.0, 1.0), (", ".join(others[:4] + [gold]), 0.0, 1.0),
             (", ".join(others[:5] + [gold]), 0.0, 0.0), (f"{others[0]} {others[0]} {gold}", 0.0, 1.0),
             (f"../{gold}", 0.0, 0.0), (f"/{gold}", 0.0, 0.0), ("", 0.0, 0.0)]
    for arg, a1, a5 in cases:
        env.reset(task)
        r = env.step(f"answer({arg})")
        assert r.terminated and r.observation == "" and r.reward == a1, arg
        assert (r.info["acc@1"], r.info["acc@5"], r.info["success"]) == (a1, a5, a1 == 1.0), arg
    assert env.step("ls(.)").info["error"]      # after the end: no crash, no reward


@pytest.mark.parametrize("action", ["", "hello", "ls", "ls(.", "LS(.)", "cat(x)", "ls(.) ls(.)",
                                    "open(a)\nanswer(a)", "answer(a) more", "grep(a))"])
def test_malformed_actions(spec, action):
    env = spec.make()
    env.reset(spec.tasks("eval")[0])
    r = env.step(action)
    assert r.observation == L.MALFORMED and r.info["tool"] is None and r.info["error"]
    assert r.reward == 0.0 and not r.terminated and not r.truncated


def test_truncation():
    spec = ENVS.get("locate")(seed=0, max_turns=2)
    env = spec.make()
    task = spec.tasks("eval")[0]
    env.reset(task)
    assert not env.step("ls(.)").truncated
    r = env.step("ls(.)")
    assert r.truncated and not r.terminated and r.reward == 0.0
    assert (r.info["success"], r.info["acc@1"], r.info["acc@5"]) == (False, 0.0, 0.0)


def _continue(spec, env, seed, k=20, error_rate=0.3):
    rng = random.Random(seed)
    out = []
    for _ in range(k):
        a = spec.expert(env, rng, error_rate)
        r = env.step(a)
        out.append((a, r.observation, r.reward, r.terminated, r.truncated, r.info.get("acc@5")))
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
    assert other.repo is env.repo              # the repository is rebuilt (cached), not copied
    assert _continue(spec, env, seed=5) == _continue(spec, other, seed=5)
    assert pickle.dumps(snap) == snap_bytes
    assert len(snap_bytes) < 4000              # a fork carries the episode, not the repository
    env.restore(snap)
    env.step("answer(x.py)")
    env.restore(snap)
    assert env.steps == 3 and not env.terminated and len(env.history) == 3


def test_expert_valid_after_policy_steps(spec):
    rng = random.Random(4)
    spec20 = ENVS.get("locate")(seed=0, max_turns=20)
    env = spec20.make()
    for task in spec20.tasks("eval", 100):
        env.reset(task)
        for _ in range(rng.randint(0, 4)):
            a = random_action(rng, task) if rng.random() < 0.5 else spec20.expert(env, rng, 0.5)
            if not a.startswith("answer("):
                env.step(a)
        clone = spec20.make()
        clone.restore(env.snapshot())
        _, results = run_from_here(spec20, clone, rng)
        assert results[-1].terminated and results[-1].reward == 1.0, task


def run_from_here(spec, env, rng):
    actions, results = [], []
    while True:
        r = env.step(spec.expert(env, rng, 0.0))
        results.append(r)
        if r.terminated or r.truncated:
            return actions, results
