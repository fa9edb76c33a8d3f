"""The agent clients `dflash-mlx launch` starts, and how each is pointed at the server.

Each client is set up only through its documented settings: environment variables, a
command-line flag, or a config file written to a temporary folder that lives as long
as the client. `min_context` is about what the client's first request takes (its
system prompt and tool definitions), rounded up: a model with less context cannot
answer it.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Endpoint:
    """The running server a client talks to."""

    url: str  # http://127.0.0.1:8080, no /v1
    model: str  # the id the server answers to
    api_key: str  # "local" when the server needs none
    context: int | None = None  # the model's context window, when it declares one


@dataclass(frozen=True)
class Setup:
    """What a client needs: environment variables, leading arguments, and commands
    of its own to run first (with the same environment)."""

    env: dict
    args: list
    before: list = field(default_factory=list)


@dataclass(frozen=True)
class Agent:
    name: str  # the CLIENT argument of `launch`
    title: str
    executable: str
    install: str  # the command that installs it
    min_context: int  # tokens its first request needs, about
    configure: Callable[[Endpoint, Path], Setup]


def _claude(e: Endpoint, _: Path) -> Setup:
    env = {
        "ANTHROPIC_BASE_URL": e.url,
        "ANTHROPIC_AUTH_TOKEN": e.api_key,
        "ANTHROPIC_MODEL": e.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": e.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": e.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": e.model,  # its background requests too
        "ANTHROPIC_SMALL_FAST_MODEL": e.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return Setup(env, [])


def _codex(e: Endpoint, _: Path) -> Setup:
    provider = "model_providers.dflash-mlx"
    args = [
        "-c", 'model_provider="dflash-mlx"',
        "-c", f"model={json.dumps(e.model)}",
        "-c", f'{provider}.name="dflash-mlx"',
        "-c", f"{provider}.base_url={json.dumps(e.url + '/v1')}",
        "-c", f'{provider}.wire_api="responses"',
        "-c", f'{provider}.env_key="DFLASH_MLX_API_KEY"',
    ]  # fmt: skip
    if e.context:
        args += ["-c", f"model_context_window={e.context}"]
    return Setup({"DFLASH_MLX_API_KEY": e.api_key}, args)


def _openai_env(e: Endpoint) -> dict:
    """The variables the OpenAI SDKs and litellm read."""
    v1 = e.url + "/v1"
    return {"OPENAI_BASE_URL": v1, "OPENAI_API_BASE": v1, "OPENAI_API_KEY": e.api_key}


def _aider(e: Endpoint, folder: Path) -> Setup:
    # aider takes context sizes from litellm's table: this model's entry in a file
    meta = folder / "aider-models.json"
    entry: dict = {"litellm_provider": "openai", "mode": "chat"}
    if e.context:
        entry.update(max_input_tokens=e.context, max_tokens=e.context)
    meta.write_text(json.dumps({f"openai/{e.model}": entry}))
    env = {
        **_openai_env(e),
        "AIDER_MODEL": f"openai/{e.model}",
        "AIDER_MODEL_METADATA_FILE": str(meta),
        "AIDER_CHECK_UPDATE": "false",
        "AIDER_ANALYTICS_DISABLE": "true",
    }
    return Setup(env, [])


def _llm(e: Endpoint, folder: Path) -> Setup:
    user = folder / "llm"
    user.mkdir()
    (user / "extra-openai-models.yaml").write_text(
        f"- model_id: dflash-mlx\n  model_name: {json.dumps(e.model)}\n"
        f'  api_base: "{e.url}/v1"\n  api_key_name: dflash-mlx\n'
        "  supports_tools: true\n  can_stream: true\n"
    )
    (user / "keys.json").write_text(json.dumps({"dflash-mlx": e.api_key}))
    (user / "default_model.txt").write_text("dflash-mlx")
    return Setup({"LLM_USER_PATH": str(user)}, [])


def _opencode(e: Endpoint, folder: Path, variable: str = "OPENCODE_CONFIG") -> Setup:
    model: dict = {"name": e.model, "tool_call": True}
    if e.context:
        model["limit"] = {"context": e.context, "output": min(e.context // 4, 32768)}
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "dflash-mlx": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "dflash-mlx",
                "options": {"baseURL": e.url + "/v1", "apiKey": e.api_key},
                "models": {e.model: model},
            }
        },
        "model": f"dflash-mlx/{e.model}",
        "small_model": f"dflash-mlx/{e.model}",
        "autoupdate": False,
        "share": "disabled",
    }
    path = folder / "opencode.json"
    path.write_text(json.dumps(config, indent=2))
    return Setup({variable: str(path)}, [])


def _kilo(e: Endpoint, folder: Path) -> Setup:
    return _opencode(e, folder, "KILO_CONFIG")  # Kilo CLI is OpenCode's fork


def _qwen(e: Endpoint, _: Path) -> Setup:
    env = {**_openai_env(e), "OPENAI_MODEL": e.model}
    return Setup(env, ["--auth-type", "openai"])


def _crush(e: Endpoint, folder: Path) -> Setup:
    model: dict = {"id": e.model, "name": e.model}
    if e.context:
        model.update(context_window=e.context, default_max_tokens=e.context // 4)
    config = {
        "$schema": "https://charm.land/crush.json",
        "providers": {
            "dflash-mlx": {
                "name": "dflash-mlx",
                "type": "openai-compat",
                "base_url": e.url + "/v1",
                "api_key": e.api_key,
                "models": [model],
            }
        },
        "models": {
            size: {"model": e.model, "provider": "dflash-mlx"}
            for size in ("large", "small")
        },
        "options": {"disable_provider_auto_update": True, "disable_metrics": True},
    }
    (folder / "crush").mkdir()
    (folder / "crush" / "crush.json").write_text(json.dumps(config, indent=2))
    return Setup({"XDG_CONFIG_HOME": str(folder)}, [])


def _continue(e: Endpoint, folder: Path) -> Setup:
    path = folder / "continue.yaml"
    path.write_text(
        "name: dflash-mlx\nversion: 1.0.0\nschema: v1\nmodels:\n"
        "  - name: dflash-mlx\n    provider: openai\n"
        f"    model: {json.dumps(e.model)}\n"
        f'    apiBase: "{e.url}/v1"\n    apiKey: {json.dumps(e.api_key)}\n'
        "    roles: [chat, edit, apply]\n    capabilities: [tool_use]\n"
    )
    return Setup({}, ["--config", str(path)])


def _cline(e: Endpoint, folder: Path) -> Setup:
    config = str(folder / "cline")  # its provider is set with `cline auth`
    auth = ["cline", "auth", "-p", "openai-compatible", "-k", e.api_key]
    auth += ["-m", e.model, "-b", e.url + "/v1", "--config", config]
    return Setup({}, ["--config", config], [auth])


def _mini(e: Endpoint, _: Path) -> Setup:
    env = {
        **_openai_env(e),
        "MSWEA_MODEL_NAME": f"openai/{e.model}",
        "MSWEA_CONFIGURED": "true",  # no first-run set-up questions
        "MSWEA_COST_TRACKING": "ignore_errors",  # a local model has no price
    }
    return Setup(env, [])


def _interpreter(e: Endpoint, _: Path) -> Setup:
    args = ["--api_base", e.url + "/v1", "--api_key", e.api_key]
    args += ["--model", f"openai/{e.model}", "--llm_supports_functions"]
    args += ["--no-llm_supports_vision", "--disable_telemetry"]
    if e.context:
        args += ["--context_window", str(e.context)]
    return Setup({}, args)


AGENTS = {
    a.name: a
    for a in (
        Agent("claude", "Claude Code", "claude",
              "npm install -g @anthropic-ai/claude-code", 20000, _claude),
        Agent("codex", "Codex", "codex", "npm install -g @openai/codex", 8000, _codex),
        Agent("aider", "aider", "aider", "pipx install aider-chat", 2000, _aider),
        Agent("llm", "llm", "llm", "pipx install llm", 1000, _llm),
        Agent("opencode", "OpenCode", "opencode", "npm install -g opencode-ai",
              12000, _opencode),
        Agent("kilo", "Kilo Code CLI", "kilo", "npm install -g @kilocode/cli",
              12000, _kilo),
        Agent("qwen", "Qwen Code", "qwen", "npm install -g @qwen-code/qwen-code",
              12000, _qwen),
        Agent("crush", "Crush", "crush", "npm install -g @charmland/crush",
              8000, _crush),
        Agent("continue", "Continue CLI", "cn", "npm install -g @continuedev/cli",
              4000, _continue),
        Agent("cline", "Cline CLI", "cline", "npm install -g cline", 12000, _cline),
        Agent("mini", "mini-swe-agent", "mini", "pipx install mini-swe-agent",
              4000, _mini),
        Agent("interpreter", "Open Interpreter", "interpreter",
              "pipx install open-interpreter", 4000, _interpreter),
    )
}  # fmt: skip


def find_agent(name: str) -> Agent:
    """The table's entry for `name`; ValueError naming the choices."""
    if name not in AGENTS:
        raise ValueError(f"Unknown client {name!r}: pick one of {', '.join(AGENTS)}.")
    return AGENTS[name]


def needs_context(agent: Agent, context: int | None):
    """ValueError when the model's context is too small for the client's first
    request."""
    if context is not None and context < agent.min_context:
        raise ValueError(
            f"{agent.title}'s first request needs about {agent.min_context} tokens of "
            f"context; this model has {context}. Pick a model with a context of at "
            f"least {agent.min_context} tokens."
        )
