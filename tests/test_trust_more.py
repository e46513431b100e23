"""User mistakes are one line, exit 2, before any work, and leave nothing behind: a sweep rerun
with other settings, bad sweep values, bounds on what a rollout may allocate, an env option out
of range, an unwritable --json, a model that is not there, a full disk during a checkpoint,
and hints that name options the command has."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli.ablate import budget as ABU, run as AR
from agentrl_cli.cli.main import app
from conftest import MICRO

runner = CliRunner(env={"COLUMNS": "1000"})
FAST = MICRO + ["train.eval_every=0", "train.steps=1"]


def _one_line_exit_2(res, needle: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.output, res.output


def _stderr_one_line_exit_2(res, needle: str) -> None:
    """As `_one_line_exit_2`, on stderr only (stdout may carry a first build of `tiny`)."""
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.output, res.output


def _sets(extra=()):
    return [a for s in [*FAST, *extra] for a in ("--set", s)]


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in folder.rglob("*")}


# ------------------------------------------------------------------ ablate records and refuses
def _fake_train(calls: list, finish: bool = True):
    """A run of a sweep without the work: its config.json (as the trainer writes it) and, when
    `finish`, its summary.json; a checkpoint marker otherwise (a partial run)."""
    def fake(sweep, cell, seed, log=lambda s: None, probe=None):
        calls.append((cell.name, seed))
        run = sweep.run_dir(cell, seed)
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.json").write_text(json.dumps(sweep.cell_config(cell, seed).to_dict()))
        s = {"final_success": 0.25, "tokens_generated": 100, "final_tokens_per_question": 5.0,
             "base_success": 0.1, "wall_seconds": 1.0}
        if finish:
            (run / "summary.json").write_text(json.dumps(s))
        else:
            (run / "checkpoints").mkdir(exist_ok=True)
            (run / "checkpoints" / "latest").write_text("step-000001")
        return s
    return fake


SWEEP = ["ablate", "--method", "grpo", "--grid", "algo.kl_coef=0,1", "--budget", "10"]


@pytest.mark.parametrize("finish", [True, False], ids=["finished", "partial"])
@pytest.mark.parametrize("change, needle", [
    (["--steps", "2"], "run with train.steps=1; this rerun would give it train.steps=2: "
                       "rerun with --steps 1"),
    (["--set", "train.lr=0.001"], "run with train.lr=0.0002; this rerun would give it "
                                  "train.lr=0.001: rerun with --set train.lr=0.0002"),
    (["--config", "{tmp}/c.yaml"], "run with rollout.top_p=1.0; this rerun would give it "
                                   "rollout.top_p=0.9"),
])
def test_a_sweep_rerun_with_other_settings_is_refused(tmp_path, monkeypatch, finish, change,
                                                       needle):
    """Rerunning a sweep in the same --out with another --steps, base --set or --config than
    its runs ran with: one line naming the key and both values, before any run, and the
    sweep's record and table are left as they were."""
    (tmp_path / "c.yaml").write_text("rollout:\n  top_p: 0.9\n")
    out = tmp_path / "sw"
    calls: list = []
    monkeypatch.setattr(AR, "_train_here", _fake_train(calls, finish))
    r = runner.invoke(app, [*SWEEP, "--out", str(out), *_sets()])
    assert r.exit_code == 0, r.output
    assert len(calls) == 2
    before = _snapshot(out)
    calls.clear()
    change = [c.replace("{tmp}", str(tmp_path)) for c in change]
    r = runner.invoke(app, [*SWEEP, "--out", str(out), *_sets(), *change])
    _one_line_exit_2(r, needle)
    assert "grpo_kl_coef=0 seed 0" in r.output
    assert calls == [] and _snapshot(out) == before


def test_a_sweep_rerun_with_a_new_budget_is_refused_for_a_partial_run(tmp_path, monkeypatch):
    out = tmp_path / "sw"
    monkeypatch.setattr(AR, "_train_here", _fake_train([], finish=False))
    r = runner.invoke(app, [*SWEEP, "--out", str(out), *_sets()])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, [*SWEEP[:-1], "12", "--out", str(out), *_sets()])
    _one_line_exit_2(r, "rollout.budget_tokens=10; this rerun would give it "
                        "rollout.budget_tokens=12: rerun with --budget 10")


def test_a_sweep_rerun_may_change_how_often_it_checks(tmp_path, monkeypatch):
    """The same sweep again skips its finished runs; a key of RERUN_MAY_CHANGE may differ."""
    out = tmp_path / "sw"
    calls: list = []
    monkeypatch.setattr(AR, "_train_here", _fake_train(calls))
    r = runner.invoke(app, [*SWEEP, "--out", str(out), *_sets()])
    assert r.exit_code == 0, r.output
    calls.clear()
    assert "train.eval_every" in AR.RERUN_MAY_CHANGE and "train.steps" not in AR.RERUN_MAY_CHANGE
    r = runner.invoke(app, [*SWEEP, "--out", str(out), *_sets(["train.eval_every=5"])])
    assert r.exit_code == 0, r.output
    assert "skipping 2 finished" in r.output and calls == []


@pytest.mark.parametrize("args, needle", [
    (["--kappa", "-1,1"], "algo.kappa must be >= 0, got -1.0"),
    (["--method", "focus", "--set", "algo.kappa=-1"], "algo.kappa must be >= 0"),
    (["--method", "nope"], "unknown method 'nope'"),
    (["--method", "grpo", "--set", "train.eval_tasks=100"],
     "train.eval_tasks=100 is above the search eval split's 60 tasks"),
    (["--method", "grpo", "--grid", "env.n_eval=2,60"],
     "train.eval_tasks=3 is above the search eval split's 2 tasks"),
    (["--method", "grpo", "--seed", str(2**63 - 1), "--seeds", "2"],
     "--seeds 2 from seed 9223372036854775807 runs seed 9223372036854775808: seed must be <="),
])
def test_a_bad_sweep_leaves_no_out_folder(tmp_path, monkeypatch, args, needle):
    monkeypatch.setattr(AR, "_train_here", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr(ABU, "measure_budget", lambda *a, **k: pytest.fail("work started"))
    out = tmp_path / "sw"
    r = runner.invoke(app, ["ablate", "--out", str(out), *_sets(), *args])
    _one_line_exit_2(r, needle)
    assert not out.exists()


# ---------------------------------------------------------- raw tracebacks become one line
@pytest.mark.parametrize("cmd", [
    ["train", "--out", "{tmp}/run"],
    ["eval", "--tasks", "1", "--n", "1"],
    ["rollout", "--n", "1", "--policy", "expert", "--out", "{tmp}/e.jsonl"],
])
def test_a_search_option_out_of_range_is_one_line(tmp_path, monkeypatch, cmd):
    monkeypatch.chdir(tmp_path)
    args = [c.replace("{tmp}", str(tmp_path)) for c in cmd]
    res = runner.invoke(app, [*args, *_sets(), "--set", "env.max_hops=6"])
    _one_line_exit_2(res, "env.max_hops must be at most 5 for the search env")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_full_disk_during_a_checkpoint_keeps_the_last_good_one(tmp_path, monkeypatch):
    """The second checkpoint's write fails with ENOSPC: one line naming it and the first,
    which is kept (and still what `latest` names); no temp folder is left; the run resumes."""
    import errno

    from agentrl_cli.train import checkpoint

    real, calls = checkpoint.torch.save, []

    def full(obj, f, *a, **k):
        calls.append(f)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(checkpoint.torch, "save", full)
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(run), *_sets(),
                              "--set", "train.steps=2", "--set", "train.save_every=1",
                              "--set", "train.eval_tasks=1"])
    assert res.exit_code == 2, res.output
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    first, second = checkpoint.step_dir(run, 1), checkpoint.step_dir(run, 2)
    assert len(err) == 1 and "Traceback" not in res.output, res.output
    assert f"cannot write checkpoint {second} (No space left on device)" in err[0]
    assert f"the last good checkpoint, {first}, is kept" in err[0]
    assert f"--resume {run}" in err[0]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000001"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000001"
    assert checkpoint.verify(first) is None


# ------------------------------------------------------------------ a model that is not there
@pytest.mark.parametrize("cmd", [
    ["train", "--out", "{tmp}/run"],
    ["eval", "--tasks", "1", "--n", "1"],
    ["rollout", "--n", "1", "--out", "{tmp}/e.jsonl"],
    ["ablate", "--method", "grpo", "--budget", "10", "--out", "{tmp}/sw"],
])
def test_a_model_that_is_not_there_fails_fast_offline(tmp_path, monkeypatch, cmd):
    """A typo'd hub id with HF_HUB_OFFLINE=1: one line in well under the loader's minute of
    retries, exit 2, and no run folder, lock or output file left."""
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    args = [c.replace("{tmp}", str(tmp_path)) for c in cmd]
    t0 = time.time()
    res = runner.invoke(app, [*args, *_sets(), "--set", "model.name=not/a-real-model"])
    _one_line_exit_2(res, "model.name: 'not/a-real-model' is not a local folder and not in the "
                          "Hugging Face cache, and HF_HUB_OFFLINE=1")
    assert time.time() - t0 < 5
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_unreachable_hub_is_asked_once_without_retries(tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    from agentrl_cli.app import preflight

    calls = []

    def unreachable(self, name, timeout=None, **k):
        calls.append((name, timeout))
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(HfApi, "model_info", unreachable)
    preflight._ask_hub.cache_clear()
    res = runner.invoke(app, ["train", "--model", "not/a-real-model2", "--out",
                              str(tmp_path / "run"), *_sets()])
    _one_line_exit_2(res, "model.name: 'not/a-real-model2' is not a local folder nor in the "
                          "Hugging Face cache, and the hub cannot be reached")
    assert calls == [("not/a-real-model2", preflight.HUB_TIMEOUT)]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cmd", [
    ["eval", "--tasks", "1", "--n", "1"],
    ["diagnose", "audit-tree", "--png", "{tmp}/a.png", "--tasks", "1"],
])
def test_an_unwritable_json_path_is_refused_before_the_work(tmp_path, monkeypatch, cmd):
    """`--json /proc/x`: the mode bits say writable to root, the write would fail at the end;
    it is one line before the work."""
    import agentrl_cli.models.loading as ml

    monkeypatch.setattr(ml, "load_policy", lambda *a, **k: pytest.fail("work started"))
    args = [c.replace("{tmp}", str(tmp_path)) for c in cmd]
    res = runner.invoke(app, [*args, "--json", "/proc/x"])
    _one_line_exit_2(res, "--json /proc/x: cannot write in /proc")


# ------------------------------------------------------- hints name options the command has
def _commands() -> dict:
    """'train', 'diagnose variance', ... -> the click command."""
    import typer

    out = {}

    def walk(c, name):
        if hasattr(c, "commands"):        # a group (typer may bring its own click)
            for n, sub in c.commands.items():
                walk(sub, f"{name} {n}".strip())
        else:
            out[name] = c
    walk(typer.main.get_command(app), "")
    return out


def _options(command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)}


def _unknown_options(text: str, here: str, commands: dict) -> list[str]:
    """The `--options` that `text` names and the command they belong to lacks: after
    `agentrl <cmd>` the options are that command's, otherwise `here`'s."""
    import re

    bad = []
    for m in re.finditer(r"(?:agentrl ((?:diagnose )?[a-z-]+)[^.;:]*?)?(?<![\w-])(--[a-z][a-z-]*)",
                         text):
        cmd = m.group(1) if m.group(1) in commands else here
        if cmd and m.group(2) not in _options(commands[cmd]):
            bad.append(f"{cmd}: {m.group(2)}")
    return bad


def test_help_texts_name_only_options_their_command_has():
    commands = _commands()
    bad = []
    for name, c in commands.items():
        for text in [c.help or "", *(getattr(p, "help", "") or "" for p in c.params)]:
            bad += _unknown_options(text, name, commands)
    assert bad == []


@pytest.mark.parametrize("cmd, args", [
    ("train", ["--model", "{run}"]),
    ("train", ["--set", "model.critic=separate", "--set", "model.critic_path={run}"]),
    ("eval", ["--model", "{run}"]),
    ("rollout", ["--model", "{run}", "--out", "{tmp}/e.jsonl"]),
    ("train", ["--out", "{run}"]),
    ("eval", ["--tasks", "61"]),
    ("train", ["--resume", "{run}", "--out", "{tmp}/x"]),
    ("train", ["--resume", "{run}", "--seed", "3"]),
    ("rollout", ["--out", "{tmp}/exists.jsonl", "--policy", "expert"]),
])
def test_error_hints_name_only_options_the_command_has(tmp_path, monkeypatch, cmd, args):
    """A one-line error's hint (`--checkpoint ...`, `--resume ...`) names options of the
    command the user ran (or of the `agentrl <command>` it names)."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000001").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    (run / ".agentrl-run.json").write_text(json.dumps(
        {"agentrl_run": 1, "files": ["config.json", "metrics.jsonl", "checkpoints"]}))
    (tmp_path / "exists.jsonl").write_text("")
    args = [a.replace("{run}", str(run)).replace("{tmp}", str(tmp_path)) for a in args]
    res = runner.invoke(app, [cmd, *args, *([] if "--resume" in args else _sets())])
    assert res.exit_code == 2, res.output
    line = [ln for ln in res.output.splitlines() if ln.strip()][-1]
    assert _unknown_options(line, cmd, _commands()) == [], line


# ------------------------------------------------------------ what a rollout may allocate
def test_a_prompt_longer_than_max_tokens_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """A prompt is fed whole: one longer than rollout.max_tokens (a BFCL prompt with its
    function docs, through a byte-level tokenizer) is one line before the weights load."""
    import agentrl_cli.models.loading as ml

    monkeypatch.setattr(ml, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "e.jsonl"
    res = runner.invoke(app, ["rollout", "--n", "2", "--out", str(out), *_sets(),
                              "--set", "rollout.max_tokens=20"])
    _stderr_one_line_exit_2(res, "above rollout.max_tokens=20: a prompt is fed whole")
    assert "the search prompt of task" in res.output and not out.exists()


@pytest.mark.parametrize("method", [None, "focus"])
def test_rows_in_flight_times_the_context_must_fit_in_memory(tmp_path, monkeypatch, method):
    """rows in flight (linear: min(n, batch_size); a FOCUS tree keeps up to 2 x batch_size rows)
    x rollout.max_tokens of KV cache, plus the CPU attention of the longest prompt, against the
    available memory: over it is one line naming the keys, before the model loads."""
    import agentrl_cli.models.loading as ml
    from agentrl_cli.app import preflight

    monkeypatch.setattr(ml, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    seen = []
    real = preflight.rollout_bytes

    def spy(model, rows, *a):
        seen.append(rows)
        return real(model, rows, *a)

    monkeypatch.setattr(preflight, "rollout_bytes", spy)
    monkeypatch.setattr(preflight, "available_memory", lambda: 10_000)
    out = tmp_path / "e.jsonl"
    res = runner.invoke(app, ["rollout", "--n", "3", "--out", str(out), *_sets(),
                              "--set", "rollout.batch_size=5",
                              *(["--method", method] if method else [])])
    _stderr_one_line_exit_2(res, "rows in flight x rollout.max_tokens=768")
    assert "above the 0.0 GiB available" in res.output and not out.exists()
    assert seen == [10 if method else 3]
    # the micro model's KV cache at these sizes, from its config.json
    kv, att = preflight.rollout_bytes({"num_hidden_layers": 2, "num_attention_heads": 4,
                                   "num_key_value_heads": 2, "head_dim": 32}, 3, 768, 100, 4, True)
    assert kv == 3 * 768 * 2 * 2 * 2 * 32 * 4 and att == 3 * 5 * 100 * 100 * 4


def test_train_and_eval_check_prompts_and_rollout_memory_before_any_work(tmp_path):
    """The rollout bounds of `agentrl rollout` hold for `train` and `eval` too: a prompt above
    rollout.max_tokens is one line, exit 2, before any run folder is written."""
    from typer.testing import CliRunner

    from agentrl_cli.cli.main import app
    from conftest import MICRO

    runner = CliRunner()
    # the default config: the shipped agent, whose tokenizer the check reads before any work
    sets = ["--set", "rollout.max_tokens=24", "--set", "rollout.max_new_tokens=8"]
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(tmp_path / "run"), *sets])
    assert res.exit_code == 2, res.output
    assert "rollout.max_tokens" in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
    res = runner.invoke(app, ["eval", *sets])
    assert res.exit_code == 2 and "rollout.max_tokens" in res.output, res.output
    # a tiny model built by the run itself is checked once it exists, still before any step
    micro = [a for s in [*MICRO, "rollout.max_tokens=24", "rollout.max_new_tokens=8"]
             for a in ("--set", s)]
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(tmp_path / "r2"), *micro])
    assert res.exit_code == 2 and "rollout.max_tokens" in res.output, res.output
    assert not (tmp_path / "r2" / "metrics.jsonl").exists()
