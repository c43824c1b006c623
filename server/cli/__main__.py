"""``python -m server.cli``: the ``tiletune`` command without the console script."""

from server.cli import main

main()
