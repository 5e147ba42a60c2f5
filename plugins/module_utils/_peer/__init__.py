# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The peer server: weights and kernel caches handed to fleet peers over HTTP."""
