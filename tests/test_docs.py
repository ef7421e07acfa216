"""The docs stay true: the configuration reference, its example, and the runbook's sections."""

from __future__ import annotations

import json
import re
import tomllib
import types
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec
import pytest

from actors.core.config import Config
from actors.core.dispatch import ArgumentError, Registry, child_id, dispatch
from messages import DenyReason, FailReason, denial_message

DOCS = Path(__file__).resolve().parent.parent / "docs"
CONFIGURATION = DOCS / "configuration.md"
RUNBOOK = DOCS / "runbook.md"

TOP = "Top level"
"""The heading of the top-level keys (``home``) in docs/configuration.md."""

_TYPE_WORDS = re.compile(r"\b(int|float|str|bool|none|list|table)\b")
PYTHON_ONLY = {("[agents.NAME]", "output")}
"""Keys a Struct has that TOML cannot set (a Python type): documented, not in the example."""


# --- reading the docs -------------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _unquote(cell: str) -> str:
    """A cell without the backticks of its code span."""
    return cell.strip().removeprefix("`").removesuffix("`").strip()


def config_tables() -> dict[str, dict[str, tuple[str, str]]]:
    """``{heading: {key: (type cell, default cell)}}`` from docs/configuration.md.

    A table belongs to the last ``##`` heading above it: ``Top level``, ``[section]`` or
    ``[[section]]`` (an array of tables). Other headings hold no reference tables.
    """
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    heading: str | None = None
    for line in CONFIGURATION.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            text = line[3:].strip()
            table = r"\[\w+\]|\[\[\w+\]\]|\[\w+\.NAME\]"
            heading = text if text == TOP or re.fullmatch(table, text) else None
            continue
        if heading is None or not line.startswith("|"):
            continue
        cells = _cells(line)
        if cells[0] == "key" or set(cells[0]) <= {"-", ":"}:
            continue  # the header row and the separator row
        key = _unquote(cells[0])
        rows = tables.setdefault(heading, {})
        assert key not in rows, f"{key} is documented twice under {heading}"
        rows[key] = (cells[1], _unquote(cells[2]))
    return tables


def parse_default(cell: str) -> Any:
    """A documented default: ``none``, ``true``, ``false``, ``{}``, a quoted string, or a
    number."""
    words = {"none": None, "true": True, "false": False}
    if cell in words:
        return words[cell]
    if cell == "{}":
        return {}
    if cell == "[]":
        return ()  # a list key's default, an empty tuple
    if cell.startswith('"'):
        return json.loads(cell)
    try:
        return int(cell)
    except ValueError:
        return float(cell)


def toml_examples() -> list[str]:
    text = CONFIGURATION.read_text(encoding="utf-8")
    return re.findall(r"^```toml\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def headings(path: Path) -> list[str]:
    return [
        line[3:].strip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("## ")
    ]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


# --- the real configuration -------------------------------------------------------------------


def _table_struct(annotation: Any) -> type[msgspec.Struct] | None:
    """The struct of a field that is a TOML table: ``S``, ``S | None``, ``tuple[S, ...]`` or
    ``dict[str, S]`` (tables by name)."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    args = [a for a in get_args(annotation) if a is not type(None) and a is not Ellipsis]
    if get_origin(annotation) is dict:
        args = args[1:]
    if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], msgspec.Struct):
        return args[0]
    return None


def sections() -> dict[str, type[msgspec.Struct]]:
    """``{heading: struct}``: ``Top level`` is Config; each table field is ``[name]``, or
    ``[[name]]`` for a tuple of tables, ``[name.NAME]`` for tables by name."""
    found: dict[str, type[msgspec.Struct]] = {TOP: Config}
    for field in msgspec.structs.fields(Config):
        struct = _table_struct(field.type)
        if struct is not None:
            origin = get_origin(field.type)
            if origin is dict:
                found[f"[{field.name}.NAME]"] = struct
            else:
                found[f"[[{field.name}]]" if origin is tuple else f"[{field.name}]"] = struct
    return found


def scalar_fields(struct: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    """The fields of ``struct`` that are keys, not tables of their own."""
    return {f.name: f for f in msgspec.structs.fields(struct) if _table_struct(f.type) is None}


def real_default(field: msgspec.structs.FieldInfo) -> Any:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    return field.default_factory()


def type_words(annotation: Any) -> tuple[set[str], list[str]]:
    """The type names a cell must name (``none`` for None), and the limits it must state."""
    names: set[str] = set()
    limits: list[str] = []
    union = get_origin(annotation) in (Union, types.UnionType)
    for member in get_args(annotation) if union else (annotation,):
        if get_origin(member) is Annotated:
            member, *metas = get_args(member)
            for meta in metas:
                for name, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                    value = getattr(meta, name, None)
                    if value is not None:
                        limits.append(f"{op} {value}")
        if get_origin(member) is tuple:  # ``tuple[str, ...]``: a TOML array of str
            names.add("list")
            for item in get_args(member):
                if item is not Ellipsis:
                    inner, _ = type_words(item)
                    names |= inner
        elif get_origin(member) is dict:  # ``dict[str, Any]``: a TOML table
            names.add("table")
        elif get_origin(member) is Literal:
            names.add("str")  # one of the quoted words the cell names
        else:
            names.add("none" if member is type(None) else member.__name__)
    return names, limits


# --- (a) the configuration reference ----------------------------------------------------------


def test_every_section_has_a_table():
    assert set(config_tables()) == set(sections())


@pytest.mark.parametrize("section", sorted(sections()))
def test_documented_keys_are_the_real_keys(section):
    documented = set(config_tables().get(section, {}))
    assert documented == set(scalar_fields(sections()[section])), section


@pytest.mark.parametrize("section", sorted(sections()))
def test_documented_defaults_are_the_real_defaults(section):
    table = config_tables()[section]
    for key, field in scalar_fields(sections()[section]).items():
        where = f"{section} {key}"
        cell = table[key][1]
        if field.required:
            assert cell == "required", f"{where}: documented {cell}, but it is required"
            continue
        assert cell != "required", f"{where}: documented required, but it has a default"
        real = real_default(field)
        if section == TOP and key == "home":
            assert cell == "~/.loopd"
            assert real == str(Path(cell).expanduser())
            continue
        documented = parse_default(cell)
        assert documented == real, f"{where}: documented {cell}, real {real!r}"
        assert type(documented) is type(real), f"{where}: {cell} is not a {type(real).__name__}"


@pytest.mark.parametrize("section", sorted(sections()))
def test_documented_types_are_the_real_types(section):
    table = config_tables()[section]
    for key, field in scalar_fields(sections()[section]).items():
        cell = table[key][0]
        if (section, key) in PYTHON_ONLY:
            assert "Python" in cell, f"{section} {key}: type {cell}"
            continue
        names, limits = type_words(field.type)
        assert set(_TYPE_WORDS.findall(cell)) == names, f"{section} {key}: type {cell}"
        for limit in limits:
            found = re.search(rf"{re.escape(limit)}(?![\d.])", cell)
            assert found, f"{section} {key}: type {cell} lacks the limit {limit}"


# --- (b) the example --------------------------------------------------------------------------


def test_the_example_loads():
    examples = toml_examples()
    assert examples, "docs/configuration.md has no ```toml example"
    for example in examples:
        config = Config.from_toml(example, source="docs/configuration.md")
        assert isinstance(config, Config)


def test_the_example_sets_every_documented_key():
    (example,) = toml_examples()
    data = tomllib.loads(example)
    for section, rows in config_tables().items():
        if section.endswith(".NAME]"):
            # Tables by name: some keys exclude each other, so the profiles together set all.
            named = data[section.strip("[]").removesuffix(".NAME")].values()
            keys = set().union(*(set(t) for t in named))
            keys |= {key for where, key in PYTHON_ONLY if where == section}
            assert set(rows) <= keys, f"the example lacks keys of {section}"
            continue
        found = data if section == TOP else data[section.strip("[]")]
        for table in found if isinstance(found, list) else [found]:
            assert set(rows) <= set(table), f"the example lacks keys of {section}"


# --- (c) the runbook's sections ---------------------------------------------------------------


def test_runbook_has_exactly_one_subagent_id_section():
    lines = RUNBOOK.read_text(encoding="utf-8").splitlines()
    assert lines.count("## subagent-id") == 1
    assert [slug(h) for h in headings(RUNBOOK)].count("subagent-id") == 1


@pytest.mark.parametrize("reason", [*DenyReason, *FailReason], ids=str)
def test_runbook_has_a_section_per_reason(reason):
    # The value opens the heading (``## busy``, ``## timeout (child)``), so that a heading such as
    # ``## turn timeout`` does not pass for the reason ``timeout``.
    first = re.compile(rf"{re.escape(reason.value)}(?![\w-])")
    found = [h for h in headings(RUNBOOK) if first.match(h.replace("`", ""))]
    assert found, f"docs/runbook.md has no ## section for {reason.value}"


def test_runbook_anchors_are_unique():
    anchors = [slug(h) for h in headings(RUNBOOK)]
    assert len(anchors) == len(set(anchors))


def test_runbook_links_to_its_own_sections():
    text = RUNBOOK.read_text(encoding="utf-8")
    anchors = {slug(h) for h in headings(RUNBOOK)}
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, f"runbook link #{target} has no section"


ARGUMENT_DENIALS = [
    ("subagent", "not json"),
    ("subagent", "[]"),
    ("subagent", '{"<key>": 1}'),
    ("subagent", "{}"),
    ("subagent", '{"task": 1}'),
    ("call_tool", "[]"),
    ("call_tool", '{"<key>": 1}'),
    ("call_tool", "{}"),
    ("call_tool", '{"name": 1}'),
    ("call_tool", '{"name": "call_tool"}'),
    ("remember", "[]"),
    ("remember", '{"<key>": 1}'),
    ("remember", "{}"),
    ("remember", '{"text": 1}'),
]
"""Calls that hit every INVALID_ARGUMENTS detail of subagent, call_tool and remember (the key:
``<key>``)."""


@pytest.mark.parametrize(("tool", "arguments"), ARGUMENT_DENIALS)
def test_runbook_names_each_argument_denial(tool, arguments):
    route = dispatch(Registry(), tool, arguments, datetime(2026, 11, 29, tzinfo=UTC))
    prefix = denial_message(DenyReason.INVALID_ARGUMENTS, "x").removesuffix("x.")
    detail = route.text.removeprefix(prefix).removesuffix(".")
    assert route.denied and detail != route.text
    assert f"`{detail}`" in RUNBOOK.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("reason", "detail"),
    [
        (DenyReason.UNKNOWN_TOOL, "<name>"),
        (DenyReason.STEP_LIMIT, "loop.max_steps is <n>"),
        (DenyReason.INTERRUPTED, None),
    ],
)
def test_runbook_quotes_the_other_denials(reason, detail):
    assert f"`{denial_message(reason, detail)}`" in RUNBOOK.read_text(encoding="utf-8")


# --- (d) the child-id denial points at the runbook --------------------------------------------


def test_child_id_denial_names_the_runbook_section():
    parent = "a" * 59
    with pytest.raises(ArgumentError) as caught:
        child_id(parent, 1)
    detail = caught.value.detail
    raw = f"sub-{parent}-1"
    assert detail == f"child session id `{raw}` would not fit; see docs/runbook.md#subagent-id"
    assert denial_message(DenyReason.INVALID_ARGUMENTS, detail) == (
        f"Denied: the arguments are not valid for this tool: {detail}."
    )
    path, anchor = re.search(r"see (\S+)#([\w-]+)", detail).groups()
    assert (DOCS.parent / path).resolve() == RUNBOOK
    assert anchor in {slug(h) for h in headings(RUNBOOK)}


@pytest.mark.parametrize(("length", "depth", "digits"), [(9, 9, 1), (9, 7, 2), (40, 4, 1)])
def test_runbook_arithmetic_of_child_ids(length, depth, digits):
    """A top-level id of length L at depth d with k-digit calls needs L + d*(5+k) bytes."""
    session = "m" * length
    number = 10 ** (digits - 1)
    for _ in range(depth):
        session = child_id(session, number)
    assert len(session) == length + depth * (5 + digits) <= 64
    with pytest.raises(ArgumentError):  # the runbook's maximum depth: one more does not fit
        child_id(session, number)


# --- docs that stand alone and install what they say (issue 19, B1 and B12) -------------------

README = DOCS.parent / "README.md"
USER_DOCS = [README, *sorted(DOCS.glob("*.md"))]

# ``pip install`` and its arguments, up to the end of the code span, the line or the command.
_INSTALL = re.compile(r"pip3?\s+install([^`\n;&|)]*)")


def pip_installs(text: str) -> list[list[str]]:
    """The arguments of every ``pip install`` in ``text``, quotes taken off."""
    return [
        [arg.strip("'\"") for arg in found.group(1).split()] for found in _INSTALL.finditer(text)
    ]


def test_pip_installs_are_found() -> None:
    text = "`pip install 'loopd[otel]'`, `pip install -U \"loopd\"`\n  pip install . && loopd demo"
    assert pip_installs(text) == [["loopd[otel]"], ["-U", "loopd"], ["."]]


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_no_install_line_installs_the_loopd_of_the_package_index(doc: Path) -> None:
    # The name loopd on PyPI belongs to an unrelated project: every install is from the checkout.
    for args in pip_installs(doc.read_text(encoding="utf-8")):
        wrong = [a for a in args if re.match(r"loopd\b", a)]
        assert not wrong, f"{doc.name}: pip install {' '.join(args)}: install from the checkout"


def test_the_otel_section_says_the_sdk_is_needed() -> None:
    guide = (DOCS / "guide.md").read_text(encoding="utf-8")
    section = guide.split("### Tracing with OpenTelemetry", 1)[1].split("\n## ", 1)[0]
    assert "pip install '.[otel]'" in section
    assert "opentelemetry.sdk" in section and "pip install opentelemetry-sdk" in section


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_no_doc_cites_the_spec(doc: Path) -> None:
    # SPEC.md is not in the repository: a doc states the rule itself.
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        assert not re.search(r"\bSPEC\b", line), f"{doc.name}:{number}: {line.strip()}"


def test_the_guide_gives_the_shape_sessions_show_json_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 19 B12: the guide called it the chat-completions shape; it is loopd's message shape.
    from actors import Runtime
    from actors.shells.views import show_session_json
    from actors.stores.reader import StoreReader
    from actors.stores.sqlite import DB_NAME
    from actors.testing import ScriptedModel, call, reply

    config = Config(home=str(tmp_path))
    with Runtime.start(config, model=ScriptedModel([call("clock"), reply("done")])) as rt:
        rt.run_turn("main", "hi", timeout=30)
    with StoreReader(tmp_path / DB_NAME) as store:
        show_session_json(store, "main")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    called = next(line["message"] for line in lines[1:] if line["message"]["tool_calls"])
    guide = (DOCS / "guide.md").read_text(encoding="utf-8")
    bullet = guide.split("- `loopd sessions show ID --json`", 1)[1].split("\n- ", 1)[0]
    assert "not the chat-completions one" in bullet
    assert f'"type": "{called["type"]}"' in bullet
    assert f'"type": "{called["tool_calls"][0]["type"]}"' in bullet
    for key in [*lines[0], *called, *called["tool_calls"][0]]:
        assert f'"{key}"' in bullet, key
