"""Grafana dashboards and alert rules (generated from Python, shipped as JSON/YAML)."""
