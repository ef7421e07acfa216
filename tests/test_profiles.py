"""Agent profiles (``[agents.NAME]``): the pure rules of dispatch and the request body, then whole
turns over the real HTTP wire, where each profile's model plays its own script."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors import Config, ModelConfig, Runtime
from actors.core.agents import Agents
from actors.core.config import AgentConfig, ConfigError
from actors.core.dispatch import SUBAGENT_SPEC, Answered, Registry, SpawnChild, ToPort, dispatch
from actors.models.wire import request_body
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import ScriptedModel, call, reply
from messages import (
    ChatMessage,
    DenyReason,
    FailReason,
    ModelAnswer,
    ModelRequest,
    RequestOptions,
    ToolSpec,
    TurnCompleted,
    TurnFailed,
    Usage,
    denial_message,
)


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


NOW = datetime(2026, 11, 29, 23, 59, 1, tzinfo=UTC)
WAIT = 10.0
PORT = Registry([ToolSpec("search", "find pages", {"type": "object"})])
CATALOGUE = {"default": "plans", "researcher": "reads and summarises"}


def invalid(detail: str) -> Answered:
    return Answered(denial_message(DenyReason.INVALID_ARGUMENTS, detail), denied=True)


def unknown(name: str) -> Answered:
    return Answered(denial_message(DenyReason.UNKNOWN_TOOL, name), denied=True)


def wrapped(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": arguments})


# --- the subagent tool's agent argument (pure) ------------------------------------------------


def test_without_profiles_subagent_is_exactly_specs_and_agent_is_an_unknown_field() -> None:
    registry = Registry().for_agent(None, {})
    subagent = next(s for s in registry.specs() if s.name == "subagent")
    assert subagent == SUBAGENT_SPEC
    assert dispatch(registry, "subagent", '{"task": "t", "agent": "x"}', NOW) == invalid(
        "unknown field: agent"
    )
    assert Agents(Config(), Registry()).get("default").registry.specs() == Registry().specs()


def test_with_profiles_subagent_lists_the_names_and_their_descriptions() -> None:
    registry = Registry().for_agent(None, CATALOGUE)
    subagent = next(s for s in registry.specs() if s.name == "subagent")
    agent = subagent.parameters["properties"]["agent"]
    assert agent["enum"] == ["default", "researcher"]
    assert "- default: plans" in agent["description"]
    assert "- researcher: reads and summarises" in agent["description"]
    assert subagent.parameters["required"] == ["task"]
    assert subagent.parameters["additionalProperties"] is False


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"task": "t", "agent": "researcher"}', SpawnChild("t", "researcher")),
        ('{"agent": "default", "task": "t"}', SpawnChild("t", "default")),
        ('{"task": "t"}', SpawnChild("t", "default")),
        ("[]", invalid("arguments must be a JSON object")),
        ('{"agent": "nope", "x": 1}', invalid("unknown field: x")),
        ('{"agent": "nope"}', invalid("task is required")),
        ('{"task": 1, "agent": "nope"}', invalid("task must be a string")),
        ('{"task": "t", "agent": 1}', invalid("agent must be a string")),
        ('{"task": "t", "agent": "nope"}', invalid("unknown agent: nope")),
    ],
)
def test_subagent_arguments_are_checked_in_specs_order_then_the_agent(
    arguments: str, expected: object
) -> None:
    registry = Registry().for_agent(None, CATALOGUE)
    assert dispatch(registry, "subagent", arguments, NOW) == expected
    inner = json.loads(arguments) if arguments != "[]" else []
    assert dispatch(registry, "call_tool", wrapped("subagent", inner), NOW) == expected


def test_the_unknown_agent_denial_is_the_exact_text() -> None:
    route = dispatch(
        Registry().for_agent(None, CATALOGUE), "subagent", '{"task":"t","agent":"x"}', NOW
    )
    assert isinstance(route, Answered)
    assert route.text == "Denied: the arguments are not valid for this tool: unknown agent: x."


# --- tool filtering (pure) --------------------------------------------------------------------


def test_a_denied_tool_is_neither_listed_nor_run() -> None:
    view = PORT.for_agent(["clock", "call_tool"])
    assert [s.name for s in view.specs()] == ["clock", "call_tool"]
    assert dispatch(view, "search", "{}", NOW) == unknown("search")
    assert dispatch(view, "subagent", '{"task": "t"}', NOW) == unknown("subagent")
    assert dispatch(view, "remember", '{"text": "t"}', NOW) == unknown("remember")
    # call_tool unwraps to the same rule.
    assert dispatch(view, "call_tool", wrapped("search", {}), NOW) == unknown("search")
    assert dispatch(view, "call_tool", wrapped("subagent", {"task": "t"}), NOW) == unknown(
        "subagent"
    )
    assert dispatch(view, "clock", "{}", NOW) == Answered("2026-11-29T23:59:01Z")
    # A profile without call_tool cannot reach anything through it.
    only_port = PORT.for_agent(["search"])
    assert dispatch(only_port, "call_tool", wrapped("search", {}), NOW) == unknown("call_tool")
    assert dispatch(only_port, "search", "{}", NOW) == ToPort("search", "{}")


def test_a_profile_naming_no_such_tool_is_refused_at_start(tmp_path: Path) -> None:
    config = Config(home=str(tmp_path), agents={"r": AgentConfig(tools=("clock", "browse"))})
    with pytest.raises(ConfigError, match=r"agents\.r\.tools: no such tool: browse"):
        Runtime.start(config, model=ScriptedModel([]))
    # Nothing was created under home: the check comes first.
    assert not (tmp_path / DB_NAME).exists()


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[agents."two words"]\n', "agents.two words: not a valid profile name"),
        ('[agents.r]\nsystem = "a"\nsystem_file = "b"\n', "agents.r: set system or system_file"),
        ("[agents.r]\nextra_body = { messages = [] }\n", "agents.r.extra_body may not set"),
        ('[agents.r]\ndescription = "a\\nb"\n', "agents.r.description must be one line"),
        ('[agents.r]\ntools = ["clock", "clock"]\n', "agents.r.tools names a tool twice"),
        ("[agents.r]\ntop_p = 2.0\n", "top_p"),
        ("[agents.r]\nmodle = 'x'\n", "unknown field `modle`"),
    ],
)
def test_bad_profiles_are_refused_naming_the_key(toml: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        Config.from_toml(toml)


# --- the request body (pure) ------------------------------------------------------------------


def model_request(options: RequestOptions) -> ModelRequest:
    messages = (ChatMessage(role="system", content="s"), ChatMessage(role="user", content="u"))
    return ModelRequest("s", 1, 0, messages, (), "session/s", agent="r", options=options)


def test_a_profile_sets_the_request_fields_and_merges_extra_body() -> None:
    options = RequestOptions(
        model="small",
        temperature=0.2,
        top_p=0.9,
        max_tokens=64,
        stop=("END",),
        seed=7,
        extra_body={"top_k": 40, "response_format": {"type": "json_object"}},
    )
    body = request_body("local", model_request(options))
    assert body["model"] == "small"
    assert {k: body[k] for k in ("temperature", "top_p", "max_tokens", "stop", "seed")} == {
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 64,
        "stop": ["END"],
        "seed": 7,
    }
    assert body["top_k"] == 40 and body["response_format"] == {"type": "json_object"}


def test_without_options_the_body_is_as_before() -> None:
    body = request_body("local", model_request(RequestOptions()))
    assert set(body) == {"model", "messages", "id_slot", "cache_prompt"}
    assert body["model"] == "local"


# --- whole turns over HTTP --------------------------------------------------------------------


PLANNER_SYSTEM = "You plan. Delegate reading to the researcher."
RESEARCHER_SYSTEM = "You research one question."


def profiles_config(base: Config, url: str, **agents: AgentConfig) -> Config:
    model = ModelConfig(base_url=url, name="big", timeout_s=10, retries=0)
    return base.replace(model=model, agents=agents)


def planner_and_researcher(base: Config, url: str) -> Config:
    return profiles_config(
        base,
        url,
        default=AgentConfig(description="Plans and delegates.", system=PLANNER_SYSTEM),
        researcher=AgentConfig(
            description="Cheap reader.",
            system=RESEARCHER_SYSTEM,
            model="small",
            tools=("clock",),
            temperature=0.2,
            extra_body={"top_k": 40},
        ),
    )


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def last_tool_text(body: dict[str, Any]) -> str:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"][-1]


def test_a_planner_delegates_to_a_cheap_researcher_model(
    chat_server, loopd_runtime, loopd_config
) -> None:
    def planner(body: dict[str, Any]):
        if body["messages"][-1]["role"] == "user":
            return call("subagent", task="find the boiling point", agent="researcher")
        return reply(last_tool_text(body))

    server = chat_server({"big": planner, "small": [call("clock"), reply("100 C at sea level")]})
    rt = loopd_runtime(config=planner_and_researcher(loopd_config, server.base_url))
    outcome = rt.run_turn("mm", "boil?", timeout=WAIT)
    assert outcome == TurnCompleted(
        "mm", "sub-mm-1 completed\n100 C at sea level", usage=unmeasured(4)
    )
    assert server.errors == []

    first, child, child_again, second = server.requests
    assert [b["model"] for b in server.requests] == ["big", "small", "small", "big"]
    # The planner sees every tool, and subagent with the profiles to pick from.
    assert tool_names(first) == ["clock", "subagent", "call_tool", "remember"]
    assert first["messages"][0] == {"role": "system", "content": PLANNER_SYSTEM}
    subagent = first["tools"][1]["function"]["parameters"]["properties"]["agent"]
    assert subagent["enum"] == ["default", "researcher"]
    assert "- researcher: Cheap reader." in subagent["description"]
    assert "temperature" not in first and "top_k" not in first
    # The researcher: its own prompt, only its tools, its request fields, on the background slot.
    assert child["messages"][0] == {"role": "system", "content": RESEARCHER_SYSTEM}
    assert tool_names(child) == ["clock"]
    assert (child["temperature"], child["top_k"], child["id_slot"]) == (0.2, 40, 1)
    assert child_again["messages"][: len(child["messages"])] == child["messages"]
    assert second["messages"][: len(first["messages"])] == first["messages"]
    rt.stop()
    with SessionStore(Path(loopd_config.home) / DB_NAME) as store:
        assert store.open("mm").agent == "default"
        assert store.open("sub-mm-1").agent == "researcher"


def test_an_unknown_agent_is_denied_without_a_child(
    chat_server, loopd_runtime, loopd_config
) -> None:
    def planner(body: dict[str, Any]):
        if body["messages"][-1]["role"] == "user":
            return call("subagent", task="t", agent="poet")
        return reply(last_tool_text(body))

    server = chat_server({"big": planner})
    rt = loopd_runtime(config=planner_and_researcher(loopd_config, server.base_url))
    outcome = rt.run_turn("mm", "go", timeout=WAIT)
    assert outcome == TurnCompleted(
        "mm",
        "Denied: the arguments are not valid for this tool: unknown agent: poet.",
        usage=unmeasured(2),
    )
    assert [b["model"] for b in server.requests] == ["big", "big"]


def test_a_denied_tool_called_anyway_is_unknown(chat_server, loopd_runtime, loopd_config) -> None:
    def researcher(body: dict[str, Any]):
        if body["messages"][-1]["role"] == "user":
            return call("subagent", task="go deeper")
        return reply(last_tool_text(body))

    server = chat_server({"small": researcher})
    config = profiles_config(
        loopd_config, server.base_url, default=AgentConfig(model="small", tools=())
    )
    rt = loopd_runtime(config=config)
    outcome = rt.run_turn("mm", "go", timeout=WAIT)
    assert outcome == TurnCompleted(
        "mm", "Denied: there is no tool with this name: subagent.", usage=unmeasured(2)
    )
    assert "tools" not in server.requests[0]  # nothing listed
    assert len(server.requests) == 2  # and no child


def test_a_session_keeps_its_agent_across_turns_and_restarts(
    chat_server, loopd_config, tmp_path
) -> None:
    server = chat_server({"big": lambda body: reply("big"), "small": lambda body: reply("small")})
    config = planner_and_researcher(loopd_config, server.base_url)
    with Runtime.start(config) as rt:
        assert rt.run_turn("r1", "hi", timeout=WAIT, agent="researcher") == TurnCompleted(
            "r1", "small", usage=unmeasured(1)
        )
        assert rt.run_turn("r1", "again", timeout=WAIT) == TurnCompleted(
            "r1", "small", usage=unmeasured(1)
        )
        with pytest.raises(ValueError, match="runs the agent profile researcher, not default"):
            rt.run_turn("r1", "as planner", timeout=WAIT, agent="default")
        with pytest.raises(ValueError, match="no agent profile is named 'poet'"):
            rt.run_turn("r2", "hi", timeout=WAIT, agent="poet")
        assert rt.run_turn("d1", "hi", timeout=WAIT) == TurnCompleted(
            "d1", "big", usage=unmeasured(1)
        )
    with Runtime.start(config) as rt:  # a restart: the stored profile is read back
        assert rt.run_turn("r1", "after", timeout=WAIT) == TurnCompleted(
            "r1", "small", usage=unmeasured(1)
        )
        with pytest.raises(ValueError, match="not researcher"):
            rt.run_turn("d1", "x", timeout=WAIT, agent="researcher")
    with SessionStore(Path(config.home) / DB_NAME) as store:
        r1 = store.open("r1")
        assert r1.turns == 3  # the refused turn stored nothing
        assert [m.content for m in r1.transcript if m.role == "user"] == ["hi", "again", "after"]
        assert store.open("d1").turns == 1
    # The researcher profile removed: its session is refused, not run as another agent.
    without = config.replace(agents={"default": config.agents["default"]})
    with (
        Runtime.start(without) as rt,
        pytest.raises(ValueError, match="which the config no longer has"),
    ):
        rt.run_turn("r1", "x", timeout=WAIT)
    assert len([b for b in server.requests if b["model"] == "small"]) == 3


def test_system_file_is_read_from_home_when_the_baseline_is_built(
    chat_server, loopd_runtime, loopd_config
) -> None:
    home = Path(loopd_config.home)
    (home / "prompts").mkdir(parents=True)
    (home / "prompts" / "writer.md").write_text("You write short poems.\n", encoding="utf-8")
    server = chat_server([reply("roses"), reply("violets")])
    config = profiles_config(
        loopd_config,
        server.base_url,
        writer=AgentConfig(system_file="prompts/writer.md"),
        broken=AgentConfig(system_file="prompts/missing.md"),
    )
    rt = loopd_runtime(config=config)
    assert rt.run_turn("w", "a poem", timeout=WAIT, agent="writer") == TurnCompleted(
        "w", "roses", usage=unmeasured(1)
    )
    assert server.requests[0]["messages"][0]["content"] == "You write short poems.\n"
    failed = rt.run_turn("b", "a poem", timeout=WAIT, agent="broken")
    assert isinstance(failed, TurnFailed) and failed.reason is FailReason.SPAWN_ERROR
    assert "missing.md" in failed.detail
    assert len(server.requests) == 1


def test_scripted_model_plays_each_profile_offline(loopd_runtime, loopd_config) -> None:
    model = ScriptedModel(
        {
            "default": [call("subagent", task="look", agent="researcher"), reply("done")],
            "researcher": [reply("found it")],
        }
    )
    config = loopd_config.replace(agents={"researcher": AgentConfig(model="small", max_tokens=99)})
    rt = loopd_runtime(model=model, config=config)
    assert rt.run_turn("mm", "go", timeout=WAIT) == TurnCompleted("mm", "done")
    parent, child, again = model.requests
    assert [r.agent for r in model.requests] == ["default", "researcher", "default"]
    assert child.options == RequestOptions(model="small", max_tokens=99, backend="llama.cpp")
    assert parent.options == again.options == RequestOptions(backend="llama.cpp")
    assert again.messages[-1].content == "sub-mm-1 completed\nfound it"


# --- backends ---------------------------------------------------------------------------------


def test_the_openai_backend_sends_only_the_chat_completions_shape() -> None:
    llama = request_body("m", model_request(RequestOptions(backend="llama.cpp")))
    openai = request_body("m", model_request(RequestOptions(backend="openai", seed=1)))
    assert (llama["id_slot"], llama["cache_prompt"]) == (0, True)
    assert set(openai) == {"model", "messages", "seed"}


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[model]\nbackend = "vllm"\n', "model.backend must be one of llama.cpp, openai"),
        ('[agents.r]\nbackend = "ollama"\n', "agents.r.backend must be one of llama.cpp, openai"),
    ],
)
def test_an_unknown_backend_is_refused(toml: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        Config.from_toml(toml)


def test_backends_over_http_per_model_and_per_profile(
    chat_server, loopd_runtime, loopd_config
) -> None:
    def planner(body: dict[str, Any]):
        if body["messages"][-1]["role"] == "user":
            return call("subagent", task="t", agent="local")
        return reply(last_tool_text(body))

    server = chat_server({"big": planner, "small": [reply("from llama.cpp")]})
    config = profiles_config(
        loopd_config, server.base_url, local=AgentConfig(model="small", backend="llama.cpp")
    )
    config = config.replace(model=msgspec.structs.replace(config.model, backend="openai"))
    rt = loopd_runtime(config=config)
    assert rt.run_turn("mm", "go", timeout=WAIT) == TurnCompleted(
        "mm", "sub-mm-1 completed\nfrom llama.cpp", usage=unmeasured(3)
    )
    first, child, second = server.requests
    for hosted in (first, second):  # a hosted API answers 400 to fields it does not know
        assert "id_slot" not in hosted and "cache_prompt" not in hosted
    assert (child["id_slot"], child["cache_prompt"]) == (1, True)


# --- per-profile endpoints, and no slots for openai -------------------------------------------


def test_a_profile_on_another_endpoint_with_its_own_key(
    chat_server, loopd_runtime, loopd_config, monkeypatch
) -> None:
    monkeypatch.setenv("RESEARCH_KEY", "sk-research-1")
    monkeypatch.setenv("MAIN_KEY", "sk-main-1")

    def planner(body: dict[str, Any]):
        if body["messages"][-1]["role"] == "user":
            return call("subagent", task="t", agent="researcher")
        return reply(last_tool_text(body))

    main = chat_server({"big": planner})
    hosted = chat_server({"small": [reply("from the other server")]})
    model = ModelConfig(
        base_url=main.base_url, name="big", timeout_s=10, retries=0, api_key_env="MAIN_KEY"
    )
    researcher = AgentConfig(
        model="small", base_url=hosted.base_url, api_key_env="RESEARCH_KEY", backend="openai"
    )
    config = loopd_config.replace(model=model, agents={"researcher": researcher})
    rt = loopd_runtime(config=config)
    outcome = rt.run_turn("mm", "go", timeout=WAIT)
    assert outcome == TurnCompleted(
        "mm", "sub-mm-1 completed\nfrom the other server", usage=unmeasured(3)
    )
    assert [b["model"] for b in main.requests] == ["big", "big"]
    (child,) = hosted.requests
    assert "id_slot" not in child
    assert hosted.request_headers[0]["authorization"] == "Bearer sk-research-1"
    assert {h["authorization"] for h in main.request_headers} == {"Bearer sk-main-1"}
    assert set(config.secrets()) >= {"sk-main-1", "sk-research-1"}


def test_a_profile_with_only_a_base_url_sends_no_key(monkeypatch, loopd_config) -> None:
    monkeypatch.setenv("MAIN_KEY", "sk-main-1")
    model = ModelConfig(api_key_env="MAIN_KEY")
    config = loopd_config.replace(
        model=model, agents={"r": AgentConfig(base_url="http://10.0.0.9:8000/v1")}
    )
    assert config.endpoint("r").api_key() is None  # the main key never goes to another server
    assert config.endpoint("default") is config.model


def test_the_openai_backend_takes_no_slot(probe) -> None:
    # Two requests on a pool of one slot: llama.cpp's wait for each other, openai's do not.
    from actors.dispatcher.directory import Directory
    from actors.services.model_service import ModelService

    both = threading.Barrier(2, timeout=WAIT)

    def script(request: ModelRequest) -> Any:
        both.wait()  # only returns once both requests run at once
        return reply("together")

    model = ScriptedModel(script, uses_slots=True)
    directory = Directory()
    service = ModelService(model, directory, concurrency=4, pools={"main": (0,)}).start()
    try:
        answers = probe(directory, "reply")
        messages = (ChatMessage(role="system", content="s"), ChatMessage(role="user", content="u"))
        openai = RequestOptions(backend="openai")
        for n in (1, 2):
            request = ModelRequest("s", n, 0, messages, (), answers.address, options=openai)
            service.tell(request)
        first, second = (
            answers.expect(ModelAnswer, timeout=WAIT),
            answers.expect(ModelAnswer, timeout=WAIT),
        )
        assert (first.slot, second.slot) == (None, None)
    finally:
        service.stop()
