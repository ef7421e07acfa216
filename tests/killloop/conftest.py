"""The kill loop is a lane of its own (`tox -e crash`, which sets LOOPD_KILLLOOP=1): it kills and
restarts a loopd process hundreds of times, so the default suite never collects it."""

from __future__ import annotations

import os

collect_ignore = [] if os.environ.get("LOOPD_KILLLOOP") == "1" else ["test_killloop.py"]
