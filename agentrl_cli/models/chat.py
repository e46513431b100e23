"""Rendering conversations to token ids once, so rollouts and warm-up share one format.

The exact ids are produced here and stored in episodes (token-in, token-out). For any Hugging
Face tokenizer with a chat template, the observation suffix is derived by rendering a dummy
conversation with and without a tool message and taking the difference of the strings, so a
model's own template (Qwen, Llama, the tiny model's) decides the formatting.

What the formatting needs from a template (`template_problem` checks it when a model loads):
it renders the `tool` role (observations go back as tool messages), an assistant message ends
with one of the stop tokens, and it is prefix-stable: on a probe conversation (system, user,
assistant, tool, assistant, tool, assistant), rendering the first k messages is a prefix of
rendering the first k + 1 (with the generation prompt when an assistant message follows; an
assistant message cut after its stop token, where generation stops). A template that rewrites
earlier turns (e.g. one that drops reasoning from all but the last assistant message) would
make the stored token ids disagree with what a re-render gives. `model.chat_template=PATH`
replaces a model's template with the Jinja file at PATH.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

_SENTINEL = "\u2063OBS\u2063"
STOP_NAMES = ("<|im_end|>", "<|eot_id|>", "<|end|>")
TEMPLATE_HINT = "give one with model.chat_template=PATH (a Jinja file; docs/your-model.md)"
# the probe conversation `template_problem` renders; distinct contents so each is findable
PROBE = [{"role": "system", "content": "probe system"}, {"role": "user", "content": "probe question"},
         {"role": "assistant", "content": "search(probe one)"},
         {"role": "tool", "content": "probe observation one"},
         {"role": "assistant", "content": "search(probe two)"},
         {"role": "tool", "content": "probe observation two"},
         {"role": "assistant", "content": "answer(probe)"}]


def stop_ids_of(tok) -> list[int]:
    """The ids that end an assistant message: the known end-of-turn tokens the vocabulary has,
    then EOS."""
    stop = []
    for name in STOP_NAMES:
        i = tok.convert_tokens_to_ids(name)
        if isinstance(i, int) and i != tok.unk_token_id and i is not None and i >= 0:
            stop.append(i)
    if tok.eos_token_id is not None and tok.eos_token_id not in stop:
        stop.append(tok.eos_token_id)
    return stop


def template_problem(tok) -> str | None:
    """What the tokenizer's chat template lacks for agent episodes (see the module docstring),
    as a phrase, or None when it has everything."""
    if not getattr(tok, "chat_template", None):
        return "has no chat template"
    stop = stop_ids_of(tok)
    if not stop:
        return "has no end-of-turn token (no EOS, no <|im_end|> / <|eot_id|> / <|end|>)"
    stop_texts = [tok.decode([i]) for i in stop]

    def render(k: int, gen: bool) -> str:
        return tok.apply_chat_template(PROBE[:k], tokenize=False, add_generation_prompt=gen)

    try:
        full = render(len(PROBE), False)
    except Exception as e:  # a template that refuses a role raises its own exception type
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"chat template cannot render a conversation with system, user, assistant and tool messages ({first})"
    for m in PROBE:
        if m["content"] not in full:
            return f"chat template drops the `{m['role']}` role's messages"
    for k in range(1, len(PROBE)):
        before = render(k, PROBE[k]["role"] == "assistant")
        if PROBE[k - 1]["role"] == "assistant":
            cut = max(before.rfind(t) + len(t) if t in before else -1 for t in stop_texts)
            if cut < 0:
                return ("chat template does not end an assistant message with a stop token ("
                        + ", ".join(repr(t) for t in stop_texts) + ")")
            before = before[:cut]
        if not render(k + 1, False).startswith(before):
            return (f"chat template is not prefix-stable: the rendering of the first {k} messages "
                    f"changes when a {PROBE[k]['role']} message follows")
    return None


@dataclass
class ChatFormat:
    tokenizer: object
    stop_ids: tuple[int, ...]      # ids that end an assistant message
    pad_id: int
    _obs_prefix: str = ""
    _obs_suffix: str = ""

    @classmethod
    def from_tokenizer(cls, tok, source: str = "the tokenizer") -> "ChatFormat":
        """The format of `tok`'s chat template; a template that lacks what episodes need
        (`template_problem`) is a one-line ConfigError naming `source` and what is missing."""
        why = template_problem(tok)
        if why is not None:
            raise ConfigError(f"{source}: {why}; {TEMPLATE_HINT}")
        stop = stop_ids_of(tok)
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
