"""Helm's own code (the helm-python-sdk wheel embeds the Helm SDK) and the Kubernetes API schemas
(kubernetes-validate), offline, for `cargo xtask kube-test` (xtask/src/kube/chart.rs).

Reads one JSON request on stdin, writes one JSON answer on stdout:

  {"op": "render", "chart": DIR, "values": {...}, "name": N, "namespace": NS, "versions": [V...]}
    -> {"lint": [[severity, path, message]...], "lint_errors": [...], "schema_error": str|null,
        "render_error": str (only when a template refuses the values), "notes": NOTES.txt,
        "objects": [{"template": T, "object": {...}}...],
        "invalid": [[version, kind/name, error]...], "unknown_kinds": [kind...]}
  {"op": "schema", "chart": DIR, "values": {...}} -> {"schema_error": str|null}
  {"op": "values", "chart": DIR, "file": F|absent} -> {"values": F's values or {}, "merged": ...}
  {"op": "validate", "objects": [{...}...], "versions": [V...]} -> {"invalid": [...], ...}
  {"op": "reuse", "chart": DIR, "old_chart": DIR, "config": {...}, "name": N, "namespace": NS,
   "versions": [V...]}
    -> {"old_schema_error": str|null (the old chart refuses the config: nothing to upgrade),
        "upgrade": <render's answer>, "expected": <render's answer>}
     `helm upgrade --reuse-values` from a release of OLD_CHART installed with CONFIG to CHART, as
     Helm's pkg/action/upgrade.go (Upgrade.reuseValues) does it: the new chart's own values are
     replaced by the old release's coalesced values (`chart.Values = oldVals`, from
     `CoalesceValues(current.Chart, current.Config)`), and the old config is the user's values.
     "expected" renders the new chart with what the operator meant: the old coalesced values,
     and each key of today's defaults that they lack at its default, inside the objects whose
     keys values.schema.json fixes; a free-form map (nodeSelector, labels) stays as it was.
"""

import json
import os
import shutil
import sys
import tempfile

import helm_python as helm
import kubernetes_validate
import yaml
from kubernetes_validate.utils import SchemaNotFoundError


def schema_error(chart, values):
    try:
        chart.validate_schema(values)
        return None
    except helm.HelmError as e:
        return str(e)


def render(request, lint=True):
    path = request["chart"]
    values = request["values"]
    answer = {}
    if lint:
        report = helm.lint(path, values, strict=True, namespace=request["namespace"])
        answer["lint"] = [[m["severity"], m["path"], m["error"]] for m in report["messages"]]
        answer["lint_errors"] = report["errors"]
    with helm.Chart.load(path) as chart:
        answer["schema_error"] = schema_error(chart, values)
        if answer["schema_error"] is not None:
            return answer
        try:
            manifests = chart.render(
                values,
                name=request["name"],
                namespace=request["namespace"],
                is_install=not request.get("upgrade", False),
                is_upgrade=request.get("upgrade", False),
            )
        except helm.HelmError as e:
            answer["render_error"] = str(e)
            return answer
    objects = []
    answer["notes"] = ""
    for template, text in sorted(manifests.items()):
        if template.endswith("NOTES.txt"):
            answer["notes"] = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                objects.append({"template": template, "object": doc})
    answer["objects"] = objects
    answer.update(validate([item["object"] for item in objects], request["versions"]))
    return answer


def validate(objects, versions):
    invalid, unknown = [], set()
    for obj in objects:
        name = "%s/%s" % (obj.get("kind"), obj.get("metadata", {}).get("name"))
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except SchemaNotFoundError:
                unknown.add(obj.get("kind"))
            except kubernetes_validate.ValidationError as e:
                invalid.append([version, name, e.message])
    return {"invalid": invalid, "unknown_kinds": sorted(unknown)}


def meant(old, defaults, schema):
    """`old` with each key of `defaults` it lacks, descending into the objects whose keys the
    schema fixes (`additionalProperties: false`), not into free-form maps."""
    out = dict(old)
    for key, default in defaults.items():
        if key not in out:
            out[key] = default
            continue
        sub = schema.get("properties", {}).get(key, {})
        fixed = sub.get("additionalProperties") is False and "properties" in sub
        if fixed and isinstance(out[key], dict) and isinstance(default, dict):
            out[key] = meant(out[key], default, sub)
    return out


def reuse(request):
    config = request["config"]
    with helm.Chart.load(request["old_chart"]) as old:
        error = schema_error(old, config)
        if error is not None:
            return {"old_schema_error": error}
        old_values = old.merge_values(config)
    with helm.Chart.load(request["chart"]) as today:
        expected = meant(old_values, today.values, today.schema or {})
    answer = {"old_schema_error": None}
    # Both render today's chart with other defaults (Helm would merge a free-form map of the
    # user's, such as nodeSelector, into today's default map) and the old config over them.
    for key, defaults in [("upgrade", old_values), ("expected", expected)]:
        with tempfile.TemporaryDirectory() as tmp:
            chart = os.path.join(tmp, os.path.basename(request["chart"].rstrip("/")))
            shutil.copytree(request["chart"], chart)
            with open(os.path.join(chart, "values.yaml"), "w") as f:
                yaml.safe_dump(defaults, f)
            answer[key] = render(dict(request, chart=chart, values=config, upgrade=True), False)
    return answer


def main():
    request = json.load(sys.stdin)
    if request["op"] == "render":
        answer = render(request)
    elif request["op"] == "schema":
        with helm.Chart.load(request["chart"]) as chart:
            answer = {"schema_error": schema_error(chart, request["values"])}
    elif request["op"] == "values":
        values = {}
        if "file" in request:
            with open(request["file"]) as f:
                values = yaml.safe_load(f) or {}
        with helm.Chart.load(request["chart"]) as chart:
            answer = {"values": values, "merged": chart.merge_values(values)}
    elif request["op"] == "reuse":
        answer = reuse(request)
    elif request["op"] == "validate":
        answer = validate(request["objects"], request["versions"])
    else:
        raise SystemExit("unknown op %r" % request["op"])
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
