"""The TextEnv protocol: a Gymnasium-style, text-in/text-out tool environment that can be forked.

The env never sees tokens. The rollout runner renders the env's text with the model's chat
template and stores the exact token ids (token-in, token-out); see `rollout/`.
"""
from __future__ import annotations

import functools
import inspect
import random
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from ..config import EnvConfig
from ..errors import ConfigError
from ..registry import Registry
from . import plugins


@dataclass(frozen=True)
class Task:
    """One task. `answer` is the gold answer (TRACE teacher-forces it; verifiers check it)."""

    task_id: str                  # unique within its env and split
    prompt: str                   # the user message that opens the episode
    answer: str                   # gold final answer, as text
    meta: dict = field(default_factory=dict, compare=False)  # env-specific (hops, entities, ...)


@dataclass
class StepResult:
    observation: str              # text shown to the policy next ("" when terminated)
    reward: float                 # terminal reward on the final step, 0 before
    terminated: bool              # the episode ended on its own (final answer)
    truncated: bool               # the env's step limit was hit
    info: dict = field(default_factory=dict)  # tool, success, error, ...


@runtime_checkable
class TextEnv(Protocol):
    """A multi-turn tool environment. Malformed actions become error observations, never raise."""

    system_prompt: str            # fixed instructions (tools and their syntax)

    def reset(self, task: Task) -> str:
        """Start an episode on `task`; return the first user message."""

    def step(self, action: str) -> StepResult:
        """Apply one complete assistant message (a tool call or a final answer)."""

    def snapshot(self) -> Any:
        """A picklable, independent copy of the episode state (for forking)."""

    def restore(self, state: Any) -> None:
        """Return to a state from `snapshot()`; later steps behave exactly as after the snapshot."""


class EnvSpec(Protocol):
    """What an env's factory returns: a factory of envs, tasks and a scripted expert (docs/your-env.md)."""

    name: str

    def make(self) -> TextEnv:
        """A fresh env instance (one per concurrent episode)."""

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        """Deterministic tasks of `split` ("train" | "eval"), the first `n` if given."""

    def expert(self, env: TextEnv, rng: random.Random, error_rate: float = 0.0) -> str:
        """The scripted expert's next action for `env`'s current state (`error_rate` > 0 makes
        an imperfect demonstrator). Optional for a user env: only the tiny model's warm-up
        (`--model tiny`) and `agentrl rollout --policy expert` call it."""


ENTRY_POINTS = "agentrl.envs"   # the entry-point group installed packages declare envs under


class EnvRegistry(plugins.PluginRegistry):
    """The env registry. Besides the registered names, `get` resolves a user env: `module:attr`,
    `path/to/file.py:attr` (`plugins`) or an installed package's `agentrl.envs` entry point,
    each a factory with the built-ins' signature, `factory(seed=0, **options) -> EnvSpec`,
    wrapped in a `UserEnvFactory` (cached per name). A registered name wins over an entry
    point of the same name."""

    def __init__(self, kind: str):
        super().__init__(kind, ENTRY_POINTS, "a user env: module:factory, path/to/file.py:factory",
                         lambda name, fn: UserEnvFactory(name, fn))
        self.schemes: dict[str, Callable[[str], Callable[..., Any]]] = {}

    def register_scheme(self, scheme: str, factory_of: Callable[[str], Callable[..., Any]]) -> None:
        """Names `SCHEME:REST` (`gym:ID`) resolve to the factory `factory_of(REST)`, wrapped and
        cached as a user env's (before `module:attr`, so a module named `SCHEME` is shadowed)."""
        if scheme in self.schemes:
            raise ValueError(f"env scheme '{scheme}' is already registered")
        self.schemes[scheme] = factory_of

    def get(self, name: str):
        scheme, sep, rest = name.partition(":")
        if sep and scheme in self.schemes and name not in self._user:
            self._user[name] = self.wrap(name, self.schemes[scheme](rest))
        return super().get(name)

    def names(self) -> list[str]:
        return sorted({*super().names(), *plugins.entry_points(ENTRY_POINTS)})

    def __contains__(self, name: str) -> bool:
        return Registry.__contains__(self, name) or name in self._user

    def is_user(self, name: str) -> bool:
        """Whether `name` is a user env (not registered by the package; a scheme's env, such
        as `gym:ID` or `reasoning-gym:NAME`, runs code from outside and counts as one)."""
        return not Registry.__contains__(self, name)


# name -> callable(seed: int, **options) -> EnvSpec, made by `env_factory` (or a user env's
# factory, wrapped in `UserEnvFactory`)
ENVS: EnvRegistry = EnvRegistry("env")

# the env section's options (`EnvConfig` but name, seed and a user env's options):
# `make_env_spec` hands a built-in factory the whole section, and each env takes the ones it
# declares (`env_factory`)
SECTION_OPTIONS = tuple(f.name for f in fields(EnvConfig)
                        if f.name not in ("name", "seed", "options"))


class EnvOptionError(ConfigError, TypeError):
    """An option an env does not take: one line for the user (ConfigError), and the TypeError
    Python raises for an unexpected keyword."""


def env_factory(env: str, options: Sequence[str]):
    """Declare the options (besides `seed`) of env `env`'s registry factory. The decorated
    factory receives only those; the env section's other fields (`SECTION_OPTIONS`, options of
    other envs) are dropped; any other keyword is a one-line `EnvOptionError` naming `env`'s
    options. The declared options are the factory's `options` attribute."""
    options = tuple(options)

    def deco(fn: Callable[..., EnvSpec]) -> Callable[..., EnvSpec]:
        @functools.wraps(fn)
        def factory(seed: int = 0, **kw: Any) -> EnvSpec:
            unknown = sorted(k for k in kw if k not in options and k not in SECTION_OPTIONS)
            if unknown:
                raise EnvOptionError(f"env '{env}' has no option '{unknown[0]}'; its options: "
                                     f"{', '.join(options) or 'none'}")
            return fn(seed, **{k: v for k, v in kw.items() if k in options})

        factory.options = options
        return factory

    return deco


class UserEnvFactory:
    """A user env's factory, called as the built-ins' are: `factory(seed=0, **options)`. Its
    options are the keyword parameters of its signature (`options`; any with `**kwargs`); an
    option it does not take is a one-line `EnvOptionError`, an exception inside it or a result
    that is not an env spec (no `make()` and `tasks(split, n)`) a one-line `ConfigError`."""

    def __init__(self, name: str, fn: Callable[..., Any]):
        fn = _as_factory(name, fn)
        self.name, self.fn = name, fn
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):   # a builtin or C callable: take what is given
            params = [inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD)]
        named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        self.any_option = any(p.kind == p.VAR_KEYWORD for p in params)
        self.takes_seed = "seed" in named or self.any_option
        self.options = tuple(n for n in named if n != "seed")

    def __call__(self, seed: int = 0, **options: Any) -> EnvSpec:
        held = {} if self.any_option else {
            k: options.pop(k) for k in list(options)
            if k not in self.options and any(k in a.options for a in SPEC_ADAPTERS)}
        unknown = sorted(k for k in options if k not in self.options)
        if unknown and not self.any_option:
            raise EnvOptionError(f"env '{self.name}' has no option '{unknown[0]}'; its options: "
                                 f"{', '.join([*self.options, *held]) or 'none'}")
        kw = {"seed": seed, **options} if self.takes_seed else options
        spec = self._call(kw)
        adapter = next((a for a in SPEC_ADAPTERS if a.accepts(spec)), None)
        if adapter is not None:
            spec = adapter(spec, lambda: self._call(kw), self.name, seed, **held)
        elif held:
            raise EnvOptionError(f"env '{self.name}' has no option '{sorted(held)[0]}'; its "
                                 f"options: {', '.join(self.options) or 'none'}")
        missing = [m for m in ("make", "tasks") if not callable(getattr(spec, m, None))]
        if missing:
            raise ConfigError(f"env '{self.name}': its factory returned a value of type "
                              f"{type(spec).__name__}, not an env spec (it lacks {' and '.join(m + '()' for m in missing)}; "
                              "see docs/your-env.md)")
        return spec

    def _call(self, kw: dict) -> Any:
        try:
            return self.fn(**kw)
        except ConfigError:
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001  (the user's code: one line, chained for debugging)
            raise ConfigError(f"env '{self.name}': its factory raised {type(e).__name__}: "
                              f"{' '.join(str(e).split())}") from e


class SpecAdapter(Protocol):
    """Turns what a user's factory returned into an env spec when it is another kind of env
    (a `gymnasium.Env`: `envs.gym_env`). `options` are the adapter's own options, which the
    factory need not take."""

    options: tuple[str, ...]

    def accepts(self, obj: Any) -> bool:
        """Whether `obj` (a factory's result) is this adapter's kind of env."""

    def __call__(self, obj: Any, remake: Callable[[], Any], name: str, seed: int,
                 **options: Any) -> EnvSpec:
        """The spec of `obj`; `remake()` calls the factory again (a fresh env)."""


# what a user's factory may return besides an env spec, each turned into one (registered in
# `envs/__init__`)
SPEC_ADAPTERS: list[SpecAdapter] = []


def _is_spec(obj: Any) -> bool:
    return callable(getattr(obj, "make", None)) and callable(getattr(obj, "tasks", None))


def _as_factory(name: str, obj: Any) -> Callable[..., Any]:
    """A user env as a factory: a factory (or a spec class) as it is; a spec object as a
    factory of itself (no options; its own seed); an env class that gives its tasks as a
    factory of `EnvClassSpec`s (its constructor's parameters are the options). Anything else,
    an env class without tasks included, is a one-line ConfigError."""
    if isinstance(obj, type) and not _is_spec(obj) and callable(getattr(obj, "step", None)):
        if not callable(getattr(obj, "tasks", None)):
            raise ConfigError(f"env '{name}' is an env class ({obj.__name__}: reset/step) without "
                              "tasks: give it a tasks(split, n=None) method, or give its "
                              "factory or spec (make() and tasks(); docs/your-env.md)")

        def factory(*args: Any, **options: Any) -> EnvClassSpec:
            return EnvClassSpec(obj, *args, **options)

        factory.__signature__ = inspect.signature(obj)
        return factory
    if not isinstance(obj, type) and _is_spec(obj):
        return lambda: obj
    if not callable(obj):
        raise ConfigError(f"env '{name}' is a {type(obj).__name__}, not a factory "
                          "(a callable: factory(seed=0, **options) -> env spec), an env spec "
                          "(make() and tasks()) or an env class")
    return obj


class EnvClassSpec:
    """The spec of an env class that also gives its tasks (`tasks(split, n=None)`): each env
    is `cls(**options)`, and the tasks are those of one instance made first."""

    def __init__(self, cls: type, *args: Any, **options: Any):
        self.cls, self.args, self.options = cls, args, options
        self.name = cls.__name__
        self._first = cls(*args, **options)

    def make(self) -> TextEnv:
        return self.cls(*self.args, **self.options)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        return self._first.tasks(split, n)


def make_env_spec(section: EnvConfig, seed: int | None = None) -> EnvSpec:
    """The spec of an env section (its world at `seed`, default the section's own): the one
    place a spec is built from configuration (`context.make_spec`, the tiny build). A built-in
    factory gets the section's fields (it takes those it declares) and `section.options`; a
    user env's factory gets only `section.options`, the keys the user set, so its own defaults
    hold for the rest."""
    factory = ENVS.get(section.name)
    seed = section.seed if seed is None else seed
    options = dict(getattr(section, "options", None) or {})
    if isinstance(factory, UserEnvFactory):
        return factory(seed=seed, **options)
    return factory(seed=seed, **{**{k: getattr(section, k) for k in SECTION_OPTIONS}, **options})


def has_expert(spec: EnvSpec) -> bool:
    """Whether `spec` has a scripted expert (`expert(env, rng, error_rate)`)."""
    return callable(getattr(spec, "expert", None))


def check_tiny_env(section: EnvConfig) -> None:
    """`--model tiny` warms the tiny model up on the env's scripted expert: a user env without
    one is a one-line error naming `--model PATH`, before any build starts."""
    if not ENVS.is_user(section.name):
        return
    if not has_expert(make_env_spec(section)):
        raise ConfigError(f"env '{section.name}' has no scripted expert (spec.expert), which the "
                          "tiny model's warm-up imitates: give a model with --model PATH (a local "
                          "Hugging Face folder or a hub id)")
