"""Agent profiles (``[agents.NAME]``): what each one sees, says and asks the model with.

:class:`Agents` is built once per runtime from the config and the registry; every session and
the Context look their profile up in it by the name stored with the session. Nothing here
talks to an actor; only :meth:`Agents.system_prompt` reads a file (``system_file``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from actors.core.bounded import OutOfBounds, decode_json
from actors.core.config import DEFAULT_AGENT, AgentConfig, Config, ConfigError
from actors.core.dispatch import Registry
from actors.core.files import read_regular_file
from actors.core.output import OutputTypes, SchemaError, final_answer_spec
from actors.core.output_schema import MAX_SCHEMA_BYTES
from messages import RequestOptions, ToolSpec

__all__ = [
    "DEFAULT_DESCRIPTION",
    "MAX_SYSTEM_FILE_BYTES",
    "TYPED_NOTE",
    "Agent",
    "Agents",
    "request_options",
]

DEFAULT_DESCRIPTION = "The general agent, with every tool this runtime gives."
"""What the ``subagent`` schema says of ``default`` when ``[agents.default]`` has no
``description``."""

MAX_SYSTEM_FILE_BYTES = 1 << 20
"""The largest ``system_file`` (or ``output_schema_file``) read (1 MiB)."""

TYPED_NOTE = "Answers with JSON that matches its output schema."
"""What the ``subagent`` schema adds to the description of a profile with an output schema."""


def request_options(
    profile: AgentConfig, backend: str = "llama.cpp", stream: bool = False
) -> RequestOptions:
    """The request fields ``profile`` sets; its ``backend`` and ``stream``, else ``backend``
    and ``stream`` (``model.backend``, ``model.stream``)."""
    return RequestOptions(
        model=profile.model,
        backend=profile.backend or backend,
        stream=stream if profile.stream is None else profile.stream,
        temperature=profile.temperature,
        top_p=profile.top_p,
        max_tokens=profile.max_tokens,
        stop=profile.stop,
        seed=profile.seed,
        extra_body=dict(profile.extra_body),
    )


@dataclass(frozen=True)
class Agent:
    """One profile as a runtime uses it: its config, its view of the tools, its request
    fields."""

    name: str
    profile: AgentConfig
    registry: Registry
    options: RequestOptions
    output: ToolSpec | None = None
    """The ``final_answer`` tool of the profile's output schema; None: untyped."""


class Agents:
    """Every profile of a runtime by name; ``default`` is always there.

    Raises ``ConfigError`` naming the key when a profile's ``tools`` names no tool of
    ``registry``.
    """

    def __init__(self, config: Config, registry: Registry) -> None:
        self._home = config.home_path
        self._system_prompt = config.loop.system_prompt
        names = config.agent_names()
        # With no profile but default the subagent tool stays exactly SPEC's.
        catalogue: dict[str, str] = {}
        if len(names) > 1:
            for name in names:
                text = config.agent(name).description
                catalogue[name] = text or (DEFAULT_DESCRIPTION if name == DEFAULT_AGENT else "")
        self.output_types = OutputTypes()
        """The Python types of output schemas this runtime knows (profiles', ``run_turn``'s)."""
        outputs = {name: self._output(name, config.agent(name)) for name in names}
        for name, spec in outputs.items():
            if name in catalogue and spec is not None:
                catalogue[name] = (catalogue[name] + " " + TYPED_NOTE).strip()
        self._agents: dict[str, Agent] = {}
        for name in names:
            profile = config.agent(name)
            try:
                view = registry.for_agent(
                    profile.tools, catalogue, background=config.subagents.background
                )
            except ValueError as exc:
                raise ConfigError(f"agents.{name}.tools: {exc}") from None
            options = request_options(profile, config.model.backend, config.model.stream)
            self._agents[name] = Agent(name, profile, view, options, outputs[name])

    def _output(self, name: str, profile: AgentConfig) -> ToolSpec | None:
        """Profile ``name``'s ``final_answer`` tool; ``ConfigError`` naming the key when its
        schema file cannot be read or its schema is not one loopd can use."""
        key = f"agents.{name}.output"
        try:
            if profile.output is not None:
                return self.output_types.register(profile.output)
            key = f"agents.{name}.output_schema"
            if profile.output_schema is not None:
                return final_answer_spec(profile.output_schema)
        except SchemaError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if profile.output_schema_file is None:
            return None
        key = f"agents.{name}.output_schema_file"
        path = self._home / Path(profile.output_schema_file)
        try:
            data = read_regular_file(path, MAX_SYSTEM_FILE_BYTES)
            schema = decode_json(data, max_bytes=MAX_SCHEMA_BYTES)
            return final_answer_spec(schema)
        except OSError as exc:
            raise ConfigError(f"{key}: cannot read {path}: {exc}") from None
        except OutOfBounds as exc:
            raise ConfigError(f"{key}: {path}: the output schema: {exc.detail}") from None
        except SchemaError as exc:
            raise ConfigError(f"{key}: {path}: {exc}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._agents

    def get(self, name: str) -> Agent:
        """The profile ``name``; ``KeyError`` if the config has none of that name."""
        return self._agents[name]

    def names(self) -> tuple[str, ...]:
        """Every profile name, ``default`` first."""
        return tuple(self._agents)

    def system_prompt(self, name: str) -> str:
        """The system prompt of a new session of profile ``name``: ``system``, the text of
        ``system_file`` (relative to ``home``, read now), or ``loop.system_prompt``.

        Raises ``OSError`` (or ``UnicodeDecodeError``) naming the file when it cannot be read.
        """
        profile = self.get(name).profile
        if profile.system is not None:
            return profile.system
        if profile.system_file is not None:
            path = self._home / Path(profile.system_file)
            data = read_regular_file(path, MAX_SYSTEM_FILE_BYTES)
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"agents.{name}.system_file {path} is not UTF-8 text: {exc}"
                ) from None
        return self._system_prompt
