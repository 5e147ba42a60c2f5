# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations


class ModuleDocFragment:
    # The proxy settings of the modules that fetch from origins (module_utils._net.proxy.proxy_for holds the rule).
    DOCUMENTATION = r"""
options:
  proxy_env:
    description:
      - Proxy settings for the requests to origins (the Hub, S3 endpoints, registries, web servers), as environment
        variables - C(HTTPS_PROXY), C(HTTP_PROXY), C(NO_PROXY) or their lowercase forms. They are read as
        C(ansible.builtin.uri) and Python's urllib read them, on top of the environment the module runs with (a key
        given here wins; an empty value turns that setting off). C(NO_PROXY) also takes C(*), C(host:port), IP
        addresses and networks (C(10.0.0.0/8)).
      - An https origin is reached through a C(CONNECT) tunnel, so its credentials never cross the proxy in the
        clear; a request with credentials to a plain http origin through the proxy is refused (use https, or list
        the host in C(NO_PROXY)). Only http:// proxies are supported.
      - A password in a proxy URL (C(http://user:password@proxy:3128)) goes only to the proxy, as
        C(Proxy-Authorization); messages and results show the URL as C(http://user:***@proxy:3128). Passing the
        settings here rather than with the C(environment) keyword keeps the password off the command line.
      - Fleet peers and instance ports are always reached directly.
      - Role P(ttfleet.inference.model_cache#role) and P(ttfleet.inference.serve#role) pass
        C(tt_proxy_env) here.
    type: dict
    default: {}
    version_added: 0.2.0
"""
