"""An engine for fault tests: while the file named by ``--crash-while`` exists it behaves
like a real engine that cannot load (a few log lines, then exit 1); once the file is gone it
is the fake engine (every other argument is the fake engine's).

    python tests/flaky_engine.py --crash-while /tmp/broken --port 8011 --served-name m
"""
import os
import runpy
import sys
import time
from pathlib import Path

FAKE_ENGINE = str(Path(__file__).resolve().parent / "fake_engine.py")


def main() -> None:
    argv = sys.argv[1:]
    flag = argv[argv.index("--crash-while") + 1]
    del argv[argv.index("--crash-while"):argv.index("--crash-while") + 2]
    if os.path.exists(flag):
        print("loading weights from /w/model.gguf", flush=True)
        time.sleep(0.2)
        print(f"pid {os.getpid()}: allocating KV cache", flush=True)
        print("RuntimeError: CUDA out of memory (simulated by tests/flaky_engine.py)", flush=True)
        sys.exit(1)
    sys.argv = [FAKE_ENGINE, *argv]
    runpy.run_path(FAKE_ENGINE, run_name="__main__")


if __name__ == "__main__":
    main()
