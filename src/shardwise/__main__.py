"""``python -m shardwise`` is the ``shardwise`` command."""

import sys

from shardwise.cli import main

sys.exit(main())
