"""Settings for the test suite: the project's settings with short periods, inline tasks and
a file SQLite test database that subprocesses (daphne, qcluster, agents) can open too."""

import os
import tempfile
from pathlib import Path

# Shared with every subprocess a test starts (they inherit the environment).
_run_dir = Path(os.environ.setdefault("LLMGW_TEST_RUN_DIR", tempfile.mkdtemp(prefix="llmgw-test-")))
os.environ.setdefault("LLMGW_DATA_DIR", str(_run_dir / "data"))
os.environ.setdefault("LLMGW_SQLITE_PATH", str(_run_dir / "test.sqlite3"))

from llmgw.settings import *  # noqa: E402,F403
from llmgw.settings import DATABASES, Q_CLUSTER  # noqa: E402

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["NAME"] = os.environ["LLMGW_SQLITE_PATH"]
    DATABASES["default"]["TEST"] = {"NAME": os.environ["LLMGW_SQLITE_PATH"]}

Q_CLUSTER["sync"] = True  # async_task runs inline: tasks are tested by calling them
LLMGW_WATCH_INTERVAL_S = 0.05
LLMGW_WATCH_FAST_INTERVAL_S = 0.02
LLMGW_USAGE_FLUSH_INTERVAL_S = 0.1
LLMGW_DRAIN_GRACE_S = 2.0
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
