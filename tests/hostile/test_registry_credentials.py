"""Credentials per registry (issue 29 case 5): ttfleet.inference.image_mirror against registries on 127.0.0.1 that
record every Authorization header they get.

The serve role used to pass the first ``tt_registry_credentials`` entry of any origin as the module's one
``source_username``/``source_password``, which went to every origin of the play and to the upstream proxy an origin
is mapped to (``tt_image_site_upstream``). Now each request carries the credentials set for the registry it actually
goes to, and nothing when none are set; the old pair only works bound to one named registry.

Each registry here is a small registry API v2 (Basic auth, one repository per image, uploads kept in memory) run by the
``hostile`` harness; the module runs as Ansible runs it (``module_code``) in a child process.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from conftest import as_json, http_head, reply, run_bounded, send
from test_kernel_store import module_code

CONFIG = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'
LAYER = b"layer-of-the-image" * 100
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
SITE = ("push", "site-Push-pw-1")
ORIGIN_A = ("fleet", "A-only-Secret-7")
ORIGIN_B = ("fleet-b", "B-own-Secret-3")


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def manifest():
    blob = {
        "mediaType": "application/vnd.docker.container.image.v1+json",
        "size": len(CONFIG),
        "digest": digest(CONFIG),
    }
    layer = {
        "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "size": len(LAYER),
        "digest": digest(LAYER),
    }
    return json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_V2, "config": blob, "layers": [layer]}).encode()


def basic(login):
    return "Basic " + base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()


def plain(login):
    return f"{login[0]}:{login[1]}"


def registry(login, images=()):
    """A registry script: Basic auth with ``login`` (None: anonymous), holding ``images`` (``path:tag``) of one layer,
    accepting uploads. Every request stays in ``server.requests`` with its headers."""
    manifests = {tuple(image.rsplit(":", 1)): manifest() for image in images}
    blobs = {digest(CONFIG): CONFIG, digest(LAYER): LAYER} if images else {}

    def script(conn, req, srv):
        if req is None:
            return
        if login is not None and req.header("authorization") != basic(login):
            reply(
                conn,
                {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]},
                401,
                {"WWW-Authenticate": 'Basic realm="registry"'},
            )
            return
        path = req.path.split("?")[0]
        if path == "/v2/":
            reply(conn, {})
            return
        repo, kind, name = (
            path[len("/v2/") :].rpartition("/")[0].rpartition("/")[0],
            path.split("/")[-2],
            path.split("/")[-1],
        )
        if req.method == "POST" and path.endswith("/blobs/uploads/"):
            send(conn, http_head(202, {"Location": f"{path}u1"}, 0))
        elif req.method == "PUT" and "/blobs/uploads/" in path:
            data = req.raw.partition(b"\r\n\r\n")[2]
            blobs[req.path.split("digest=")[1].replace("%3A", ":")] = data
            send(conn, http_head(201, {}, 0))
        elif req.method == "PUT" and kind == "manifests":
            data = req.raw.partition(b"\r\n\r\n")[2]
            manifests[(repo, name)] = data
            send(conn, http_head(201, {"Docker-Content-Digest": digest(data)}, 0))
        elif kind == "manifests" and (repo, name) in manifests:
            body = manifests[(repo, name)]
            head = {"Content-Type": MANIFEST_V2, "Docker-Content-Digest": digest(body)}
            send(conn, http_head(200, head, len(body)) + (b"" if req.method == "HEAD" else body))
        elif kind == "blobs" and name in blobs:
            body = blobs[name]
            send(conn, http_head(200, {}, len(body)) + (b"" if req.method == "HEAD" else body))
        else:
            reply(conn, {"errors": [{"code": "NOT_FOUND", "message": "unknown"}]}, 404)

    return script


def seen(server):
    """Every Authorization a registry received, Basic ones decoded to ``user:password``."""
    found = []
    for req in server.requests:
        value = req.header("authorization")
        if value and value.startswith("Basic "):
            found.append(base64.b64decode(value[len("Basic ") :]).decode("utf-8", "replace"))
        elif value:
            found.append(value)
    return found


def run_mirror(args):
    result = run_bounded(module_code("image_mirror", {"timeout": 10, **args}), timeout=120)
    return as_json(result["out"]), result


@pytest.mark.broke29(5)
@pytest.mark.parametrize("given", ["one-pair-as-the-role-passed-it", "per-registry"])
def test_another_origin_never_gets_the_first_origins_password(hostile, given):
    origin_a = hostile(registry(ORIGIN_A, ["tt/a:1.0"]))
    origin_b = hostile(registry(ORIGIN_B, ["tt/b:1.0"]))
    site = hostile(registry(SITE))
    address = {name: server.url.split("//")[1] for name, server in (("a", origin_a), ("b", origin_b), ("s", site))}
    args = {
        "images": [
            {"source": f"{address['a']}/tt/a:1.0", "target": f"{address['s']}/tt/a:1.0"},
            {"source": f"{address['b']}/tt/b:1.0", "target": f"{address['s']}/tt/b:1.0"},
        ],
        "plain_http": list(address.values()),
    }
    if given == "per-registry":
        args["registry_credentials"] = [
            {"registry": address["a"], "username": ORIGIN_A[0], "password": ORIGIN_A[1]},
            {"registry": address["b"], "username": ORIGIN_B[0], "password": ORIGIN_B[1]},
            {"registry": address["s"], "username": SITE[0], "password": SITE[1]},
        ]
    else:
        # What roles/serve/tasks/images.yml passed before: the first matching entry, for every origin.
        args.update(
            source_username=ORIGIN_A[0], source_password=ORIGIN_A[1], target_username=SITE[0], target_password=SITE[1]
        )
    out, result = run_mirror(args)
    assert ORIGIN_A[1] not in json.dumps(seen(origin_b)) + json.dumps(seen(site))
    assert set(seen(origin_b)) <= {plain(ORIGIN_B)}
    assert set(seen(origin_a)) <= {plain(ORIGIN_A)}
    assert set(seen(site)) <= {plain(SITE)}
    if given == "per-registry":
        assert not out.get("failed"), (out, result["err"][-600:])
        assert [image["blobs_copied"] for image in out["images"]] == [2, 2]
    else:
        # The pair names no registry: refused before any request, with the fix.
        assert out.get("failed") and "source_registry" in out["msg"] and "registry_credentials" in out["msg"]
        assert not origin_a.requests and not origin_b.requests


@pytest.mark.broke29(5)
@pytest.mark.parametrize("given", ["one-pair-as-the-role-passed-it", "per-registry"])
def test_the_upstream_proxy_never_gets_the_origins_password(hostile, given):
    # The origin is named ghcr.io; tt_image_site_upstream sends its reads to a proxy that asks for a password.
    proxy = hostile(registry(("proxy-user", "proxy-pw"), ["tenstorrent/x:1.0"]))
    site = hostile(registry(SITE))
    proxy_at, site_at = proxy.url.split("//")[1], site.url.split("//")[1]
    args = {
        "images": [{"source": "ghcr.io/tenstorrent/x:1.0", "target": f"{site_at}/tenstorrent/x:1.0"}],
        "upstream": {"ghcr.io": proxy_at},
        "plain_http": [proxy_at, site_at],
    }
    if given == "per-registry":
        args["registry_credentials"] = [
            {"registry": "ghcr.io", "username": ORIGIN_A[0], "password": ORIGIN_A[1]},
            {"registry": site_at, "username": SITE[0], "password": SITE[1]},
        ]
    else:
        args.update(
            source_username=ORIGIN_A[0], source_password=ORIGIN_A[1], target_username=SITE[0], target_password=SITE[1]
        )
    out, _result = run_mirror(args)
    assert ORIGIN_A[1] not in json.dumps(seen(proxy))
    assert seen(proxy) == []
    assert out.get("failed")
    if given == "per-registry":
        # No entry for the proxy: it was asked anonymously, and the error says so and names it.
        assert f"registry {proxy_at} refused access" in out["msg"] and "no credentials are set for it" in out["msg"]
    else:
        assert "source_registry" in out["msg"]


def test_the_proxy_gets_its_own_entry_and_the_copy_works(hostile):
    proxy_login = ("proxy-user", "proxy-pw")
    proxy = hostile(registry(proxy_login, ["tenstorrent/x:1.0"]))
    site = hostile(registry(SITE))
    proxy_at, site_at = proxy.url.split("//")[1], site.url.split("//")[1]
    out, result = run_mirror(
        {
            "images": [{"source": "ghcr.io/tenstorrent/x:1.0", "target": f"{site_at}/tenstorrent/x:1.0"}],
            "upstream": {"ghcr.io": proxy_at},
            "plain_http": [proxy_at, site_at],
            "registry_credentials": [
                {"registry": "ghcr.io", "username": ORIGIN_A[0], "password": ORIGIN_A[1]},
                {"registry": proxy_at, "username": proxy_login[0], "password": proxy_login[1]},
                {"registry": site_at, "username": SITE[0], "password": SITE[1]},
            ],
        }
    )
    assert not out.get("failed"), (out, result["err"][-600:])
    assert set(seen(proxy)) == {plain(proxy_login)} and set(seen(site)) == {plain(SITE)}


def _client(server, login):
    from ansible_collections.ttfleet.inference.plugins.module_utils._images.registry import Registry

    return Registry(server.url.split("//")[1], login, plain_http=True, timeout=10)


def test_a_token_service_on_another_host_gets_no_password(hostile, catcher):
    # The registry's Bearer challenge names a realm elsewhere: that host gets an anonymous request, never Basic.
    from ansible_collections.ttfleet.inference.plugins.module_utils._images.refs import ImageError

    realm = f"{catcher.url}/token"

    def origin(conn, req, srv):
        if req is not None:
            challenge = {"WWW-Authenticate": f'Bearer realm="{realm}",service="reg"'}
            reply(conn, {"errors": [{"code": "UNAUTHORIZED", "message": "token"}]}, 401, challenge)

    with pytest.raises(ImageError):
        _client(hostile(origin), ORIGIN_A).resolve("tt/x", "1.0")
    assert catcher.requests and seen(catcher) == []


def test_a_redirect_to_another_host_carries_no_credentials(hostile, catcher):
    # A blob redirected to storage elsewhere (as registries do): the registry's credentials stay with the registry.
    inner = registry(ORIGIN_A, ["tt/x:1.0"])

    def origin(conn, req, srv):
        if req is not None and "/blobs/" in req.path and req.header("authorization") == basic(ORIGIN_A):
            send(conn, http_head(307, {"Location": f"{catcher.url}/blob"}, 0))
        else:
            inner(conn, req, srv)

    client = _client(hostile(origin), ORIGIN_A)
    with client.open_blob("tt/x", digest(LAYER), len(LAYER)) as resp:
        resp.read()
    assert [req.path for req in catcher.requests] == ["/blob"] and seen(catcher) == []


def test_a_host_asks_each_registry_with_its_own_stored_login_only(hostile, tmp_path, monkeypatch):
    # container_image on a host: the login root stored for A (registry_auth) never goes to B, whose image is pulled.
    from ansible_collections.ttfleet.inference.plugins.module_utils._images import fetch
    from ansible_collections.ttfleet.inference.plugins.module_utils._images.auth import encode_auth
    from ansible_collections.ttfleet.inference.plugins.module_utils._images.engine import Engine

    origin_a = hostile(registry(ORIGIN_A, ["tt/a:1.0"]))
    origin_b = hostile(registry(ORIGIN_B, ["tt/b:1.0"]))
    a_at, b_at = origin_a.url.split("//")[1], origin_b.url.split("//")[1]
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"auths": {a_at: {"auth": encode_auth(*ORIGIN_A)}}}))
    params = {
        "images": [{"image": f"{b_at}/tt/b:1.0"}],
        "pull": True,
        "docker_config": str(config),
        "certs_dir": str(tmp_path / "certs"),
        "timeout": 10,
    }
    warnings = []
    # Check mode on a host whose engine is not there yet: only the registry is asked (plain HTTP for the stand-in).
    real = fetch.Registry
    monkeypatch.setattr(fetch, "Registry", lambda *args, **kwargs: real(*args, plain_http=True, **kwargs))
    fetch.plan(params, Engine(str(tmp_path / "none.sock")), True, warnings.append)
    assert origin_b.requests and seen(origin_b) == []
    assert any(f"registry {b_at} refused access" in w and "no credentials are set for it" in w for w in warnings)
