"""Configuration (SPEC 9): a TOML file, strict about keys and types, errors naming the key."""

from __future__ import annotations

import contextlib
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.config import (
    CompactConfig,
    Config,
    ConfigError,
    LoopConfig,
    ModelConfig,
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
