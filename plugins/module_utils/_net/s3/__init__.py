# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""A small S3 client for S3-compatible object stores, standard library only."""
