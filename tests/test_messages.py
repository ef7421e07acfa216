"""The protocol (SPEC 2): every message is frozen pure data that survives a process boundary."""

from __future__ import annotations

import typing
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import messages
from messages import (
    Appended,
    AppendMessages,
    BackgroundLoaded,
    BackgroundReport,
    BackgroundRow,
    BackgroundSaved,
    Baseline,
    CallDecision,
    CallId,
    ChatMessage,
    Compacted,
    CompactHistory,
    CompactionFailed,
    ContextStatus,
    CreateChild,
    DataClass,
    DenyReason,
    DropBackground,
    FailReason,
    FamilyIdle,
    Inspect,
    LoadBackground,
    ModelAnswer,
    ModelAnswered,
    ModelError,
    ModelRequest,
    ModelRequestSent,
    OpenSession,
    PortCall,
    ProposedCall,
    ReleaseSession,
    RequestOptions,
    RunTurn,
    SaveBackground,
    SessionCrashed,
    SessionId,
    SessionLoaded,
    SessionRecord,
    SessionTurnEnded,
    StartTurn,
    StoreFailed,
    SubagentCompleted,
    SubagentFailed,
    SubagentFinished,
    SubagentRequest,
    SubagentStarted,
    ToolCall,
    ToolCallFinished,
    ToolCallStarted,
    ToolDone,
    ToolResult,
    ToolSpec,
    ToolWorkerLost,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
    TurnStarted,
    Usage,
    WaitFamily,
    check_session_id,
    denial_message,
)

AT = datetime(2026, 11, 29, 23, 59, 1, 123456, tzinfo=UTC)
SPEC = ToolSpec(
    name="hostname",
    description="The host's name.",
    parameters={"type": "object", "properties": {"fqdn": {"type": "boolean"}}, "required": []},
)
BASELINE = Baseline(system="You are careful.", tools=(SPEC,))
CALL = ToolCall(id=3, name="subagent", arguments='{"task": "look"}')
ASSISTANT = ChatMessage(role="assistant", content=None, tool_calls=(CALL,))
TOOL_MESSAGE = ChatMessage(role="tool", content="sub-mm-thread-3 completed\nok", tool_call_id=3)
USER = ChatMessage(role="user", content="hello", name="ann")
RESULT = ToolResult(call_id=3, text="secret", data_class=DataClass.PRIVATE, untrusted=True)
RECORD = SessionRecord(
    id="mm-thread",
    baseline=BASELINE,
    slot=1,
    transcript=(USER, ASSISTANT, TOOL_MESSAGE),
    turns=2,
    next_call_id=4,
    untrusted=True,
    parent="mm",
)

BACKGROUND_ROW = BackgroundRow(
    "sub-mm-thread-1", "mm-thread", 1, "sub-mm-thread-1 completed\nok", untrusted=True
)

# One sample per concrete message class, every optional field set away from its default where
# that is possible, so a field that does not survive the wire is caught.
SAMPLES: dict[type[messages.Message], Callable[[], messages.Message]] = {
    AppendMessages: lambda: AppendMessages(
        session="mm-thread",
        request_id=7,
        messages=(USER, ASSISTANT, TOOL_MESSAGE),
        turns=2,
        next_call_id=4,
        untrusted=True,
        reply_to="session/mm-thread",
        reports=("sub-mm-thread-1",),
    ),
    Appended: lambda: Appended(session="mm-thread", request_id=7),
    Baseline: lambda: BASELINE,
    CallDecision: lambda: CallDecision(approved=True, note="ship it"),
    ChatMessage: lambda: ASSISTANT,
    CompactHistory: lambda: CompactHistory(
        session="mm-thread",
        request_id=8,
        summary=ChatMessage(role="user", content="Summary so far."),
        reply_to="session/mm-thread",
    ),
    Compacted: lambda: Compacted(session="mm-thread", before=250_000, after=2_000, at=AT),
    CompactionFailed: lambda: CompactionFailed(session="mm-thread", detail="model down", at=AT),
    ContextStatus: lambda: ContextStatus(held=("mm-thread", "sub-mm-thread-1"), live=("x",)),
    Inspect: lambda: Inspect(),
    ModelAnswer: lambda: ModelAnswer(
        session="mm-thread",
        request_id=9,
        content="thinking",
        tool_calls=(ProposedCall(name="clock", arguments="{}"),),
        slot=2,
        slot_wait_s=0.25,
        usage=Usage(prompt_tokens=1755, completion_tokens=12, cached_tokens=1680, requests=1),
        truncated=True,
    ),
    Usage: lambda: Usage(prompt_tokens=10, completion_tokens=2, cached_tokens=8, requests=1),
    ModelAnswered: lambda: ModelAnswered(
        session="mm-thread",
        step=2,
        content=None,
        tools=("clock", "subagent"),
        slot=2,
        slot_wait_s=0.25,
        at=AT,
    ),
    ModelError: lambda: ModelError(
        session="mm-thread",
        request_id=9,
        detail="HTTP 400",
        context_exceeded=True,
        context_tokens=4096,
    ),
    ModelRequest: lambda: ModelRequest(
        session="mm-thread",
        request_id=9,
        slot=0,
        messages=(ChatMessage(role="system", content="sys"), USER),
        tools=(SPEC,),
        reply_to="session/mm-thread",
        pool="background",
        prefer_slot=True,
        agent="researcher",
        options=RequestOptions(model="cheap", temperature=0.2, stop=("END",)),
    ),
    RequestOptions: lambda: RequestOptions(
        model="cheap",
        temperature=0.2,
        top_p=0.9,
        max_tokens=256,
        stop=("END",),
        seed=7,
        extra_body={"top_k": 40, "response_format": {"type": "json_object"}},
    ),
    ModelRequestSent: lambda: ModelRequestSent(session="mm-thread", slot=1, step=3, at=AT),
    CreateChild: lambda: CreateChild(
        session="sub-mm-thread-3",
        parent="mm-thread",
        baseline=BASELINE,
        slot=1,
        untrusted=True,
        first=USER,
        reply_to="context",
        request_id=5,
    ),
    OpenSession: lambda: OpenSession(
        session="mm-thread",
        baseline=BASELINE,
        slot=1,
        reply_to="context",
        create_only=True,
    ),
    PortCall: lambda: PortCall(
        session="mm-thread", call_id=5, name="hostname", arguments="{}", reply_to="port"
    ),
    ProposedCall: lambda: ProposedCall(name="subagent", arguments='{"task": "t"}'),
    RunTurn: lambda: RunTurn(
        text="hello",
        speaker="ann",
        stored=True,
        pool="background",
        reports=(BackgroundReport("mm-thread", "sub-mm-thread-1", "sub-mm-thread-1 failed"),),
        resume=messages.Resume(waiting=(2,)),
    ),
    SessionCrashed: lambda: SessionCrashed(
        session="mm-thread", detail="boom", reports=("sub-mm-thread-1",)
    ),
    SessionLoaded: lambda: SessionLoaded(record=RECORD, created=True),
    SessionRecord: lambda: RECORD,
    SessionTurnEnded: lambda: SessionTurnEnded(
        session="mm-thread",
        outcome=TurnFailed(session="mm-thread", reason=FailReason.TURN_LIMIT, detail="16"),
        turns=3,
        untrusted=True,
        reports=("sub-mm-thread-2",),
    ),
    StartTurn: lambda: StartTurn(
        session="mm-thread",
        text="hello",
        speaker="ann",
        reply_to="supervisor",
        output=ToolSpec("final_answer", "Give it.", {"type": "object", "properties": {}}),
    ),
    StoreFailed: lambda: StoreFailed(
        session="mm-thread",
        detail="exists",
        exists=True,
        request_id=4,
        missing=True,
        taken=True,
        held_elsewhere=True,
    ),
    ReleaseSession: lambda: ReleaseSession(session="sub-mm-thread-1"),
    SubagentCompleted: lambda: SubagentCompleted(
        parent="mm-thread",
        call_id=1,
        child="sub-mm-thread-1",
        summary="done",
        untrusted=True,
    ),
    SubagentFailed: lambda: SubagentFailed(
        parent="mm-thread",
        call_id=1,
        child="sub-mm-thread-1",
        reason=FailReason.CRASHED,
        untrusted=False,
        detail="stopped",
    ),
    SubagentFinished: lambda: SubagentFinished(
        session="mm-thread",
        call_id=1,
        child="sub-mm-thread-1",
        completed=False,
        reason=FailReason.BUSY,
        at=AT,
    ),
    SubagentRequest: lambda: SubagentRequest(
        parent="mm-thread", call_id=2, task="look", untrusted=True, background=True
    ),
    SubagentStarted: lambda: SubagentStarted(
        session="mm-thread", call_id=1, child="sub-mm-thread-1", background=True, at=AT
    ),
    BackgroundRow: lambda: BACKGROUND_ROW,
    SaveBackground: lambda: SaveBackground("sub-mm-thread-1", BACKGROUND_ROW, "context", 3),
    DropBackground: lambda: DropBackground("sub-mm-thread-1", "context", 4),
    BackgroundSaved: lambda: BackgroundSaved("sub-mm-thread-1", 3, "disk full"),
    LoadBackground: lambda: LoadBackground("context", 5, "all"),
    BackgroundLoaded: lambda: BackgroundLoaded((BACKGROUND_ROW,), 5, "unreadable"),
    BackgroundReport: lambda: BackgroundReport(
        "mm-thread", "sub-mm-thread-1", "sub-mm-thread-1 failed", untrusted=True
    ),
    WaitFamily: lambda: WaitFamily("mm-thread", "waiter:1"),
    FamilyIdle: lambda: FamilyIdle("mm-thread"),
    ToolCall: lambda: CALL,
    ToolCallFinished: lambda: ToolCallFinished(
        session="mm-thread", call_id=2, name="clock", denied=True, at=AT
    ),
    ToolCallStarted: lambda: ToolCallStarted(session="mm-thread", call_id=2, name="clock", at=AT),
    ToolWorkerLost: lambda: ToolWorkerLost(
        session="mm-thread", call_id=2, name="clock", stuck=1, at=AT
    ),
    ToolDone: lambda: ToolDone(session="mm-thread", result=RESULT),
    ToolResult: lambda: RESULT,
    ToolSpec: lambda: SPEC,
    TurnCompleted: lambda: TurnCompleted(
        session="mm-thread",
        content='{"city":"Oslo","people":[1,2.5,null,true]}',
        output={"city": "Oslo", "people": [1, 2.5, None, True]},
    ),
    TurnEnded: lambda: TurnEnded(
        session="mm-thread", completed=False, reason=FailReason.MODEL_ERROR, detail="503", at=AT
    ),
    TurnFailed: lambda: TurnFailed(session="mm-thread", reason=FailReason.BUSY, detail="held"),
    TurnStarted: lambda: TurnStarted(session="mm-thread", slot=0, at=AT),
    messages.Cancel: lambda: messages.Cancel(
        FailReason.CANCELLED, "by the user", park=True, keep=(2,)
    ),
    messages.ApprovalRequested: lambda: messages.ApprovalRequested(
        session="mm-thread",
        call_id=3,
        tool="deploy",
        arguments='{"env": "prod"}',
        untrusted=True,
        at=AT,
    ),
    messages.ApprovalSettled: lambda: messages.ApprovalSettled(
        session="mm-thread", call_id=3, approved=True, at=AT
    ),
    messages.ApproveCall: lambda: messages.ApproveCall("mm-thread", 3, "ok", "ask-1"),
    messages.DenyCall: lambda: messages.DenyCall("mm-thread", 3, "too risky", "ask-1"),
    messages.ApprovalRefused: lambda: messages.ApprovalRefused("mm-thread", 3, "not waiting"),
    messages.ApprovalDecision: lambda: messages.ApprovalDecision(3, False, "too risky"),
    messages.ApprovalTimedOut: lambda: messages.ApprovalTimedOut("mm-thread", 3),
    messages.StoredApproval: lambda: messages.StoredApproval(
        messages.ApprovalRequested(
            session="mm-thread", call_id=3, tool="deploy", arguments="{}", at=AT
        ),
        AT,
        approved=False,
        reason="no",
        spent=120,
        background=True,
    ),
    messages.StoreApproval: lambda: messages.StoreApproval(
        "mm-thread",
        9,
        messages.StoredApproval(
            messages.ApprovalRequested(
                session="mm-thread", call_id=3, tool="d", arguments="{}", at=AT
            ),
            AT,
        ),
        "session:mm-thread",
    ),
    messages.SettleApproval: lambda: messages.SettleApproval("mm-thread", 3, False, "no"),
    messages.ApprovalStored: lambda: messages.ApprovalStored("mm-thread", 3, "disk full"),
    messages.DropApprovals: lambda: messages.DropApprovals("mm-thread", (3, 4)),
    messages.ListApprovals: lambda: messages.ListApprovals(),
    messages.RecordSpent: lambda: messages.RecordSpent("mm-thread", (3, 4), 120),
    messages.ApprovalsRun: lambda: messages.ApprovalsRun("mm-thread", (3,)),
    messages.Park: lambda: messages.Park(),
    messages.Parked: lambda: messages.Parked("mm-thread", 3, True),
    messages.Resume: lambda: messages.Resume(
        (messages.ApprovalDecision(3, True),),
        (4,),
        (5,),
        (
            messages.SubagentCompleted("mm-thread", 6, "sub-mm-thread-6", "done", False),
            messages.SubagentFailed(
                "mm-thread", 7, "sub-mm-thread-7", FailReason.CANCELLED, False, "cancelled"
            ),
        ),
    ),
    messages.CancelTurn: lambda: messages.CancelTurn("mm-thread", "by the user"),
    messages.CancelModelRequest: lambda: messages.CancelModelRequest("mm-thread", 12),
    messages.CancelPortCall: lambda: messages.CancelPortCall("mm-thread", 4),
    messages.ChildTimedOut: lambda: messages.ChildTimedOut("sub-mm-thread-1", 3),
    messages.JobSkipped: lambda: messages.JobSkipped(
        session="mm-thread", job="heartbeat:mm-thread", held=("sub-mm-thread-1",), at=AT
    ),
    messages.MemoryWarning: lambda: messages.MemoryWarning(
        session="mm-thread", detail="memory file MEMORY.md is damaged", at=AT
    ),
    messages.ToolProgress: lambda: messages.ToolProgress(
        session="mm-thread",
        call_id=3,
        name="files__slow",
        progress=2,
        total=5,
        message="2/5",
        at=AT,
    ),
    messages.McpServerUp: lambda: messages.McpServerUp(
        server="files", tools=("files__read",), skipped=("t" * 70,), at=AT
    ),
    messages.McpServerDown: lambda: messages.McpServerDown(
        server="files", detail="its process exited", at=AT
    ),
    messages.Remember: lambda: messages.Remember("mm-thread", 4, "The user's name is Ana."),
    messages.ScheduledTurn: lambda: messages.ScheduledTurn(
        "cron:0:mm-thread", "mm-thread", "It is 2026-11-30T07:00:00Z.\n\nMorning.", "scheduler"
    ),
    messages.Tick: lambda: messages.Tick(AT),
    messages.TextDelta: lambda: messages.TextDelta(session="sub-mm-thread-1", text="Hel", at=AT),
    messages.TokensSpent: lambda: messages.TokensSpent(
        "sub-mm-thread-1", messages.Usage(prompt_tokens=90, completion_tokens=5, requests=1)
    ),
    messages.SessionStopped: lambda: messages.SessionStopped("mm-thread", 2),
}


def exported_message_classes() -> list[type[messages.Message]]:
    """Every concrete message class `messages` exports."""
    found = []
    for name in messages.__all__:
        value = getattr(messages, name)
        if (
            isinstance(value, type)
            and issubclass(value, messages.Message)
            and value is not messages.Message
        ):
            found.append(value)
    return found


MESSAGE_CLASSES = exported_message_classes()
CLASS_IDS = [cls.__name__ for cls in MESSAGE_CLASSES]
UNIONS = {
    "TurnEvent": messages.TurnEvent,
    "TurnOutcome": messages.TurnOutcome,
    "SubagentResult": messages.SubagentResult,
    "ModelReply": messages.ModelReply,
}
UNION_MEMBERS = [
    pytest.param(union, member, id=f"{name}-{member.__name__}")
    for name, union in UNIONS.items()
    for member in typing.get_args(union)
]


def sample(cls: type[messages.Message]) -> messages.Message:
    if cls not in SAMPLES:
        pytest.fail(f"{cls.__name__} is exported by messages but has no sample in SAMPLES")
    value = SAMPLES[cls]()
    assert type(value) is cls
    return value


# --- every message class is covered ---------------------------------------------------------


def test_every_exported_message_class_has_a_sample() -> None:
    exported = set(MESSAGE_CLASSES)
    assert exported - SAMPLES.keys() == set(), "new message classes need a sample"
    assert SAMPLES.keys() - exported == set(), "samples for classes messages no longer exports"


def test_the_spec_names_are_exported() -> None:
    for name in (
        "SessionId",
        "CallId",
        "ToolCall",
        "ToolResult",
        "DataClass",
        "DenyReason",
        "denial_message",
        "StartTurn",
        "TurnCompleted",
        "TurnFailed",
        "SubagentRequest",
        "SubagentResult",
        "SubagentCompleted",
        "SubagentFailed",
        "TurnEvent",
    ):
        assert name in messages.__all__
    assert {"PUBLIC", "PRIVATE"} <= DataClass.__members__.keys()
    assert {"INVALID_ARGUMENTS", "UNKNOWN_TOOL"} <= DenyReason.__members__.keys()
    assert {"TURN_LIMIT", "MODEL_ERROR", "BUSY", "CANCELLED", "CRASHED"} <= (
        FailReason.__members__.keys()
    )


# --- frozen, round-trips, unions ------------------------------------------------------------


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=CLASS_IDS)
def test_message_is_frozen(cls: type[messages.Message]) -> None:
    value = sample(cls)
    assert cls.__struct_config__.frozen
    for name in cls.__struct_fields__:
        before = getattr(value, name)
        with pytest.raises(AttributeError):
            setattr(value, name, before)
        assert getattr(value, name) is before
    with pytest.raises(AttributeError):
        value.not_a_field = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=CLASS_IDS)
def test_message_round_trips_through_json(cls: type[messages.Message]) -> None:
    value = sample(cls)
    back = msgspec.json.decode(msgspec.json.encode(value), type=cls)
    assert type(back) is cls
    assert back == value


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=CLASS_IDS)
def test_message_round_trips_through_msgpack(cls: type[messages.Message]) -> None:
    value = sample(cls)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=cls)
    assert type(back) is cls
    assert back == value


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=CLASS_IDS)
def test_message_wire_names_its_type(cls: type[messages.Message]) -> None:
    wire = msgspec.json.decode(msgspec.json.encode(sample(cls)))
    assert wire["type"] == cls.__name__


@pytest.mark.parametrize(("union", "member"), UNION_MEMBERS)
def test_union_decodes_to_the_same_class(union: Any, member: type[messages.Message]) -> None:
    value = sample(member)
    from_json = msgspec.json.decode(msgspec.json.encode(value), type=union)
    from_msgpack = msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=union)
    assert type(from_json) is member
    assert type(from_msgpack) is member
    assert from_json == value
    assert from_msgpack == value


def test_turn_event_union_holds_only_events_that_name_a_session() -> None:
    for member in typing.get_args(messages.TurnEvent):
        assert "session" in member.__struct_fields__, member.__name__
        assert "at" in member.__struct_fields__, member.__name__


# --- no live objects ------------------------------------------------------------------------


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=CLASS_IDS)
def test_message_holds_no_live_object(cls: type[messages.Message]) -> None:
    value = sample(cls)
    data = msgspec.json.encode(value)  # a live object (ref, lock, callback) would fail here
    assert msgspec.json.decode(data, type=cls) == value


def _live_object_fields(info: mi.Type, path: str, seen: set[type]) -> list[str]:
    """Paths of fields whose declared type could hold something that is not plain data."""
    if isinstance(info, mi.CustomType | mi.ExtType):
        return [path]
    if isinstance(info, mi.AnyType):
        return [path]
    if isinstance(info, mi.Metadata):
        return _live_object_fields(info.type, path, seen)
    if isinstance(info, mi.UnionType):
        return [bad for t in info.types for bad in _live_object_fields(t, path, seen)]
    if isinstance(info, mi.VarTupleType | mi.ListType):
        return _live_object_fields(info.item_type, f"{path}[]", seen)
    if isinstance(info, mi.TupleType):
        return [bad for t in info.item_types for bad in _live_object_fields(t, f"{path}[]", seen)]
    if isinstance(info, mi.DictType):
        return _live_object_fields(info.value_type, f"{path}{{}}", seen)
    if isinstance(info, mi.StructType):
        if not issubclass(info.cls, messages.Message):
            return [f"{path} ({info.cls.__name__} is not a Message)"]
        if info.cls in seen:
            return []
        seen.add(info.cls)
        return [
            bad
            for field in info.fields
            for bad in _live_object_fields(field.type, f"{info.cls.__name__}.{field.name}", seen)
        ]
    return []


def test_no_message_field_is_declared_to_hold_a_live_object() -> None:
    infos = mi.multi_type_info(MESSAGE_CLASSES)
    loose: set[str] = set()
    for info in infos:
        loose.update(_live_object_fields(info, "", set()))
    # A tool's JSON schema, a profile's extra request fields and a typed turn's validated
    # value are free-form JSON; they are the only places an untyped value is allowed.
    assert loose <= {
        "ToolSpec.parameters{}",
        "RequestOptions.extra_body{}",
        "TurnCompleted.output",
        "TurnEnded.output",
    }


# --- SessionId ------------------------------------------------------------------------------

VALID_IDS = [
    "mm-thread",
    "a",
    "Z",
    "7",
    "a" * 64,
    "A.b_c-9",
    "sub-mm-thread-1",
    "a..b",
    "x-",
]
INVALID_IDS = [
    pytest.param("", id="empty"),
    pytest.param("a" * 65, id="65-bytes"),
    pytest.param("-a", id="leading-dash"),
    pytest.param(".a", id="leading-dot"),
    pytest.param("_a", id="leading-underscore"),
    pytest.param("a/b", id="slash"),
    pytest.param("/", id="only-slash"),
    pytest.param("..", id="dotdot"),
    pytest.param("a/../b", id="traversal"),
    pytest.param("a\\b", id="backslash"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a b", id="space"),
    pytest.param("a\n", id="trailing-newline"),
    pytest.param("a\tb", id="tab"),
    pytest.param("a:b", id="colon"),
    pytest.param("café", id="latin-accent"),
    pytest.param("mm-thre\u0430d", id="cyrillic-a"),
    pytest.param("\u0430", id="only-cyrillic-a"),
    pytest.param("\uff11\uff12", id="fullwidth-digits"),
    pytest.param("a\uff11", id="fullwidth-digit-inside"),
    pytest.param("\u212a", id="kelvin-sign"),
    pytest.param("\u0131d", id="dotless-i"),
    pytest.param("a\u200b", id="zero-width-space"),
    pytest.param("\u00e9" * 32, id="64-bytes-non-ascii"),
]


def spec_allows(text: str) -> bool:
    """SPEC 2's rule, written out independently of the module."""
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    size = len(text.encode("utf-8", "surrogatepass"))
    return 1 <= size <= 64 and all(c in allowed for c in text) and text[0] not in "._-"


@pytest.mark.parametrize("text", VALID_IDS)
def test_valid_session_id_is_returned_unchanged(text: str) -> None:
    assert check_session_id(text) == text
    if text.startswith("sub-"):
        return  # a child's id: valid, but no top-level turn may open it (tests/test_doors.py)
    assert StartTurn(session=text, text="t").session == text
    wire = msgspec.json.encode({"type": "StartTurn", "session": text, "text": "t"})
    assert msgspec.json.decode(wire, type=StartTurn).session == text


@pytest.mark.parametrize("text", INVALID_IDS)
def test_invalid_session_id_is_refused_naming_it(text: str) -> None:
    assert not spec_allows(text)  # the case really is outside the rule
    with pytest.raises(ValueError) as caught:
        check_session_id(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("text", INVALID_IDS)
def test_start_turn_refuses_an_invalid_session_id(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        StartTurn(session=text, text="t")
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("text", INVALID_IDS)
def test_decoding_start_turn_refuses_an_invalid_session_id(text: str) -> None:
    wire = msgspec.json.encode({"type": "StartTurn", "session": text, "text": "t"})
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(wire, type=StartTurn)
    assert isinstance(caught.value, ValueError)
    assert repr(text) in str(caught.value)


def test_decoding_start_turn_with_a_path_traversal_id_names_it() -> None:
    with pytest.raises(ValueError, match=r"'\.\./x'"):
        msgspec.json.decode(b'{"type":"StartTurn","session":"../x","text":"t"}', type=StartTurn)


def test_session_id_is_never_truncated() -> None:
    long_id = "a" * 65
    with pytest.raises(ValueError) as caught:
        check_session_id(long_id)
    assert repr(long_id) in str(caught.value)  # the whole id, not a cut one
    with pytest.raises(ValueError):
        StartTurn(session=long_id, text="t")
    with pytest.raises(ValueError):
        msgspec.msgpack.decode(
            msgspec.msgpack.encode({"type": "StartTurn", "session": long_id, "text": "t"}),
            type=StartTurn,
        )


def test_non_string_session_id_is_refused() -> None:
    for value in (None, 5, b"mm-thread"):
        with pytest.raises(ValueError):
            check_session_id(value)


def _session_id_fields() -> list[Any]:
    params = []
    for cls in MESSAGE_CLASSES:
        for field in msgspec.structs.fields(cls):
            if field.type in (SessionId, tuple[SessionId, ...]):
                params.append(pytest.param(cls, field.name, id=f"{cls.__name__}.{field.name}"))
    return params


SESSION_ID_FIELDS = _session_id_fields()


def test_session_id_fields_are_found() -> None:
    found = {p.id for p in SESSION_ID_FIELDS}
    assert {
        "StartTurn.session",
        "SubagentRequest.parent",
        "SubagentCompleted.child",
        "ContextStatus.held",
    } <= found


# ids.py: "Checked by check_session_id wherever a message carries one."
@pytest.mark.parametrize(("cls", "field"), SESSION_ID_FIELDS)
def test_every_message_refuses_an_invalid_session_id(
    cls: type[messages.Message], field: str
) -> None:
    value = sample(cls)
    bad: object = ("mm-thread", "../x") if isinstance(getattr(value, field), tuple) else "../x"
    with pytest.raises(ValueError, match=r"'\.\./x'"):
        msgspec.structs.replace(value, **{field: bad})
    wire = msgspec.json.decode(msgspec.json.encode(value))
    wire[field] = bad
    with pytest.raises(msgspec.ValidationError, match=r"\.\./x"):
        msgspec.json.decode(msgspec.json.encode(wire), type=cls)


@given(st.text(alphabet=st.characters(exclude_categories=())))
@example("mm-thread")
@example("a" * 64)
@example("a" * 65)
@example("a\n")
@example("\ud800")
def test_check_session_id_returns_the_text_or_raises_value_error(text: str) -> None:
    try:
        result = check_session_id(text)
    except ValueError as exc:
        assert not spec_allows(text)
        assert repr(text) in str(exc)
    else:
        assert result == text
        assert spec_allows(text)


# --- CallId ---------------------------------------------------------------------------------


@pytest.mark.parametrize("call_id", [0, -1])
def test_tool_call_id_below_one_does_not_decode(call_id: int) -> None:
    wire = {"type": "ToolCall", "id": call_id, "name": "clock", "arguments": "{}"}
    with pytest.raises(msgspec.ValidationError, match=r"\$\.id"):
        msgspec.json.decode(msgspec.json.encode(wire), type=ToolCall)
    with pytest.raises(msgspec.ValidationError, match=r"\$\.id"):
        msgspec.msgpack.decode(msgspec.msgpack.encode(wire), type=ToolCall)


def test_tool_call_id_one_decodes() -> None:
    wire = b'{"type":"ToolCall","id":1,"name":"clock","arguments":"{}"}'
    assert msgspec.json.decode(wire, type=ToolCall) == ToolCall(id=1, name="clock", arguments="{}")


def _call_id_fields() -> list[Any]:
    params = []
    for cls in MESSAGE_CLASSES:
        for field in msgspec.structs.fields(cls):
            if field.type in (CallId, CallId | None):
                params.append(pytest.param(cls, field.name, id=f"{cls.__name__}.{field.name}"))
    return params


@pytest.mark.parametrize(("cls", "field"), _call_id_fields())
def test_every_call_id_field_refuses_zero_on_decode(
    cls: type[messages.Message], field: str
) -> None:
    wire = msgspec.json.decode(msgspec.json.encode(sample(cls)))
    wire[field] = 0
    with pytest.raises(msgspec.ValidationError, match=rf"\$\.{field}"):
        msgspec.json.decode(msgspec.json.encode(wire), type=cls)


# --- denials --------------------------------------------------------------------------------


def test_invalid_arguments_denial_is_exact() -> None:
    assert (
        denial_message(DenyReason.INVALID_ARGUMENTS, "task is required")
        == "Denied: the arguments are not valid for this tool: task is required."
    )
    assert (
        denial_message(DenyReason.INVALID_ARGUMENTS, "unknown field: x")
        == "Denied: the arguments are not valid for this tool: unknown field: x."
    )


def test_unknown_tool_denial_names_the_tool() -> None:
    text = denial_message(DenyReason.UNKNOWN_TOOL, "hostname")
    assert text.startswith("Denied: ")
    assert "hostname" in text
    assert text != denial_message(DenyReason.INVALID_ARGUMENTS, "hostname")


@pytest.mark.parametrize("reason", list(DenyReason))
def test_every_deny_reason_has_a_text(reason: DenyReason) -> None:
    assert denial_message(reason).startswith("Denied: ")
    assert denial_message(reason, "why").startswith("Denied: ")


# --- decoding garbage -----------------------------------------------------------------------

_EVENT_TAGS = [member.__name__ for member in typing.get_args(messages.TurnEvent)]
_JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=70),
    st.just("2026-11-29T23:59:01Z"),
    st.just("mm-thread"),
)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
_FIELD_NAMES = st.sampled_from(
    ["session", "slot", "step", "at", "text", "call_id", "child", "name", "reason", "completed"]
)
# Near misses: objects with a real tag and plausible fields, so decoding gets past the tag.
_NEAR_MISSES = st.builds(
    lambda tag, fields: msgspec.json.encode({"type": tag, **fields}),
    st.sampled_from([*_EVENT_TAGS, "StartTurn", "Nope", ""]),
    st.dictionaries(_FIELD_NAMES | st.text(max_size=6), _JSON_VALUES, max_size=6),
)


@given(st.one_of(st.binary(), _NEAR_MISSES))
@example(b"")
@example(b'{"type":"TurnStarted","session":"../x","slot":0}')
@example(b'{"type":"TurnStarted","session":"a","slot":0,"at":"not a time"}')
@example(b'{"type":"StartTurn","session":"../x","text":"t"}')
@example(b'{"type":"StartTurn","session":"\\u0000","text":"t"}')
@example(b"\xff\xfe")
def test_decoding_garbage_raises_only_decode_errors(data: bytes) -> None:
    for decode in (msgspec.json.decode, msgspec.msgpack.decode):
        for target in (messages.TurnEvent, StartTurn):
            try:
                decode(data, type=target)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                assert isinstance(exc, ValueError)
