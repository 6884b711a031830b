"""The prometheusUrl allow-list (operator/kube/url_policy.py): prefixes match on parsed parts,
so look-alike hosts, other ports, credentials and path tricks are refused; a bad prefix from
the installer fails with a message naming where it came from."""

from __future__ import annotations

import pytest

from specpilot.operator.app.cli import main
from specpilot.operator.kube.url_policy import ALLOW_ENV, FIELD, FLAG, UrlAllowList
from specpilot.tuner import ConfigError

POLICY = UrlAllowList(("http://prom.monitoring:9090", "https://thanos.example/query/"))


@pytest.mark.parametrize(
    "url",
    [
        "http://prom.monitoring:9090",
        "http://prom.monitoring:9090/",
        "http://prom.monitoring:9090/api/v1/query",
        "HTTP://PROM.monitoring:9090",  # scheme and host are case-insensitive
        "https://thanos.example/query",
        "https://thanos.example/query/sub",
        "https://thanos.example:8443/query",  # the prefix names no port: any port of that host
    ],
)
def test_allowed(url: str) -> None:
    assert POLICY.allows(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://prom.monitoring:9090.evil.example",  # a look-alike host
        "http://prom.monitoring.evil.example:9090",
        "http://evil.example/http://prom.monitoring:9090",
        "http://prom.monitoring:90901",  # another port
        "http://prom.monitoring:9091",
        "http://prom.monitoring",  # no port: not the port the prefix names
        "http://prom.monitoring:notaport",
        "https://prom.monitoring:9090",  # another scheme
        "ftp://prom.monitoring:9090",
        "file:///etc/passwd",
        "http://user@prom.monitoring:9090",  # credentials
        "http://prom.monitoring:9090@evil.example",  # the host is evil.example
        "http://user:pw@prom.monitoring:9090",
        "http://prom.monitoring:9090\\@evil.example",  # a backslash, read as / by some clients
        "http://prom.monitoring:9090/\n",  # control characters urlsplit would drop silently
        "http://prom.mon\titoring:9090",
        " http://prom.monitoring:9090",
        "https://thanos.example/queryx",  # a path prefix only on a / boundary
        "https://thanos.example/",
        "https://thanos.example/query/../admin",  # dot segments escape the path
        "https://thanos.example/query/%2e%2e/admin",
        "https://thanos.example/query/%5c..",
        "http://",
        "",
        "prom.monitoring:9090",
    ],
)
def test_refused(url: str) -> None:
    assert not POLICY.allows(url)


def test_nothing_is_allowed_without_a_prefix() -> None:
    empty = UrlAllowList.configured(env={})
    assert empty.prefixes == () and not empty.allows("http://prom.monitoring:9090")
    assert "none configured" in empty.refusal("http://x")


def test_flags_and_environment_add_up_without_repeats() -> None:
    env = {ALLOW_ENV: " http://a:9090 , ,http://b:9090,http://a:9090"}
    policy = UrlAllowList.configured(["http://c", "http://a:9090"], env=env)
    assert policy.prefixes == ("http://c", "http://a:9090", "http://b:9090")


def test_the_refusal_names_the_field_and_the_allowed_prefixes() -> None:
    message = POLICY.refusal("http://evil.example")
    assert FIELD in message and "'http://evil.example'" in message
    assert "http://prom.monitoring:9090, https://thanos.example/query/" in message


@pytest.mark.parametrize(
    ("flags", "env", "source"),
    [
        (["prom:9090"], {}, FLAG),
        (["http://user@prom"], {}, FLAG),
        ([], {ALLOW_ENV: "http://ok:9090,ftp://prom"}, ALLOW_ENV),
    ],
)
def test_a_bad_prefix_names_where_it_came_from(
    flags: list[str], env: dict[str, str], source: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        UrlAllowList.configured(flags, env=env)
    assert refused.value.field == source and "http(s) URL prefix" in str(refused.value)


def test_the_operator_command_refuses_a_bad_prefix_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["operator", "--standalone", "--prometheus-url-allow", "ftp://prom"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --prometheus-url-allow='ftp://prom' is invalid")
    assert "Traceback" not in error
