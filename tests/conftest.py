"""loopd's own suite uses the public test kit (the pytest11 plugin) and pytest's pytester."""

pytest_plugins = ["pytester"]

import os

# tests/cluster needs PostgreSQL and Ray and takes minutes: it runs in its own tox env
# (`tox -e cluster`, which sets LOOPD_CLUSTER_TESTS=1), never in the default suite.
collect_ignore = [] if os.environ.get("LOOPD_CLUSTER_TESTS") == "1" else ["cluster"]
