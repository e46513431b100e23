"""agentrl serve-env"""
from __future__ import annotations

from typing import Annotated

import typer

from .options import ConfigOpt, SetOpt, user_errors


@user_errors(interrupted="env server stopped")
def serve_env_cmd(
    env: Annotated[str, typer.Argument(help="The env to serve: a built-in name, an installed agentrl.envs entry point, module:factory or path/to/file.py:factory.")],
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port to listen on (0: a free one, printed).")] = 8765,
    host: Annotated[str, typer.Option("--host", help="Address to listen on: 127.0.0.1 (this machine only) or 0.0.0.0 (every interface; the server has no authentication).")] = "127.0.0.1",
    max_episodes: Annotated[int, typer.Option("--max-episodes", help="Most envs held at once; the least recently used beyond it are released.")] = 4096,
    max_snapshots: Annotated[int, typer.Option("--max-snapshots", help="Most snapshots held (FOCUS and VinePPO fork from them); the least recently used beyond it are released.")] = 20000,
    config: ConfigOpt = None,
    set_: SetOpt = None,
):
    """Serve an env over HTTP (JSON; OpenEnv's endpoint names where they fit) until Ctrl-C, so that `agentrl train --env http://HOST:PORT` (and eval, rollout) runs on it from another process or machine, Ray rollout workers included (docs/your-env.md). Example: agentrl serve-env search --port 8765 --set env.max_turns=8"""
    # deferred: CLI start-up
    from ..envs.env_server import EnvServer, open_server, url_of
    from ..app.preflight import load_checked

    cfg = load_checked(str(config) if config else None, list(set_ or []), **{"env.name": env})
    server = EnvServer(cfg.env, max_episodes=max_episodes, max_snapshots=max_snapshots)
    httpd = open_server(server, host, port)
    typer.echo(f"serving env '{cfg.env.name}' at {url_of(httpd)} (at most {max_episodes} envs "
               f"and {max_snapshots} snapshots held); train on it with --env {url_of(httpd)}",
               err=False)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
