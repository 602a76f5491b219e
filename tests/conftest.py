"""The whole suite: tests keep what they store (verify-cost surfaces, adapters) out of the
user's data directory. APPLESPEC_HOME points at one temporary folder for the session;
tests that need their own set it again (monkeypatch), and worker subprocesses inherit it."""

import atexit
import os
import shutil
import tempfile

_home = tempfile.mkdtemp(prefix="applespec-test-home-")
os.environ["APPLESPEC_HOME"] = _home
atexit.register(shutil.rmtree, _home, ignore_errors=True)
