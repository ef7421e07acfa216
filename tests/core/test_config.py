"""Configuration (SPEC 9): a TOML file, strict about keys and types, errors naming the key."""

from __future__ import annotations

import contextlib
import pathlib
import re

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.config import (
    CompactConfig,
    Config,
    ConfigError,
    CronJob,
    HeartbeatConfig,
    LoopConfig,
    MemoryConfig,
    ModelConfig,
    PortConfig,
    SlotsConfig,
)

FULL = """\
home = "{home}"

[model]
base_url = "http://10.0.0.5:9000/v1"
name = "qwen3-32b"
api_key_env = "LOOPD_TEST_API_KEY"
timeout_s = 42.5

[slots]
main = 3
background = 4

[loop]
max_steps = 5
tool_result_cap = 777

[compact]
summary_chars = 321
threshold_chars = 9999
"""

SECTIONS = ["model", "slots", "loop", "compact"]


def write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    path = tmp_path / "loopd.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: pathlib.Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        Config.load(path)
    message = str(caught.value)
    assert str(path) in message  # every load error names the file
    return message


# --- defaults and a full file ---------------------------------------------------------------


def test_empty_file_loads_the_defaults(tmp_path: pathlib.Path) -> None:
    assert Config.load(write(tmp_path, "")) == Config()


def test_a_partial_section_keeps_the_other_defaults(tmp_path: pathlib.Path) -> None:
    config = Config.load(write(tmp_path, "[loop]\nmax_steps = 3\n"))
    assert config.loop.max_steps == 3
    assert config.loop.tool_result_cap == Config().loop.tool_result_cap
    assert config.model == Config().model
    assert config.slots == Config().slots
    assert config.compact == Config().compact


def test_every_spec_key_is_read(tmp_path: pathlib.Path) -> None:
    home = tmp_path / "home"
    config = Config.load(write(tmp_path, FULL.format(home=home)))
    assert config.home == str(home)
    assert config.model.base_url == "http://10.0.0.5:9000/v1"
    assert config.model.name == "qwen3-32b"
    assert config.model.api_key_env == "LOOPD_TEST_API_KEY"
    assert config.model.timeout_s == 42.5
    assert config.slots.main == 3
    assert config.slots.background == 4
    assert config.loop.max_steps == 5
    assert config.loop.tool_result_cap == 777
    assert config.compact.summary_chars == 321
    assert config.compact.threshold_chars == 9999


def test_load_accepts_a_str_path(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, "[slots]\nbackground = 2\n")
    assert Config.load(str(path)).slots.background == 2


def test_an_integer_timeout_is_accepted_as_seconds(tmp_path: pathlib.Path) -> None:
    assert Config.load(write(tmp_path, "[model]\ntimeout_s = 30\n")).model.timeout_s == 30.0


def test_config_is_built_in_code_the_same_way(tmp_path: pathlib.Path) -> None:
    home = tmp_path / "home"
    loaded = Config.load(write(tmp_path, FULL.format(home=home)))
    built = Config(
        home=str(home),
        model=ModelConfig(
            base_url="http://10.0.0.5:9000/v1",
            name="qwen3-32b",
            api_key_env="LOOPD_TEST_API_KEY",
            timeout_s=42.5,
        ),
        slots=SlotsConfig(main=3, background=4),
        loop=LoopConfig(max_steps=5, tool_result_cap=777),
        compact=CompactConfig(summary_chars=321, threshold_chars=9999),
    )
    assert loaded == built


# --- unknown keys ---------------------------------------------------------------------------


def test_unknown_top_level_key_is_refused_naming_it(tmp_path: pathlib.Path) -> None:
    message = load_error(tmp_path, 'hoem = "/tmp/x"\n')
    assert "hoem" in message


def test_unknown_section_is_refused_naming_it(tmp_path: pathlib.Path) -> None:
    message = load_error(tmp_path, "[modle]\nname = 'x'\n")
    assert "modle" in message


@pytest.mark.parametrize("section", SECTIONS)
def test_unknown_key_in_a_section_is_refused_naming_it(
    tmp_path: pathlib.Path, section: str
) -> None:
    message = load_error(tmp_path, f"[{section}]\nnot_a_key = 1\n")
    assert "not_a_key" in message
    assert f"$.{section}" in message


# --- wrong types and ranges -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path"),
    [
        pytest.param("home = 5\n", "$.home", id="home"),
        pytest.param("model = 'x'\n", "$.model", id="section-not-a-table"),
        pytest.param("[model]\nbase_url = 8080\n", "$.model.base_url", id="base_url"),
        pytest.param("[model]\nname = ['a']\n", "$.model.name", id="name"),
        pytest.param("[model]\napi_key_env = true\n", "$.model.api_key_env", id="api_key_env"),
        pytest.param("[model]\ntimeout_s = '30'\n", "$.model.timeout_s", id="timeout_s"),
        pytest.param("[slots]\nmain = '0'\n", "$.slots.main", id="main"),
        pytest.param("[slots]\nbackground = 1.5\n", "$.slots.background", id="background"),
        pytest.param("[loop]\nmax_steps = '16'\n", "$.loop.max_steps", id="max_steps"),
        pytest.param("[loop]\ntool_result_cap = true\n", "$.loop.tool_result_cap", id="cap"),
        pytest.param("[compact]\nsummary_chars = [1]\n", "$.compact.summary_chars", id="summary"),
        pytest.param(
            "[compact]\nthreshold_chars = {a = 1}\n", "$.compact.threshold_chars", id="threshold"
        ),
    ],
)
def test_wrong_type_is_refused_naming_the_key_path(
    tmp_path: pathlib.Path, text: str, path: str
) -> None:
    message = load_error(tmp_path, text)
    assert f"`{path}`" in message


@pytest.mark.parametrize(
    ("text", "path"),
    [
        pytest.param("[loop]\nmax_steps = 0\n", "$.loop.max_steps", id="max_steps-0"),
        pytest.param("[loop]\ntool_result_cap = 0\n", "$.loop.tool_result_cap", id="cap-0"),
        pytest.param("[slots]\nmain = -1\n", "$.slots.main", id="main-negative"),
        pytest.param("[slots]\nbackground = -2\n", "$.slots.background", id="bg-negative"),
        pytest.param("[model]\ntimeout_s = 0\n", "$.model.timeout_s", id="timeout-0"),
        pytest.param("[model]\ntimeout_s = -1.0\n", "$.model.timeout_s", id="timeout-negative"),
        pytest.param("[compact]\nsummary_chars = 0\n", "$.compact.summary_chars", id="summary-0"),
        pytest.param(
            "[compact]\nthreshold_chars = -5\n", "$.compact.threshold_chars", id="threshold-neg"
        ),
    ],
)
def test_out_of_range_value_is_refused_naming_the_key_path(
    tmp_path: pathlib.Path, text: str, path: str
) -> None:
    message = load_error(tmp_path, text)
    assert f"`{path}`" in message


def test_smallest_allowed_values_are_accepted(tmp_path: pathlib.Path) -> None:
    text = "[loop]\nmax_steps = 1\ntool_result_cap = 1\n[slots]\nmain = 0\nbackground = 0\n"
    config = Config.load(write(tmp_path, text))
    assert (config.loop.max_steps, config.loop.tool_result_cap) == (1, 1)
    assert (config.slots.main, config.slots.background) == (0, 0)


# --- unreadable files -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("home = \n", id="missing-value"),
        pytest.param("[loop\nmax_steps = 3\n", id="broken-header"),
        pytest.param("[loop]\nmax_steps = 3\nmax_steps = 4\n", id="duplicate-key"),
        pytest.param("max_steps: 3\n", id="not-toml"),
    ],
)
def test_invalid_toml_is_refused(tmp_path: pathlib.Path, text: str) -> None:
    load_error(tmp_path, text)


def test_missing_file_is_refused_naming_the_path(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nowhere" / "loopd.toml"
    with pytest.raises(ConfigError) as caught:
        Config.load(path)
    assert str(path) in str(caught.value)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# --- home and the api key -------------------------------------------------------------------


def test_home_accepts_a_path_and_stores_a_str(tmp_path: pathlib.Path) -> None:
    config = Config(home=tmp_path / "home")  # type: ignore[arg-type]
    assert isinstance(config.home, str)
    assert config.home == str(tmp_path / "home")
    assert config.home_path == tmp_path / "home"


def test_home_that_is_not_a_path_is_refused() -> None:
    with pytest.raises(ConfigError, match="home"):
        Config(home=5)  # type: ignore[arg-type]


def test_api_key_is_read_from_the_named_variable(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = Config.load(write(tmp_path, FULL.format(home=tmp_path)))
    monkeypatch.setenv("LOOPD_TEST_API_KEY", "sk-test-123")
    assert config.model.api_key() == "sk-test-123"
    monkeypatch.setenv("LOOPD_TEST_API_KEY", "sk-rotated")
    assert config.model.api_key() == "sk-rotated"  # read when asked, not when loaded
    monkeypatch.delenv("LOOPD_TEST_API_KEY")
    assert config.model.api_key() is None


def test_no_api_key_without_api_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-be-used")
    assert Config().model.api_key_env is None
    assert Config().model.api_key() is None


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_toml_text_loads_or_fails_with_a_config_error(text: str) -> None:
    with contextlib.suppress(ConfigError):
        Config.from_toml(text)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["home", "model", "slots", "loop", "compact", "memory", "x"]),
        st.one_of(
            st.integers(), st.text(), st.booleans(), st.dictionaries(st.text(), st.integers())
        ),
    )
)
def test_any_shape_of_config_fails_only_with_a_config_error(data: dict) -> None:
    import msgspec

    with contextlib.suppress(ConfigError):
        Config.from_toml(msgspec.toml.encode(data))


# --- values checked when the config is read or built (issue 9, item 8) ------------------------


def every_key() -> list[tuple[str, str, type[msgspec.Struct]]]:
    """``(section, key, struct)`` for every scalar key of every table ("" is the top level)."""
    found = [("", "home", Config)]
    tables = {
        "model": ModelConfig,
        "slots": SlotsConfig,
        "loop": LoopConfig,
        "compact": CompactConfig,
        "port": PortConfig,
        "memory": MemoryConfig,
        "heartbeat": HeartbeatConfig,
        "cron": CronJob,
    }
    for section, struct in tables.items():
        found += [(section, f.name, struct) for f in msgspec.structs.fields(struct)]
    return found


REQUIRED = {
    "heartbeat": {"session": "watch", "every_s": 60.0},
    "cron": {"session": "ops", "schedule": "0 7 * * *", "prompt": "go"},
}
FLOAT_KEYS = [
    (section, key)
    for section, key, struct in every_key()
    for f in msgspec.structs.fields(struct)
    if f.name == key and "float" in str(f.type)
]


def build(section: str, key: str, value: object) -> Config:
    """A Config built in Python with ``section.key = value``."""
    if section == "":
        return Config(**{key: value})
    struct = {s: t for s, _, t in every_key()}[section]
    table = struct(**{**REQUIRED.get(section, {}), key: value})
    return Config(**{section: (table,) if section == "cron" else table})


def as_toml(section: str, key: str, value: str) -> str:
    """TOML text setting ``section.key`` to the TOML literal ``value``."""
    if section == "":
        return f"{key} = {value}\n"
    rows = {**{k: msgspec.json.encode(v).decode() for k, v in REQUIRED.get(section, {}).items()}}
    rows[key] = value
    header = "[[cron]]" if section == "cron" else f"[{section}]"
    return header + "\n" + "".join(f"{k} = {v}\n" for k, v in rows.items())


def test_every_float_key_is_found() -> None:
    assert ("model", "timeout_s") in FLOAT_KEYS and ("heartbeat", "every_s") in FLOAT_KEYS


@pytest.mark.parametrize(("section", "key"), FLOAT_KEYS)
@pytest.mark.parametrize("literal", ["inf", "-inf", "nan", "1e308", "-1.0"])
def test_a_float_key_refuses_what_is_not_a_sane_number_of_seconds(
    section: str, key: str, literal: str
) -> None:
    name = f"{section}.{key}" if section else key
    value = float(literal)
    with pytest.raises(ConfigError, match=re.escape(name)):
        build(section, key, value)
    with pytest.raises(ConfigError, match=re.escape(name)):
        Config.from_toml(as_toml(section, key, literal))


@pytest.mark.parametrize(
    ("built", "key"),
    [
        (lambda: ModelConfig(concurrency=0), "model.concurrency"),
        (lambda: ModelConfig(timeout_s=0), "model.timeout_s"),
        (lambda: ModelConfig(retries=11), "model.retries"),
        (lambda: ModelConfig(name=7), "model.name"),
        (lambda: LoopConfig(max_steps="16"), "loop.max_steps"),
        (lambda: LoopConfig(max_steps=True), "loop.max_steps"),
        (lambda: LoopConfig(system_prompt="a\ud800"), "loop.system_prompt"),
        (lambda: SlotsConfig(main=2**70), "slots.main"),
        (lambda: MemoryConfig(file=""), "memory.file"),
        (lambda: MemoryConfig(max_entry_chars=0), "memory.max_entry_chars"),
        (lambda: HeartbeatConfig(session="w", every_s=60, file="a\x00b"), "heartbeat.file"),
        (lambda: ModelConfig(api_key_env="MY KEY"), "model.api_key_env"),
        (lambda: Config(home=""), "home"),
    ],
)
def test_a_config_built_in_python_is_checked_like_toml(built, key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        built()


def test_an_int_given_for_a_float_becomes_a_float_and_a_list_a_tuple() -> None:
    assert ModelConfig(timeout_s=5).timeout_s == 5.0
    assert type(ModelConfig(timeout_s=5).timeout_s) is float
    job = CronJob(session="ops", schedule="0 7 * * *", prompt="go")
    assert Config(cron=[job]).cron == (job,)


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        "http://a\r\nb",
        "http://a b",
        "http://" + "h" * 5000,
        "http://" + "h" * 300 + ".example",
        "localhost:8080",
        "ftp://host/v1",
        "http://",
        "http://host:99999/v1",
        "http://host/v1?x=1",
        "http://host/v1#frag",
    ],
)
def test_an_unusable_base_url_is_refused_when_read(url: str) -> None:
    with pytest.raises(ConfigError, match=r"model\.base_url .* is not a usable URL"):
        ModelConfig(base_url=url)
    with pytest.raises(ConfigError, match=r"model\.base_url"):
        Config.from_toml(f"[model]\nbase_url = {msgspec.json.encode(url).decode()}\n")


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8080/v1", "https://api.example.com/v1", "http://[::1]:8080/v1"]
)
def test_usable_base_urls_load(url: str) -> None:
    assert ModelConfig(base_url=url).base_url == url


def test_url_credentials_never_appear_in_the_error() -> None:
    with pytest.raises(ConfigError) as caught:
        ModelConfig(base_url="http://ann:hunter2@[::1")
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("schedule", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4 *"])
def test_a_cron_schedule_that_can_never_fire_is_refused(schedule: str) -> None:
    with pytest.raises(ConfigError, match="can never fire"):
        CronJob(session="ops", schedule=schedule, prompt="go")


def test_a_leap_day_schedule_is_accepted() -> None:
    assert CronJob(session="ops", schedule="0 0 29 2 *", prompt="go").schedule == "0 0 29 2 *"


def test_a_bom_at_the_start_of_the_file_is_accepted(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "loopd.toml"
    path.write_bytes(b"\xef\xbb\xbf[loop]\nmax_steps = 3\n")
    assert Config.load(path).loop.max_steps == 3


def test_the_api_key_is_stripped_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    model = ModelConfig(api_key_env="LOOPD_TEST_API_KEY")
    monkeypatch.setenv("LOOPD_TEST_API_KEY", " sk-abc\n")
    assert model.api_key() == "sk-abc"
    assert set(model.secrets()) == {" sk-abc\n", "sk-abc"}
    monkeypatch.setenv("LOOPD_TEST_API_KEY", "sk-ab\x01c")
    with pytest.raises(ConfigError, match="LOOPD_TEST_API_KEY") as caught:
        model.api_key()
    assert "sk-ab" not in str(caught.value)
    monkeypatch.setenv("LOOPD_TEST_API_KEY", "   ")
    assert model.api_key() is None


any_value = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(["http://127.0.0.1:1/v1", "0 7 * * *", "ops", "MEMORY.md", "KEY"]),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(where=st.sampled_from(every_key()), value=any_value)
def test_any_value_of_any_key_is_refused_or_reads_back_the_same_from_toml(
    where: tuple[str, str, type], value: object
) -> None:
    section, key, _ = where
    try:
        config = build(section, key, value)
    except ConfigError:
        return
    # What Python accepts, TOML accepts and reads back equal: one set of rules.
    again = Config.from_toml(msgspec.toml.encode(without_none(msgspec.to_builtins(config))))
    assert again == config


def without_none(data: object) -> object:
    """``data`` with every None left out (TOML has no null: an unset key is a missing key)."""
    if isinstance(data, dict):
        return {k: without_none(v) for k, v in data.items() if v is not None}
    if isinstance(data, list | tuple):  # to_builtins keeps a tuple (the [[cron]] tables)
        return [without_none(v) for v in data]
    return data


def test_a_home_of_an_unknown_user_is_a_config_error() -> None:
    # Found by hypothesis: Path("~0").expanduser() raises RuntimeError.
    with pytest.raises(ConfigError, match="home '~no-such-user-here'"):
        Config(home="~no-such-user-here")


# --- cron fields (issue 19, A15) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "field"),
    [
        ("1-0 * * * *", "the minute field '1-0': its range '1-0' runs backwards"),
        ("*/1000000000000 * * * *", "the minute field '*/1000000000000': its step"),
        ("0-59/61 * * * *", "the minute field '0-59/61': its step '61'"),
        ("0 23-1 * * *", "the hour field '23-1': its range"),
        ("0 0 20-10 * *", "the day of month field '20-10'"),
        ("0 0 1 dec-jan *", "the month field 'dec-jan'"),
        ("0 7 * * 5-1", "the day of week field '5-1'"),
        ("0 7 * * 1,sat-sun", "the day of week field '1,sat-sun'"),
        ("0 */99999999999999999999 * * *", "the hour field"),
    ],
)
def test_a_cron_field_that_cannot_mean_what_it_says_is_refused_at_load_naming_it(
    tmp_path: pathlib.Path, schedule: str, field: str
) -> None:
    # croniter takes ``1-0`` for every minute and ``*/1000000000000`` for the top of each hour.
    path = tmp_path / "loopd.toml"
    path.write_text(
        '[[cron]]\nsession = "morning"\nschedule = "0 7 * * *"\nprompt = "go"\n\n'
        f'[[cron]]\nsession = "ops"\nschedule = "{schedule}"\nprompt = "go"\n'
    )
    with pytest.raises(ConfigError) as caught:
        Config.load(path)
    text = str(caught.value)
    assert field in text
    assert "the job on ops" in text and "$.cron[1]" in text  # which job: its session and index


@pytest.mark.parametrize(
    "schedule",
    [
        "*/15 9-17 * * mon-fri",
        "0 0 * * 0-7",
        "*/60 * * * *",
        "0 0 1 */3 *",
        "0 0 1 jan-mar *",
        "0 0 L * *",
        "0 0 15W * *",
        "0 0 * * 5#2",
        "5,10-20/5 * * * *",
    ],
)
def test_ordinary_cron_fields_still_load(schedule: str) -> None:
    assert CronJob(session="ops", schedule=schedule, prompt="go").schedule == schedule


def test_a_new_sessions_home_slot_is_the_first_of_its_pool() -> None:
    for slots in (
        SlotsConfig(),
        SlotsConfig(main=3, background=4),
        SlotsConfig(main=(5, 5, 2), background=(7, 1)),
        SlotsConfig(main=(0, 1), total=4),
    ):
        for pool in ("main", "background"):
            assert slots.home_slot(pool) == slots.pool(pool)[0], (slots, pool)


@pytest.mark.parametrize(
    ("table", "key"),
    [("[approvals]\ntools", "approvals.tools"), ("[agents.ops]\napprove", "agents.ops.approve")],
)
@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        ("**", "'**' is not a tool name or pattern: a '*' may only end a name"),
        ("a*b", "'a*b' is not a tool name or pattern"),
        ("*clock", "'*clock' is not a tool name or pattern"),
        ("github__**", "'github__**' is not a tool name or pattern"),
        ("", "an empty tool name"),
        ("final_answer", "'final_answer' never waits for a person"),
    ],
)
def test_an_approval_pattern_that_cannot_mean_what_it_seems_is_refused_naming_it(
    table: str, key: str, pattern: str, named: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        Config.from_toml(f"{table} = [{pattern!r}]".replace("'", '"', 2))
    assert f"{key}: {named}" in str(refused.value)


def test_approval_patterns_ending_in_a_star_are_prefixes() -> None:
    from actors.core.approvals import approval_policies

    config = Config.from_toml('[approvals]\ntools = ["clock*", "github__*"]')
    (policy,) = approval_policies(config).values()
    assert policy.needs("clock") and policy.needs("clock2") and policy.needs("github__merge")
    assert not policy.needs("deploy")
    (every,) = approval_policies(Config.from_toml('[approvals]\ntools = ["*"]')).values()
    assert all(every.needs(n) for n in ("clock", "remember", "subagent", "x__y", "deploy"))
