"""One model client per endpoint, for runtimes whose agent profiles name other servers."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from actors.core.config import DEFAULT_AGENT, Config, ModelConfig
from actors.models.http import HttpChatModel
from messages import ModelAnswer, ModelRequest

__all__ = ["AgentEndpoints"]


class AgentEndpoints:
    """The model client of a runtime whose profiles name other endpoints (``base_url``,
    ``api_key_env``): one :class:`~actors.models.http.HttpChatModel` per distinct endpoint, and each
    request goes to its agent's (``request.agent``; an unknown name goes to ``default``'s).

    Behaves as one :class:`~actors.models.base.AsyncChatModel` (and ``ChatModel``) to the model
    service: cancelling a request's task closes its connection, whichever server it is on.
    """

    uses_slots = True
    """Requests of llama.cpp backends take slots; the service skips them for ``openai``."""

    def __init__(self, config: Config, model: ModelConfig) -> None:
        """``model`` is ``[model]`` as the runtime uses it (its concurrency raised)."""
        by_endpoint: dict[tuple[str, str | None], HttpChatModel] = {}
        self._by_agent: dict[str, HttpChatModel] = {}
        for name in config.agent_names():
            endpoint = config.endpoint(name)
            key = (endpoint.base_url, endpoint.api_key_env)
            client = by_endpoint.get(key)
            if client is None:
                client = HttpChatModel(
                    msgspec.structs.replace(
                        model, base_url=endpoint.base_url, api_key_env=endpoint.api_key_env
                    )
                )
                by_endpoint[key] = client
            self._by_agent[name] = client
        self._clients = tuple(by_endpoint.values())

    def client(self, agent: str) -> HttpChatModel:
        """The client of profile ``agent`` (``default``'s for a name it does not know)."""
        return self._by_agent.get(agent) or self._by_agent[DEFAULT_AGENT]

    streams = True
    """:meth:`acomplete` and :meth:`complete` take ``on_text``, as the HTTP client's."""

    async def acomplete(
        self, request: ModelRequest, on_text: Callable[[str], None] | None = None
    ) -> ModelAnswer:
        """:meth:`HttpChatModel.acomplete` on the request's agent's endpoint."""
        return await self.client(request.agent).acomplete(request, on_text)

    def complete(
        self, request: ModelRequest, on_text: Callable[[str], None] | None = None
    ) -> ModelAnswer:
        """:meth:`HttpChatModel.complete` on the request's agent's endpoint."""
        return self.client(request.agent).complete(request, on_text)

    async def aclose(self) -> None:
        """Close every endpoint's connections of the running loop."""
        for client in self._clients:
            await client.aclose()

    def close(self) -> None:
        """Close every endpoint's client."""
        for client in self._clients:
            client.close()
