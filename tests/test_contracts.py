"""The contracts (docs/contracts.md): every command has a JSON Schema and a section, every schema lets new
keys in, every `--json` carries `schema_version`, and every command's output is validated against its
schema somewhere in the suite: the cheap ones here, the slow ones (estimate, fit, measure, tune, watch,
scale, train, demo) in the tests that already run them with their smallest settings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuwise import cli, contracts
from gpuwise.contracts import OUTPUTS, SCHEMA_VERSION, names, schema, validate

jsonschema = pytest.importorskip("jsonschema")  # a dev dependency; absent from a bare GPU image

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "contracts.md").read_text()
TESTS = Path(__file__).resolve().parent


def cli_json(capsys, *argv: str) -> dict:
    assert cli.main(list(argv)) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert len(lines) == 1  # exactly one JSON object on stdout
    return json.loads(lines[0])


def test_every_command_has_a_schema_and_a_section():
    assert set(OUTPUTS) == set(cli.COMMANDS)  # a new command needs its schema (and its section)
    for name in names():
        jsonschema.Draft202012Validator.check_schema(schema(name))
        assert f"contracts/{name}.schema.json" in DOC, name
    for name in OUTPUTS:
        assert f"### `gpuwise {name}" in DOC, name
        assert "schema_version" in schema(name)["required"]


def _objects(node, path="$"):
    if isinstance(node, dict):
        if node.get("type") == "object" or "object" in (node.get("type") or []):
            yield path, node
        for k, v in node.items():
            yield from _objects(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _objects(v, f"{path}[{i}]")


def test_every_object_in_every_schema_allows_new_keys():
    closed = [(name, path) for name in names() for path, obj in _objects(schema(name))
              if obj.get("additionalProperties", True) is False]
    assert closed == []


def test_every_command_is_validated_in_the_suite():
    called = set()
    for path in TESTS.glob("test_*.py"):
        called |= set(re.findall(r"""validate\(\s*["']([\w-]+)["']""", path.read_text()))
    assert set(OUTPUTS) - called == set()


def test_unknown_schema_name_and_a_broken_output_are_refused():
    with pytest.raises(ValueError, match="no schema named"):
        schema("nope")
    good = {"schema_version": SCHEMA_VERSION, "devices": [], "cuda_visible_devices": ""}
    validate("pick", good)
    validate("pick", {**good, "a_key_added_later": 1})  # extend-only: new keys pass
    with pytest.raises(jsonschema.ValidationError):
        validate("pick", {k: v for k, v in good.items() if k != "cuda_visible_devices"})  # a key removed
    with pytest.raises(jsonschema.ValidationError):
        validate("pick", {**good, "cuda_visible_devices": 3})  # a key retyped
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema_version": SCHEMA_VERSION, "workload": "x"}, schema("estimate"))  # neither shape


def test_fake_gpu_files_follow_their_schema_with_every_health_field(fake_gpus):
    validate("fake-gpus", fake_gpus)
    health = {"pcie_gen_current": 3, "pcie_gen_max": 4, "pcie_gen_gpu_max": 4, "pcie_width_current": 8,
              "pcie_width_max": 16, "clock_reasons": ["sw_power_cap"], "sm_clock_mhz": 1100,
              "sm_clock_max_mhz": 1980, "temperature_c": 71, "temperature_slowdown_c": 87,
              "temperature_shutdown_c": 92, "compute_mode": "exclusive_process", "mig_enabled": True,
              "mig_devices": [{"uuid": "MIG-1", "name": "1g.10gb", "memory_total_mib": 9984}],
              "ecc_enabled": True, "ecc_uncorrected_volatile": 0, "retired_pages": 0,
              "retired_pages_pending": False, "persistence_mode": True, "driver_version": "580.65.06",
              "cuda_driver_version": "13.0"}
    validate("fake-gpus", [{**fake_gpus[0], **health}])
    with pytest.raises(jsonschema.ValidationError):
        validate("fake-gpus", [{**fake_gpus[0], "compute_mode": "sometimes"}])
    validate("fake-torch", {"version": "2.13.0+cu130", "cuda": "13.0", "device_count": 1,
                            "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}], "warnings": []})


def test_truth_records_on_disk_follow_their_schema():
    from gpuwise.truth import TRUTH_FIELDS, read_records

    assert list(schema("truth-record")["required"]) == list(TRUTH_FIELDS)
    for record in read_records(ROOT / "benchmarks" / "truth"):
        validate("truth-record", {k: v for k, v in record.items() if not k.startswith("_")})


def test_published_rows_follow_their_schema():
    rows = [json.loads(line) for path in sorted((ROOT / "benchmarks" / "published").glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        validate("published-row", row)


# -- the cheap commands, run here (fake GPUs where they need GPUs) ------------------------------------------

def test_gpus_pick_run_launch_json(fake_gpus, capsys):
    out = cli_json(capsys, "gpus", "--json")
    assert list(out)[0] == "schema_version" and out["schema_version"] == SCHEMA_VERSION
    validate("gpus", out)
    validate("pick", cli_json(capsys, "pick", "-n", "2", "--no-reserve", "--json"))
    validate("run", cli_json(capsys, "run", "--json", "--", "true"))
    validate("launch", cli_json(capsys, "launch", "-n", "2", "--dry-run", "--json", "--", "python", "train.py"))


def test_run_cpu_fallback_json(monkeypatch, tmp_path, capsys):
    none = tmp_path / "none.json"
    none.write_text("[]")
    monkeypatch.setenv("GPUWISE_FAKE_GPUS", str(none))
    out = cli_json(capsys, "run", "--cpu-fallback", "--json", "--", "true")
    assert out["cpu_fallback"] is True
    validate("run", out)


def test_doctor_json(fake_gpus, capsys):
    validate("doctor", cli_json(capsys, "doctor", "--no-torch", "--json"))


def test_train_plan_json(capsys):
    validate("train", cli_json(capsys, "train", "examples:mlp", "-n", "4", "--optimizer", "adam", "--plan", "--json"))


def test_every_schema_file_in_the_package_is_named():
    folder = Path(contracts.__file__).parent
    assert sorted(p.name.removesuffix(".schema.json") for p in folder.glob("*.schema.json")) == sorted(names())
