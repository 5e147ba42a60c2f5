# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""The safe-file layer: how root-run code touches directories that a non-root user can write."""
