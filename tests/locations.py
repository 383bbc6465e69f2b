"""Where the tests find the repository and their data, wherever a test file sits under tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = TESTS / "data"
PLUGINS = TESTS / "plugins"
