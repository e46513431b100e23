"""A Gymnasium env with text spaces, trained as an agentrl env (docs/envs.md, "Gymnasium").

The agent guesses a number from 1 to `high`; each guess is answered "higher" or "lower", a right
guess ends the episode with reward 1, and `max_guesses` wrong ones truncate it.

    agentrl check-env examples/guess_number_gym.py:make
    agentrl train --env examples/guess_number_gym.py:make --model PATH --steps 2
    agentrl train --env gym:guess_number_gym:GuessNumber-v0 --model PATH   # examples/ on PYTHONPATH

`make` returns a `gymnasium.Env`; agentrl wraps it (tasks are reset seeds, forks deep copies).
Importing the module also registers it with Gymnasium as `GuessNumber-v0`.
"""
from __future__ import annotations

import string

import gymnasium as gym
from gymnasium import spaces


class GuessNumber(gym.Env):
    metadata = {"render_modes": []}
    system_prompt = ("Guess the secret number. Reply with the number only, e.g. 7. Each reply "
                     "is answered with higher or lower.")

    def __init__(self, high: int = 8, max_guesses: int = 4, render_mode=None):
        self.high, self.max_guesses, self.render_mode = high, max_guesses, render_mode
        self.observation_space = spaces.Text(200, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(64, min_length=0, charset=string.printable)
        self.secret, self.guesses = 1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret, self.guesses = int(self.np_random.integers(1, self.high + 1)), 0
        return f"I picked a number from 1 to {self.high}. Guess it.", {"answer": str(self.secret)}

    def step(self, action):
        self.guesses += 1
        text = action.strip()
        if not text.isdigit():
            obs, reward, done = f"error: reply with a number from 1 to {self.high}", 0.0, False
        elif int(text) == self.secret:
            obs, reward, done = "right", 1.0, True
        else:
            obs, reward, done = ("higher" if int(text) < self.secret else "lower"), 0.0, False
        truncated = not done and self.guesses >= self.max_guesses
        return obs, reward, done, truncated, {"success": done}


def make(high: int = 8, max_guesses: int = 4):
    return GuessNumber(high, max_guesses)


if "GuessNumber-v0" not in gym.registry:
    gym.register("GuessNumber-v0", entry_point=GuessNumber)
