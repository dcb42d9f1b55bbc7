"""Makes the harness importable and registers the shared fixtures."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures import backends, sluice  # noqa: E402,F401  (pytest fixtures)
