"""Tool calls per episode over training, and tool-call collapse (docs/methods.md).

FOCUS reports that GRPO collapsed late in training: the agent stopped calling tools and answered
at once, and success fell with it. This reads a run's `metrics.jsonl` (`rollout/tool_calls`: mean
tool calls per training episode, `success`: training success, per step) and flags a collapse:

with trailing means over `window` steps, after the step where the mean tool calls peaked, the
first stretch of at least `window` consecutive steps whose mean tool calls all stay below
`(1 - drop) x peak` and at whose end the mean success is below the mean success at the peak
[our choice of a concrete rule]. The collapse is reported from the stretch's first step.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from ..errors import ConfigError
from ..reporting.metrics import read_metrics


def trailing_mean(xs: Sequence[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def detect_collapse(steps: Sequence[int], tool_calls: Sequence[float], success: Sequence[float],
                    window: int = 5, drop: float = 0.5) -> dict | None:
    """The collapse (see the module docstring) or None."""
    if window < 1 or not 0 < drop < 1:
        raise ValueError("window must be >= 1 and drop in (0, 1)")
    tc, su = trailing_mean(tool_calls, window), trailing_mean(success, window)
    if len(tc) < window:
        return None
    start = window - 1                    # first full window
    peak = max(range(start, len(tc)), key=lambda i: tc[i])
    thresh = (1 - drop) * tc[peak]
    run = 0
    for i in range(peak + 1, len(tc)):
        run = run + 1 if tc[i] < thresh else 0
        if run >= window and su[i] < su[peak]:
            return {"step": steps[i - run + 1], "peak_step": steps[peak],
                    "peak_tool_calls": tc[peak], "tool_calls_after": tc[i],
                    "success_at_peak": su[peak], "success_after": su[i]}
    return None


def tool_call_trend(run: Path, window: int = 5, drop: float = 0.5,
                    log: Callable[[str], None] | None = None) -> dict:
    """Per-step tool calls and success of a run, their trailing means, and the collapse verdict.
    A torn last line of metrics.jsonl (a run killed mid-write) is dropped and reported to `log`."""
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"no metrics.jsonl in {run}")
    try:
        all_rows = read_metrics(path, on_torn=log)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    rows = [r for r in all_rows if "rollout/tool_calls" in r and "step" in r]
    if not rows:
        raise ConfigError(f"{path} has no training steps with rollout/tool_calls")
    steps = [r["step"] for r in rows]
    tc = [float(r["rollout/tool_calls"]) for r in rows]
    su = [float(r.get("success", 0.0)) for r in rows]
    ev = {r["step"]: r["eval/tool_calls"] for r in all_rows if "eval/tool_calls" in r and "step" in r}
    return {"run": str(run), "window": window, "drop": drop, "steps": steps, "tool_calls": tc,
            "success": su, "tool_calls_mean": trailing_mean(tc, window),
            "success_mean": trailing_mean(su, window),
            "eval_tool_calls": {str(k): v for k, v in ev.items()},
            "collapse": detect_collapse(steps, tc, su, window, drop)}
