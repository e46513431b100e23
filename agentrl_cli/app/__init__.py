"""The application floor: each command's library function in one home (train, eval,
rollout, check-env, build-tiny, view), between the commands (`cli/`, `api.py`, `ablate`, `diagnostics`)
and the engine rooms below (`train/` the trainer, `rollout/`, `evaluation/`, ...): the
command-level checks before any work (`preflight`), the run's env file (`env_file`) and the tiny
agent's build (`tiny_build`) live here too."""
