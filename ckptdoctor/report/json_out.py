"""`--format json`: {"version": 1, "command", "findings": [...], "summary": {...}} on stdout."""
import json


def render(report, out) -> None:
    json.dump(report.to_json(), out, indent=2, sort_keys=False, default=str)
    out.write("\n")
