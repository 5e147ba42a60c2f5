# Copyright (c) ttfleet.inference contributors
# SPDX-License-Identifier: Apache-2.0
