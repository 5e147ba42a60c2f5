"""The proxy rule of module_utils._net.proxy (proxy_for, bypasses, Proxy), compared with urllib's own reading of the
environment (getproxies_environment, proxy_bypass_environment) wherever the two agree, and the cases where ours
goes further (CIDR, IP addresses, host:port with the default port, ``*`` in a list) named as such."""

import base64
import os
import urllib.request

import pytest
from conftest import patch_module_args

from ansible_collections.ttfleet.inference.plugins.module_utils._net.deadline import Deadline
from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import ProxyError
from ansible_collections.ttfleet.inference.plugins.module_utils._net.http import connection
from ansible_collections.ttfleet.inference.plugins.module_utils._net.proxy import (
    PROXY_OPTIONS,
    apply_proxy_env,
    proxy_for,
)
from ansible_collections.ttfleet.inference.plugins.module_utils._net.redact import mask_proxy

# (url, NO_PROXY value, bypassed?, does urllib decide the same?)
BYPASS = [
    ("https://hub.example.com/x", "", False, True),
    ("https://hub.example.com/x", "hub.example.com", True, True),
    ("https://hub.example.com/x", "HUB.Example.COM", True, True),
    ("https://hub.example.com/x", "example.com", True, True),
    ("https://hub.example.com/x", ".example.com", True, True),
    ("https://example.com/x", ".example.com", True, True),
    ("https://notexample.com/x", "example.com", False, True),
    ("https://example.com.evil.net/x", "example.com", False, True),
    ("https://hub.example.com/x", " other.net , example.com ", True, True),
    ("https://hub.example.com/x", "other.net,,", False, True),
    ("https://hub.example.com/x", "*", True, True),
    ("https://hub.example.com:8443/x", "hub.example.com:8443", True, True),
    ("https://hub.example.com:8443/x", "hub.example.com:9000", False, True),
    ("https://hub.example.com:8443/x", "hub.example.com", True, True),
    ("http://10.1.2.3:8765/x", "10.1.2.3", True, True),
    ("http://10.1.2.3/x", "10.1.2.4", False, True),
    # Ours only: networks, the default port spelt out, "*" in a list, IPv6 in brackets.
    ("http://10.1.2.3:8765/x", "10.0.0.0/8", True, False),
    ("http://192.168.1.3/x", "10.0.0.0/8", False, True),
    ("https://hub.example.com/x", "hub.example.com:443", True, False),
    ("https://hub.example.com/x", "other.net,*", True, False),
    ("http://[fd00::5]:8080/x", "fd00::/8", True, False),
    ("http://[fd00::5]:8080/x", "[fd00::5]:8080", True, True),
    ("http://[fd00::5]:8080/x", "[fd00::5]:9", False, True),
    # An IP entry never matches a name by suffix, nor a name an address.
    ("http://1.2.3.4/x", "2.3.4", False, False),
]


@pytest.mark.parametrize(("url", "no_proxy", "bypassed", "urllib_agrees"), BYPASS)
def test_no_proxy_entries(url, no_proxy, bypassed, urllib_agrees):
    environ = {"HTTPS_PROXY": "http://proxy:3128", "HTTP_PROXY": "http://proxy:3128", "NO_PROXY": no_proxy}
    assert (proxy_for(url, environ) is None) is bypassed
    host = urllib.request.Request(url).host
    theirs = bool(urllib.request.proxy_bypass_environment(host, {"no": no_proxy}))
    assert (theirs == bypassed) is urllib_agrees, (theirs, bypassed)


# (environment, url, the proxy host:port chosen or None); lowercase wins over uppercase as in urllib.
CHOICE = [
    ({}, "https://h.example/", None),
    ({"HTTPS_PROXY": "http://up:1"}, "https://h.example/", "up:1"),
    ({"https_proxy": "http://low:2"}, "https://h.example/", "low:2"),
    ({"HTTPS_PROXY": "http://up:1", "https_proxy": "http://low:2"}, "https://h.example/", "low:2"),
    ({"HTTPS_PROXY": "http://up:1", "https_proxy": ""}, "https://h.example/", None),
    ({"HTTP_PROXY": "http://plain:3"}, "https://h.example/", None),
    ({"HTTP_PROXY": "http://plain:3"}, "http://h.example/", "plain:3"),
    ({"HTTPS_PROXY": "http://up:1"}, "http://h.example/", None),
    ({"http_proxy": "proxy.example:3128"}, "http://h.example/", "proxy.example:3128"),
    ({"http_proxy": "http://proxy.example"}, "http://h.example/", "proxy.example:80"),
    ({"HTTPS_PROXY": "http://up:1", "NO_PROXY": "h.example", "no_proxy": ""}, "https://h.example/", "up:1"),
    ({"HTTPS_PROXY": "http://up:1", "NO_PROXY": "", "no_proxy": "h.example"}, "https://h.example/", None),
    ({"ALL_PROXY": "http://all:4"}, "https://h.example/", None),
]


@pytest.mark.parametrize(("environ", "url", "chosen"), CHOICE)
def test_which_proxy(monkeypatch, environ, url, chosen):
    proxy = proxy_for(url, environ)
    assert (None if proxy is None else f"{proxy.host}:{proxy.port}") == chosen
    # urllib reads only the process environment: give it the same one.
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name == "REQUEST_METHOD":
            monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    theirs = urllib.request.getproxies_environment()
    scheme = url.partition(":")[0]
    host = urllib.request.Request(url).host
    bypass = "no" in theirs and urllib.request.proxy_bypass_environment(host, {"no": theirs["no"]})
    expected = None if bypass or scheme not in theirs else theirs[scheme].rpartition("/")[2]
    assert expected == (None if chosen is None else environ_value(environ, scheme).rpartition("/")[2])


def environ_value(environ, scheme):
    return environ.get(f"{scheme}_proxy") or environ[f"{scheme.upper()}_PROXY"]


def test_the_process_environment_is_the_default(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert proxy_for("https://h.example/") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://from-env:3128")
    assert proxy_for("https://h.example/").host == "from-env"


def test_proxy_credentials_become_a_header_and_are_masked_everywhere():
    proxy = proxy_for("https://h.example/", {"HTTPS_PROXY": "http://us%40er:p%3Ass-w0rd@proxy:3128/"})
    assert proxy.headers() == {"Proxy-Authorization": "Basic " + base64.b64encode(b"us@er:p:ss-w0rd").decode()}
    assert proxy.shown == "http://us%40er:***@proxy:3128/"
    assert "w0rd" not in repr(proxy) + proxy.shown
    assert proxy_for("https://h.example/", {"HTTPS_PROXY": "http://proxy:3128"}).headers() == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("https://user:s3cret@proxy:3128", "a https proxy; only http:// proxies are supported"),
        ("socks5://user:s3cret@proxy:1080", "a socks5 proxy"),
        ("http://user:s3cret@proxy:port", "whose port is not a number"),
        ("http://user:s3cret@:3128", "which names no host"),
    ],
)
def test_an_unusable_proxy_is_refused_naming_the_variable_not_the_password(value, expected):
    with pytest.raises(ProxyError) as err:
        proxy_for("https://h.example/", {"https_proxy": value})
    text = str(err.value)
    assert expected in text
    assert "https_proxy is " in text
    assert "user:***@" in text
    assert "s3cret" not in text
    assert "set https_proxy to http://[user:password@]host:port" in text


def test_an_unusable_proxy_of_another_scheme_is_not_read():
    assert proxy_for("https://h.example/", {"HTTP_PROXY": "socks5://x:1"}) is None


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("http://user:pw@proxy:3128", "http://user:***@proxy:3128"),
        ("http://user@proxy:3128", "http://user:***@proxy:3128"),
        ("user:pw@proxy:3128", "user:***@proxy:3128"),
        ("http://proxy:3128", "http://proxy:3128"),
        ("http://a:b@c@proxy:3128/x", "http://a:***@proxy:3128/x"),
    ],
)
def test_mask_proxy(value, shown):
    assert mask_proxy(value) == shown


def test_peers_and_instance_ports_stay_direct_unless_told(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    deadline = Deadline(total=5, stall=5)
    direct = connection("http", "10.0.0.5", 8765, deadline)
    assert (direct.host, direct.port, direct.ttfleet_proxy) == ("10.0.0.5", 8765, None)
    proxied = connection("http", "10.0.0.5", 8765, deadline, use_proxy=True)
    assert (proxied.host, proxied.port, proxied.ttfleet_absolute) == ("127.0.0.1", 9, "http://10.0.0.5:8765")
    tunnelled = connection("https", "hub.example", None, deadline, use_proxy=True)
    assert (tunnelled.host, tunnelled.port) == ("127.0.0.1", 9)
    assert (tunnelled._tunnel_host, tunnelled._tunnel_port) == ("hub.example", 443)
    assert tunnelled.ttfleet_absolute is None


def test_the_proxy_env_option_reaches_the_environment_with_its_password_masked(monkeypatch):
    from ansible.module_utils.basic import AnsibleModule

    # Set through monkeypatch first, so that what the module puts in the environment is undone after the test.
    for name in ("https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "")
    monkeypatch.delenv("no_proxy")
    monkeypatch.setenv("HTTPS_PROXY", "http://host-env:1")  # the host's; the option's lowercase key wins
    secret = "opt-" + "Secret77"
    value = {"https_proxy": f"http://ops:{secret}@proxy.site:3128", "NO_PROXY": ".site,10.0.0.0/8"}
    with patch_module_args({"proxy_env": value}):
        module = AnsibleModule(argument_spec=dict(PROXY_OPTIONS))
    apply_proxy_env(module)
    assert secret in module.no_log_values and f"ops:{secret}" in module.no_log_values
    assert ".site,10.0.0.0/8" not in module.no_log_values
    assert proxy_for("https://hub.example/").host == "proxy.site"
    assert proxy_for("https://a.site/") is None and proxy_for("https://10.1.1.1/") is None


def test_the_proxy_env_option_takes_proxy_variables_only(monkeypatch):
    from ansible.module_utils.basic import AnsibleModule

    with patch_module_args({"proxy_env": {"LD_PRELOAD": "/tmp/x.so"}}):
        module = AnsibleModule(argument_spec=dict(PROXY_OPTIONS))

    def fail_json(msg):
        raise AssertionError(msg)

    monkeypatch.setattr(module, "fail_json", fail_json)
    with pytest.raises(AssertionError, match="proxy_env holds 'LD_PRELOAD', which is not a proxy variable"):
        apply_proxy_env(module)
    assert "LD_PRELOAD" not in os.environ or os.environ["LD_PRELOAD"] != "/tmp/x.so"
