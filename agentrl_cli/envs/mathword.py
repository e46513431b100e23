"""The built-in "math" env: multi-step arithmetic word problems with a calculator tool.

A seeded generator writes short problems whose answer takes `hops` arithmetic operations, e.g.
`Problem: Ann has 3 boxes of 12 pens each. Ann buys 5 more pens. Ann shares them equally among
4 friends. How many pens does each friend get?` (3*12, +5, /4 -> 41/4). Some problems carry an
irrelevant number ("Ann is 9 years old."). Quantities such as litres may end in fractions.

Tools (the whole assistant message is exactly one call, see `calls.py`):
  calc(EXPRESSION) -> the exact value (`41/4` shows as `10.25`; `1/3` as `1/3`). A safe evaluator
                      over + - * / ** and parentheses on exact fractions; no Python `eval`.
  answer(NUMBER)   -> ends the episode; reward 1.0 if math-verify finds NUMBER equal to the gold
                      answer (`10.25`, `41/4` and `\\frac{41}{4}` all match), else 0.0.

Module named `mathword` so that it never shadows the standard `math` module.
Everything is deterministic from the seed (`random.Random`, never the global RNG).
"""
from __future__ import annotations

import ast
import functools
import logging
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..errors import ConfigError
from .base import ENVS, Task, env_factory
from .calls import CallEnv, CallSpec
from .tool_calls import function_tool

__all__ = [
    "CalcError",
    "MathEnv",
    "MathSpec",
    "MALFORMED",
    "SYSTEM_PROMPT",
    "calculate",
    "check_answer",
    "format_number",
    "make_math_spec",
    "split_binop",
]

SYSTEM_PROMPT = ("Solve the problem using tools, one call per message: "
                 "calc(expression), answer(number).")
MALFORMED = "error: use calc(expression) or answer(number)"
TOOLS = ("calc", "answer")
# the tools as JSON schemas, for models that call tools in their own format (model.tool_format)
TOOL_SCHEMAS = (
    function_tool("calc", "Exact arithmetic over + - * / ** and parentheses.",
                  expression=("string", "e.g. (3*12+5)/4")),
    function_tool("answer", "Give the final answer; ends the episode.",
                  number=("number", "the answer")),
)
TOOLS_SYSTEM_PROMPT = "Solve the problem using the tools, one call per message; end with answer."
MAX_HOPS = 5

# ------------------------------------------------------------------------------ calculator
MAX_EXPR_CHARS = 80
MAX_NUMERATOR = 10**15
MAX_DENOMINATOR = 10**12
MAX_EXPONENT = 12
_EXPR_CHARS = re.compile(r"^[0-9.+\-*/() ]*$")
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class CalcError(ValueError):
    """An expression the calculator refuses (its message is shown to the policy)."""


def _bounded(x: Fraction) -> Fraction:
    if abs(x.numerator) > MAX_NUMERATOR or x.denominator > MAX_DENOMINATOR:
        raise CalcError("number too large")
    return x


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(Fraction(str(node.value)) if isinstance(node.value, float)
                        else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Add):
            return _bounded(a + b)
        if isinstance(node.op, ast.Sub):
            return _bounded(a - b)
        if isinstance(node.op, ast.Mult):
            return _bounded(a * b)
        if isinstance(node.op, ast.Div):
            if b == 0:
                raise CalcError("division by zero")
            return _bounded(a / b)
        if isinstance(node.op, ast.Pow):
            if b.denominator != 1 or abs(b) > MAX_EXPONENT:
                raise CalcError(f"exponent must be a whole number up to {MAX_EXPONENT}")
            if a == 0 and b < 0:
                raise CalcError("division by zero")
            if abs(a.numerator) > MAX_NUMERATOR or a.denominator > MAX_DENOMINATOR:
                raise CalcError("number too large")
            return _bounded(a ** int(b))
    raise CalcError("bad expression")


def _parse_expr(expr: str) -> ast.AST:
    text = expr.replace("×", "*").replace("÷", "/").replace("^", "**").strip()
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_EXPR_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPR_CHARS} characters")
    if not _EXPR_CHARS.match(text):
        raise CalcError("bad expression")
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError("bad expression") from None


def calculate(expr: str) -> Fraction:
    """Exact value of an arithmetic expression (+ - * / **, parentheses, decimals). Only
    number literals and those operators are accepted; values are bounded (numerator < 1e15,
    denominator < 1e12, whole exponents up to 12). Raises CalcError otherwise."""
    return _eval(_parse_expr(expr))


def split_binop(expr: str) -> tuple[Fraction, str, Fraction] | None:
    """`(left, op, right)` of an expression whose outermost operation is + - * or /, evaluating
    both sides (`(41/4)*2` -> (41/4, "*", 2)); None for anything else or an invalid expression."""
    try:
        node = _parse_expr(expr)
        if not isinstance(node, ast.BinOp) or type(node.op) not in _BINOPS:
            return None
        return _eval(node.left), _BINOPS[type(node.op)], _eval(node.right)
    except CalcError:
        return None


def format_number(x: Fraction) -> str:
    """`36`, `10.25` (a terminating decimal of at most 6 places) or `1/3`."""
    if x.denominator == 1:
        return str(x.numerator)
    d, twos, fives = x.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    places = max(twos, fives)
    if d != 1 or places > 6:
        return f"{x.numerator}/{x.denominator}"
    scaled = abs(x.numerator) * 10**places // x.denominator
    whole, frac = divmod(scaled, 10**places)
    sign = "-" if x < 0 else ""
    return f"{sign}{whole}.{str(frac).rjust(places, '0').rstrip('0')}"


def _apply(a: Fraction, op: str, b: Fraction) -> Fraction:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]


# ------------------------------------------------------------------------------ checking
# Answers math-verify may see: numbers, fractions, signs, decimals, `$...$`, `\frac{a}{b}`,
# `\boxed{...}`. No exponents, factorials or names, and at most 64 characters, so that sympy's
# work is small and bounded: math-verify runs without its signal.alarm timeout (it must, off
# the main thread), hence the input bound here.
_ANSWER_CHARS = re.compile(r"^[0-9\s.,/+\-(){}$]*$")
_LATEX_WORDS = re.compile(r"\\(?:dfrac|frac|boxed)")
MAX_ANSWER_CHARS = 64


@functools.lru_cache(maxsize=1)
def _math_verify():
    # deferred: optional extra (math_verify)
    import math_verify

    # Parsing and verifying run with timeouts off (see above); math-verify warns about that
    # once per process. The bound on inputs is ours, so the warning is noise in CLI output.
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return math_verify


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str):
    return _math_verify().parse(gold, parsing_timeout=None)


def check_answer(pred: str, gold: str) -> bool:
    """True when math-verify finds `pred` equal to `gold` (`0.5`, `1/2`, `$\\frac{1}{2}$` are one
    answer). Text outside the bounded answer syntax above is simply wrong."""
    text = pred.strip()
    if not text or len(text) > MAX_ANSWER_CHARS:
        return False
    if not _ANSWER_CHARS.match(_LATEX_WORDS.sub("", text)):
        return False
    mv = _math_verify()
    try:
        return bool(mv.verify(_parse_gold(gold), mv.parse(text, parsing_timeout=None),
                              timeout_seconds=None))
    except Exception:  # math-verify is defensive already; a parse failure is a wrong answer
        return False


# ------------------------------------------------------------------------------ problems
_NAMES = ("Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jill", "Kai",
          "Lena", "Milo", "Nia", "Omar", "Pia", "Rex", "Sara", "Tom", "Uma")
# (unit, stuff, container singular, container plural): discrete items have no stuff
_DISCRETE = (("pens", "", "box", "boxes"), ("apples", "", "bag", "bags"),
             ("stamps", "", "album", "albums"), ("marbles", "", "jar", "jars"),
             ("cards", "", "pack", "packs"), ("eggs", "", "carton", "cartons"),
             ("books", "", "crate", "crates"), ("coins", "", "purse", "purses"))
_CONTINUOUS = (("liters", "juice", "bottle", "bottles"), ("kg", "flour", "sack", "sacks"),
               ("meters", "rope", "coil", "coils"))
_GROUPS = ("friends", "boxes", "plates", "teams")


@dataclass(frozen=True)
class Op:
    """One operation: `left` is a number from the text, or None for the running value."""

    left: str | None
    op: str
    right: str


def _problem(rng: random.Random, hops: int) -> tuple[str, list[Op], list[Fraction], dict]:
    name = rng.choice(_NAMES)
    continuous = rng.random() < 0.3
    unit, stuff, _, boxes = rng.choice(_CONTINUOUS if continuous else _DISCRETE)
    amount = (lambda n: f"{n} {unit} of {stuff}") if continuous else (lambda n: f"{n} {unit}")
    ops: list[Op] = []
    sentences: list[str] = []
    start: Fraction | None = None   # the running value before the first operation
    if rng.random() < 0.5:      # the start is itself an operation: a containers of b each
        a, b = rng.randint(2, 9), rng.randint(3, 15)
        sentences.append(f"{name} has {a} {boxes} of {amount(b)} each.")
        ops.append(Op(str(a), "*", str(b)))
        value = Fraction(a * b)
    else:
        a = rng.randint(6, 60)
        sentences.append(f"{name} has {amount(a)}.")
        value = start = Fraction(a)
    question = (f"How many {unit} does {name} have now?" if not continuous
                else f"How many {unit} of {stuff} does {name} have now?")
    while len(ops) < hops:
        last = len(ops) == hops - 1
        kinds = ["+", "-", "*"] + (["/"] if last else [])
        kind = rng.choice(kinds)
        if kind == "/":
            divisors = [d for d in range(2, 10) if continuous or value % d == 0]
            if not divisors:
                kind = rng.choice(["+", "-"])
        if kind == "-" and value <= 2:
            kind = "+"
        if kind == "+":
            b = rng.randint(2, 20)
            sentences.append(f"{name} buys {b} more {unit}.")
        elif kind == "-":
            b = rng.randint(1, min(20, int(value) - 1))
            sentences.append(f"{name} uses {b} {unit}.")
        elif kind == "*":
            b = rng.randint(2, 4)
            sentences.append(f"{name} then has {b} times as many.")
        else:
            b = rng.choice(divisors)
            group = rng.choice(_GROUPS)
            sentences.append(f"{name} shares them equally among {b} {group}.")
            question = f"How many {unit} does each of the {group} get?"
        ops.append(Op(None, kind, str(b)))
        value = _apply(value, kind, Fraction(b))
    extra = None
    if rng.random() < 0.4:        # an irrelevant number
        extra = rng.randint(5, 40)
        sentences.insert(rng.randint(1, len(sentences)), f"{name} is {extra} years old.")
    values, v = [], start
    for o in ops:
        v = _apply(Fraction(o.left) if o.left is not None else v, o.op, Fraction(o.right))
        values.append(v)
    assert values[-1] == value
    text = "Problem: " + " ".join(sentences) + " " + question
    meta = {"hops": hops, "ops": [[o.left, o.op, o.right] for o in ops],
            "start": None if start is None else str(start),
            "values": [format_number(x) for x in values], "distractor": extra}
    return text, ops, values, meta


@functools.lru_cache(maxsize=16)
def _tasks(seed: int, min_hops: int, max_hops: int, n_train: int,
           n_eval: int) -> dict[str, tuple[Task, ...]]:
    rng = random.Random(f"math-tasks-{seed}-{min_hops}-{max_hops}")
    seen: set[str] = set()
    out: dict[str, tuple[Task, ...]] = {}
    for split, n in (("eval", n_eval), ("train", n_train)):   # disjoint by problem text
        tasks: list[Task] = []
        tries = 0
        while len(tasks) < n:
            tries += 1
            if tries > 50 * (n + 10):
                raise ConfigError(f"math (seed={seed}) cannot make {n} distinct {split} problems "
                                 f"of {min_hops}..{max_hops} steps")
            hops = rng.randint(min_hops, max_hops)
            text, _, values, meta = _problem(rng, hops)
            if text in seen:
                continue
            seen.add(text)
            tasks.append(Task(task_id=f"math-{split}-{len(tasks):05d}", prompt=text,
                              answer=str(values[-1]), meta=meta))
        out[split] = tuple(tasks)
    return out


# ------------------------------------------------------------------------------ env
class MathEnv(CallEnv):
    """One episode at a time: `calc` and `answer` (see `CallEnv` for the bookkeeping)."""

    system_prompt = SYSTEM_PROMPT
    tools = TOOLS
    malformed = MALFORMED

    def _tool(self, tool: str, arg: str) -> tuple[str, bool]:  # calc
        try:
            return format_number(calculate(arg)), False
        except CalcError as e:
            return f"error: {e}", True

    def _check(self, arg: str) -> bool:
        return check_answer(arg, self.task.answer)


def _operand(x: Fraction) -> str:
    s = format_number(x)
    return f"({s})" if "/" in s or x < 0 else s


def _slip(rng: random.Random, want: Op, distractor: int | None) -> tuple[str, Fraction]:
    """A reasoning slip, never a copying one (numbers are copied exactly): the wrong operation
    on the right number, or the right operation on the problem's irrelevant number."""
    ops = [o for o in ("+", "-", "*") if o != want.op]
    choices = [(o, Fraction(want.right)) for o in ops]
    if distractor is not None and Fraction(distractor) != Fraction(want.right):
        choices.append((want.op, Fraction(distractor)))
    return rng.choice(choices)


def _expert_action(env: MathEnv, rng: random.Random, error_rate: float) -> str:
    """Replay the calc history to find how many operations are done, then act (see MathSpec)."""
    task = env.task
    if task is None:
        return "answer(0)"
    ops = [Op(*o) for o in task.meta["ops"]]
    start = task.meta["start"]
    running: Fraction | None = None if start is None else Fraction(start)
    k = 0
    for h in env.history:
        if k >= len(ops):
            break
        if h["tool"] != "calc" or h["error"]:
            continue
        parts = split_binop(h["arg"])
        if parts is None:
            continue
        left, op, right = parts
        want = ops[k]
        want_left = Fraction(want.left) if want.left is not None else running
        # a slip (error_rate > 0) still counts as this step: the expert carries on from it
        exact = op == want.op and right == Fraction(want.right)
        if left == want_left and (exact or error_rate > 0):
            running = _apply(left, op, right)
            k += 1
    if k >= len(ops):
        return f"answer({format_number(running)})"
    want = ops[k]
    left = Fraction(want.left) if want.left is not None else running
    op, right = want.op, Fraction(want.right)
    if error_rate > 0 and rng.random() < error_rate:
        op, right = _slip(rng, want, task.meta.get("distractor"))
    return f"calc({_operand(left)}{op}{_operand(right)})"


class MathSpec(CallSpec):
    """The "math" env spec: deterministic train/eval problems and the scripted expert
    (options and tasks: see `CallSpec`)."""

    name = "math"
    tool_schemas = TOOL_SCHEMAS
    tools_system_prompt = TOOLS_SYSTEM_PROMPT
    env_class = MathEnv
    hops_limit = MAX_HOPS
    build = staticmethod(_tasks)

    def expert(self, env: MathEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """One `calc(<running value><op><operand>)` per operation, then `answer(<last result>)`.
        With `error_rate` e, each calc is a reasoning slip with probability e (the wrong
        operation, or the problem's irrelevant number as the operand; numbers are always
        copied exactly), and the expert carries on from that result."""
        return _expert_action(env, rng, error_rate)


@env_factory("math", ("min_hops", "max_hops", "n_train", "n_eval", "max_turns", "call_cost"))
def make_math_spec(seed: int = 0, **options: Any) -> MathSpec:
    """Registry factory. Options: min_hops, max_hops (arithmetic operations per problem, 1-5),
    n_train, n_eval, max_turns, call_cost (`CallEnv`)."""
    return MathSpec(seed, **options)


ENVS.register("math", make_math_spec)
