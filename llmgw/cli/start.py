"""``llmgw start``: serve again; every model is placed as the catalog asks."""

import getpass
import time

from django.utils import timezone

from fleet.ops.operations import models_short_of_ready, start_cluster
from llmgw.cli.output import FAILED, OK
from llmgw.cli.progress import StatusLine

HELP = ("Start the cluster after `llmgw stop`: models are placed again as the catalog asks "
        "(on-demand ones stay at zero until asked for). Exit 0 when started (or already serving), "
        "1 if --wait timed out.")


def add_arguments(parser) -> None:
    parser.add_argument("--wait", action="store_true",
                        help="wait until every model has the replicas it should have, ready")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="how long --wait waits")


def run(options, stdout, stderr) -> int:
    since = timezone.now()
    changed = start_cluster(f"{getpass.getuser()} (CLI)")
    stdout.write("cluster started: placing models as the catalog asks\n" if changed else "cluster was already serving\n")
    if not options["wait"]:
        return OK
    deadline = time.monotonic() + options["timeout_s"]
    line = StatusLine(stdout)
    short = models_short_of_ready(since)
    while short != [] and time.monotonic() < deadline:
        if short is None:
            line.show("  waiting for the reconciler's first pass…")
        else:
            line.show("  not ready yet: " + ", ".join(f"{m['model']} {m['ready']}/{m['desired']}" for m in short))
        time.sleep(1.0)
        short = models_short_of_ready(since)
    line.end()
    if short is None:
        stderr.write(f"no reconcile pass ran within {options['timeout_s']:.0f} s: is a worker (`llmgw worker`) running?\n")
        return FAILED
    if short:
        stderr.write(f"not every model is ready after {options['timeout_s']:.0f} s:\n")
        for m in short:
            stderr.write(f"  {m['model']}: {m['ready']} of {m['desired']} ready — {m['reason'] or 'starting'}\n")
        return FAILED
    stdout.write("every model has its replicas ready\n")
    return OK
