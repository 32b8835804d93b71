"""``python -m fusefs`` runs the seerfs CLI."""

import sys

from .cli import main

sys.exit(main())
