"""Sweeps over config keys, methods and seeds at a matched generation budget (`agentrl ablate`).

A sweep is a list of *axes*. An axis has a name and values; each value is a label and the
`--set` overrides it stands for (a plain config key `algo.beta` with values 0, 0.5, 1 gives
`algo.beta=0`, ...; a preset axis such as "refinement on/off" maps a label to several keys).
The methods are one more axis. Every combination is a *cell*, and every cell runs once per seed
as an ordinary `agentrl train` run in `<out>/cells/<cell>/seed-<S>/`.

Matched budget: every cell runs with the same `rollout.budget_tokens`. By default it is measured
[our choice]: the tokens one step of the base config's linear rollout generates (tasks_per_step
x group_size episodes of the initial policy on step 1's tasks, i.e. what a GRPO step spends), or
the base config's own `rollout.budget_tokens` when that is set. It is written to
`<out>/ablation.json` and reused when the sweep is rerun.

Resumable: a run whose folder has `summary.json` is finished and skipped; one with a checkpoint
resumes from it (`agentrl train --resume`); anything else starts over. Each run records its
full resolved config (the run's own `config.json`); a rerun with the same `--out` is refused,
before any run starts, when a cell that finished or stopped with a checkpoint ran with a
different config than the rerun would give it (`check_rerun`: another `--steps`, base `--set`,
`--config` or `--budget`). Only `RERUN_MAY_CHANGE` may differ (how often a run checks and saves,
where its metrics and rollouts go): none of them changes what a run computes.
Cells run one after another in this process (`jobs = 1`) or as `jobs` parallel
`agentrl train` subprocesses (each with its log in `<out>/logs/<cell>-seed-<S>.log`, outside the
run folder, which only the run itself writes).

Modules: `ablate.plan` (axes, cells, presets, the sweep and its plan), `ablate.budget` (the
matched budget of a sweep), `ablate.run` (rerun checks, running the cells here or as
subprocesses), `ablate.aggregate` (per-cell results, summary.json and summary.csv),
`ablate.reads` (which keys a method reads, from what its parts declare where they register),
`ablate.tune` (the tuning stage, `--tune`: each method's grid on exploration seeds, the
mean-of-checks pick), `ablate.command` (`agentrl ablate`'s library function); the table and figures are
`reporting.ablation`'s.

Presets (`plan.PRESETS`): the papers' named ablations: FOCUS refinement rollouts on/off,
compaction vs workspace, free vs structured compaction; MPO turn vs token ratio; TRACE K = 3
vs 0.

Tuning (`--tune`, `ablate.tune`): before the cells run, every method runs the same number of
points of its own grid on exploration seeds (100 and up, never verdict seeds); each method's
cells then run at its point with the highest mean of held-out checks.

Reported per cell (mean ± sample std over its finished seeds): the final held-out success, the
tokens generated in training, the tasks a step learnt from, the share of mixed-outcome groups,
generated tokens per held-out question and the method's tuned values, in one table
(`summary.csv`, `summary.json`), plus `learning_curves.png` (held-out success vs step) and
`final_vs_param.png` (final success vs each swept value).
"""
from __future__ import annotations
