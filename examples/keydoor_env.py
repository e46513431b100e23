"""A small env with a scripted expert, in one file: find the key that opens the way out.

Each task is a house: a hall with side rooms and a locked exit. The exit's lock has a colour;
a key of that colour lies in one of the side rooms, keys of other colours in others. The agent
sees only the room it is in, and names doors and items by their number in the observation:

    Find the way out. You are in the hall. Doors: 1 kitchen, 2 cellar, 3 study, 4 exit (locked, red).
    go(2)     -> You are in the cellar. Items: 1 blue key. Doors: 1 hall.
    go(1)     -> You are in the hall. Doors: ...
    go(3)     -> You are in the study. Items: 1 red key. Doors: 1 hall.
    take(1)   -> You take the red key. You are in the study. Doors: 1 hall.
    go(1)     -> ...
    go(4)     -> the exit opens; the episode ends with reward 1.0

Going to the locked exit without its key is allowed (the lock stays shut); a malformed or
impossible message gets an error observation (never an exception); `max_turns` messages
without getting out truncate the episode with reward 0.

It has a scripted expert (`spec.expert`), so `--model tiny` builds a starting agent from it:

    agentrl check-env examples/keydoor_env.py:make
    agentrl build-tiny --env examples/keydoor_env.py:make --out runs/keydoor-agent
    agentrl train --method grpo --env examples/keydoor_env.py:make --model runs/keydoor-agent

See docs/your-env.md for the protocol.
"""
from __future__ import annotations

import random
import re

from agentrl_cli.envs import StepResult, Task

SYSTEM_PROMPT = ("Get out of the house. One call per message: go(N) through door N, take(N) "
                 "item N. The exit needs the key of its colour.")
CALL = re.compile(r"^\s*(go|take)\((\d{1,2})\)\s*\.?\s*$")
ROOMS = ("kitchen", "cellar", "study", "attic", "garage", "library", "pantry", "bathroom")
COLOURS = ("red", "blue", "green", "white", "black", "yellow")


class KeyDoorEnv:
    """One episode at a time. Its state is the room, the keys held and taken, the side rooms
    visited and the turn count."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, max_turns: int = 10):
        self.max_turns = max_turns
        self.task: Task | None = None
        self.room, self.held, self.taken, self.visited = "hall", (), (), ()
        self.turns, self.done = 0, False

    def reset(self, task: Task) -> str:
        self.task, self.room, self.held, self.taken, self.visited = task, "hall", (), (), ()
        self.turns, self.done = 0, False
        return "Find the way out. " + self.describe()

    # what the agent sees: the numbered doors and items of the current room
    def doors(self) -> list[str]:
        house = self.task.meta
        return list(house["rooms"]) + ["exit"] if self.room == "hall" else ["hall"]

    def items(self) -> list[str]:
        house = self.task.meta
        key = house["keys"].get(self.room)
        return [key] if key is not None and key not in self.taken else []

    def describe(self) -> str:
        lock = self.task.meta["lock"]
        names = [f"exit (locked, {lock})" if d == "exit" else d for d in self.doors()]
        items = self.items()
        shown = f" Items: {', '.join(f'{i + 1} {k} key' for i, k in enumerate(items))}." if items else ""
        return (f"You are in the {self.room}.{shown} "
                f"Doors: {', '.join(f'{i + 1} {d}' for i, d in enumerate(names))}.")

    def step(self, action: str) -> StepResult:
        if self.task is None or self.done:
            return StepResult("error: the episode is over", 0.0, False, False,
                              {"tool": None, "error": True})
        self.turns += 1
        m = CALL.match(action if isinstance(action, str) else "")
        info = {"tool": m.group(1) if m else None, "error": m is None}
        if m is None:
            obs = "error: use go(N) or take(N)"
        elif m.group(1) == "go":
            doors, n = self.doors(), int(m.group(2))
            if not 1 <= n <= len(doors):
                obs, info["error"] = f"error: no door {n}. " + self.describe(), True
            elif doors[n - 1] == "exit":
                if self.task.meta["lock"] in self.held:
                    self.done = True
                    return StepResult("", 1.0, True, False, {**info, "success": True,
                                                             "answer": "out"})
                obs = f"The exit is locked: it needs the {self.task.meta['lock']} key. " + self.describe()
            else:
                self.room = doors[n - 1]
                if self.room != "hall" and self.room not in self.visited:
                    self.visited += (self.room,)
                obs = self.describe()
        else:
            items, n = self.items(), int(m.group(2))
            if not 1 <= n <= len(items):
                obs, info["error"] = f"error: no item {n}. " + self.describe(), True
            else:
                key = items[n - 1]
                self.held, self.taken = self.held + (key,), self.taken + (key,)
                obs = f"You take the {key} key. " + self.describe()
        if self.turns >= self.max_turns:   # the step limit: truncated, reward 0
            self.done = True
            return StepResult("", 0.0, False, True, {**info, "success": False})
        return StepResult(obs, 0.0, False, False, info)

    def snapshot(self):
        return (self.task, self.room, self.held, self.taken, self.visited, self.turns, self.done)

    def restore(self, state) -> None:
        (self.task, self.room, self.held, self.taken, self.visited, self.turns,
         self.done) = state


class KeyDoorSpec:
    """Houses from the seed alone (`random.Random(seed)`): `rooms` side rooms, each holding a
    key of a distinct colour or nothing; one of them holds the exit's. Train and eval houses
    are disjoint."""

    name = "keydoor"

    def __init__(self, seed: int = 0, n_train: int = 2000, n_eval: int = 100, rooms: int = 4,
                 max_turns: int = 10):
        if not 2 <= rooms <= len(ROOMS):
            raise ValueError(f"rooms must be in 2..{len(ROOMS)}")
        self.max_turns = max_turns
        rng, seen, tasks = random.Random(seed), set(), []
        while len(tasks) < n_train + n_eval:
            names = rng.sample(ROOMS, rooms)
            colours = rng.sample(COLOURS, rooms)
            keys = {r: c for r, c in zip(names, colours) if rng.random() < 0.8 or c == colours[0]}
            lock = colours[0]
            house = (tuple(names), tuple(sorted(keys.items())), lock)
            if house in seen:
                if len(seen) > 20 * (n_train + n_eval):
                    raise ValueError("too few distinct houses: raise rooms or lower n_train")
                continue
            seen.add(house)
            split = "train" if len(tasks) < n_train else "eval"
            tasks.append(Task(f"{split}-{len(tasks):05d}", "Find the way out.", "out",
                              {"rooms": names, "keys": keys, "lock": lock}))
        self._tasks = {"train": tasks[:n_train], "eval": tasks[n_train:]}

    def make(self) -> KeyDoorEnv:
        return KeyDoorEnv(self.max_turns)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in self._tasks:
            raise ValueError(f"unknown split '{split}'; valid: train, eval")
        out = self._tasks[split]
        return list(out if n is None else out[:n])

    def expert(self, env: KeyDoorEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """What a player who searches the rooms in order does: in the hall with the key, the
        exit; in the hall without it, the first room not yet searched; in a room, take the
        lock's key if it lies there, else back to the hall. With `error_rate` e, each move is a
        uniformly random door or item instead, with probability e."""
        doors, items = env.doors(), env.items()
        if rng.random() < error_rate:
            if items and rng.random() < 0.5:
                return f"take({rng.randint(1, len(items))})"
            return f"go({rng.randint(1, len(doors))})"
        lock = env.task.meta["lock"]
        if env.room != "hall":
            return "take(1)" if lock in items and lock not in env.held else "go(1)"
        if lock in env.held:
            return f"go({len(doors)})"
        unseen = [i for i, d in enumerate(doors[:-1]) if d not in env.visited]
        return f"go({(unseen[0] if unseen else rng.randrange(len(doors) - 1)) + 1})"


def make(seed: int = 0, n_train: int = 2000, n_eval: int = 100, rooms: int = 4,
         max_turns: int = 10) -> KeyDoorSpec:
    """The factory agentrl calls: `--env examples/keydoor_env.py:make`; its keyword parameters
    are the env's options (`--set env.rooms=4`)."""
    return KeyDoorSpec(seed, n_train, n_eval, rooms, max_turns)
