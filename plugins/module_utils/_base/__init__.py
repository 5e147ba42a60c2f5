# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The base layer: the one error class every subject derives from, and the adapter that turns it into fail_json."""
