"""The release of this code: what a candidate registers by default (``election_release``).

Kept apart from ``__init__`` (which re-exports it as ``__version__``) so the elector can
read it without importing the package's front door; equal to pyproject.toml's version
(tests/unit/test_release.py).
"""

RELEASE = "0.2.0"
