"""loopd's own suite uses the public test kit (the pytest11 plugin) and pytest's pytester."""

pytest_plugins = ["pytester"]
