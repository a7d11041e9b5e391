"""tests/fake_engine.py on uvloop (same arguments), for bench/gateway.py.

The fake engine shares a core with the load generator in that benchmark; uvloop makes it
cheaper per request so the direct baseline is as fast as this machine allows. Falls back to
the standard loop when uvloop is missing.
"""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import fake_engine  # noqa: E402

if __name__ == "__main__":
    args = fake_engine.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(fake_engine.main(args))
    else:
        uvloop.run(fake_engine.main(args))
