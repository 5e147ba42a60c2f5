# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
"""Host checks: preflight, tt-smi facts and progress records."""
