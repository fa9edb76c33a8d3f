"""`dflash-mlx launch CLIENT [-- ARGS]`: an agent already pointed at the server."""

import typer

from .options import DRAFT_HELP, MODEL_HELP

CLIENT_HELP = (
    "The agent to start: claude, codex, aider, llm, opencode, kilo, qwen, crush, "
    "continue (Continue CLI), cline, mini (mini-swe-agent) or interpreter (Open "
    "Interpreter)."
)


def launch(
    ctx: typer.Context,
    client: str = typer.Argument(..., help=CLIENT_HELP),
    model: str | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    draft: str | None = typer.Option(None, "--draft", "-d", help=DRAFT_HELP),
    no_draft: bool = typer.Option(False, "--no-draft", help="Plain decoding."),
    host: str = typer.Option("127.0.0.1", "--host", help="The server's address."),
    port: int | None = typer.Option(
        None,
        "--port",
        "-p",
        min=1,
        max=65535,
        help="Reuse the server answering here, or start one on this port "
        "(default: a free port).",
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="DFLASH_MLX_API_KEY", help="The server's key."
    ),
    serve_option: list[str] = typer.Option(
        [],
        "--serve-option",
        help="An option for `dflash-mlx serve`, e.g. --serve-option=--max-tokens=8192 "
        "(repeatable).",
    ),
):
    """Start an agent already pointed at a server for the model; the server stops
    when the agent exits. Arguments after `--` go to the agent."""
    from dflash_mlx.serve.agents import find_agent
    from dflash_mlx.serve.launch import launch as run_launch

    from . import errors, ui
    from .serve import served_name

    err = ui.console(stderr=True)
    with errors.usage(err):
        agent = find_agent(client)
    serve_args = [*serve_option]
    if model:
        serve_args += ["--model", model]
    if draft:
        serve_args += ["--draft", draft]
    if no_draft:
        serve_args.append("--no-draft")

    def started(server):
        how = "reusing" if server.process is None else "started"
        ui.info(err, f"{how} the server at {server.url} for {agent.title}")
        serving, wanted = server.health.get("model"), model and served_name(model)
        if server.process is None and wanted and serving != wanted:
            ui.warning(
                err,
                f"the server at {server.url} serves '{serving}', not "
                f"'{wanted}' (--model): {agent.title} talks to "
                f"'{serving}'. Stop that server, or give another --port to start "
                "one for your model.",
            )

    with errors.runtime(err):
        code = run_launch(
            agent, list(ctx.args), serve_args, host, port, api_key, on_server=started
        )
    raise typer.Exit(code)
