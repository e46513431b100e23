"""What the env boundary's per-step checks cost (agentrl_cli/envs/guard.py): the same env
steps run bare, guarded without a timeout (type, reward and size checks only) and guarded
with the default `env.step_timeout_s` (each reset and step handed to a pooled worker thread).

Each round drives `--steps` env steps with the scripted expert's actions (recorded once, so
the expert's own time is not counted), episode after episode over the held-out tasks, and the
best of `--repeats` rounds is kept. Prints microseconds per step and the ratio to the bare env
side by side, per env.

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="+", default=["search", "math"])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"{'env':<8} {'bare us/step':>13} {'checks':>16} {'checks + timeout':>22}")
    for name in args.envs:
        t = measure(name, args.steps, args.repeats)
        b = t["bare"]
        cells = [f"{t[k] * 1e6:8.1f} ({t[k] / b:4.2f}x)" for k in ("checks", "checks + timeout")]
        print(f"{name:<8} {b * 1e6:13.1f} {cells[0]:>16} {cells[1]:>22}")


if __name__ == "__main__":
    main()
