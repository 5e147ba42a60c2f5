# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Container images: references, the registry HTTP API v2, credentials and the Docker Engine API."""
