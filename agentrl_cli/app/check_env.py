"""`agentrl check-env`'s library function: an env checked against the protocol the trainer
relies on (`envs.checker.check_env`), its factory and spec built under `env.step_timeout_s`."""
from __future__ import annotations

from typing import Callable

from ..envs.base import make_env_spec
from ..envs.checker import EnvReport, check_env
from ..envs.guard import EnvContractError, StepTimeout, call_with_timeout
from .preflight import load_checked

QUIET_S = 1.0   # a factory that returns (or fails) sooner prints nothing before its result


def check_env_named(env: str, config: str | None = None, sets: list[str] | None = None,
                    seed: int | None = None, say: Callable[[str], None] = print
                    ) -> tuple[str, EnvReport]:
    """(the env's name, its report). `say` gets each check's line as it starts: a header, the
    factory's line when it is still busy after `QUIET_S`, then the checker's. A factory, reset
    or step that does not return within `env.step_timeout_s` is an `EnvContractError`."""
    sets = list(sets or []) + ([f"env.seed={seed}"] if seed is not None else [])
    cfg = load_checked(config, sets, **{"env.name": env})
    timeout = cfg.env.step_timeout_s
    said: list[str] = []

    def header() -> None:
        said.append(f"checking env '{cfg.env.name}' (seed {cfg.env.seed}; its factory and each "
                    f"reset and step within env.step_timeout_s={timeout:g} s)")
        say(said[-1])

    def slow_factory() -> None:           # a factory still busy after QUIET_S: say so now
        header()
        say("  factory: loading the env and calling its factory with the options given")

    try:                                  # a spec that does not build: its one-line error
        call_with_timeout(make_env_spec, cfg.env, timeout, slow=(QUIET_S, slow_factory))
    except StepTimeout as e:
        raise EnvContractError(cfg.env.name, f"its factory {e} (env.step_timeout_s)") from None
    if not said:
        header()
    try:
        report = check_env(lambda s: make_env_spec(cfg.env, s), seed=cfg.env.seed,
                           max_turns=cfg.env.max_turns, timeout_s=timeout,
                           max_chars=cfg.env.max_observation_chars,
                           progress=lambda line: say(f"  {line}"))
    except EnvContractError as e:         # a reset, step or factory that did not return in time
        raise EnvContractError(cfg.env.name, e.problem, e.task, e.step) from None
    return cfg.env.name, report
