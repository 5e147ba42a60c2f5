# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The XML of S3: error documents, ListObjectsV2 pages and the bodies the client sends.

Endpoints may be hostile: XML holding a DTD is refused before it reaches the parser, and a listing page is parsed as a
stream, capped at ``limits.MAX_LISTED_FILES`` objects.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, cast

from ansible_collections.ttfleet.inference.plugins.module_utils._net.errors import S3Error
from ansible_collections.ttfleet.inference.plugins.module_utils._net.limits import MAX_LISTED_FILES

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    JSON = dict[str, Any]


def _strip_ns(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def child_text(elem: ET.Element, name: str, default: str | None = None) -> str | None:
    """The text of the child ``name`` of ``elem`` (any namespace; "" when empty), or ``default`` without one."""
    for child in elem:
        if _strip_ns(child.tag) == name:
            return child.text if child.text is not None else ""
    return default


def _no_dtd(body: bytes) -> bool:
    """Whether ``body`` is free of a document type declaration: S3 answers never hold one, and refusing it keeps
    entity expansion (billion laughs) out whatever expat's own limit (>= 2.4.1) is."""
    return b"<!DOCTYPE" not in body and b"<!ENTITY" not in body


def parse_xml(body: bytes) -> ET.Element:
    """The root element of ``body``; ET.ParseError when it is not XML or holds a DTD."""
    if not _no_dtd(body):
        raise ET.ParseError("a document type declaration (S3 answers never hold one)")
    # Accepted bandit B314: no DTD reaches the parser (refused above), so no entity is expanded; ElementTree
    # resolves no external entity anyway, and expat >= 2.4.1 caps amplification.
    return ET.fromstring(body)  # nosec B314


def parse_error(body: bytes) -> tuple[str | None, str | None]:
    """``(code, message)`` from an S3 ``<Error>`` body; ``(None, None)`` when it is not one."""
    try:
        root = parse_xml(body)
    except ET.ParseError:
        return None, None
    if _strip_ns(root.tag) != "Error":
        return None, None
    return child_text(root, "Code"), child_text(root, "Message")


def parse_list(body: bytes, limit: int | None = None) -> tuple[list[JSON], str | None]:
    """``(objects, next_token)`` of one ListObjectsV2 page; more than ``limit`` objects is refused.

    The page is parsed as a stream and each ``<Contents>`` dropped once read, so memory follows the objects kept,
    not the elements of the page."""
    if not _no_dtd(body):
        raise S3Error("the server sent a ListObjectsV2 answer with a document type declaration; refused")
    # Accepted bandit B314 (XMLPullParser): no DTD reaches it (refused above); no external entities.
    parser: ET.XMLPullParser[ET.Element] = ET.XMLPullParser(events=("start", "end"))  # nosec B314
    objects: list[JSON]
    fields: dict[str, str]
    root: ET.Element | None
    objects, fields, root, depth = [], {}, None, 0
    try:
        for offset in range(0, len(body), 1 << 16):
            parser.feed(body[offset : offset + (1 << 16)])
            # Start and end events only: each is (event, element).
            for event, elem in cast("Iterator[tuple[str, ET.Element]]", parser.read_events()):
                if event == "start":
                    root = elem if root is None else root
                    depth += 1
                    continue
                depth -= 1
                if depth != 1:
                    continue
                name = _strip_ns(elem.tag)
                if name == "Contents":
                    size = cast("str", child_text(elem, "Size", "0"))  # a str with a str default
                    key = child_text(elem, "Key")
                    if not key:
                        raise S3Error("the server sent a ListObjectsV2 entry without a Key; refused")
                    objects.append(
                        {
                            "key": key,
                            "size": int(size) if size.isdigit() else 0,
                            "etag": (child_text(elem, "ETag") or "").strip('"'),
                            "last_modified": child_text(elem, "LastModified"),
                        }
                    )
                    if limit is not None and len(objects) > limit:
                        raise S3Error(f"the listing holds more than {MAX_LISTED_FILES} objects; refused")
                elif name in ("IsTruncated", "NextContinuationToken"):
                    fields[name] = elem.text or ""
                cast("ET.Element", root).remove(elem)  # set at the first start event, before any end
        parser.close()
    except ET.ParseError as exc:
        raise S3Error(f"the server sent a ListObjectsV2 answer that is not XML ({exc})") from None
    truncated = (fields.get("IsTruncated") or "false").lower() == "true"
    token = fields.get("NextContinuationToken") if truncated else None
    if truncated and not token:
        raise S3Error("the server sent a truncated ListObjectsV2 page without NextContinuationToken")
    return objects, token


def xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
