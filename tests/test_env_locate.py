"""The built-in "locate" env: repositories, tools, path confinement, Acc@k, expert, forking."""
from __future__ import annotations

import random
from collections import defaultdict

import pytest

from agentrl_cli.envs import ENVS
from agentrl_cli.envs import locate as L
from agentrl_cli.errors import ConfigError

from env_checks import (check_deterministic, check_expert_recovers, check_expert_solves,
                        check_malformed, check_registered, check_snapshot_restore,
                        random_policy_finals, run_expert, spec_fixture, start_episode)

spec = spec_fixture("locate")


def test_registered_and_protocol(spec):
    s2 = check_registered("locate", spec, L.LocateSpec,
                          {"min_hops": 1, "max_hops": 5, "n_train": 40, "n_eval": 10,
                           "n_entities": 100, "relations": "full"},   # generic env-config options
                          n_train=40, n_eval=10, hops={1, 2, 3, 4, 5},
                          bad=({"max_hops": 6}, {"n_files": 4}, {"n_entities": 500},
                               {"min_hops": 0}, {"n_train": -1}))
    assert spec.n_files == 48 and s2.n_files == 100
    assert ENVS.get("locate")(seed=0, n_files=20, n_entities=100).n_files == 20


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
    check_deterministic(lambda seed: build(seed, 30, 2, 3, 30, 10),
                        lambda: build(9, 30, 1, 4, 20, 5))
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
    tasks = spec.tasks("train") + spec.tasks("eval")
    for task, actions, results in check_expert_solves(spec, tasks, random.Random(0)):
        assert results[-1].info["acc@1"] == results[-1].info["acc@5"] == 1.0
        assert len(actions) <= 2 * task.meta["hops"] + 1 and actions[-1] == "answer(1)"
        # the expert copies function names only: files are opened and answered by number
        assert all(a.startswith("grep(def ") or a in ("open(1)", "answer(1)") for a in actions)
        assert results[-1].info["answer"] == "1"


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
    finals = random_policy_finals(spec, spec.tasks("train", 300), random.Random(2), random_action)
    acc1 = sum(r.info["acc@1"] for r in finals) / len(finals)
    acc5 = sum(r.info["acc@5"] for r in finals) / len(finals)
    assert acc1 < 0.05 and acc5 < 0.1


@pytest.mark.parametrize("path", ["/", "/etc/passwd", "../x", "..", "a/../../b", "db/../..",
                                  "~/x", "C:/x", "a\\b", "./../x"])
def test_path_traversal_refused(spec, path):
    env, _ = start_episode(spec)
    for tool in ("ls", "open"):
        r = env.step(f"{tool}({path})")
        assert r.observation == L.OUTSIDE and r.info["error"] and not r.terminated
    assert L.resolve_path(path) is None


def test_tools(spec):
    env, task = start_episode(spec, 1)
    repo = env.repo
    def numbered(entries):
        return " ".join(f"[{i}] {e}" for i, e in enumerate(entries, 1))

    r = env.step("ls(.)")
    assert r.observation == numbered(repo.dirs[""]) and r.info == {"tool": "ls", "error": False,
                                                                   "steps": 1}
    assert env.step("ls()").observation == r.observation
    pkg = repo.dirs[""][0]
    assert env.step(f"ls({pkg})").observation == numbered(repo.dirs[pkg.rstrip("/")])
    gold = task.answer
    assert env.step(f"ls(./{gold})").observation == f"[1] {gold}"
    assert env.step("ls(nope)").observation == "error: no such path nope"
    r = env.step(f"open({gold})")
    assert r.observation == repo.files[gold] and f'raise ValueError("{task.meta["message"]}")' \
        in r.observation
    assert env.step(f"open({pkg})").observation == f"error: {pkg} is a folder"
    assert env.step("open(a/b.py)").observation == "error: no file a/b.py"
    r = env.step(f"grep({task.meta['message'].upper()})")      # case-insensitive literal
    lines = r.observation.split("\n")
    assert len(lines) == len(task.meta["raised_in"]) and all("raise ValueError" in x for x in lines)
    assert [x.split(" ")[0] for x in lines] == [f"[{i}]" for i in range(1, len(lines) + 1)]
    assert {x.split(" ", 1)[1].split(": ")[0] for x in lines} == set(task.meta["raised_in"])
    r = env.step("grep(def )")
    assert len(r.observation.split("\n")) == L.GREP_HITS + 1 and r.observation.endswith("more)")
    assert env.step("grep(.*)").observation == "no matches"          # not a regex
    assert env.step("grep()").info["error"]


def test_numbers_name_the_latest_results(spec):
    """open(N) / ls(N) / answer(N, M) name the N-th result of the latest ls or grep; a number
    with no result is an error observation, before any listing too."""
    env, task = start_episode(spec, 1)
    repo, gold = env.repo, task.answer
    r = env.step("open(1)")
    assert r.info["error"] and r.observation == L.NO_RESULT.format(n=1)
    env.step("ls(.)")
    top = repo.dirs[""]
    r = env.step("ls(2)")                                    # a folder by its number
    assert r.observation.split(" ")[1] == repo.dirs[top[1].rstrip("/")][0]
    assert env.history[-1]["path"] == top[1].rstrip("/")
    assert env.step("open(1)").observation.startswith("error: ")   # ...its first entry: a folder
    assert env.step("open(99)").observation == L.NO_RESULT.format(n=99)
    env.step(f"grep({task.meta['message']})")                # every file raising the message
    hits = env.listing()
    assert set(hits) == set(task.meta["raised_in"])
    r = env.step(f"open({hits.index(gold) + 1})")
    assert r.observation.startswith(f'    raise ValueError("{task.meta["message"]}")')
    assert env.history[-1]["path"] == gold
    assert env.listing() == hits                             # open does not renumber
    other = next(i for i, p in enumerate(hits, 1) if p != gold)
    r = env.step(f"answer({other}, {hits.index(gold) + 1})")
    assert (r.info["acc@1"], r.info["acc@5"]) == (0.0, 1.0)
    env.reset(task)
    env.step(f"grep(def {task.meta['chain'][-1]})")
    assert env.step("answer(1)").reward == 1.0
    env.reset(task)
    env.step("grep(no such text)")                            # no matches: nothing to name
    assert env.step("answer(1)").reward == 0.0


def test_opening_a_grep_result_jumps_to_its_line(spec):
    """open(N) of a grep result shows the file from the hit's line to the end, then how many
    lines are above it; open(path), or a number from ls, shows the whole file."""
    for task in spec.tasks("eval", 20):
        env, _ = start_episode(spec)
        env.reset(task)
        fn, path = task.meta["chain"][-1], task.answer
        lines = env.repo.files[path].split("\n")
        at = lines.index(f"def {fn}(x):")
        env.step(f"grep(def {fn})")
        r = env.step("open(1)")
        want = lines[at:] + ([f"({at} lines above)"] if at else [])
        assert r.observation.split("\n") == want and not r.info["error"]
        assert r.observation.split("\n")[1] == f'    raise ValueError("{task.meta["message"]}")'
        assert env.history[-1]["path"] == path
        assert env.step(f"open({path})").observation == env.repo.files[path]
        env.step(f"ls({path})")
        assert env.step("open(1)").observation == env.repo.files[path]


def test_a_restored_state_refers_to_its_own_results(spec):
    env, task = start_episode(spec, 1)
    env.step("ls(.)")
    snap = env.snapshot()
    env.step(f"grep(def {task.meta['chain'][-1]})")
    assert env.listing() == (task.answer,)
    env.restore(snap)
    assert env.listing() == tuple(e.rstrip("/") for e in env.repo.dirs[""])
    assert env.step("answer(1)").reward == 0.0


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
    check_malformed(spec, action, L.MALFORMED)


def test_truncation():
    spec = ENVS.get("locate")(seed=0, max_turns=2)
    env, task = start_episode(spec)
    assert not env.step("ls(.)").truncated
    r = env.step("ls(.)")
    assert r.truncated and not r.terminated and r.reward == 0.0
    assert (r.info["success"], r.info["acc@1"], r.info["acc@5"]) == (False, 0.0, 0.0)


def test_snapshot_restore(spec):
    env, other, snap_bytes = check_snapshot_restore(spec, prefix=3, losing="answer(x.py)")
    assert other.repo is env.repo              # the repository is rebuilt (cached), not copied
    assert len(snap_bytes) < 4000              # a fork carries the episode, not the repository


def test_expert_valid_after_policy_steps(spec):
    def prefix(env, task, rng):
        a = random_action(rng, task) if rng.random() < 0.5 else spec20.expert(env, rng, 0.5)
        return None if a.startswith("answer(") else a

    spec20 = ENVS.get("locate")(seed=0, max_turns=20)
    check_expert_recovers(spec20, spec20.tasks("eval", 100), random.Random(4), prefix)


# ----------------------------------------------------------------------------- env.repos=shared


def test_shared_repository_tasks():
    """`repos=shared`: one repository for every task, one task per entry function, train and
    held-out entries disjoint, a quarter at most held out; deterministic; the per-task default
    is unchanged by the option's existence."""
    s = ENVS.get("locate")(seed=0, n_entities=100, repos="shared", n_train=595, n_eval=60)
    train, ev = s.tasks("train"), s.tasks("eval")
    assert {t.meta["repo"] for t in train + ev} == {"0-shared"}
    entries = [t.prompt.split()[1] for t in train + ev]
    assert len(entries) == len(set(entries))                      # one task per entry function
    n_entries = sum(1 for d in L.make_repo("0-shared", 100).depth.values() if 2 <= d <= 3)
    assert len(ev) == min(60, n_entries // 4) and len(train) == n_entries - len(ev)
    assert {t.meta["hops"] for t in train} == {2, 3}
    again = ENVS.get("locate")(seed=0, n_entities=100, repos="shared", n_train=595, n_eval=60)
    assert [(t.prompt, t.answer) for t in again.tasks("eval")] == [(t.prompt, t.answer) for t in ev]
    capped = ENVS.get("locate")(seed=0, n_entities=100, repos="shared", n_train=10, n_eval=5)
    assert len(capped.tasks("train")) == 10 and len(capped.tasks("eval")) == 5
    assert ENVS.get("locate")(seed=1, n_entities=100, repos="shared").tasks("eval")[0].meta["repo"] == "1-shared"
    with pytest.raises(ConfigError):
        ENVS.get("locate")(seed=0, repos="per-repo")


def test_shared_repository_expert_snapshot_and_config():
    from agentrl_cli import config
    from agentrl_cli.context import make_spec

    s = make_spec(config.load(sets=["env.name=locate", "env.repos=shared"]))
    assert s.repos == "shared"
    check_expert_solves(s, s.tasks("eval")[:10] + s.tasks("train")[:10], random.Random(0))
    check_snapshot_restore(s, prefix=3, losing="answer(x.py)")
    with pytest.raises(ConfigError):
        config.load(sets=["env.repos=one"])
    # other envs take the generic option and ignore it
    for name in ("search", "rules", "math"):
        assert make_spec(config.load(sets=[f"env.name={name}", "env.repos=shared"])).tasks("eval")


def test_tiny_recipe_key_stable_for_options_at_their_default():
    """A field added after a recipe version changes the tiny build's cache key only when set:
    cached default builds stay valid, a shared-repository build gets its own folder."""
    from agentrl_cli.models import tiny

    r = tiny.TinyRecipe()
    assert r.env.repos == "per-task" and "repos" in tiny.LATER_FIELDS
    old = tiny.hashlib.sha256(tiny.json.dumps(
        {"v": tiny.RECIPE_VERSION, **{k: v for k, v in r.flat().items() if k != "repos"}},
        sort_keys=True).encode()).hexdigest()[:12]
    assert r.key() == old
    assert tiny.TinyRecipe.from_flat({"repos": "shared"}).key() != old


def test_a_split_and_a_reset_build_only_the_repositories_they_need(monkeypatch):
    """With per-task repositories, `tasks("eval")` makes no training repository, a prefix
    makes only its own, and a reset builds none until a tool reads the repository (a run's
    prompt checks reset every training task: 10,000 for the shipped agent's world)."""
    made = []
    real = L.make_repo
    monkeypatch.setattr(L, "make_repo", lambda key, n: made.append(key) or real(key, n))
    L._repo.cache_clear()
    L._split_tasks.cache_clear()
    L._tasks.cache_clear()
    spec = L.LocateSpec(seed=5, n_train=10_000, n_eval=6)
    evals = spec.tasks("eval")
    assert len(evals) == 6 and all(k.startswith("5-eval-") for k in made)
    made.clear()
    first = spec.tasks("train", 3)
    assert sorted(made) == ["5-train-0", "5-train-1", "5-train-2"]
    small = L.LocateSpec(seed=5, n_train=40, n_eval=6)
    assert [t.task_id for t in small.tasks("train")[:3]] == [t.task_id for t in first]
    assert [t.answer for t in small.tasks("train")[:3]] == [t.answer for t in first]
    L._repo.cache_clear()
    made.clear()
    env = spec.make()
    env.reset(first[0])
    assert made == []
    env.step("ls(.)")
    assert made == ["5-train-0"]
