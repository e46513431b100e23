"""Rendering conversations to token ids once, so rollouts and warm-up share one format.

The exact ids are produced here and stored in episodes (token-in, token-out). For any Hugging
Face tokenizer with a chat template, the observation suffix is derived by rendering a dummy
conversation with and without a tool message and taking the difference of the strings, so a
model's own template (Qwen, Llama, the tiny model's) decides the formatting.
"""
from __future__ import annotations

from dataclasses import dataclass

_SENTINEL = "\u2063OBS\u2063"


@dataclass
class ChatFormat:
    tokenizer: object
    stop_ids: tuple[int, ...]      # ids that end an assistant message
    pad_id: int
    _obs_prefix: str = ""
    _obs_suffix: str = ""

    @classmethod
    def from_tokenizer(cls, tok) -> "ChatFormat":
        stop = []
        for name in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            i = tok.convert_tokens_to_ids(name)
            if isinstance(i, int) and i != tok.unk_token_id and i is not None and i >= 0:
                stop.append(i)
        if tok.eos_token_id is not None and tok.eos_token_id not in stop:
            stop.append(tok.eos_token_id)
        pad = tok.pad_token_id if tok.pad_token_id is not None else stop[0]
        fmt = cls(tok, tuple(stop), pad)
        fmt._obs_prefix, fmt._obs_suffix = fmt._derive_observation_wrap()
        return fmt

    def _render(self, messages, gen: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)

    def _derive_observation_wrap(self) -> tuple[str, str]:
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        before = self._render(base, gen=False)
        after = self._render(base + [{"role": "tool", "content": _SENTINEL}], gen=True)
        # the assistant message in `before` ends with its end-of-turn marker and maybe "\n";
        # the policy's generation stops at the marker, so the env part starts right after it.
        stop_text = self.tokenizer.decode([self.stop_ids[0]])
        cut = before.rfind(stop_text) + len(stop_text)
        if cut < len(stop_text) or not after.startswith(before[:cut]):
            raise ValueError("chat template is not prefix-stable; cannot derive observation format")
        delta = after[cut:]
        pre, _, post = delta.partition(_SENTINEL)
        return pre, post

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, system: str, user: str) -> list[int]:
        """Ids of the task prompt, ending with the assistant header (ready to generate)."""
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]
        return self.encode(self._render(msgs, gen=True))

    def observation_ids(self, observation: str) -> list[int]:
        """Ids appended after a policy message that ended with its stop token: the tool
        message and the next assistant header."""
        return self.encode(self._obs_prefix + observation + self._obs_suffix)

    def decode_action(self, ids: list[int]) -> str:
        ids = [i for i in ids if i not in self.stop_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()
