"""benchmarks.yaml and its loader, `--benchmark`, the qa adapter, and experiments/*.yaml."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.errors import ConfigError
from agentrl_cli.envs import ENVS
from agentrl_cli.envs import benchmarks as bm
from agentrl_cli.envs.qa import QAEnv, extract_answer, verify

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {"math-l45", "deonticbench-airline", "deonticbench-sara-numeric",
            "deonticbench-sara-binary", "browsecomp-plus", "locbench", "tau2-retail", "gaia",
            "hle", "bfcl-multi-turn-base", "bfcl-multi-turn-miss-func",
            "bfcl-multi-turn-miss-param", "bfcl-multi-turn-long-context", "search", "search-long",
            "search-long-compaction",
            "locate", "rules", "math", "allocation-early", "allocation-late", "allocation-recover"}


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_DATA", str(tmp_path))
    return tmp_path


def _math_data(root: Path) -> None:
    rows = [{"problem": "What is 1/2 + 1/4?", "solution": "So $\\boxed{\\frac{3}{4}}$.", "level": "Level 4"},
            {"problem": "1 + 1?", "solution": "$\\boxed{2}$", "level": "Level 1"},
            {"problem": "x^2 = 9, x > 0.", "solution": "Hence $x = \\boxed{3}$.", "level": "Level 5"},
            {"problem": "No final answer.", "solution": "It is 3.", "level": "Level 5"}]
    (root / "math-l45").mkdir()
    for split in ("train", "test"):
        (root / "math-l45" / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def test_the_file_has_every_benchmark_and_its_envs_exist():
    table = bm.load_benchmarks()
    assert bm.benchmarks_file() == ROOT / "benchmarks.yaml"
    assert set(table) == EXPECTED
    for b in table.values():
        assert b.env in ENVS and b.cpu_env in ENVS, b.name
        assert ENVS.get(b.cpu_env) is not None
        assert b.adapter == "builtin" or b.cpu_env in {"search", "locate", "rules", "math"} \
            or b.adapter == "bfcl", b.name
        assert b.metrics and b.data["get"]
    assert {k: v["size"] for k, v in table["browsecomp-plus"].splits.items()} == \
        {"train": 498, "dev": 83, "eval": 249}
    assert table["locbench"].splits["eval"]["size"] == 560


def test_reference_numbers_are_the_papers():
    rows = {(r[0], r[1], r[3]): r[4] for b in bm.load_benchmarks().values() for r in b.reference_rows()}
    assert rows[("FOCUS", "Qwen3.5-9B", "focus")] in {"56.5", "55.4", "72.4 / 81.6"}
    bc = {(r[0], r[1], r[3]): r[4] for r in bm.get_benchmark("browsecomp-plus").reference_rows()}
    assert bc[("FOCUS", "Qwen3.5-9B", "focus")] == "55.4" and bc[("FOCUS", "Qwen3.5-9B", "grpo")] == "48.2"
    assert bc[("TRACE", "Qwen3-4B", "trace")] == "35.6" and bc[("TRACE", "Qwen3-30B-A3B", "start")] == "8.4"
    de = {(r[1], r[3]): r[4] for r in bm.get_benchmark("deonticbench-sara-binary").reference_rows()}
    assert de[("Qwen3.5-9B", "vineppo")] == "49.4" and de[("Qwen3.5-27B (LoRA)", "focus")] == "76.3"
    lb = {r[3]: r[4] for r in bm.get_benchmark("locbench").reference_rows()}
    assert lb == {"focus": "72.4 / 81.6", "grpo": "70.1 / 80.5", "vineppo": "67.8 / 79.3"}
    ma = {r[3]: r[4] for r in bm.get_benchmark("math-l45").reference_rows()}
    assert (ma["focus"], ma["grpo"], ma["ppo"]) == ("2782", "5747", "7207")
    tau = {r[3]: r[4] for r in bm.get_benchmark("tau2-retail").reference_rows()}
    assert (tau["start"], tau["grpo"]) == ("0.25", "0.44")


def test_missing_data_is_one_line_with_how_to_get_it(data_dir):
    for name in ("math-l45", "browsecomp-plus", "deonticbench-sara-numeric", "gaia"):
        b = bm.get_benchmark(name)
        assert b.data_status() == "missing"
        with pytest.raises(ConfigError) as e:
            b.check()
        msg = str(e.value)
        assert "\n" not in msg and str(data_dir) in msg and b.data["get"] in msg
    with pytest.raises(ConfigError, match="no data at"):      # the env name says the same
        ENVS.get("math-l45")(seed=0)
    (data_dir / "locbench").mkdir()                            # data present, no adapter
    with pytest.raises(ConfigError, match="no adapter for the real data.*--env locate"):
        bm.get_benchmark("locbench").check()
    with pytest.raises(ConfigError, match="did you mean 'locbench'"):
        bm.get_benchmark("locbench2")
    assert bm.get_benchmark("search").data_status() == "built-in"
    assert bm.get_benchmark("bfcl-multi-turn-base").data_status() == "ready"


def test_cli_benchmark_errors_exit_2(data_dir):
    runner = CliRunner()
    for args, text in [(["rollout", "--benchmark", "math-l45"], "no data at"),
                       (["train", "--benchmark", "browsecomp-plus"], "Tevatron/browsecomp-plus"),
                       (["eval", "--benchmark", "nope"], "unknown benchmark 'nope'"),
                       (["rollout", "--benchmark", "search", "--env", "search"], "not both"),
                       (["benchmarks", "nope"], "unknown benchmark")]:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert text in res.output and res.output.strip().count("\n") == 0, res.output
    res = runner.invoke(app, ["benchmarks"])
    assert res.exit_code == 0 and "browsecomp-plus" in res.output
    res = runner.invoke(app, ["benchmarks", "locbench"])
    assert res.exit_code == 0 and "72.4 / 81.6" in res.output


def test_benchmark_presets_rank_below_file_and_set(tmp_path):
    from agentrl_cli.app.preflight import load_config

    cfg = load_config(None, None, benchmark="bfcl-multi-turn-base")
    assert (cfg.env.name, cfg.env.max_turns, cfg.rollout.max_tokens) == \
        ("bfcl-multi-turn-base", 20, 131072)
    f = tmp_path / "c.yaml"
    f.write_text("env:\n  max_turns: 7\nrollout:\n  max_tokens: 4096\n")
    cfg = load_config(f, ["rollout.max_tokens=2048"], benchmark="bfcl-multi-turn-base")
    assert (cfg.env.max_turns, cfg.rollout.max_tokens) == (7, 2048)
    with pytest.raises(ConfigError, match="unknown config key"):
        config.load(presets={"env.nmae": 1})
    cfg = load_config(None, None, env="bfcl-multi-turn-long-context")   # --env: same presets
    assert (cfg.env.max_turns, cfg.rollout.max_tokens) == (20, 131072)
    cfg = load_config(None, None, env="search")
    assert cfg.rollout.max_tokens == config.RunConfig().rollout.max_tokens


def test_qa_adapter_on_local_data(data_dir):
    _math_data(data_dir)
    b = bm.get_benchmark("math-l45")
    assert b.data_status() == "ready"
    spec = ENVS.get("math-l45")(seed=0, max_turns=3)
    tasks = spec.tasks("eval")
    assert [t.answer for t in tasks] == ["\\frac{3}{4}", "3"]   # levels 4-5 with a boxed answer
    assert tasks[0].prompt == "What is 1/2 + 1/4?" and len(spec.tasks("train")) == 2
    env = spec.make()
    env.reset(tasks[0])
    res = env.step(spec.expert(env, random.Random(0)))
    assert res.terminated and res.reward == 1.0
    env.reset(tasks[0])
    assert env.step("Adding gives 0.75, so the answer is answer(0.75)").reward == 1.0
    env.reset(tasks[0])
    assert env.step("\\boxed{5/6}").reward == 0.0
    env.reset(tasks[1])
    snap = env.snapshot()
    r1 = [env.step("thinking").observation for _ in range(2)]
    res = env.step("still thinking")
    assert res.truncated and not res.info["success"] and r1[0].startswith("No final answer")
    env.restore(snap)
    assert env.step("\\boxed{3}").reward == 1.0


def test_qa_answers_and_verifiers():
    assert extract_answer("so answer(42).") == "42"
    assert extract_answer("first answer(1) then answer('Yes')") == "Yes"
    assert extract_answer("x = \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_answer("the answer is 3") is None
    assert verify("\\frac{1}{2}", "0.5", "math") and not verify("1/3", "0.5", "math")
    assert verify("$1,234.00", "1234", "number") and not verify("1235", "1234", "number")
    assert verify("Entailment.", "entailment", "exact") and not verify("", "", "exact")
    with pytest.raises(ValueError):
        QAEnv("fuzzy")


def test_cli_expert_rollout_through_benchmark(data_dir, tmp_path):
    _math_data(data_dir)
    runner = CliRunner()
    out = tmp_path / "m.jsonl"
    res = runner.invoke(app, ["rollout", "--benchmark", "math-l45", "--policy", "expert",
                              "--n", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    eps = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(eps) == 2 and all(e["success"] for e in eps)
    out = tmp_path / "b.jsonl"
    res = runner.invoke(app, ["rollout", "--benchmark", "bfcl-multi-turn-base", "--policy",
                              "expert", "--n", "3", "--out", str(out)])
    assert res.exit_code == 0, res.output
    eps = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(eps) == 3 and all(e["success"] and e["finish"] == "answer" for e in eps)
    assert all(e["num_tool_calls"] >= 3 for e in eps)


# ----------------------------------------------------------------------------- experiments
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))


def test_experiments_exist_in_pairs():
    names = {p.stem for p in EXPERIMENTS}
    full = {n for n in names if not n.endswith("-cpu")}
    assert full == {"focus-math", "focus-deonticbench", "focus-browsecomp-plus", "focus-locbench",
                    "mpo-search", "trace-browsecomp-plus", "grpo-tau2-retail",
                    "focus-deonticbench-lora"}
    assert {n + "-cpu" for n in full} == names - full


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_experiment_loads(path):
    cfg = config.load(str(path))
    table = bm.load_benchmarks()
    envs = {b.env: b for b in table.values()}
    assert cfg.env.name in envs
    if path.stem.endswith("-cpu"):
        assert cfg.model.name == "tiny" and envs[cfg.env.name].adapter == "builtin"
    else:
        assert cfg.model.name != "tiny" and envs[cfg.env.name].adapter != "builtin"
        assert cfg.method == path.stem.split("-")[0]
    # the papers' hyperparameters (the papers)
    if cfg.method == "focus":
        assert (cfg.algo.kappa, cfg.algo.gamma, cfg.algo.focus_lam, cfg.algo.focus_max_inflight) == (1.0, 1.0, 0.0, 2)
        assert cfg.rollout.budget_tokens > 0          # matched per-step generation budget
    if cfg.method == "mpo":
        assert (cfg.algo.lam, cfg.algo.lam_intra, cfg.algo.beta, cfg.algo.loss) == (0.8, 0.95, 1.0, "turn_ratio")
    if cfg.method == "trace":
        a = cfg.algo
        assert (a.trace_eps, a.trace_k, a.gamma_td, a.lambda_term, a.alpha_out, a.alpha_turn,
                cfg.rollout.group_size) == (0.1, 3, 0.8, 2.0, 1.0, 0.2, 8)
