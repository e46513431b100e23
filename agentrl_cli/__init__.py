"""agentrl: reinforcement learning for long-horizon, tool-using LLM agents."""

__version__ = "0.1.0"
