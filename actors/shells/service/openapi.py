"""The OpenAPI 3.1 document of the service's API (``GET /v1/openapi.json``).

Written by hand to say what each endpoint does; a test checks that its paths and methods are
exactly the app's ``/v1`` routes and ``/healthz``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["openapi_document"]

_ERROR = {
    "type": "object",
    "properties": {"error": {"type": "string"}},
    "required": ["error"],
}


def _err(text: str) -> dict[str, Any]:
    return {
        "description": text,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _ok(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": schema}}}


_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "A session id: 1 to 64 bytes of ASCII letters, digits, '.', '_' and '-', "
    "first a letter or digit.",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
}

_AUTH = {"401": _err("The token is missing or wrong (only when the service has one).")}

_OUTCOME = {
    "type": "object",
    "description": "A TurnCompleted or TurnFailed message (its `type` field says which).",
    "properties": {
        "type": {"enum": ["TurnCompleted", "TurnFailed"]},
        "session": {"type": "string"},
        "content": {"type": "string"},
        "truncated": {"type": "boolean"},
        "output": {"description": "A typed turn's validated value (output_schema); else null."},
        "reason": {"type": "string"},
        "detail": {"type": "string"},
        "usage": {"type": "object"},
    },
    "required": ["type", "session"],
}


_USAGE = {"type": "object", "description": "A Usage: tokens in, out and cached, and requests."}

_STATE = {
    "enum": ["idle", "running", "waiting", "completed", "failed", "cancelled"],
    "description": "`idle` (no turn has run yet), `running`, `waiting` (a call of its own waits "
    "for a person), or the last turn's outcome: `completed`, `failed`, `cancelled`.",
}
_BACKGROUND = {"type": "boolean", "description": "A background child (it keeps its state)."}

_SESSION_ROW = {
    "type": "object",
    "properties": {
        "session": {"type": "string"},
        "agent": {"type": "string"},
        "parent": {"type": ["string", "null"]},
        "state": _STATE,
        "background": _BACKGROUND,
        "slot": {
            "type": ["integer", "null"],
            "description": "null where the profile's server has no slots (`openai`).",
        },
        "turns": {"type": "integer"},
        "untrusted": {"type": "boolean"},
        "messages": {"type": "integer"},
        "created_at": {"type": "string"},
        "updated_at": {"type": "string"},
    },
    "required": ["session", "state", "background"],
}

_SESSION_VIEW = {
    "session": {"type": "string"},
    "agent": {"type": "string", "description": "The session's profile."},
    "parent": {"type": ["string", "null"], "description": "The parent's id, for a child."},
    "state": _STATE,
    "background": _BACKGROUND,
    "slot": {"type": "integer"},
    "backend": {
        "type": ["string", "null"],
        "description": "The model backend of the session's profile (`openai` has no slots).",
    },
    "turns": {"type": "integer"},
    "untrusted": {"type": "boolean"},
    "next_call_id": {"type": "integer"},
    "children": {"type": "array", "items": {"type": "string"}},
    "usage": _USAGE,
    "usage_with_children": _USAGE,
    "turn_usage": {
        "type": "array",
        "description": "Each stored turn's usage, in order: its own, and with its children's.",
        "items": {
            "type": "object",
            "properties": {
                "usage": _USAGE,
                "usage_with_children": _USAGE,
                "output": {"description": "The turn's validated output (null: a text turn)."},
            },
            "required": ["usage", "usage_with_children", "output"],
        },
    },
    "output": {
        "description": "A typed session's latest validated output as JSON (null for a text "
        "turn), as `TurnCompleted.output` encodes it; for a schema that is not an object, as "
        "the `value` the model gave."
    },
    "tools": {
        "type": "array",
        "description": "The tools the session is offered: each one's `name` and `description`.",
        "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "description": {"type": "string"}},
            "required": ["name", "description"],
        },
    },
    "transcript": {
        "type": "array",
        "description": "The live transcript: ChatMessage objects, as the next request sends "
        "(a tool message also says if its result was `untrusted` and, for a call that waited "
        "for a person, its `decision`: `approved`, `note`, `reason`; neither is sent).",
        "items": {"type": "object"},
    },
    "history": {
        "type": "array",
        "description": "Every stored message in order, those a compaction summary replaced "
        "included: `seq` its number, `compacted`, `at` when stored, `message` its ChatMessage.",
        "items": {
            "type": "object",
            "properties": {
                "seq": {"type": "integer"},
                "compacted": {"type": "boolean"},
                "at": {"type": "string"},
                "message": {"type": "object"},
            },
            "required": ["seq", "compacted", "at", "message"],
        },
    },
}


_REQUESTED = {
    "type": "object",
    "description": "An ApprovalRequested event: the call `call_id` of `session` (a child's "
    "included) waits for a person. `arguments` is the model's JSON text; `untrusted`: the "
    "session had read untrusted data, so the arguments may come from injected text.",
    "properties": {
        "type": {"const": "ApprovalRequested"},
        "session": {"type": "string"},
        "call_id": {"type": "integer", "minimum": 1},
        "tool": {"type": "string"},
        "arguments": {"type": "string"},
        "untrusted": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"},
    },
    "required": ["type", "session", "call_id", "tool", "arguments", "at"],
}

_SETTLED = {
    "type": "object",
    "description": "An ApprovalSettled event: the call was approved (with the `note` given) "
    "or declined (for `reason`, which the model reads).",
    "properties": {
        "type": {"const": "ApprovalSettled"},
        "session": {"type": "string"},
        "call_id": {"type": "integer"},
        "approved": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "reason": {"type": ["string", "null"]},
        "at": {"type": "string", "format": "date-time"},
    },
    "required": ["type", "session", "call_id", "approved"],
}

_REFUSED = {
    "type": "object",
    "description": "An ApprovalRefused message: the call is not waiting (it never was, or it "
    "was settled already); nothing changed.",
    "properties": {
        "type": {"const": "ApprovalRefused"},
        "session": {"type": "string"},
        "call_id": {"type": "integer"},
        "detail": {"type": "string"},
    },
    "required": ["type", "session", "call_id", "detail"],
}

_APPROVALS: dict[str, Any] = {
    "/v1/approvals": {
        "get": {
            "summary": "The calls waiting for a person's decision, oldest first.",
            "responses": {
                "200": _ok(
                    "The waiting calls.",
                    {
                        "type": "object",
                        "properties": {
                            "approvals": {
                                "type": "array",
                                "items": {"$ref": "#/components/schemas/ApprovalRequested"},
                            }
                        },
                    },
                ),
                **_AUTH,
                "503": _err("The service is stopping."),
            },
        }
    },
    "/v1/approvals/{session}/{call_id}": {
        "post": {
            "summary": "Approve or decline a waiting call; of two decisions at once exactly "
            "one is applied (the other is 409).",
            "parameters": [
                {**_ID, "name": "session", "description": "The session whose call waits."},
                {
                    "name": "call_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1},
                },
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["approve"],
                            "properties": {
                                "approve": {"type": "boolean"},
                                "note": {
                                    "type": ["string", "null"],
                                    "description": "Kept with an approval.",
                                },
                                "reason": {
                                    "type": ["string", "null"],
                                    "description": "Why a call is declined (needed then): "
                                    "the model reads it.",
                                },
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": _ok(
                    "The decision was applied.", {"$ref": "#/components/schemas/ApprovalSettled"}
                ),
                "400": _err(
                    "A bad session or call id, or body (not an object, no boolean approve, a "
                    "decline without a reason)."
                ),
                **_AUTH,
                "409": _ok(
                    "The call is not waiting: nothing changed.",
                    {"$ref": "#/components/schemas/ApprovalRefused"},
                ),
                "413": _err("The body is over the cap."),
                "503": _err("The service is stopping."),
            },
        }
    },
}


def openapi_document() -> dict[str, Any]:
    """The document, as a JSON-ready dict."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "loopd",
            "version": "1",
            "description": "A running loopd runtime over HTTP: turns, cancels, stored sessions, "
            'live turn events and the calls waiting for a person. Errors are {"error": text}.',
        },
        "components": {
            "schemas": {
                "Error": _ERROR,
                "TurnOutcome": _OUTCOME,
                "ApprovalRequested": _REQUESTED,
                "ApprovalSettled": _SETTLED,
                "ApprovalRefused": _REFUSED,
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/sessions/{id}/turns": {
                "post": {
                    "summary": "Run a turn of a top-level session (a new one is created).",
                    "parameters": [_ID],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["text"],
                                    "properties": {
                                        "text": {"type": "string"},
                                        "speaker": {"type": ["string", "null"]},
                                        "agent": {
                                            "type": ["string", "null"],
                                            "description": "The agent profile of a new session.",
                                        },
                                        "wait": {"type": "boolean", "default": True},
                                        "output_schema": {
                                            "type": ["object", "null"],
                                            "description": "A JSON schema: the turn is typed "
                                            "(the model answers by calling final_answer) and "
                                            "TurnCompleted.output is the validated value. A "
                                            "session keeps the schema it was created with: "
                                            "another is 400.",
                                        },
                                        "cancel_on_disconnect": {
                                            "type": "boolean",
                                            "default": False,
                                            "description": "With wait: a client that goes "
                                            "away before the answer cancels the turn.",
                                        },
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _ok(
                            "With wait: how the turn ended (a turn cut off by a stop is its "
                            "TurnFailed).",
                            {"$ref": "#/components/schemas/TurnOutcome"},
                        ),
                        "202": _ok(
                            "Without wait: the turn was started.",
                            {"type": "object", "properties": {"session": {"type": "string"}}},
                        ),
                        "400": _err(
                            "A bad id (a child's sub- id included), text, agent, output_schema "
                            "or body."
                        ),
                        **_AUTH,
                        "413": _err("The body is over the cap (1 MiB)."),
                        "503": _err("The service is stopping."),
                    },
                }
            },
            "/v1/sessions/{id}/cancel": {
                "post": {
                    "summary": "Cancel the session's running turn and its descendants'.",
                    "parameters": [_ID],
                    "responses": {
                        "200": _ok(
                            "The ids that were cancelled (empty if nothing ran).",
                            {
                                "type": "object",
                                "properties": {
                                    "cancelled": {"type": "array", "items": {"type": "string"}}
                                },
                            },
                        ),
                        "400": _err("A bad id or body."),
                        **_AUTH,
                        "413": _err("The body is over the cap."),
                        "503": _err("The service is stopping."),
                    },
                }
            },
            "/v1/sessions": {
                "get": {
                    "summary": "Every stored session, with its state (idle, running, waiting, "
                    "completed, failed, cancelled) and whether it runs in the background.",
                    "responses": {
                        "200": _ok(
                            "The sessions.",
                            {
                                "type": "object",
                                "properties": {
                                    "sessions": {"type": "array", "items": _SESSION_ROW}
                                },
                            },
                        ),
                        **_AUTH,
                    },
                }
            },
            "/v1/sessions/{id}": {
                "get": {
                    "summary": "One stored session: agent, state, usage (each turn's too), "
                    "children, transcript, and every stored message with its number.",
                    "parameters": [_ID],
                    "responses": {
                        "200": _ok(
                            "The session.",
                            {
                                "type": "object",
                                "required": [
                                    "session",
                                    "agent",
                                    "transcript",
                                    "usage",
                                    "children",
                                ],
                                "properties": _SESSION_VIEW,
                            },
                        ),
                        "400": _err("A bad id."),
                        **_AUTH,
                        "404": _err("No such session is stored."),
                    },
                }
            },
            "/v1/events": {
                "get": {
                    "summary": "Turn events as server-sent events: `id:` an increasing "
                    "number, `event:` the event's type, `data:` its JSON. A client that falls "
                    "behind gets a `dropped` event and the stream ends; `Last-Event-ID` "
                    "replays from the buffer of recent events (a `gap` event if it no longer "
                    "reaches back that far).",
                    "parameters": [
                        {
                            "name": "session",
                            "in": "query",
                            "required": False,
                            "description": "Only this session's family (it and its descendants).",
                            "schema": {"type": "string"},
                        },
                        {
                            "name": "Last-Event-ID",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "integer", "minimum": 0},
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "The event stream.",
                            "content": {"text/event-stream": {"schema": {"type": "string"}}},
                        },
                        "400": _err("A bad session id or Last-Event-ID."),
                        **_AUTH,
                    },
                }
            },
            **_APPROVALS,
            "/v1/openapi.json": {
                "get": {
                    "summary": "This document.",
                    "responses": {"200": _ok("The document.", {"type": "object"}), **_AUTH},
                }
            },
            "/healthz": {
                "get": {
                    "summary": "Whether the service runs (never needs the token).",
                    "security": [],
                    "responses": {
                        "200": _ok("It runs.", {"type": "object"}),
                        "503": _ok("It is stopping.", {"type": "object"}),
                    },
                }
            },
        },
    }
