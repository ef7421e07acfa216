"""Typed results over the real HTTP wire and the real SQLite store: a session whose model ends
its turn by calling ``final_answer`` with a value loopd validates (msgspec for a Struct, the
``jsonschema`` package for a plain schema), retries on an invalid value, fails
``OUTPUT_INVALID`` when the tries run out, and a typed child whose JSON reaches its parent."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors import Config, ConfigError, ModelConfig, Runtime
from actors.aio import AsyncRuntime
from actors.core.agents import TYPED_NOTE
from actors.core.config import AgentConfig
from actors.core.output import ANSWER_BY_CALLING
from actors.shells.cli import main as cli_main
from actors.testing import call, calls, reply
from messages import FailReason, TurnCompleted, TurnFailed, Usage

WAIT = 10.0


class Weather(msgspec.Struct, frozen=True):
    city: str
    celsius: int


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "people": {"type": "integer"}},
    "required": ["city", "people"],
    "additionalProperties": False,
}


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


def wire(config: Config, url: str, **loop: Any) -> Config:
    model = ModelConfig(base_url=url, name="local", timeout_s=10, retries=0)
    changes: dict[str, Any] = {"model": model}
    if loop:
        changes["loop"] = msgspec.structs.replace(config.loop, **loop)
    return config.replace(**changes)


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body["tools"]]


def assert_prefix_only_extended(requests: list[dict[str, Any]]) -> None:
    """Each request's messages begin with exactly the previous request's, tools unchanged."""
    for before, after in itertools.pairwise(requests):
        assert after["messages"][: len(before["messages"])] == before["messages"]
        assert after["tools"] == before["tools"]


def test_run_turn_with_a_struct_retries_an_invalid_value_and_returns_the_struct(
    chat_server, loopd_runtime, loopd_config
) -> None:
    server = chat_server(
        [
            call("final_answer", city="Oslo", celsius="cold"),  # invalid: celsius
            call("final_answer", city="Oslo", celsius=-3),
        ]
    )
    rt = loopd_runtime(config=wire(loopd_config, server.base_url))
    outcome = rt.run_turn("w", "weather in Oslo?", timeout=WAIT, output=Weather)
    assert isinstance(outcome, TurnCompleted)
    assert outcome.output == Weather("Oslo", -3)
    assert outcome.content == '{"city":"Oslo","celsius":-3}'

    first, second = server.requests
    final = next(t for t in first["tools"] if t["function"]["name"] == "final_answer")
    assert final["function"]["parameters"]["properties"] == {
        "city": {"type": "string"},
        "celsius": {"type": "integer"},
    }
    assert "$ref" not in str(final["function"]["parameters"])  # the top-level $ref resolved
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "Denied: the arguments are not valid for this tool: "
        "Expected `int`, got `str` - at `$.celsius`.",
    }
    assert_prefix_only_extended(server.requests)

    # The same schema is accepted again, and a turn without output keeps the session's.
    more = chat_server([call("final_answer", city="Rome", celsius=20)] * 2)
    rt.stop()
    rt = loopd_runtime(config=wire(loopd_config, more.base_url))
    again = rt.run_turn("w", "and Rome?", timeout=WAIT, output=Weather)
    assert isinstance(again, TurnCompleted) and again.output == Weather("Rome", 20)
    kept = rt.run_turn("w", "and Rome again?", timeout=WAIT)
    assert isinstance(kept, TurnCompleted) and kept.output == {"city": "Rome", "celsius": 20}
    assert "final_answer" in tool_names(more.requests[-1])
    assert_prefix_only_extended([first, second, *more.requests])


def test_a_text_answer_is_answered_and_the_last_failed_try_fails_output_invalid(
    chat_server, loopd_runtime, loopd_config
) -> None:
    server = chat_server(
        [
            reply("Oslo has about 700000 people."),  # text: a failed try
            call("final_answer", city="Oslo"),  # missing people: a failed try
            calls(("clock", {}), ("final_answer", {"city": "Oslo", "people": "many"})),
        ]
    )
    rt = loopd_runtime(config=wire(loopd_config, server.base_url, output_retries=2))
    outcome = rt.run_turn("c", "how many live in Oslo?", timeout=WAIT, output=CITY)
    assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.OUTPUT_INVALID
    assert "3 tries" in outcome.detail and "loop.output_retries is 2" in outcome.detail
    assert "docs/runbook.md#output_invalid" in outcome.detail

    _first, second, third = server.requests
    assert second["messages"][-2:] == [
        {"role": "assistant", "content": "Oslo has about 700000 people."},
        {"role": "user", "content": ANSWER_BY_CALLING},
    ]
    assert third["messages"][-1]["content"] == (
        "Denied: the arguments are not valid for this tool: 'people' is a required property."
    )
    assert_prefix_only_extended(server.requests)

    # The next turn goes on from a valid stored transcript; plain schemas give the JSON value.
    server2 = chat_server([call("final_answer", city="Oslo", people=700000)])
    rt.stop()
    rt = loopd_runtime(config=wire(loopd_config, server2.base_url))
    done = rt.run_turn("c", "try again", timeout=WAIT)
    assert done == TurnCompleted(
        "c",
        '{"city":"Oslo","people":700000}',
        usage=unmeasured(1),
        output={"city": "Oslo", "people": 700000},
    )
    (last,) = server2.requests
    assert last["messages"][: len(third["messages"])] == third["messages"]


def test_a_schema_that_is_not_an_object_is_wrapped_as_value(
    chat_server, loopd_runtime, loopd_config
) -> None:
    server = chat_server([call("final_answer", value=[1, 2, 3])])
    rt = loopd_runtime(config=wire(loopd_config, server.base_url))
    outcome = rt.run_turn("n", "three numbers", timeout=WAIT, output=list[int])
    assert outcome == TurnCompleted("n", "[1,2,3]", usage=unmeasured(1), output=[1, 2, 3])
    (body,) = server.requests
    final = next(t for t in body["tools"] if t["function"]["name"] == "final_answer")
    assert final["function"]["parameters"] == {
        "type": "object",
        "properties": {"value": {"type": "array", "items": {"type": "integer"}}},
        "required": ["value"],
        "additionalProperties": False,
    }


def test_another_schema_or_none_on_a_stored_session_raises_value_error(
    chat_server, loopd_runtime, loopd_config
) -> None:
    server = chat_server([call("final_answer", city="Oslo", celsius=1), reply("plain")])
    rt = loopd_runtime(config=wire(loopd_config, server.base_url))
    assert isinstance(rt.run_turn("w", "typed", timeout=WAIT, output=Weather), TurnCompleted)
    assert isinstance(rt.run_turn("u", "untyped", timeout=WAIT), TurnCompleted)
    with pytest.raises(ValueError, match="another output schema"):
        rt.run_turn("w", "live, another", timeout=WAIT, output=CITY)
    with pytest.raises(ValueError, match="another output schema"):
        rt.run_turn("u", "live, none before", timeout=WAIT, output=Weather)
    rt.stop()
    rt = loopd_runtime(config=wire(loopd_config, server.base_url))  # stored, not live
    with pytest.raises(ValueError, match="another output schema"):
        rt.run_turn("w", "stored, another", timeout=WAIT, output=CITY)
    with pytest.raises(ValueError, match="another output schema"):
        rt.run_turn("u", "stored, none before", timeout=WAIT, output=Weather)
    assert len(server.requests) == 2  # nothing was asked of the model for the refused turns
    rt.stop()
    with Runtime.start(wire(loopd_config, server.base_url)) as again:
        assert [m.content for m in again_transcript(again, "u")] == ["untyped", "plain"]


def again_transcript(rt: Runtime, session: str) -> list[Any]:
    from actors.stores.open import open_store

    store = open_store(rt.config)
    try:
        return list(store.open(session).transcript)
    finally:
        store.close()


def test_a_typed_child_answers_its_parent_with_its_json_uncut(
    chat_server, loopd_runtime, loopd_config
) -> None:
    long_city = "X" * 3000  # longer than compact.summary_chars (2000): still whole

    def script(body: dict[str, Any]):
        if body["id_slot"] == 1:  # the child
            return call("final_answer", city=long_city + "<|im_start|>", people=5)
        if body["messages"][-1]["role"] == "user":
            return call("subagent", task="find the city", agent="census")
        return reply(body["messages"][-1]["content"])

    server = chat_server(script)
    census = AgentConfig(description="Counts people.", output_schema=CITY)
    config = wire(loopd_config, server.base_url).replace(agents={"census": census})
    rt = loopd_runtime(config=config)
    outcome = rt.run_turn("p", "go", timeout=WAIT)
    expected = (
        "sub-p-1 completed\n" + msgspec.json.encode({"city": long_city, "people": 5}).decode()
    )
    assert outcome == TurnCompleted("p", expected, usage=unmeasured(3))  # the child's included

    parent_first, child, parent_second = server.requests
    assert "final_answer" in tool_names(child) and "final_answer" not in tool_names(parent_first)
    subagent = next(t for t in parent_first["tools"] if t["function"]["name"] == "subagent")
    agent_list = subagent["function"]["parameters"]["properties"]["agent"]["description"]
    assert f"- census: Counts people. {TYPED_NOTE}" in agent_list
    assert parent_second["messages"][-1]["content"] == expected
    assert_prefix_only_extended([parent_first, parent_second])


def test_a_typed_child_longer_than_the_tool_result_cap_fails_at_once(
    chat_server, loopd_runtime, loopd_config
) -> None:
    def script(body: dict[str, Any]):
        if body["id_slot"] == 1:
            return call("final_answer", city="Y" * 200, people=1)
        if body["messages"][-1]["role"] == "user":
            return call("subagent", task="find", agent="census")
        return reply(body["messages"][-1]["content"])

    server = chat_server(script)
    events: list[Any] = []
    census = AgentConfig(output_schema=CITY)
    config = wire(loopd_config, server.base_url, tool_result_cap=100)
    rt = loopd_runtime(config=config.replace(agents={"census": census}))
    rt.subscribe(events.append)
    outcome = rt.run_turn("p", "go", timeout=WAIT)
    assert outcome == TurnCompleted("p", "sub-p-1 failed", usage=unmeasured(3))
    assert len(server.requests) == 3  # no retry of the child
    ended = [e for e in events if type(e).__name__ == "TurnEnded" and e.session == "sub-p-1"]
    assert ended and ended[0].reason is FailReason.OUTPUT_INVALID
    assert "loop.tool_result_cap (100)" in ended[0].detail


def test_a_profile_struct_and_a_schema_file(chat_server, loopd_runtime, loopd_config) -> None:
    server = chat_server(
        [call("final_answer", city="Oslo", celsius=2), call("final_answer", city="Oslo", people=1)]
    )
    home = Path(loopd_config.home)
    home.mkdir(parents=True, exist_ok=True)
    (home / "city.json").write_text(msgspec.json.encode(CITY).decode())
    config = wire(loopd_config, server.base_url).replace(
        agents={
            "default": AgentConfig(output=Weather),
            "census": AgentConfig(output_schema_file="city.json"),
        }
    )
    rt = loopd_runtime(config=config)
    outcome = rt.run_turn("w", "weather?", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted) and outcome.output == Weather("Oslo", 2)
    census = rt.run_turn("c", "people?", timeout=WAIT, agent="census")
    assert isinstance(census, TurnCompleted) and census.output == {"city": "Oslo", "people": 1}
    final = [
        next(t for t in body["tools"] if t["function"]["name"] == "final_answer")
        for body in server.requests
    ]
    assert final[1]["function"]["parameters"] == CITY


def test_config_refuses_a_bad_output_schema_naming_the_key(loopd_config) -> None:
    with pytest.raises(ConfigError, match=r"agents\.x\.output_schema: .*not a valid JSON schema"):
        Config.from_toml('[agents.x]\noutput_schema = { type = "nonsense" }\n')
    with pytest.raises(ConfigError, match=r"agents\.x\.output: it is a Python type"):
        Config.from_toml('[agents.x]\noutput = "Weather"\n')
    with pytest.raises(ConfigError, match="set one of output_schema, output_schema_file"):
        Config.from_toml('[agents.x]\noutput_schema = {}\noutput_schema_file = "f.json"\n')
    toml = '[loop]\noutput_retries = 0\n[agents.x]\noutput_schema = { type = "integer" }\n'
    config = Config.from_toml(toml)
    assert config.loop.output_retries == 0
    assert config.agents["x"].output_schema == {"type": "integer"}
    missing = loopd_config.replace(agents={"x": AgentConfig(output_schema_file="nope.json")})
    with pytest.raises(ConfigError, match=r"agents\.x\.output_schema_file: cannot read"):
        Runtime.start(missing)


def test_async_runtime_and_send_turn_take_output(chat_server, loopd_config) -> None:
    server = chat_server([call("final_answer", city="Bergen", celsius=9)])

    async def main() -> Any:
        async with AsyncRuntime.start(wire(loopd_config, server.base_url)) as rt:
            return await rt.run_turn("a", "weather?", timeout=WAIT, output=Weather)

    outcome = asyncio.run(main())
    assert isinstance(outcome, TurnCompleted) and outcome.output == Weather("Bergen", 9)


def test_loopd_run_output_schema_prints_the_json(
    chat_server, loopd_config, tmp_path: Path, capsys
) -> None:
    server = chat_server([call("final_answer", city="Oslo", people=3)])
    schema = tmp_path / "city.json"
    schema.write_text(msgspec.json.encode(CITY).decode())
    argv = ["run", "--home", loopd_config.home, "--base-url", server.base_url, "-q"]
    code = cli_main([*argv, "--output-schema", str(schema), "how many?"])
    assert code == 0
    assert capsys.readouterr().out == '{"city":"Oslo","people":3}\n'
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": 3}')
    assert cli_main([*argv, "--session", "other", "--output-schema", str(bad), "x"]) == 2
    assert "--output-schema" in capsys.readouterr().err


def test_the_repl_turn_takes_output(chat_server, loopd_runtime, loopd_config, capsys) -> None:
    from actors.shells.repl import Helpers

    server = chat_server([call("final_answer", city="Oslo", celsius=4)])
    rt = loopd_runtime(config=wire(loopd_config, server.base_url))
    outcome = Helpers(rt).turn("r", "weather?", 30, output=Weather)
    assert isinstance(outcome, TurnCompleted) and outcome.output == Weather("Oslo", 4)


def test_a_typed_turn_on_the_openai_backend(chat_server, loopd_runtime, loopd_config) -> None:
    server = chat_server([call("final_answer", city="Oslo", celsius=5)])
    config = wire(loopd_config, server.base_url)
    config = config.replace(model=msgspec.structs.replace(config.model, backend="openai"))
    rt = loopd_runtime(config=config)
    outcome = rt.run_turn("o", "weather?", timeout=WAIT, output=Weather)
    assert isinstance(outcome, TurnCompleted) and outcome.output == Weather("Oslo", 5)
    (body,) = server.requests
    assert "id_slot" not in body and "response_format" not in body
    assert tool_names(body)[-1] == "final_answer"


def test_hostile_answers_over_the_wire_are_denied_by_name_and_tried_again(
    chat_server, loopd_runtime, loopd_config
) -> None:
    pattern = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}
    server = chat_server(
        [
            call("final_answer", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
            call("final_answer", '{"a": 1180591620717411303424}'),
            call("final_answer", '{"a": "' + "a" * 34 + '!"}'),
            call("final_answer", '{"a": "aaa"}'),
        ]
    )
    rt = loopd_runtime(config=wire(loopd_config, server.base_url, output_retries=3))
    outcome = rt.run_turn("h", "answer", timeout=WAIT, output=pattern)
    assert isinstance(outcome, TurnCompleted) and outcome.output == {"a": "aaa"}
    denials = [body["messages"][-1]["content"] for body in server.requests[1:]]
    prefix = "Denied: the arguments are not valid for this tool: "
    assert denials == [
        prefix + "JSON nested deeper than 64 levels.",
        prefix + "an integer outside the 64-bit range at $.a.",
        prefix + f"'{'a' * 34}!' does not match '^(a+)+$' - at `$.a`.",
    ]


def test_a_schema_past_the_limits_is_refused_before_the_turn_starts(
    loopd_runtime, loopd_config
) -> None:
    rt = loopd_runtime([reply("plain")])
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}}
    with pytest.raises(ValueError, match=r"more than 1,000 JSON objects"):
        rt.run_turn("wide", "answer", timeout=WAIT, output=wide)
    assert rt.run_turn("wide", "hello", timeout=WAIT) == TurnCompleted("wide", "plain")


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        (
            {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
            "the $ref '#/$defs/a' refers back to itself",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)"}}},
            "the pattern '(?=a)' at $.properties.a.pattern cannot be used",
        ),
    ],
)
def test_an_output_schema_file_that_loops_or_backtracks_fails_the_start(
    loopd_config, schema: dict[str, Any], named: str
) -> None:
    home = Path(loopd_config.home)
    home.mkdir(parents=True, exist_ok=True)
    (home / "loop.json").write_text(msgspec.json.encode(schema).decode())
    config = loopd_config.replace(agents={"x": AgentConfig(output_schema_file="loop.json")})
    with pytest.raises(ConfigError) as refused:
        Runtime.start(config)
    assert str(refused.value).startswith("agents.x.output_schema_file: ")
    assert named in str(refused.value)
    with pytest.raises(ConfigError, match=r"agents\.x\.output_schema: .*refers back to itself"):
        Config.from_toml(
            '[agents.x]\noutput_schema = { "$ref" = "#/$defs/a", "$defs" = { a = { "$ref" = '
            '"#/$defs/b" }, b = { "$ref" = "#/$defs/a" } } }\n'
        )
