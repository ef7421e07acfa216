"""``python -m actors.testing.chat_server --script FILE``: see :mod:`.cli`.

The command lives in a module of its own, never imported by the package, so that runpy runs
it as ``__main__`` without finding it imported already (which would warn on every start).
"""

import sys

from actors.testing.chat_server.cli import main

sys.exit(main())
