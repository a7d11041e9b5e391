"""``llmgw stop``: stop serving; every engine drains and stops, every GPU is freed."""

import getpass
import time

from catalog.models import ClusterSettings
from fleet.ops.operations import replicas_running, stop_cluster
from llmgw.cli.output import FAILED, OK
from llmgw.cli.progress import StatusLine

HELP = ("Stop the cluster: every replica drains and stops, /v1/ answers 503 system_stopped. "
        "The catalog is untouched; `llmgw start` brings it back. Exit 0 when stopped (or already), "
        "1 if --wait timed out.")


def add_arguments(parser) -> None:
    parser.add_argument("--by", default=None, help="who is stopping it (default: your user name, marked (CLI))")
    parser.add_argument("--wait", action="store_true", help="wait until every engine has stopped")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="how long --wait waits")


def run(options, stdout, stderr) -> int:
    by = options["by"] or f"{getpass.getuser()} (CLI)"  # as start, restart and agents name the CLI
    changed = stop_cluster(by)
    if changed:
        stdout.write(f"cluster stopped (by {by}); engines drain and stop; /v1/ answers 503 system_stopped\n")
    else:
        cluster = ClusterSettings.get_solo()
        when = f" at {cluster.stopped_at:%Y-%m-%d %H:%M:%S %Z}" if cluster.stopped_at else ""
        stdout.write(f"cluster was already stopped (by {cluster.stopped_by or 'someone'}{when}); "
                     "/v1/ answers 503 system_stopped\n")
    if not options["wait"]:
        return OK
    deadline = time.monotonic() + options["timeout_s"]
    line = StatusLine(stdout)
    while (left := replicas_running()) and time.monotonic() < deadline:
        line.show(f"  {left} replica(s) still stopping…")
        time.sleep(0.5)
    line.end()
    if left:
        stderr.write(f"{left} replica(s) still running after {options['timeout_s']:.0f} s\n")
        return FAILED
    stdout.write("every engine stopped; its GPUs (or cores and memory) are free\n")
    return OK
