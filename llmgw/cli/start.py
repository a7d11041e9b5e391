"""``llmgw start``: serve again; every model is placed as the catalog asks."""

from fleet.operations import start_cluster
from llmgw.cli.output import OK

HELP = ("Start the cluster after `llmgw stop`: models are placed again as the catalog asks "
        "(on-demand ones stay at zero until asked for). Exit 0.")


def add_arguments(parser) -> None:
    pass


def run(options, stdout, stderr) -> int:
    changed = start_cluster()
    stdout.write("cluster started: placing models as the catalog asks\n" if changed else "cluster was already serving\n")
    return OK
