"""The tool-call table of docs/results.md (`agentrl diagnose tool-call-table`): tool calls per
episode over training, per method (or sweep cell) over its seeds, with `agentrl diagnose
tool-calls`'s collapse verdict per seed.

Columns, each a mean over seeds: training tool calls per episode over consecutive stretches of
the run (`--windows` equal stretches; the first and last say whether calls fell), training
reward and success over the last stretch, held-out tool calls and success at the first and the
last check, context resets per training episode, and the seeds whose run `detect_collapse`
(the rule of `agentrl diagnose tool-calls`) flags as collapsed (tool calls below half their peak
for five steps while success falls)."""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from ...reporting.run_reader import read_run, runs_under
from ..tool_calls import detect_collapse


def load_run(run: Path, windows: int) -> dict | None:
    """One finished run's numbers (None without summary.json or training steps)."""
    folder = read_run(run)
    if folder is None:
        return None
    steps, checks = folder.steps("rollout/tool_calls"), folder.checks()
    windows = min(windows, len(steps))       # a run shorter than the stretches asked for
    if not windows:
        return None
    size = len(steps) // windows
    stretches = [steps[i * size:(i + 1) * size] for i in range(windows)]
    stretches[-1] = steps[(windows - 1) * size:]
    last = stretches[-1]
    collapse = detect_collapse([r["step"] for r in steps], [r["rollout/tool_calls"] for r in steps],
                               [float(r.get("success", 0.0)) for r in steps])
    return {"label": folder.label, "seed": folder.seed,
            "spans": [(s[0]["step"], s[-1]["step"]) for s in stretches],
            "calls": [statistics.mean(r["rollout/tool_calls"] for r in s) for s in stretches],
            "reward": statistics.mean(r.get("reward/mean", 0.0) for r in last),
            "success": statistics.mean(r.get("success", 0.0) for r in last),
            "resets": statistics.mean(r.get("rollout/context_resets", 0.0) for r in steps),
            "eval_calls": (checks[0].get("eval/tool_calls"), checks[-1].get("eval/tool_calls")),
            "eval_success": (checks[0]["eval/success"], checks[-1]["eval/success"]),
            "collapse": collapse}


def collect(paths: list[Path], windows: int) -> dict[str, list[dict]]:
    """label -> its runs, from run folders and ablate folders (their cells/*/seed-*)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for run in runs_under(paths):
        r = load_run(run, windows)
        if r is not None:
            out[r["label"]].append(r)
    return out


def _mean(xs) -> str:
    xs = [x for x in xs if x is not None]
    return f"{statistics.mean(xs):.2f}" if xs else "–"


def table(groups: dict[str, list[dict]]) -> str:
    if not groups:
        return "no finished runs"
    spans = next(iter(groups.values()))[0]["spans"]
    heads = [f"calls, steps {a}-{b}" for a, b in spans]
    lines = ["| method | seeds | " + " | ".join(heads) + " | reward, last stretch | success, "
             "last stretch | held-out calls, first / last check | held-out success, first / "
             "last check | resets / episode | collapsed seeds |",
             "|---|---|" + "---|" * (len(heads) + 6)]
    for label, runs in groups.items():
        runs = sorted(runs, key=lambda r: r["seed"])
        calls = [_mean(r["calls"][i] for r in runs) for i in range(len(spans))]
        collapsed = [str(r["seed"]) for r in runs if r["collapse"] is not None]
        lines.append(
            f"| `{label}` | {','.join(str(r['seed']) for r in runs)} | " + " | ".join(calls)
            + f" | {_mean(r['reward'] for r in runs)} | {_mean(r['success'] for r in runs)} | "
            f"{_mean(r['eval_calls'][0] for r in runs)} / {_mean(r['eval_calls'][1] for r in runs)} | "
            f"{_mean(r['eval_success'][0] for r in runs)} / "
            f"{_mean(r['eval_success'][1] for r in runs)} | {_mean(r['resets'] for r in runs)} | "
            f"{', '.join(collapsed) or 'none'} |")
    return "\n".join(lines)
