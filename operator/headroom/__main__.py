"""``python -m headroom`` is the ``headroom`` command."""

import sys

from headroom.cli import main

sys.exit(main())
