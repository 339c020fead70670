"""Loads each dashboard given as an argument into grafana-foundation-sdk's typed model and fails
on what the model rejects or does not know: a parse error, a panel type or query type without a
model, or a field the model drops when the dashboard is written back (a misspelt or misplaced
key). Fields Grafana keeps that the model leaves out are listed in NOT_MODELLED."""

import json
import sys

from grafana_foundation_sdk.cog import runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

# Paths (list indices as []) of fields Grafana reads that the model does not carry.
NOT_MODELLED = {
    # A query variable's query as shown in the editor.
    ".templating.list[].definition",
}


def dropped(raw, back, path, out):
    """Appends to out the paths of raw's non-null fields that back lacks or holds otherwise."""
    if isinstance(raw, dict):
        if not isinstance(back, dict):
            out.append(f"{path}: an object became {type(back).__name__}")
            return
        for key, value in raw.items():
            here = f"{path}.{key}"
            generic = "".join(c for c in here if not c.isdigit())
            if value is None or generic in NOT_MODELLED:
                continue
            if key not in back:
                out.append(f"{here}: not in the model")
            else:
                dropped(value, back[key], here, out)
    elif isinstance(raw, list):
        if not isinstance(back, list) or len(raw) != len(back):
            out.append(f"{path}: the list changed")
            return
        for n, (a, b) in enumerate(zip(raw, back)):
            dropped(a, b, f"{path}[{n}]", out)
    elif raw != back and not (isinstance(raw, (int, float)) and raw == back):
        out.append(f"{path}: {raw!r} became {back!r}")


def check(path):
    with open(path) as f:
        raw = json.load(f)
    dashboard = Dashboard.from_json(raw)
    problems = []
    for n, panel in enumerate(dashboard.panels or []):
        if panel.type_val == "row":
            continue
        where = f"panel {n} ({panel.title!r}, {panel.type_val})"
        if runtime.panelcfg_config(panel.type_val) is None:
            problems.append(f"{where}: no model for this panel type")
        elif panel.options is not None and isinstance(panel.options, dict):
            problems.append(f"{where}: options not parsed into the panel's model")
        for target in panel.targets or []:
            if isinstance(target, runtime.UnknownDataquery):
                problems.append(f"{where}: a query without a model: {target.to_json()}")
    back = json.loads(json.dumps(dashboard, cls=JSONEncoder))
    dropped(raw, back, "", problems)
    return problems


def main():
    register_default_plugins()
    failed = False
    for path in sys.argv[1:]:
        try:
            problems = check(path)
        except Exception as e:  # the model's parse error, whatever its type
            problems = [f"does not parse: {type(e).__name__}: {e}"]
        for p in problems:
            print(f"{path}: {p}", file=sys.stderr)
        failed = failed or bool(problems)
        if not problems:
            print(f"{path}: parsed into the typed model")
    sys.exit(1 if failed else 0)


main()
