"""An env whose tools are those an MCP server lists (the `mcp` package, stdio transport), with
the tasks and the reward from the user's file (docs/your-env.md, "Tools from an MCP server").

A user's factory returns an `MCPSpec`:

    def make(seed=0):
        return MCPSpec([sys.executable, "my_server.py"], tasks=my_tasks, reward=my_reward)

The spec starts the server once, lists its tools (`tools/list`) and shares one MCP client
among its envs. The mcp client is asyncio: it runs on a dedicated event-loop thread
(`MCPConnection`), and the synchronous env protocol submits each call to it and waits.

  tools       the server's tools, as JSON-schema tools (`tool_schemas`, for
              `model.tool_format=hermes | llama3-json`), plus `answer(answer: string)`, which
              ends the episode; under the default text format a message is `name({JSON
              arguments})`, or `name(value)` for a tool of one argument.
  a call      `tools/call` on the server; the observation is the result's text content. A result
              flagged `isError`, a malformed message or an unknown tool is an error observation
              (info["error"]). A server that has exited raises (the episode fails and the run
              counts it in `env/exceptions`).
  reward      `reward(task, answer) -> float` from the user's file, on the `answer` call;
              `max_turns` messages without one truncate the episode with reward 0.
  forking     the server's state is outside agentrl: with `stateless=True` (the tools are pure
              functions of their arguments) snapshot/restore copy the episode's own state and
              FOCUS and VinePPO fork; otherwise `snapshot()` raises and they refuse the env in
              one line (the fork check).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import sys
import threading
import weakref
from typing import Any, Callable, Sequence

from ..errors import ConfigError
from .base import StepResult, Task

__all__ = ["ANSWER_TOOL", "MCPConnection", "MCPEnv", "MCPSpec", "mcp_tool_schema"]

ANSWER_TOOL = {"type": "function", "function": {
    "name": "answer", "description": "Give the final answer; ends the episode.",
    "parameters": {"type": "object", "properties": {
        "answer": {"type": "string", "description": "the final answer"}}, "required": ["answer"]}}}
_CALL = re.compile(r"^\s*([A-Za-z_][\w.-]*)\((.*)\)\s*$", re.DOTALL)
_INSTALL = "pip install 'agentrl[mcp]' (or pip install mcp)"


def _field(obj: Any, *names: str, default: Any = None) -> Any:
    """The first of `names` on `obj` (the mcp package spells fields `inputSchema` in 1.x and
    `input_schema` in 2.x)."""
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    return default


def mcp_tool_schema(tool: Any) -> dict:
    """An MCP tool (`tools/list`) as an OpenAI function tool."""
    params = dict(_field(tool, "input_schema", "inputSchema", default=None) or {})
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    return {"type": "function", "function": {"name": tool.name,
                                             "description": tool.description or "",
                                             "parameters": params}}


def _shutdown(loop: asyncio.AbstractEventLoop, state: dict) -> None:
    """Close the client and the server, then stop the loop (also at interpreter exit)."""
    if loop.is_closed():
        return
    stop, served = state.get("stop"), state.get("served")
    if stop is not None and served is not None and not served.done():
        loop.call_soon_threadsafe(stop.set)
        try:
            served.result(timeout=10)
        except Exception:  # noqa: BLE001  (a server that died already: nothing to close)
            pass
    loop.call_soon_threadsafe(loop.stop)


async def _serve(params: Any, ready: concurrent.futures.Future, state: dict) -> None:
    """Start the server, open the client, list the tools (`ready`'s result), keep the client
    in `state["client"]` until `state["stop"]` is set, then close both. (A function, not a
    method: the running task must not keep the connection alive, so that collecting it stops
    the server.)"""
    # deferred: optional extra (mcp)
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    state["stop"] = asyncio.Event()
    try:
        async with stdio_client(params, errlog=sys.__stderr__) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                tools = await _list_tools(client)
                state["client"] = client
                ready.set_result(tools)
                await state["stop"].wait()
    except BaseException as e:
        if not ready.done():
            ready.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
        raise


async def _list_tools(client: Any) -> list:
    """Every page of `tools/list`."""
    page = await client.list_tools()
    tools = list(page.tools)
    cursor = _field(page, "next_cursor", "nextCursor")
    while cursor:
        try:
            # deferred: optional extra (mcp)
            from mcp.types import PaginatedRequestParams

            page = await client.list_tools(params=PaginatedRequestParams(cursor=cursor))
        except (ImportError, TypeError):      # mcp 1.x: list_tools(cursor=...)
            page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = _field(page, "next_cursor", "nextCursor")
    return tools


class MCPConnection:
    """One stdio MCP server and its client (`mcp.ClientSession`), on a dedicated event-loop thread.

    `call(name, arguments, timeout)` is synchronous: it submits the client's `call_tool` to the
    loop and waits. The client's async context managers are entered and left by one task
    (`_serve`), as anyio requires; `close()` (or garbage collection, or interpreter exit) ends
    it and the server process."""

    def __init__(self, command: Sequence[str], env: dict | None = None, cwd: str | None = None,
                 startup_timeout_s: float = 60.0, label: str = "mcp"):
        try:
            # deferred: optional extra (mcp)
            from mcp.client.stdio import StdioServerParameters
        except ImportError as e:
            raise ConfigError(f"env '{label}': an MCP env needs the mcp package: {_INSTALL}") from e
        if not command or not all(isinstance(c, str) for c in command):
            raise ConfigError(f"env '{label}': the MCP server command must be a non-empty list "
                              f"of strings, got {command!r}")
        self.label, self.command = label, list(command)
        params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=env, cwd=cwd)
        self.loop = asyncio.new_event_loop()
        self._state: dict = {}
        threading.Thread(target=self.loop.run_forever, name="agentrl-mcp", daemon=True).start()
        self._finalizer = weakref.finalize(self, _shutdown, self.loop, self._state)
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._state["served"] = asyncio.run_coroutine_threadsafe(_serve(params, ready, self._state),
                                                                 self.loop)
        try:
            self.tools = ready.result(timeout=startup_timeout_s)
        except concurrent.futures.TimeoutError:
            self.close()
            raise ConfigError(f"env '{label}': the MCP server {' '.join(self.command)} did not "
                              f"answer within {startup_timeout_s:g} s") from None
        except Exception as e:  # noqa: BLE001  (a server that does not start: one line)
            self.close()
            raise ConfigError(f"env '{label}': the MCP server {' '.join(self.command)} did not "
                              f"start: {type(e).__name__}: {' '.join(str(e).split())}") from e

    @property
    def alive(self) -> bool:
        served = self._state.get("served")
        return served is not None and not served.done()

    def call(self, name: str, arguments: dict, timeout: float) -> tuple[str, bool]:
        """(the result's text, whether the server flagged it an error) of one `tools/call`."""
        if not self.alive:
            raise ConnectionError(f"the MCP server {' '.join(self.command)} has exited")
        client = self._state["client"]
        fut = asyncio.run_coroutine_threadsafe(client.call_tool(name, arguments), self.loop)
        try:
            result = fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            return f"error: tool {name} did not answer within {timeout:g} s", True
        except Exception as e:  # noqa: BLE001  (a protocol error: the model is told)
            if not self.alive:
                raise ConnectionError(f"the MCP server {' '.join(self.command)} has exited") from e
            return f"error: {name}: {' '.join(str(e).split())}", True
        text = "\n".join(getattr(c, "text", f"[{getattr(c, 'type', 'content')}]")
                         for c in result.content)
        return text, bool(_field(result, "is_error", "isError", default=False))

    def close(self) -> None:
        self._finalizer()


class MCPSpec:
    """An env spec whose tools come from an MCP server (the module docstring).

    `server`: the server's command (`[sys.executable, "server.py"]`); `tasks`: `tasks(split)
    -> list[Task]` or a dict split -> list (tasks of `Task` or dicts with "prompt" and
    "answer"); `reward(task, answer) -> float` on the final answer; `stateless`: the tools are
    pure functions, so episodes may fork."""

    def __init__(self, server: Sequence[str], tasks: Callable[[str], Sequence[Any]] | dict,
                 reward: Callable[[Task, str], float], *, name: str = "mcp", max_turns: int = 8,
                 stateless: bool = False, system_prompt: str | None = None,
                 reward_range: tuple[float, float] = (0.0, 1.0), env: dict | None = None,
                 cwd: str | None = None, call_timeout_s: float = 30.0,
                 startup_timeout_s: float = 60.0):
        if not callable(reward):
            raise ConfigError(f"env '{name}': reward must be a function reward(task, answer) -> float")
        self.name, self.max_turns, self.stateless = name, int(max_turns), bool(stateless)
        self.reward, self.reward_range, self.call_timeout_s = reward, reward_range, call_timeout_s
        self._tasks_of, self._tasks = tasks, {}
        self.connection = MCPConnection(server, env, cwd, startup_timeout_s, name)
        self.server_tools = tuple(mcp_tool_schema(t) for t in self.connection.tools)
        names = [s["function"]["name"] for s in self.server_tools]
        if "answer" in names:
            raise ConfigError(f"env '{name}': the MCP server lists a tool named 'answer', which "
                              "agentrl keeps for the final answer")
        self.tool_schemas = (*self.server_tools, ANSWER_TOOL)
        self.system_prompt = system_prompt or _text_prompt(self.server_tools)
        self.tools_system_prompt = system_prompt or (
            "Solve the task with the tools, one call per message; end with the answer tool.")

    def make(self) -> "MCPEnv":
        return MCPEnv(self)

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split not in self._tasks:
            got = (self._tasks_of.get(split) if isinstance(self._tasks_of, dict)
                   else self._tasks_of(split))
            if got is None:
                raise ConfigError(f"env '{self.name}' has no '{split}' tasks")
            self._tasks[split] = [_task(t, split, i, self.name) for i, t in enumerate(got)]
        return self._tasks[split][:n] if n is not None else list(self._tasks[split])

    def close(self) -> None:
        """Stop the server (also done when the spec is garbage-collected, or at exit)."""
        self.connection.close()


def _task(t: Any, split: str, i: int, env: str) -> Task:
    if isinstance(t, Task):
        return t
    if isinstance(t, dict) and isinstance(t.get("prompt"), str):
        return Task(str(t.get("task_id", f"{split}-{i:05d}")), t["prompt"], str(t.get("answer", "")),
                    {k: v for k, v in t.items() if k not in ("task_id", "prompt", "answer")})
    raise ConfigError(f"env '{env}': {split} task {i} is a {type(t).__name__}, not a Task or a "
                      "dict with a prompt")


def _text_prompt(tools: Sequence[dict]) -> str:
    lines = ["Solve the task with the tools below, one call per message: name({\"arg\": value, "
             "...}) with JSON arguments, or name(value) for a tool of one argument. End with "
             "answer(your final answer).", "Tools:"]
    for s in tools:
        fn = s["function"]
        args = ", ".join(f"{k}: {v.get('type', 'any')}"
                         for k, v in fn["parameters"].get("properties", {}).items())
        lines.append(f"- {fn['name']}({args}): {fn['description']}")
    lines.append("- answer(text): your final answer; ends the episode.")
    return "\n".join(lines)


def _text_arguments(raw: str, schema: dict) -> dict | None:
    """The arguments of a text call: a JSON object, or one value for a tool of one argument
    (JSON when it parses, else the text, one pair of quotes removed)."""
    raw = raw.strip()
    if raw.startswith("{"):
        try:
            args = json.loads(raw)
        except json.JSONDecodeError:
            return None
        return args if isinstance(args, dict) else None
    props = list(schema["function"]["parameters"].get("properties", {}))
    if len(props) != 1:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" else raw
    if schema["function"]["parameters"]["properties"][props[0]].get("type") == "string":
        value = value if isinstance(value, str) else raw
    return {props[0]: value}


class MCPEnv:
    """One episode on an `MCPSpec`'s server (the module docstring)."""

    def __init__(self, spec: MCPSpec):
        self.spec, self.max_turns = spec, spec.max_turns
        self.system_prompt = spec.system_prompt
        self.task: Task | None = None
        self.turns, self.done, self.terminated, self.truncated = 0, False, False, False

    def reset(self, task: Task) -> str:
        self.task, self.turns, self.done, self.terminated, self.truncated = task, 0, False, False, False
        return task.prompt

    def step(self, action: str) -> StepResult:
        m = _CALL.match(action) if isinstance(action, str) else None
        by_name = {s["function"]["name"]: s for s in self.spec.tool_schemas}
        if m is None or m.group(1) not in by_name:
            why = ("unknown tool '" + m.group(1) + "'") if m else "no tool call"
            return self._malformed(f"error: {why}; call one tool per message as name({{\"arg\": "
                                   f"value}}); tools: {', '.join(by_name)}")
        if m.group(1) == "answer":
            return self.step_call("answer", {"answer": m.group(2).strip()})
        args = _text_arguments(m.group(2), by_name[m.group(1)])
        if args is None:
            return self._malformed(f"error: the arguments of {m.group(1)} are not a JSON object")
        return self.step_call(m.group(1), args)

    def step_call(self, name: str, arguments: dict) -> StepResult:
        """One tool call with its arguments (a JSON tool format's calls come here)."""
        if self.task is None or self.done:
            why = "call reset() first" if self.task is None else "the episode is over"
            return StepResult(f"error: {why}", 0.0, self.terminated, self.truncated,
                              {"tool": None, "error": True, "success": False})
        self.turns += 1
        if name == "answer":
            answer = str(arguments.get("answer", ""))
            reward = float(self.spec.reward(self.task, answer))
            self.done = self.terminated = True
            return StepResult("", reward, True, False,
                              {"tool": "answer", "answer": answer, "success": reward > 0})
        if name not in {s["function"]["name"] for s in self.spec.server_tools}:
            return self._end_or(f"error: unknown tool '{name}'", {"tool": None, "error": True})
        text, is_error = self.spec.connection.call(name, arguments, self.spec.call_timeout_s)
        return self._end_or(text, {"tool": name, "error": is_error})

    def _malformed(self, message: str) -> StepResult:
        if self.task is None or self.done:
            return self.step_call("", {})
        self.turns += 1
        return self._end_or(message, {"tool": None, "error": True})

    def _end_or(self, observation: str, info: dict) -> StepResult:
        if self.turns >= self.max_turns:
            self.done = self.truncated = True
            return StepResult("", 0.0, False, True, {**info, "success": False})
        return StepResult(observation, 0.0, False, False, info)

    def snapshot(self) -> Any:
        if not self.spec.stateless:
            raise TypeError("the MCP server's state cannot be copied (give MCPSpec "
                            "stateless=True when its tools are pure functions of their arguments)")
        return (self.task, self.turns, self.done, self.terminated, self.truncated)

    def restore(self, state: Any) -> None:
        self.task, self.turns, self.done, self.terminated, self.truncated = state
