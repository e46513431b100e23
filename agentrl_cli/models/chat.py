"""Rendering conversations to token ids once, so rollouts and warm-up share one format.

The exact ids are produced here and stored in episodes (token-in, token-out): the ids the
policy generated are kept as generated, and each new message (a tool result, with the next
assistant header) is appended as the **delta** of the model's own chat template (Qwen, Llama,
the tiny model's): the conversation is rendered with the new message appended, and the
message's text is what follows the end-of-turn token that closes the assistant message before
it. Earlier turns are never re-rendered, so a template that renders them differently once
they are no longer last (Qwen3's drops the thinking block of earlier assistant messages) works
as it is: the whole rendering need not be prefix-stable.

What the formatting needs from a template (`template_problem` checks it when a model loads):
it renders the `tool` role (observations go back as tool messages), an assistant message ends
with one of the stop tokens, and a tool message's delta is the same wherever it comes (on a
probe conversation of system, user, assistant, tool, assistant, tool, assistant, after the
first and after the second assistant message). With `model.tool_format` other than `text` the
template must also render the env's tool schemas (`tools=`), which `prompt_ids` passes.
`model.chat_template=PATH` replaces a model's template with the Jinja file at PATH.
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
# the tool a template must render when the model calls tools in its own format
PROBE_TOOLS = [{"type": "function", "function": {
    "name": "probe_lookup", "description": "probe tool description",
    "parameters": {"type": "object", "properties": {"probe_key": {"type": "string"}},
                   "required": ["probe_key"]}}}]


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


def render(tok, messages: list[dict], gen: bool, tools: list[dict] | None = None) -> str:
    """The template's text of `messages` (`gen`: with the next assistant header); `tools` (JSON
    schemas) are passed to the template only when given."""
    extra = {"tools": list(tools)} if tools else {}
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **extra)


def tool_delta(tok, before: list[dict], tools: list[dict] | None = None) -> tuple[str, str] | str:
    """(text before, text after) the content of a tool message appended to `before` (which ends
    with an assistant message), with the next assistant header: the delta of the rendering
    after that assistant message's end-of-turn token. A phrase naming the problem when the
    template drops the tool message or ends the assistant message without a stop token."""
    after = render(tok, before + [{"role": "tool", "content": _SENTINEL}], True, tools)
    at = after.find(_SENTINEL)
    if at < 0:
        return "chat template drops the `tool` role's messages"
    start = after.rfind(before[-1]["content"], 0, at)
    stops = [tok.decode([i]) for i in stop_ids_of(tok)]
    ends = [after.rfind(t, max(start, 0), at) + len(t) for t in stops if after.rfind(t, max(start, 0), at) >= 0]
    if start < 0 or not ends:
        return ("chat template does not end an assistant message with a stop token ("
                + ", ".join(repr(t) for t in stops) + ")")
    return after[max(ends):at], after[at + len(_SENTINEL):]


def template_problem(tok, tool_format: str = "text") -> str | None:
    """What the tokenizer's chat template lacks for agent episodes (see the module docstring),
    as a phrase, or None when it has everything."""
    if not getattr(tok, "chat_template", None):
        return "has no chat template"
    if not stop_ids_of(tok):
        return "has no end-of-turn token (no EOS, no <|im_end|> / <|eot_id|> / <|end|>)"
    tools = PROBE_TOOLS if tool_format != "text" else None
    try:
        full = render(tok, PROBE, False, tools)
        wraps = [tool_delta(tok, PROBE[:k], tools) for k in (3, 5)]
    except Exception as e:  # a template that refuses a role raises its own exception type
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"chat template cannot render a conversation with system, user, assistant and tool messages ({first})"
    for m in PROBE:
        if m["content"] not in full:
            return f"chat template drops the `{m['role']}` role's messages"
    problem = next((w for w in wraps if isinstance(w, str)), None)
    if problem is None and wraps[0] != wraps[1]:
        problem = ("chat template renders a tool message differently after the first and the "
                   f"second assistant message ({wraps[0]!r} vs {wraps[1]!r})")
    if problem is None and tools and "probe tool description" not in render(tok, PROBE[:2], True, tools):
        problem = (f"chat template does not render the tool schemas (tools=), which "
                   f"model.tool_format={tool_format} needs")
    return problem


@dataclass
class ChatFormat:
    tokenizer: object
    stop_ids: tuple[int, ...]      # ids that end an assistant message
    pad_id: int
    tool_format: str = "text"      # model.tool_format: text, or a JSON format (tools= rendered)
    _obs_prefix: str = ""
    _obs_suffix: str = ""

    @classmethod
    def from_tokenizer(cls, tok, source: str = "the tokenizer",
                       tool_format: str = "text") -> "ChatFormat":
        """The format of `tok`'s chat template; a template that lacks what episodes need
        (`template_problem`) is a one-line ConfigError naming `source` and what is missing."""
        why = template_problem(tok, tool_format)
        if why is not None:
            raise ConfigError(f"{source}: {why}; {TEMPLATE_HINT}")
        stop = stop_ids_of(tok)
        pad = tok.pad_token_id if tok.pad_token_id is not None else stop[0]
        fmt = cls(tok, tuple(stop), pad, tool_format)
        tools = PROBE_TOOLS if tool_format != "text" else None
        fmt._obs_prefix, fmt._obs_suffix = tool_delta(tok, PROBE[:3], tools)
        return fmt

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, system: str, user: str, tools: list[dict] | None = None) -> list[int]:
        """Ids of the task prompt, ending with the assistant header (ready to generate). The
        env's tool schemas `tools` are rendered by the template (`tools=`) unless the tool
        format is `text`."""
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]
        shown = tools if self.tool_format != "text" else None
        return self.encode(render(self.tokenizer, msgs, True, shown))

    def observation_ids(self, observation: str) -> list[int]:
        """Ids appended after a policy message that ended with its stop token: the tool
        message and the next assistant header (its delta, see the module docstring)."""
        return self.encode(self._obs_prefix + observation + self._obs_suffix)

    def decode_action(self, ids: list[int]) -> str:
        ids = [i for i in ids if i not in self.stop_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()
