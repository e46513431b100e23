"""Tools as JSON schemas, and tool calls in a model's own format (`model.tool_format`).

An env spec declares its tools in the OpenAI function format, as its `tool_schemas`:

    {"type": "function", "function": {"name": "search", "description": "...",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                    "required": ["query"]}}}

With `model.tool_format` `hermes` or `llama3-json` the chat template renders them (`tools=`)
and each assistant message is read in that format:

  hermes       <tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>
               (Qwen2.5, Qwen3, Hermes; text around the call, e.g. a <think> block, is allowed)
  llama3-json  {"name": "search", "parameters": {"query": "..."}}
               (Llama 3.1 and 3.2: the whole message is the call, <|python_tag|> before it allowed)

Either key, `arguments` or `parameters`, is read in both formats. `ToolCallSpec` wraps an env
spec so that its envs (`ToolCallEnv`) take messages in the format: a valid call (one call, a
declared tool, its required arguments present, no undeclared ones, each of its declared type)
reaches the env as the env's own text syntax, `name(value)` for a tool of one parameter (the
built-in envs' syntax) or `name(key=value, ...)` with Python literals, or as
`env.step_call(name, arguments)` when the env has that method. A message that tries a call and
fails gets an error observation saying what is wrong; the env still steps on the message as
written (which it rejects as malformed), so turn limits, call costs and history stay the env's.
A message without a call reaches the env as written; if the env calls it an error, the
observation says how to call a tool.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError
from .base import StepResult
from .calls import parse_call

__all__ = ["TOOL_FORMATS", "ToolCallEnv", "ToolCallError", "ToolCallSpec", "ToolFormat",
           "check_schemas", "function_tool", "read_call", "tool_spec"]

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}
MAX_JSON_DEPTH = 32        # nesting of a call's JSON: deeper is an error observation
MAX_NUMBER_CHARS = 64      # digits of one JSON number: longer is an error observation


class ToolCallError(ValueError):
    """A message that tries a tool call and fails; the message is what the model is told."""


def function_tool(name: str, description: str, required: tuple[str, ...] | None = None,
                  **parameters: tuple[str, str]) -> dict:
    """One tool in the OpenAI function format; `parameters` maps each argument to its (JSON
    type, description); all are required unless `required` names the required ones."""
    props = {k: {"type": t, "description": d} for k, (t, d) in parameters.items()}
    need = list(parameters) if required is None else list(required)
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": need}}}


def check_schemas(schemas: Any, env: str) -> tuple[dict, ...]:
    """`schemas` as a tuple of OpenAI function tools; anything else is a one-line ConfigError
    naming the env and the faulty entry."""
    if not isinstance(schemas, (list, tuple)) or not schemas:
        raise ConfigError(f"env '{env}': tool_schemas must be a non-empty list of tools "
                          "({\"type\": \"function\", \"function\": {...}}), docs/your-env.md")
    for i, s in enumerate(schemas):
        fn = s.get("function") if isinstance(s, dict) and s.get("type") == "function" else None
        params = fn.get("parameters", {}) if isinstance(fn, dict) else None
        bad = ("is not {\"type\": \"function\", \"function\": {...}}" if not isinstance(fn, dict)
               else "has no name (a string)" if not isinstance(fn.get("name"), str)
               else "parameters must be a JSON schema of type object"
               if not isinstance(params, dict) or params.get("type", "object") != "object"
               else "required names an argument its properties lack"
               if set(params.get("required", ())) - set(params.get("properties", {})) else None)
        if bad:
            raise ConfigError(f"env '{env}': tool_schemas[{i}] {bad}")
    return tuple(schemas)


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def _hermes_calls(text: str) -> list[str] | None:
    """The bodies between `<tool_call>` and `</tool_call>`, found in one pass (linear in the
    message: a regular expression is quadratic in unclosed tags)."""
    if _OPEN not in text:
        return None
    bodies, at = [], text.find(_OPEN)
    while at >= 0:
        end = text.find(_CLOSE, at + len(_OPEN))
        nested = text.find(_OPEN, at + len(_OPEN), len(text) if end < 0 else end)
        if end < 0 or nested >= 0:
            raise ToolCallError("error: a tool call is not closed: end it with </tool_call>")
        bodies.append(text[at + len(_OPEN):end])
        at = text.find(_OPEN, end + len(_CLOSE))
    return bodies


def _llama3_calls(text: str) -> list[str] | None:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    return [body] if body.startswith("{") else None


@dataclass(frozen=True)
class ToolFormat:
    """How a model family writes a tool call: `calls` finds the call bodies of a message (None:
    no call attempted), `write` writes one call, `example` shows the syntax in error messages."""

    name: str
    calls: Callable[[str], list[str] | None]
    write: Callable[[str, dict], str]
    example: str


TOOL_FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat(
        "hermes", _hermes_calls,
        lambda n, a: "<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>",
        '<tool_call>{"name": TOOL, "arguments": {...}}</tool_call>'),
    "llama3-json": ToolFormat(
        "llama3-json", _llama3_calls,
        lambda n, a: json.dumps({"name": n, "parameters": a}),
        '{"name": TOOL, "parameters": {...}}'),
}


def _number(text: str, parse: Callable[[str], Any]) -> Any:
    if len(text) > MAX_NUMBER_CHARS:
        raise ToolCallError(f"error: a number in the tool call has {len(text):,} characters, "
                            f"more than {MAX_NUMBER_CHARS}")
    value = parse(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolCallError(f"error: the number {text} in the tool call is not finite")
    return value


def _not_json(name: str) -> Any:
    raise ToolCallError(f"error: {name} is not JSON (a number must be finite)")


def _depth(text: str) -> int:
    """The deepest nesting of JSON arrays and objects in `text`, strings skipped (linear)."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            escaped, in_str = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def load_json(body: str, fmt: ToolFormat) -> Any:
    """`body` as JSON within the bounds (`MAX_JSON_DEPTH`, `MAX_NUMBER_CHARS`, finite
    numbers); anything else raises `ToolCallError` with the error observation."""
    brackets = body.count("[") + body.count("{")     # the common case skips the scan
    if brackets > MAX_JSON_DEPTH and _depth(body) > MAX_JSON_DEPTH:
        raise ToolCallError(f"error: the tool call nests JSON deeper than {MAX_JSON_DEPTH} "
                            f"levels; write {fmt.example}")
    try:
        return json.loads(body, parse_int=lambda t: _number(t, int),
                          parse_float=lambda t: _number(t, float), parse_constant=_not_json)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"error: the tool call is not valid JSON ({e.msg} at character "
                            f"{e.pos}); write {fmt.example}") from None
    except (RecursionError, ValueError) as e:    # a bound the checks above missed
        if isinstance(e, ToolCallError):
            raise
        raise ToolCallError(f"error: the tool call is not valid JSON ({type(e).__name__}); "
                            f"write {fmt.example}") from None


def _decode(body: str, fmt: ToolFormat) -> tuple[str, dict]:
    call = load_json(body, fmt)
    args = call.get("arguments", call.get("parameters", {})) if isinstance(call, dict) else None
    if isinstance(args, str):           # some models write the arguments as a JSON string
        try:
            args = load_json(args, fmt)
        except ToolCallError:
            args = None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(args, dict):
        raise ToolCallError(f"error: a tool call is a JSON object with \"name\" (a string) and "
                            f"arguments (an object); write {fmt.example}")
    return call["name"], args


def _type_problem(value: Any, schema: dict) -> str | None:
    want = schema.get("type")
    kinds = [want] if isinstance(want, str) else list(want or ())
    if kinds and not any(_JSON_TYPES.get(k, lambda v: True)(value) for k in kinds):
        return f"must be {' or '.join(kinds)}, got {json.dumps(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {', '.join(json.dumps(v) for v in schema['enum'])}, got {json.dumps(value)}"
    return None


def _check_arguments(name: str, args: dict, schema: dict) -> None:
    params = schema["function"].get("parameters", {})
    props = params.get("properties", {})
    for key in params.get("required", ()):
        if key not in args:
            raise ToolCallError(f"error: {name} is missing its required argument '{key}'")
    for key, value in args.items():
        if key not in props:
            raise ToolCallError(f"error: {name} has no argument '{key}'; its arguments: "
                                f"{', '.join(props) or 'none'}")
        why = _type_problem(value, props[key])
        if why:
            raise ToolCallError(f"error: {name}'s argument '{key}' {why}")


def read_call(text: str, fmt: ToolFormat, schemas: tuple[dict, ...]) -> tuple[str, dict] | None:
    """`(tool, arguments)` of the one valid call in message `text`, None when it has no call;
    a call that fails (bad JSON, unknown tool, missing, undeclared or mistyped argument, more
    than one call) raises `ToolCallError` with the error observation for the model."""
    bodies = fmt.calls(text)
    if bodies is None:
        return None
    if len(bodies) != 1:
        raise ToolCallError(f"error: one tool call per message, got {len(bodies)}")
    name, args = _decode(bodies[0].strip(), fmt)
    by_name = {s["function"]["name"]: s for s in schemas}
    if name not in by_name:
        raise ToolCallError(f"error: unknown tool '{name}'; the tools: {', '.join(by_name)}")
    _check_arguments(name, args, by_name[name])
    return name, args


def text_call(name: str, args: dict, schema: dict) -> str:
    """The call in the built-in envs' text syntax: `name(value)` for a tool of one parameter,
    else `name(key=value, ...)` with Python literals."""
    props = schema["function"].get("parameters", {}).get("properties", {})
    if len(props) == 1 and len(args) == 1:
        (value,) = args.values()
        return f"{name}({value if isinstance(value, str) else json.dumps(value)})"
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


class ToolCallEnv:
    """The inner env taking messages in a JSON tool format (the module docstring); `reset`,
    `snapshot`, `restore` and every other attribute are the inner env's."""

    def __init__(self, inner, fmt: ToolFormat, schemas: tuple[dict, ...], system_prompt: str | None):
        self.inner, self.fmt, self.tool_schemas = inner, fmt, schemas
        self._system_prompt = system_prompt

    @property
    def system_prompt(self) -> str:
        return self._system_prompt or self.inner.system_prompt

    def reset(self, task) -> str:
        return self.inner.reset(task)

    def step(self, action: str) -> StepResult:
        try:
            call = read_call(action, self.fmt, self.tool_schemas)
        except ToolCallError as e:
            return self._told(self.inner.step(action), str(e))
        if call is None:
            names = ", ".join(s["function"]["name"] for s in self.tool_schemas)
            return self._told(self.inner.step(action), f"error: no tool call; call one tool per "
                              f"message as {self.fmt.example} (tools: {names})", only_error=True)
        name, args = call
        if callable(getattr(self.inner, "step_call", None)):
            return self.inner.step_call(name, args)
        schema = next(s for s in self.tool_schemas if s["function"]["name"] == name)
        return self.inner.step(text_call(name, args, schema))

    @staticmethod
    def _told(res: StepResult, message: str, only_error: bool = False) -> StepResult:
        """`res` with `message` as its observation, unless the episode ended (or, with
        `only_error`, the env did not call the message an error)."""
        if res.terminated or res.truncated or (only_error and not res.info.get("error")):
            return res
        res.observation = message
        res.info["error"] = True
        return res

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def restore(self, state: Any) -> None:
        self.inner.restore(state)

    def __getattr__(self, name: str):
        if name in ("inner", "fmt", "tool_schemas", "_system_prompt"):   # during unpickling
            raise AttributeError(name)
        return getattr(self.inner, name)


class ToolCallSpec:
    """An env spec whose envs are `ToolCallEnv`s in format `fmt`. The spec's scripted expert
    (where it has one) writes its calls in the format too: a text call `tool(argument)` of a
    tool of one parameter becomes that tool's call; anything else stays as written."""

    def __init__(self, inner, fmt: ToolFormat, schemas: tuple[dict, ...]):
        self.inner, self.fmt, self.tool_schemas = inner, fmt, schemas
        self.name = getattr(inner, "name", "env")
        self.tools_system_prompt = getattr(inner, "tools_system_prompt", None)

    def make(self) -> ToolCallEnv:
        return ToolCallEnv(self.inner.make(), self.fmt, self.tool_schemas, self.tools_system_prompt)

    def tasks(self, split: str, n: int | None = None):
        return self.inner.tasks(split, n)

    def write_call(self, action: str) -> str:
        """A text-syntax call `action` in this spec's format (unchanged if it is not one)."""
        single = {s["function"]["name"]: next(iter(s["function"]["parameters"]["properties"]))
                  for s in self.tool_schemas
                  if len(s["function"].get("parameters", {}).get("properties", {})) == 1}
        parsed = parse_call(action, tuple(single))
        return action if parsed is None else self.fmt.write(parsed[0], {single[parsed[0]]: parsed[1]})

    def __getattr__(self, name: str):
        if name in ("inner", "fmt", "tool_schemas", "name", "tools_system_prompt"):
            raise AttributeError(name)
        value = getattr(self.inner, name)
        if name == "expert":
            return lambda env, rng, error_rate=0.0: self.write_call(
                value(env.inner if isinstance(env, ToolCallEnv) else env, rng, error_rate))
        return value


def tool_spec(spec, tool_format: str, env: str):
    """`spec` with its envs taking calls in `tool_format` (`model.tool_format`); `spec` itself
    for `text`. A spec without `tool_schemas` is a one-line ConfigError."""
    if tool_format == "text":
        return spec
    if tool_format not in TOOL_FORMATS:
        raise ConfigError(f"model.tool_format must be one of text, {', '.join(TOOL_FORMATS)}, "
                          f"got '{tool_format}'")
    schemas = getattr(spec, "tool_schemas", None)
    if schemas is None:
        raise ConfigError(f"env '{env}' declares no tool_schemas (its tools as JSON schemas), "
                          f"which model.tool_format={tool_format} needs (docs/your-env.md)")
    return ToolCallSpec(spec, TOOL_FORMATS[tool_format], check_schemas(schemas, env))
