"""Helm's own code (the helm-python-sdk wheel embeds the Helm SDK) and the Kubernetes API schemas
(kubernetes-validate), offline, for `cargo xtask kube-test` (xtask/src/kube/chart.rs).

Reads one JSON request on stdin, writes one JSON answer on stdout:

  {"op": "render", "chart": DIR, "values": {...}, "name": N, "namespace": NS, "versions": [V...]}
    -> {"lint": [[severity, path, message]...], "lint_errors": [...], "schema_error": str|null,
        "render_error": str (only when a template refuses the values),
        "objects": [{"template": T, "object": {...}}...],
        "invalid": [[version, kind/name, error]...], "unknown_kinds": [kind...]}
  {"op": "schema", "chart": DIR, "values": {...}} -> {"schema_error": str|null}
  {"op": "values", "chart": DIR, "file": F|absent} -> {"values": F's values or {}, "merged": ...}
  {"op": "validate", "objects": [{...}...], "versions": [V...]} -> {"invalid": [...], ...}
"""

import json
import sys

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


def render(request):
    path = request["chart"]
    values = request["values"]
    answer = {}
    report = helm.lint(path, values, strict=True, namespace=request["namespace"])
    answer["lint"] = [[m["severity"], m["path"], m["error"]] for m in report["messages"]]
    answer["lint_errors"] = report["errors"]
    with helm.Chart.load(path) as chart:
        answer["schema_error"] = schema_error(chart, values)
        if answer["schema_error"] is not None:
            return answer
        try:
            manifests = chart.render(
                values, name=request["name"], namespace=request["namespace"], is_install=True
            )
        except helm.HelmError as e:
            answer["render_error"] = str(e)
            return answer
    objects = []
    for template, text in sorted(manifests.items()):
        if template.endswith("NOTES.txt"):
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
    elif request["op"] == "validate":
        answer = validate(request["objects"], request["versions"])
    else:
        raise SystemExit("unknown op %r" % request["op"])
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
