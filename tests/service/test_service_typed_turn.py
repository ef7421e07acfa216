"""A typed turn over the service: ``POST /v1/sessions/{id}/turns`` with ``output_schema``, as
``run_turn(output=...)`` (the model answers by calling ``final_answer``)."""

from __future__ import annotations

from typing import Any

from actors.shells.service.openapi import openapi_document
from actors.testing import call, reply

SCHEMA = {
    "type": "object",
    "properties": {"status": {"type": "string"}, "hosts": {"type": "integer"}},
    "required": ["status", "hosts"],
    "additionalProperties": False,
}


def test_a_turn_with_an_output_schema_is_typed(serve: Any) -> None:
    s = serve([call("final_answer", status="green", hosts=3)])
    answer = s.client.post(
        "/v1/sessions/typed/turns", json={"text": "status?", "output_schema": SCHEMA}
    )
    assert answer.status_code == 200, answer.text
    outcome = answer.json()
    assert outcome["type"] == "TurnCompleted", outcome
    assert outcome["output"] == {"status": "green", "hosts": 3}
    # The session keeps its schema: another one is refused, naming it.
    other = {"type": "object", "properties": {"x": {"type": "string"}}}
    refused = s.client.post("/v1/sessions/typed/turns", json={"text": "x", "output_schema": other})
    assert refused.status_code == 400 and "schema" in refused.json()["error"]


def test_a_bad_output_schema_is_400_and_a_plain_turn_still_runs(serve: Any) -> None:
    s = serve([reply("plain")])
    bad = s.client.post("/v1/sessions/p/turns", json={"text": "x", "output_schema": "nope"})
    assert bad.status_code == 400 and "output_schema" in bad.json()["error"]
    plain = s.client.post("/v1/sessions/p/turns", json={"text": "hi"})
    assert plain.status_code == 200 and plain.json()["content"] == "plain"


def test_the_openapi_document_names_output_schema() -> None:
    turns = openapi_document()["paths"]["/v1/sessions/{id}/turns"]["post"]
    body = turns["requestBody"]["content"]["application/json"]["schema"]
    assert "final_answer" in body["properties"]["output_schema"]["description"]
