"""reasoning-gym's procedural tasks as agentrl envs: `--env reasoning-gym:NAME` (any of its
generators) or `--env reasoning-gym:NAME,NAME` (a mix, tasks taken from each in turn).

Tasks come from reasoning-gym's own generators (`reasoning_gym.create_dataset`), seeded from
`env.seed`: the train split from one seed, the held-out split from another, with every held-out
question that also appears in the train split dropped. The reward is reasoning-gym's own
`score_answer(answer, entry)` of the agent's final answer (1.0 exact; some generators give
partial credit), and `success` is a score of 1.

Tools (the whole assistant message is one call, as in `math`; `calls.py`):
  calc(EXPRESSION) -> the exact value (the `math` env's calculator); offered where the task is
                      arithmetic (`CALC_GENERATORS`, or `env.options.calculator=true`)
  answer(TEXT)     -> ends the episode; TEXT is what `score_answer` sees (it may span lines)

Generator options are env options (`--set env.options.max_terms=3`): with one generator every
option goes to it; in a mix an option goes to each generator that has it, and
`env.options.NAME={...}` to generator NAME only. An option no generator has is a one-line error.

The scripted expert (`agentrl build-tiny`, `rollout --policy expert`) answers with the gold
answer; where a generator's solution is a chain of arithmetic (`chain_sum`, `leg_counting`) it
first computes it with one `calc` a step, so episodes have states to branch at. Its slips (with
`error_rate`) are reasoning slips: the wrong operator (`chain_sum`), a wrong leg count for one
animal (`leg_counting`), or another task's answer (every other generator).

reasoning-gym is an optional dependency (`pip install reasoning-gym`), imported on first use.
"""
from __future__ import annotations

import functools
import random
import re
from dataclasses import fields, is_dataclass
from fractions import Fraction
from typing import Any, Callable

from ..errors import ConfigError
from ..registry import suggest
from .base import SECTION_OPTIONS, Task
from .calls import CallEnv, check_call_cost
from .mathword import CalcError, calculate, format_number
from .tool_calls import function_tool

__all__ = ["PREFIX", "CALC_GENERATORS", "ReasoningGymEnv", "ReasoningGymSpec",
           "make_factory", "expert_plan"]

PREFIX = "reasoning-gym"
# generators whose solution is arithmetic a calculator does: they get the calc tool
CALC_GENERATORS = frozenset({"chain_sum", "basic_arithmetic", "leg_counting", "products",
                             "decimal_arithmetic", "fraction_simplification", "gcd", "lcm",
                             "time_intervals", "decimal_chain_sum", "countdown", "puzzle24"})
# the env section's fields this env reads; the section's other fields belong to other envs
OWN_OPTIONS = ("n_train", "n_eval", "max_turns", "call_cost")
MAX_ANSWER_CHARS = 2000
_CALL = re.compile(r"^([a-z_]+)\((.*)\)$", re.DOTALL)
_SEED_SPACING = 1_000_003      # train and eval datasets of one env seed never share a seed


@functools.lru_cache(maxsize=1)
def _rg():
    try:
        # deferred: optional extra (reasoning_gym)
        import reasoning_gym
    except ImportError as e:
        raise ConfigError(f"env '{PREFIX}:...' needs reasoning-gym: pip install reasoning-gym "
                          f"({type(e).__name__}: {e})") from e
    return reasoning_gym


def generator_names() -> list[str]:
    """Every generator reasoning-gym registers (one line naming the install when it is missing)."""
    return sorted(_rg().factory.DATASETS)


def _config_fields(name: str) -> set[str]:
    _, config_cls = _rg().factory.DATASETS[name]
    return {f.name for f in fields(config_cls)} - {"seed", "size"} if is_dataclass(config_cls) else set()


def _generator_options(names: list[str], options: dict) -> dict[str, dict]:
    """Each generator's own options (module docstring: how a mix shares them)."""
    own: dict[str, dict] = {n: {} for n in names}
    valid = {n: _config_fields(n) for n in names}
    for key, value in options.items():
        if key in own:
            if not isinstance(value, dict):
                raise ConfigError(f"env '{PREFIX}': option '{key}' names a generator, so it takes "
                                  f"a mapping of that generator's options, got {value!r}")
            for k in value:
                if k not in valid[key]:
                    raise ConfigError(f"env '{PREFIX}:{key}' has no option '{k}'; its options: "
                                      f"{', '.join(sorted(valid[key])) or 'none'}")
            own[key].update(value)
            continue
        takers = [n for n in names if key in valid[n]]
        if not takers:
            every = sorted(set().union(*valid.values()) | set(OWN_OPTIONS) | {"calculator"})
            raise ConfigError(f"env '{PREFIX}:{','.join(names)}' has no option '{key}'; its "
                              f"options: {', '.join(every)}")
        for n in takers:
            own[n][key] = value
    return own


def _dataset(name: str, seed: int, size: int, options: dict):
    try:
        return _rg().create_dataset(name, seed=seed, size=max(1, size), **options)
    except (AssertionError, TypeError, ValueError) as e:
        raise ConfigError(f"env '{PREFIX}:{name}': reasoning-gym refuses its options "
                          f"{options}: {type(e).__name__}: {' '.join(str(e).split())}") from e


class ReasoningGymEnv(CallEnv):
    """One episode: `calc` (where offered) and `answer`, scored by reasoning-gym."""

    failed_info = {"success": False, "score": 0.0}

    def __init__(self, spec: "ReasoningGymSpec", max_turns: int, call_cost: float):
        self.spec = spec
        self.tools = ("calc", "answer") if spec.calculator else ("answer",)
        self.system_prompt = spec.system_prompt
        self.malformed = spec.malformed
        super().__init__(max_turns, call_cost)

    def _parse(self, action: str) -> tuple[str, str] | None:
        """`tool(argument)`; an answer's argument may span lines and holds anything but an
        unbalanced closing parenthesis (so two calls in one message stay malformed)."""
        if not isinstance(action, str):
            return None
        m = _CALL.match(action.strip())
        if m is None or m.group(1) not in self.tools:
            return None
        arg = m.group(2).strip()
        depth = 0
        for ch in arg:
            depth += (ch == "(") - (ch == ")")
            if depth < 0:
                return None
        if m.group(1) != "answer" and "\n" in arg:
            return None
        return m.group(1), arg

    def _tool(self, tool: str, arg: str) -> tuple[str, bool]:  # calc
        try:
            return format_number(calculate(arg)), False
        except CalcError as e:
            return f"error: {e}", True

    def _answer(self, arg: str) -> dict[str, Any]:
        self._score = self.spec.score(self.task, arg)    # `_reward` of this answer reads it
        return {"success": self._score >= 1.0, "score": self._score}

    def _reward(self, success: bool) -> float:
        """reasoning-gym's score (partial credit kept) less `call_cost` per earlier message."""
        return max(0.0, self._score - self.call_cost * (self.steps - 1))


class ReasoningGymSpec:
    """The spec of one generator or a mix: seeded train/eval tasks, the env, the expert."""

    def __init__(self, names: list[str], seed: int = 0, n_train: int = 595, n_eval: int = 60,
                 max_turns: int = 12, call_cost: float = 0.0, calculator: Any = "auto",
                 **options: Any):
        known = generator_names()
        for n in names:
            if n not in known:
                close = suggest(n, known)
                hint = f" (did you mean '{close}'?)" if close else ""
                raise ConfigError(f"env '{PREFIX}:{n}': reasoning-gym has no generator '{n}'{hint}; "
                                  f"`python -c \"import reasoning_gym.factory as f; print(sorted(f.DATASETS))\"` lists them")
        if n_train < 0 or n_eval < 0:
            raise ConfigError(f"env '{PREFIX}': env.n_train and env.n_eval must be non-negative")
        if max_turns < 1:
            raise ConfigError(f"env '{PREFIX}': env.max_turns must be at least 1, got {max_turns}")
        self.names = list(names)
        self.name = f"{PREFIX}:{','.join(self.names)}"
        self.seed, self.n_train, self.n_eval = int(seed), int(n_train), int(n_eval)
        self.max_turns, self.call_cost = int(max_turns), check_call_cost(call_cost)
        self.options = _generator_options(self.names, options)
        self.calculator = (any(n in CALC_GENERATORS for n in self.names) if calculator == "auto"
                           else _flag(calculator))
        tools = "calc(expression), answer(text)" if self.calculator else "answer(text)"
        self.system_prompt = f"Solve the task using tools, one call per message: {tools}."
        self.malformed = f"error: use {' or '.join(t.split('(')[0] + '(...)' for t in tools.split(', '))}"
        self.tool_schemas = ((function_tool("calc", "Exact arithmetic over + - * / ** and parentheses.",
                                            expression=("string", "e.g. (3*12+5)/4")),)
                             if self.calculator else ()) + (
            function_tool("answer", "Give the final answer; ends the episode.",
                          text=("string", "the answer, in the format the task asks for")),)
        self.tools_system_prompt = "Solve the task using the tools, one call per message; end with answer."
        self._datasets: dict[tuple[str, str], Any] = {}

    # ------------------------------------------------------------------ tasks
    def _split_dataset(self, name: str, split: str, size: int):
        key = (name, split)
        if key not in self._datasets:
            offset = 0 if split == "train" else 1
            self._datasets[key] = _dataset(name, self.seed * 2 * _SEED_SPACING + offset * _SEED_SPACING
                                           + self.names.index(name), size, self.options[name])
        return self._datasets[key]

    def _entries(self, split: str, n: int) -> list[tuple[str, int, dict]]:
        """`n` entries taken from the generators in turn: (generator, index, entry)."""
        k = len(self.names)
        per = -(-n // k) if n else 0
        out = []
        for i in range(n):
            name = self.names[i % k]
            ds = self._split_dataset(name, split, per)
            out.append((name, i // k, ds[i // k]))
        return out

    @functools.cached_property
    def _splits(self) -> dict[str, tuple[Task, ...]]:
        train = self._entries("train", self.n_train)
        seen = {e["question"] for _, _, e in train}
        # held-out: a longer draw from the eval seed, less every question the train split has
        extra, evals = 0, []
        while True:
            draw = self._entries("eval", self.n_eval + extra) if self.n_eval else []
            evals = [t for t in draw if t[2]["question"] not in seen][:self.n_eval]
            if len(evals) >= self.n_eval or extra > 4 * self.n_eval + 100:
                break
            extra = 2 * extra + 10 * len(self.names)
            self._datasets = {k: v for k, v in self._datasets.items() if k[1] != "eval"}
        if len(evals) < self.n_eval:
            raise ConfigError(f"env '{self.name}' cannot make {self.n_eval} held-out tasks that "
                              f"differ from its {self.n_train} training tasks: lower env.n_eval or "
                              "widen the generator's options")
        return {split: tuple(Task(task_id=f"rg-{split}-{i:05d}", prompt=e["question"].strip(),
                                  answer=str(e["answer"]),
                                  meta={"generator": name, "index": idx, "entry": e})
                             for i, (name, idx, e) in enumerate(entries))
                for split, entries in (("train", train), ("eval", evals))}

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in ("train", "eval"):
            raise ConfigError(f"unknown split '{split}'; valid: train, eval")
        tasks = self._splits[split]
        return list(tasks if n is None else tasks[:n])

    def score(self, task: Task, answer: str) -> float:
        """reasoning-gym's score of `answer` for `task`, in [0, 1] (anything else counts 0)."""
        if len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        name = task.meta["generator"]
        # scoring reads the entry, not a split: a one-entry dataset of the generator scores it,
        # kept apart from the splits (a split made here at size 1 would be cached at that size)
        if (name, "score") not in self._datasets:
            self._datasets[name, "score"] = _dataset(name, self.seed, 1, self.options[name])
        ds = self._datasets[name, "score"]
        try:
            score = float(ds.score_answer(answer, task.meta["entry"]))
        except Exception:  # noqa: BLE001  (a verifier that chokes on a malformed answer: wrong)
            return 0.0
        return score if 0.0 <= score <= 1.0 else 0.0

    def make(self) -> ReasoningGymEnv:
        return ReasoningGymEnv(self, self.max_turns, self.call_cost)

    # ------------------------------------------------------------------ expert
    def expert(self, env: ReasoningGymEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """The gold answer, after its calc steps where the generator has them (module doc)."""
        task = env.task
        if task is None:
            return "answer(0)"
        plan = expert_plan(task.meta["generator"], task.meta["entry"]) if env.spec.calculator else None
        if plan is None:
            if error_rate > 0 and rng.random() < error_rate:
                other = self.tasks("train")[rng.randrange(max(1, self.n_train))] if self.n_train else task
                return f"answer({other.answer})"
            return f"answer({task.answer})"
        done = [h for h in env.history if h["tool"] == "calc" and not h["error"]]
        if len(done) >= len(plan):
            return f"answer({done[-1]['observation'] if done else task.answer})"
        running = Fraction(done[-1]["observation"]) if done else None
        op, operand, slip = plan[len(done)]
        if error_rate > 0 and rng.random() < error_rate:
            op, operand = slip(rng)
        left = "" if running is None else _operand(running)
        return f"calc({left}{op}{operand})"


def _operand(x: Fraction) -> str:
    s = format_number(x)
    return f"({s})" if "/" in s or x < 0 else s


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ConfigError(f"env '{PREFIX}': option calculator is true, false or auto, got {value!r}")


Step = tuple[str, str, Callable[[random.Random], tuple[str, str]]]


def _chain_sum_plan(entry: dict) -> list[Step] | None:
    """`a - b + c`: calc(a-b), calc(<running>+c); a slip flips one operator."""
    parts = entry["metadata"].get("expression", "").split()
    flip = {"+": "-", "-": "+"}
    if len(parts) < 3 or len(parts) % 2 == 0 or any(op not in flip for op in parts[1::2]):
        return None
    first, rest = parts[0], list(zip(parts[1::2], parts[2::2]))
    plan: list[Step] = [("", f"{first}{rest[0][0]}{rest[0][1]}",
                         lambda rng, o=flip[rest[0][0]], t=rest[0][1]: ("", f"{first}{o}{t}"))]
    plan += [(op, term, lambda rng, o=flip[op], t=term: (o, t)) for op, term in rest[1:]]
    return plan


def _leg_counting_plan(entry: dict) -> list[Step] | None:
    """`3 cats, 2 ducks`: calc(3*4), calc(<running>+2*2); a slip miscounts one animal's legs."""
    # deferred: optional extra (reasoning_gym)
    from reasoning_gym.arithmetic.leg_counting import ANIMALS

    plan: list[Step] = []
    for i, (animal, count) in enumerate(entry["metadata"]["animals"].items()):
        legs = ANIMALS.get(animal)
        if legs is None:
            return None
        op = "" if i == 0 else "+"
        wrong = [n for n in (0, 2, 4, 6, 8) if n != legs]
        plan.append((op, f"{count}*{legs}",
                     lambda rng, op=op, c=count, w=wrong: (op, f"{c}*{rng.choice(w)}")))
    return plan


_PLANS: dict[str, Callable[[dict], list[Step] | None]] = {
    "chain_sum": _chain_sum_plan, "leg_counting": _leg_counting_plan}


def expert_plan(generator: str, entry: dict) -> list[Step] | None:
    """The expert's calc steps for an entry: (operator joining the running value, operand text,
    a slip `rng -> (operator, operand)`) each; None where the generator has none."""
    make = _PLANS.get(generator)
    return make(entry) if make is not None else None


def make_factory(rest: str) -> Callable[..., ReasoningGymSpec]:
    """The registry factory of `reasoning-gym:REST` (REST: generator names, comma-separated)."""
    names = [n.strip() for n in rest.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"env '{PREFIX}:{rest}': name a generator, e.g. {PREFIX}:chain_sum")

    def factory(seed: int = 0, **kw: Any) -> ReasoningGymSpec:
        # the section's own fields this env reads; its other fields are other envs' options
        own = {k: v for k, v in kw.items() if k in OWN_OPTIONS}
        options = {k: v for k, v in kw.items() if k not in SECTION_OPTIONS}
        return ReasoningGymSpec(names, seed, **own, **options)

    factory.options = OWN_OPTIONS + ("calculator",)
    return factory

