"""benchmarks/bench_trl.py without TRL: the missing-trl exit, the prompts TRL is given (agentrl's
tasks and prompt ids), the reward, the warm-up-free per-step summary and the table's ratios."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_trl", ROOT / "benchmarks" / "bench_trl.py")
bt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bt)


def test_without_trl_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)        # `import trl` raises ImportError
    assert bt.trl_version() is None
    with pytest.raises(SystemExit) as e:
        bt.main([])
    assert e.value.code == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "pip install trl" in out and "not installed" in out


def test_arguments():
    args = bt.parse(["--steps", "2", "--warmup", "0", "--set", "rollout.group_size=4"])
    assert (args.steps, args.warmup, args.rounds, args.set) == (2, 0, 1, ["rollout.group_size=4"])
    assert list(bt.arms(args, "/m")) == ["agentrl", bt.ONE_TURN, "TRL"]
    assert bt.arms(args, "/m")[bt.ONE_TURN] == ("agentrl", ["env.max_turns=1", "model.name=/m"])
    assert list(bt.arms(bt.parse(["--no-one-turn"]), "/m")) == ["agentrl", "TRL"]
    with pytest.raises(SystemExit):
        bt.parse(["--steps", "0"])


def test_prompts_are_agentrls_tasks_and_ids():
    from transformers import AutoTokenizer

    from agentrl_cli.context import make_spec
    from agentrl_cli.rollout.tasks import TaskSampler
    from agentrl_cli.app.tiny_build import ensure_model

    cfg = bt.run_config(2, ["rollout.tasks_per_step=3"])
    assert (cfg.method, cfg.train.trace_every, cfg.train.eval_samples) == ("grpo", 0, 1)
    tok = AutoTokenizer.from_pretrained(ensure_model(cfg, log=lambda s: None))
    rows = bt.prompt_rows(cfg, tok, 2)
    spec = make_spec(cfg)
    sampler = TaskSampler(spec.tasks("train"), cfg.seed, 3)
    tasks = sampler.for_step(1) + sampler.for_step(2)
    assert [r["answer"] for r in rows] == [t.answer for t in tasks]
    for r, t in zip(rows, tasks):
        assert r["prompt"].startswith("<|im_start|>system\n")
        assert r["prompt"].endswith("<|im_start|>assistant\n")
        assert t.prompt in r["prompt"]
        assert tok(r["prompt"])["input_ids"] == r["ids"]   # what TRL's tokenisation gives


def test_reward_is_an_exact_answer():
    assert bt.answer_reward(["answer(Robro)", " answer(robro) ", "search(Robro)", "answer(Rob)"],
                            ["Robro"] * 4) == [1.0, 1.0, 0.0, 0.0]


def _step(cpu, tokens, rollout=0.5, episodes=64, turns=64, learn=1000):
    return {"cpu": cpu, "wall": cpu, "rollout_cpu": rollout, "tokens": tokens,
            "episodes": episodes, "turns": turns, "learn_tokens": learn}


def test_summary_leaves_out_the_warmup_and_the_table_has_the_ratios():
    a = bt.summary([_step(50.0, 10), _step(1.0, 3000, turns=320), _step(3.0, 5000, turns=320)], 1)
    assert a["steps"] == 2 and a["tokens/step"] == 4000 and a["CPU s/step"] == 2.0
    assert a["tok/CPU s (step)"] == 2000 and a["tok/CPU s (rollout)"] == 8000
    assert a["turns/episode"] == 5.0 and a["CPU s/step spread"] == (1.0, 3.0)
    t = bt.summary([_step(1.0, 500, rollout=0.25)], 0)
    one = bt.summary([_step(0.25, 500, rollout=0.25)], 0)
    with pytest.raises(ValueError):
        bt.summary([_step(1.0, 1)], 1)
    lines = bt.table({"agentrl": a, bt.ONE_TURN: one, "TRL": t})
    assert "agentrl/TRL" in lines[0] and "1-turn/TRL" in lines[0]
    step = next(l for l in lines if "tok/CPU s (step)" in l).split()
    assert step[-5:] == ["2000.0", "2000.0", "500.0", "4.00x", "4.00x"]
    roll = next(l for l in lines if "tok/CPU s (rollout)" in l).split()
    assert roll[-2:] == ["4.00x", "1.00x"]
    assert "1.00..3.00" in lines[-1]
