# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The bounds of every network call: caps on what one reply may hold, and the default time limits
(docs/security.md lists them; roles/serve/files/ttfleet-serve repeats the health check's)."""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB

MAX_JSON_BYTES = 32 * MIB  # a Hub file-list page, a manifest, a revision answer
MAX_XML_BYTES = 16 * MIB  # an S3 ListObjectsV2 page or error document
MAX_ERROR_BYTES = 64 * KIB  # an error body kept for a message
MAX_HEALTH_BYTES = 64 * KIB  # an instance's /health or /v1/models answer
MAX_LISTED_FILES = 200_000  # files in one listing (a model has hundreds; a Hub repository allows 100,000)
MAX_REDIRECTS = 5
CHUNK = 1 * MIB

DEFAULT_STALL = 60.0  # seconds without a byte
DEFAULT_TOTAL = 600.0  # seconds for a request whose size is small or unknown
MIN_RATE = 1 * MIB  # bytes/s a transfer may not stay below for long: a file's deadline grows with its size
