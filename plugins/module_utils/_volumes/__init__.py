# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Host volumes of tt-inference-server: the scan, their contents, alias candidates and alias writes."""
