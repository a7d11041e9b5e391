"""``llmgw explain MODEL``: why a model has the replicas it has."""

import json

from catalog.models import Model
from fleet.ops.explain import explain_model, explain_text

HELP = ("Explain a model's state: desired and ready replicas, demand, last use, placement reason, routing "
        "policy.")


def add_arguments(parser) -> None:
    parser.add_argument("model", help="the model's name (or an alias)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(options, stdout, stderr) -> int:
    model = Model.resolve(options["model"])
    if model is None:
        if options["json"]:
            stdout.write(json.dumps({"error": f"no model called {options['model']!r}"}) + "\n")
        stderr.write(f"no model called {options['model']!r}\n")
        return 1
    info = explain_model(model)
    if options["json"]:
        stdout.write(json.dumps(info, indent=2) + "\n")
        return 0
    stdout.write(explain_text(info))
    return 0
