# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""tt-inference-server's rules: specs, names, devices, selection, tuning and the container command."""
