"""Settings for the test suite: the project's settings with short periods, inline tasks and
a test database that subprocesses (daphne, qcluster, agents) can open too: a file SQLite
database, or with ``LLMGW_DATABASE_URL`` a PostgreSQL database of a name fixed per run
(and with ``LLMGW_REDIS_URL`` a Redis prefix and task queue of its own)."""

import os
import re
import secrets
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# Shared with every subprocess a test starts (they inherit the environment).
_run_dir = Path(os.environ.setdefault("LLMGW_TEST_RUN_DIR", tempfile.mkdtemp(prefix="llmgw-test-")))
os.environ.setdefault("LLMGW_DATA_DIR", str(_run_dir / "data"))
os.environ.setdefault("LLMGW_SQLITE_PATH", str(_run_dir / "test.sqlite3"))
# Runs sharing one PostgreSQL or Redis (other checkouts, CI) must not meet.
_run_id = re.sub(r"[^a-z0-9]", "_", _run_dir.name.lower())
# The prefix names the task queue too (llmgw.settings).
os.environ.setdefault("LLMGW_REDIS_PREFIX", f"llmgw_{_run_id}")
# The URL the run was started with; LLMGW_DATABASE_URL itself is pointed at the test
# database below, for the subprocesses.
_database_url = os.environ.setdefault("LLMGW_TEST_BASE_DATABASE_URL", os.environ.get("LLMGW_DATABASE_URL", ""))
os.environ["LLMGW_DATABASE_URL"] = _database_url
if _database_url:
    # Production mode needs one shared secret (llmgw.E004): this run's processes share this one.
    os.environ.setdefault("LLMGW_SECRET_KEY", secrets.token_urlsafe(50))

from llmgw.settings import *  # noqa: E402,F403
from llmgw.settings import DATABASES, Q_CLUSTER  # noqa: E402

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["NAME"] = os.environ["LLMGW_SQLITE_PATH"]
    DATABASES["default"]["TEST"] = {"NAME": os.environ["LLMGW_SQLITE_PATH"]}
else:
    # pytest-django creates this database; live-cluster processes open it by name.
    TEST_DATABASE_NAME = f"test_llmgw_{_run_id}"[:63]
    DATABASES["default"]["TEST"] = {"NAME": TEST_DATABASE_NAME}
    _url = urlsplit(_database_url)
    os.environ["LLMGW_DATABASE_URL"] = urlunsplit(_url._replace(path="/" + TEST_DATABASE_NAME))

Q_CLUSTER["sync"] = True  # async_task runs inline: tasks are tested by calling them
LLMGW_WATCH_INTERVAL_S = 0.05
LLMGW_WATCH_FAST_INTERVAL_S = 0.02
LLMGW_USAGE_FLUSH_INTERVAL_S = 0.1
LLMGW_DRAIN_GRACE_S = 2.0
# Every pass reads the measured cold starts: a process-wide cache would carry one test's
# rows into the next test's passes.
LLMGW_COLD_STARTS_CACHE_S = 0.0
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
