"""The container tests use the session's Docker daemon, images and box (tests/conftest.py)."""
