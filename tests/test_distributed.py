"""Data-parallel learner: 2 CPU processes over gloo (spawned, with torchrun's environment
variables) take one update on their halves of a global batch and end with the parameters of one
process taking the whole batch; then `train()` runs one data-parallel step end to end."""
from __future__ import annotations

import copy
import json
import os
import socket

import pytest
import torch

from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.credit.estimators import ESTIMATORS
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.rollout.runner import run_episodes
from agentrl_cli.train import distributed
from agentrl_cli.train.batch import collate
from agentrl_cli.train.learner import build_learner, score, update

from conftest import MICRO

# PPO with a critic (a separate model: its parameters are all-reduced with the policy's), two
# epochs, one episode per micro-batch (gradient accumulation), clipping
SETS = MICRO + ["algo.whiten=false", "train.ppo_epochs=2", "train.max_tokens_per_microbatch=64",
                "train.grad_clip=0.5", "rollout.tasks_per_step=2", "model.critic=separate"]


def _cfg():
    return config.load(sets=SETS, method="ppo")


def _global_episodes(micro_policy):
    """4 groups x 2 episodes with made-up, varied rewards (an untrained model rarely succeeds)."""
    model, tok, fmt, spec = micro_policy
    tasks = spec.tasks("train", 4)
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(2)]
    eps = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, pairs, SamplingParams(max_new_tokens=8),
                       512, len(pairs), torch.Generator().manual_seed(3))
    for i, e in enumerate(eps):
        e.reward = [0.0, 1.0, 0.5][i % 3]
    return eps


def _one_update(learner, eps, cfg, fmt):
    batch = collate(eps, fmt.pad_id)
    score(learner, batch, cfg)
    credit = ESTIMATORS.get(cfg.algo.estimator)(batch, cfg.algo)
    batch.advantages, batch.returns, batch.value_mask = credit.advantages, credit.returns, credit.value_mask
    return update(learner, batch, cfg, step=1)


def _rank_main(rank, world, port, eps, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from agentrl_cli.models.loading import load_policy
    from agentrl_cli.app.train import train

    cfg = _cfg()
    comm = distributed.from_env(cfg)
    model, tok, fmt, _ = load_policy(cfg, log=lambda s: None)
    learner = build_learner(cfg, model, comm)
    mine = [e for e in eps if e.group % world == rank]   # whole groups, as `comm.share` of tasks
    stats = _one_update(learner, mine, cfg, fmt)
    torch.save({"params": [p.detach().clone() for p in learner.params], "stats": stats},
               os.path.join(out_dir, f"update{rank}.pt"))
    # one data-parallel training step end to end (eval on rank 0 only, metrics over ranks)
    e2e = config.load(sets=MICRO + ["train.steps=1", "rollout.tasks_per_step=2", "train.eval_tasks=1"],
                      method="grpo")
    summary = train(e2e, __import__("pathlib").Path(out_dir) / "run", log=lambda s: None)
    with open(os.path.join(out_dir, f"summary{rank}.json"), "w") as f:
        json.dump(summary, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_equal_one_process_with_the_global_batch(micro_policy, tmp_path):
    import torch.multiprocessing as mp

    model, tok, fmt, spec = micro_policy
    eps = _global_episodes(micro_policy)
    assert len({e.reward for e in eps}) > 1
    mp.spawn(_rank_main, args=(2, _free_port(), eps, str(tmp_path)), nprocs=2, join=True)

    cfg = _cfg()
    single = build_learner(cfg, copy.deepcopy(model))
    start = [p.detach().clone() for p in single.params]
    stats = _one_update(single, copy.deepcopy(eps), cfg, fmt)
    r0, r1 = (torch.load(tmp_path / f"update{r}.pt") for r in (0, 1))
    moved = 0.0
    for a, b, c, p0 in zip(r0["params"], r1["params"], single.params, start):
        assert torch.equal(a, b), "ranks must hold identical parameters"
        torch.testing.assert_close(a, c.detach(), rtol=1e-5, atol=1e-6)
        moved = max(moved, float((c.detach() - p0).abs().max()))
    assert moved > 1e-4, "the update must change the parameters"
    assert r0["stats"]["loss/critic"] == pytest.approx(stats["loss/critic"], rel=1e-4)
    assert r0["stats"]["loss/policy"] == pytest.approx(stats["loss/policy"], rel=1e-4, abs=1e-7)

    s0 = json.loads((tmp_path / "summary0.json").read_text())
    s1 = json.loads((tmp_path / "summary1.json").read_text())
    assert s0 == {**s1, "wall_seconds": s0["wall_seconds"]}   # rank 0's evaluation, broadcast
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[1]["rollout/tokens"] == s0["tokens_generated"] > 0
    assert (run / "summary.json").is_file() and (run / "checkpoints").is_dir()


def test_one_process_is_local_and_bad_setups_are_one_line_errors(monkeypatch):
    assert isinstance(distributed.from_env(_cfg()), distributed.Local)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="tasks_per_step"):
        distributed.from_env(_cfg())
    with pytest.raises(ConfigError, match="not combined"):
        distributed.from_env(config.load(sets=MICRO + ["rollout.workers=2"]))
