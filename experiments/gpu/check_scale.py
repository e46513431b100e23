"""GPU check of the scaling paths (run by check_scale.sh; one call, under 8 minutes on one GPU).

  build   a small Qwen3 model from a config (random weights, the built-in tiny tokenizer, no hub)
  bench   rollout throughput on the same episodes: hf engine vs vllm (lock-step runner and path
          scheduler); engine-vs-trainer log-prob gap; weight sync (after loading perturbed
          weights the gap is measured against the perturbed and the original trainer model);
          sleep / wake
  focus   a few FOCUS training steps with --engine vllm next to the same steps with hf

Every number printed comes from this run. The hf/CPU parts run anywhere (`--device cpu`
with `--small` exercises this script without vLLM); the vllm parts need vLLM and CUDA.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

SETS_COMMON = ["env.max_turns=6", "rollout.max_new_tokens=40", "rollout.max_tokens=768"]


def build(out: Path, small: bool) -> Path:
    """<out>/qwen3-small: Qwen3ForCausalLM from a config + the tiny model's tokenizer."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from agentrl_cli import config
    from agentrl_cli.app.tiny_build import ensure_model

    folder = out / ("qwen3-micro" if small else "qwen3-small")
    if (folder / "config.json").is_file():
        return folder
    cfg = config.load(sets=["model.tiny_warmup_steps=0"])
    tok = AutoTokenizer.from_pretrained(ensure_model(cfg, log=lambda s: None))  # tokenizer only
    hidden, layers, heads, kv = (64, 2, 2, 1) if small else (512, 8, 8, 4)
    mcfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=hidden // heads,
                       max_position_embeddings=2048, tie_word_embeddings=True,
                       rope_theta=10000.0, pad_token_id=tok.pad_token_id,
                       eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(mcfg)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    print(f"built {folder}: Qwen3, {layers} layers, hidden {hidden}, {n / 1e6:.1f}M parameters")
    return folder


def _cfg(folder: Path, engine: str, device: str, extra=(), method: str = "grpo"):
    from agentrl_cli import config

    dtype = "bfloat16" if device == "cuda" else "float32"
    return config.load(sets=SETS_COMMON + [f"model.name={folder}", f"rollout.engine={engine}",
                                           f"model.device={device}", f"model.dtype={dtype}",
                                           "rollout.vllm_gpu_memory=0.3", *extra], method=method)


def _gap(model, episodes, temperature: float = 1.0) -> float:
    """Mean |engine log-prob - trainer log-prob| over policy tokens."""
    from agentrl_cli.models.sequences import pad_episodes, token_logprobs

    device = next(model.parameters()).device
    tot, n = 0.0, 0
    for i in range(0, len(episodes), 16):
        part = episodes[i:i + 16]
        ids, mask, attn = pad_episodes(part, 0)
        with torch.no_grad():
            lp = token_logprobs(model, ids.to(device), attn.to(device), temperature).float().cpu()
        eng = torch.zeros_like(mask)
        for j, e in enumerate(part):
            eng[j, :len(e.logprobs)] = torch.tensor(e.logprobs)
        m = mask[:, 1:].bool()
        tot += float((eng[:, 1:] - lp)[m].abs().sum())
        n += int(m.sum())
    return tot / max(n, 1)


def _timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def bench(folder: Path, device: str, engines: list[str], n_tasks: int, group: int) -> dict:
    from agentrl_cli.engines import build_engine
    from agentrl_cli.engines.base import SamplingParams
    from agentrl_cli.models.loading import load_policy
    from agentrl_cli.rollout.executors import HFPathExecutor
    from agentrl_cli.rollout.pools import LocalPool
    from agentrl_cli.rollout.scheduler import PATH_CONTROLLERS, PathRunner
    from agentrl_cli.rollout.values import CriticValues
    from agentrl_cli.rollout.controllers import RolloutContext
    from agentrl_cli.rollout.runner import run_episodes
    from agentrl_cli.context import make_spec

    cfg = _cfg(folder, "hf", device)
    model, tok, fmt, _ = load_policy(cfg, log=lambda s: None)
    spec = make_spec(cfg)
    tasks = spec.tasks("train", n_tasks)
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(group)]
    params = SamplingParams(1.0, 1.0, cfg.rollout.max_new_tokens)
    rows = {}

    def gens():
        return [torch.Generator().manual_seed(1000 + i) for i in range(len(pairs))]

    def report(name, eps, secs):
        toks = sum(e.generated_tokens for e in eps)
        rows[name] = {"episodes": len(eps), "tokens": toks, "seconds": round(secs, 2),
                      "tokens/s": round(toks / secs, 1), "logprob_gap": float(f"{_gap(model, eps):.3g}"),
                      "turns/episode": round(sum(e.num_turns for e in eps) / len(eps), 2)}
        print(f"{name:28s} {json.dumps(rows[name])}", flush=True)

    if "hf" in engines:
        hf = build_engine(cfg, model, fmt)
        run_episodes(hf, fmt, spec, pairs[:8], params, cfg.rollout.max_tokens, 8, gens())  # warm-up
        eps, secs = _timed(lambda: run_episodes(hf, fmt, spec, pairs, params, cfg.rollout.max_tokens,
                                                len(pairs), gens()))
        report("hf lock-step", eps, secs)
        ctx = RolloutContext(hf, fmt, spec, params, group, cfg.rollout.max_tokens, len(pairs), 0,
                             torch.Generator().manual_seed(7), algo=cfg.algo)
        ex = HFPathExecutor(hf, fmt, spec, params, cfg.rollout.max_tokens, share=len(pairs))
        runner = PathRunner(LocalPool(ex), CriticValues(model, None), ticks=1)
        res, secs = _timed(lambda: PATH_CONTROLLERS.get("linear")(ctx, tasks, runner))
        report("hf path scheduler", res.episodes, secs)
    if "vllm" in engines:
        import vllm

        print(f"vllm {vllm.__version__}, torch {torch.__version__}, "
              f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda'}")
        vcfg = _cfg(folder, "vllm", device)
        (engine, secs) = _timed(lambda: build_engine(vcfg, model, fmt))
        print(f"vllm engine built in {secs:.1f}s")
        run_episodes(engine, fmt, spec, pairs[:8], params, cfg.rollout.max_tokens, 8, gens())
        eps, secs = _timed(lambda: run_episodes(engine, fmt, spec, pairs, params,
                                                cfg.rollout.max_tokens, len(pairs), gens()))
        report("vllm lock-step", eps, secs)
        ctx = RolloutContext(engine, fmt, spec, params, group, cfg.rollout.max_tokens, len(pairs), 0,
                             torch.Generator().manual_seed(7), algo=cfg.algo)
        ex = engine.path_executor(fmt, spec, params, cfg.rollout.max_tokens)
        runner = PathRunner(LocalPool(ex), CriticValues(model, None), ticks=1)
        res, secs = _timed(lambda: PATH_CONTROLLERS.get("linear")(ctx, tasks, runner))
        report("vllm path scheduler", res.episodes, secs)
        stops = sum(e.token_ids[t.end - 1] in fmt.stop_ids or t.end - t.start == params.max_new_tokens
                    for e in res.episodes for t in e.turns)
        print(f"turns ending on a stop token or the turn budget: {stops}/"
              f"{sum(len(e.turns) for e in res.episodes)}")
        # weight sync: perturbed weights into the engine (through sleep / wake when enabled)
        original = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            g = torch.Generator(device="cpu").manual_seed(0)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g).to(p.device, p.dtype) * 0.5 * float(p.float().std()))
        engine.release()
        print(f"released (asleep={engine.asleep}); loading perturbed weights")
        _, secs = _timed(lambda: engine.load_weights(model))
        print(f"load_weights took {secs:.2f}s")
        eps = run_episodes(engine, fmt, spec, pairs[:32], params, cfg.rollout.max_tokens, 32, gens())
        gap_new = _gap(model, eps)
        model.load_state_dict(original)
        gap_old = _gap(model, eps)
        rows["weight_sync"] = {"gap_vs_synced_weights": float(f"{gap_new:.3g}"),
                               "gap_vs_previous_weights": float(f"{gap_old:.3g}"),
                               "ok": gap_new < gap_old / 3}
        print(f"weight sync: {json.dumps(rows['weight_sync'])}")
    return rows


def focus(folder: Path, device: str, engines: list[str], steps: int) -> dict:
    from agentrl_cli.app.train import train

    out = {}
    for engine in engines:
        cfg = _cfg(folder, engine, device, ["rollout.tasks_per_step=8", "rollout.group_size=4",
                                            "rollout.batch_size=32", "train.eval_tasks=8",
                                            "train.eval_samples=1", f"train.steps={steps}",
                                            "train.save_every=0"], method="focus")
        run = Path(os.environ["OUT"]) / f"focus-{engine}"
        t0 = time.perf_counter()
        train(cfg, run, log=print)
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:]
        keys = ("rollout/tokens", "tokens/s", "time/rollout", "time/step", "rollout/logprob_gap",
                "focus/continuations")
        for r in rows:
            print(f"{engine} step {r['step']}: " + ", ".join(f"{k}={r.get(k)}" for k in keys), flush=True)
        out[engine] = {"wall_seconds": round(time.perf_counter() - t0, 1),
                       "tokens/s (mean over steps)": round(sum(r["tokens/s"] for r in rows) / len(rows), 1),
                       "logprob_gap (mean)": float(f"{sum(r['rollout/logprob_gap'] for r in rows) / len(rows):.3g}")}
    print("focus steps:", json.dumps(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["build", "bench", "focus"])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/agentrl-check-scale"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--small", action="store_true", help="a 2-layer model (CPU dry run)")
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OUT", str(out))
    folder = build(out, a.small)
    engines = a.engines.split(",")
    if a.what == "bench":
        rows = bench(folder, a.device, engines, a.tasks, a.group)
        (out / "bench.json").write_text(json.dumps(rows, indent=2))
    elif a.what == "focus":
        rows = focus(folder, a.device, engines, a.steps)
        (out / "focus.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
