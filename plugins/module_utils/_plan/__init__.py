# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Plans: what a host or the fleet should do next, decided in tested Python."""
