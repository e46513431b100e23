"""What the env boundary's per-step checks cost (agentrl_cli/envs/guard.py): the same env
steps run bare, guarded without a timeout (type, reward and size checks only) and guarded
with the default `env.step_timeout_s` (each reset and step handed to a pooled worker thread).

Each round drives `--steps` env steps with the scripted expert's actions (recorded once, so
the expert's own time is not counted), episode after episode over the held-out tasks, and the
best of `--repeats` rounds is kept. Prints microseconds per step and the ratio to the bare env
side by side, per env.

The same guard runs a user's reward functions and FOCUS allocators (`envs.guard.call_user`):
`--calls` calls of a reward function on a finished expert episode of the first env, bare and
through `rollout.rewards.score` (its own copies of the episode's values, the type and range
checks) without and with the timeout; and of an allocator on a tree's candidates, bare and
through `rollout.planner.guarded_allocator` without and with the timeout. Microseconds per
call and the ratio to the bare call.

    OMP_NUM_THREADS=1 python benchmarks/bench_env_guard.py [--envs search math] [--steps 2000]
"""
from __future__ import annotations

import argparse
import random
import time

from agentrl_cli import config
from agentrl_cli.envs.base import make_env_spec
from agentrl_cli.envs.guard import GuardedSpec, limits_of


def expert_episodes(spec, n_steps: int) -> list[tuple]:
    """(task, actions) of expert episodes over the eval tasks, at least `n_steps` steps in all."""
    rng, out, total = random.Random(0), [], 0
    tasks = spec.tasks("eval")
    while total < n_steps:
        task = tasks[len(out) % len(tasks)]
        env, actions = spec.make(), []
        env.reset(task)
        while True:
            a = spec.expert(env, rng, 0.0)
            actions.append(a)
            res = env.step(a)
            if res.terminated or res.truncated:
                break
        out.append((task, actions))
        total += len(actions)
    return out


def steps_per_second(spec, episodes, n_steps: int) -> float:
    """Seconds per step over `n_steps` steps of the recorded episodes (make and reset counted)."""
    done, t0 = 0, time.perf_counter()
    for task, actions in episodes:
        env = spec.make()
        env.reset(task)
        for a in actions:
            env.step(a)
            done += 1
            if done == n_steps:
                return (time.perf_counter() - t0) / done
    return (time.perf_counter() - t0) / max(done, 1)


def measure(name: str, n_steps: int, repeats: int) -> dict[str, float]:
    section = config.load(**{"env.name": name}).env
    bare = make_env_spec(section)
    limits = limits_of(bare, section)
    variants = {"bare": bare,
                "checks": GuardedSpec(bare, limits.__class__(limits.env, limits.rewards, 0.0,
                                                             limits.max_observation_chars)),
                "checks + timeout": GuardedSpec(bare, limits)}
    episodes = expert_episodes(bare, n_steps)
    best = {k: float("inf") for k in variants}
    for _ in range(repeats):
        for k, spec in variants.items():
            best[k] = min(best[k], steps_per_second(spec, episodes, n_steps))
    return best


def best_per_call(fn, n_calls: int, repeats: int) -> float:
    """Seconds per call of `fn()`, the best of `repeats` rounds of `n_calls` calls."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n_calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / n_calls)
    return best


def measure_user_code(name: str, n_calls: int, repeats: int) -> dict[str, dict[str, float]]:
    """Seconds per call of a reward function and an allocator, bare and guarded."""
    from agentrl_cli.rollout import planner
    from agentrl_cli.rollout.rewards import RewardFn, episode_args, score
    from agentrl_cli.rollout.tree import Tree

    def turns(messages, answer, gold, task_id, **kwargs):
        return float(sum(m["role"] == "assistant" for m in messages))

    ep = bench_episode(name)
    fn = RewardFn("turns", "bench:turns", 1.0, turns, ("messages", "answer", "gold", "task_id"))
    full = RewardFn("turns", "bench:turns", 1.0, turns, ("messages", "answer", "gold", "task_id",
                                                         "episode"))
    args = episode_args(ep, copy_episode=False)
    reward = {"bare": lambda: turns(**{k: args[k] for k in fn.params}),
              "checks": lambda: score(fn, episode_args(ep, False), 0.0),
              "checks + timeout": lambda: score(fn, episode_args(ep, False), 60.0),
              "+ episode copy": lambda: score(full, episode_args(ep, True), 60.0)}
    tree = Tree("t0", 0)
    nodes = [tree.add(0 if d else -1, d, 10 * d, 0) for d in range(8)]
    ctx = planner.AllocatorContext(None, None, [tree])

    def deepest(cands, ctx):
        return max(cands, key=lambda nd: nd.depth)

    alloc = {"bare": lambda: deepest(nodes, ctx),
             "checks": lambda: planner.guarded_allocator("f.py:deepest", deepest, 0.0)(nodes, ctx),
             "checks + timeout": (lambda g: lambda: g(nodes, ctx))(
                 planner.guarded_allocator("f.py:deepest", deepest, 60.0))}
    return {"reward function": {k: best_per_call(f, n_calls, repeats) for k, f in reward.items()},
            "allocator": {k: best_per_call(f, n_calls, repeats) for k, f in alloc.items()}}


def bench_episode(name: str):
    """A finished episode of env `name`: its expert's actions stepped through a guarded env."""
    from agentrl_cli.types import Episode, Turn

    spec = make_env_spec(config.load(**{"env.name": name}).env)
    (task, actions), = expert_episodes(spec, 1)[:1]
    env = spec.make()
    env.reset(task)
    ep = Episode(task_id=task.task_id, group=0, token_ids=list(range(900)),
                 response_mask=[1] * 900, logprobs=[0.0] * 900, turn_index=[0] * 900,
                 segment_starts=[0], segment_index=[0] * 900, answer=task.answer,
                 question=task.prompt)
    for a in actions:
        res = env.step(a)
        ep.turns.append(Turn(start=0, end=0, action=a, observation=res.observation, tool=None))
    ep.reward, ep.finish = float(res.reward), "answer"
    return ep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="+", default=["search", "math"])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    print(f"{'env':<8} {'bare us/step':>13} {'checks':>16} {'checks + timeout':>22}")
    for name in args.envs:
        t = measure(name, args.steps, args.repeats)
        b = t["bare"]
        cells = [f"{t[k] * 1e6:8.1f} ({t[k] / b:4.2f}x)" for k in ("checks", "checks + timeout")]
        print(f"{name:<8} {b * 1e6:13.1f} {cells[0]:>16} {cells[1]:>22}")
    for what, t in measure_user_code(args.envs[0], args.calls, args.repeats).items():
        b = t["bare"]
        cells = "  ".join(f"{k} {t[k] * 1e6:.1f} ({t[k] / b:.1f}x)" for k in t if k != "bare")
        print(f"{what} (us/call): bare {b * 1e6:.1f}  {cells}")


if __name__ == "__main__":
    main()
