# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The network layer: bounded HTTP calls, proxies, URL redaction and the S3 client."""
