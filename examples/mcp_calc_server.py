"""A small MCP server (stdio transport) with two arithmetic tools, for the MCP env example
(examples/mcp_calc_env.py) and its tests. Run by the env as a subprocess:

    python examples/mcp_calc_server.py
"""
try:                                     # mcp 2.x
    from mcp.server.mcpserver import MCPServer
except ImportError:                      # mcp 1.x
    from mcp.server.fastmcp import FastMCP as MCPServer

import logging

logging.getLogger("mcp").setLevel(logging.WARNING)   # no INFO line per rejected call on stderr
server = MCPServer("calc")


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@server.tool()
def add(a: float, b: float) -> str:
    """Add two numbers: a + b."""
    return _number(a + b)


@server.tool()
def multiply(a: float, b: float) -> str:
    """Multiply two numbers: a * b."""
    return _number(a * b)


if __name__ == "__main__":
    server.run("stdio")
