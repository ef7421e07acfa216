"""The model URL check, with the standard library only: every refusal it made with httpx."""

from __future__ import annotations

import subprocess
import sys

import pytest

from actors.core.config import ConfigError, ModelConfig


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://1.2.3.999/v1", "invalid IPv4 address"),
        ("http://[v1.x]/v1", "invalid IPv6 address"),
        ("http://[::1]x/v1", "invalid port"),
        ("http://\u2603.example/v1", "invalid IDNA hostname"),
    ],
)
def test_a_host_httpx_refused_is_refused(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"model\.base_url .* is not a usable URL: {why}"):
        ModelConfig(base_url=url)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.7:8080/v1",
        "http://[fe80::1%25eth0]:8080/v1",
        "https://b\u00fccher.example/v1",
        "http://llama_server:8080/v1",
    ],
)
def test_a_usable_host_loads(url: str) -> None:
    assert ModelConfig(base_url=url).base_url == url


@pytest.mark.timeout(60)
def test_the_config_imports_no_http_client() -> None:
    code = (
        "import sys, actors.core.config\n"
        "print(sorted(m for m in ('httpx', 'aiohttp') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
