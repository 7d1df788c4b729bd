"""`gpuwise doctor`: every check on fake GPUs and crafted environments (fake /dev, fake PCI tree, canned
PyTorch probes), the pip command for a driver, the CUDA_VISIBLE_DEVICES mapping, and the exit codes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from conftest import run_cli

from gpuwise import cli
from gpuwise.doctor import EXIT_NO_GPU, EXIT_OK, EXIT_PROBLEM, Options, diagnose, gather
from gpuwise.doctor import torch_probe as tp
from gpuwise.doctor.facts import list_nvidia_pci
from gpuwise.doctor.torch_probe import TorchFacts
from gpuwise.doctor.wheels import install_command

CPU_TORCH = TorchFacts(installed=True, version="2.13.0+cpu", cuda=None, warnings=())
CUDA_TORCH = TorchFacts(installed=True, version="2.13.0+cu130", cuda="13.0", cuda_available=True, device_count=1,
                        devices=({"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]},))


def gpu(index=0, name="NVIDIA H100 80GB HBM3", **extra) -> dict:
    return {"index": index, "uuid": f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd", "name": name,
            "memory_total_mib": 81559, "memory_used_mib": 0, "utilization_pct": 0, "processes": [],
            "pci_bus_id": f"0000:{index + 0x18:02x}:00.0", **extra}


def make_dirs(tmp_path, dev=("nvidia0", "nvidiactl", "nvidia-uvm"), pci=("0000:18:00.0",)):
    """A fake /dev and a fake /sys/bus/pci/devices holding NVIDIA 3D controllers at `pci`."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))  # fresh for every call: tests may run several machines
    d, p = root / "dev", root / "pci"
    d.mkdir()
    p.mkdir()
    for n in dev:
        (d / n).write_text("")
    for addr in pci:
        (p / addr).mkdir()
        (p / addr / "vendor").write_text("0x10de\n")
        (p / addr / "class").write_text("0x030200\n")
    (p / "0000:00:1f.0").mkdir()  # an Intel ISA bridge: not a GPU
    (p / "0000:00:1f.0" / "vendor").write_text("0x8086\n")
    (p / "0000:00:1f.0" / "class").write_text("0x060100\n")
    return str(d), str(p)


def run(tmp_path, torch=CUDA_TORCH, env=None, dev=("nvidia0", "nvidiactl", "nvidia-uvm"), pci=("0000:18:00.0",),
        **opts):
    d, p = make_dirs(tmp_path, dev, pci)
    facts = gather(env=env or {}, dev_dir=d, pci_dir=p, container_root=str(tmp_path), torch_probe=lambda e: torch)
    report = diagnose(facts, Options(**opts))
    return {c.name: c for c in report.checks}, report


# -- the machine this runs on: CPU-only torch, no NVML -------------------------------------------------

def test_this_machine_real_cli_json_and_expect_gpu():
    """The real command here (CPU torch, no driver): nothing wrong for a CPU job; exit 4 when a GPU is expected."""
    done = run_cli("doctor", "--json")
    assert done.returncode == EXIT_OK, done.stderr
    out = json.loads(done.stdout)
    by = {c["name"]: c for c in out["checks"]}
    assert set(by["pytorch_build"]) >= {"name", "status", "evidence", "fix"}
    assert by["pytorch_build"]["status"] == "ok" and "CPU-only build" in by["pytorch_build"]["evidence"]
    assert "pip install torch==" in by["pytorch_build"]["fix"] and "download.pytorch.org/whl/cu" in by["pytorch_build"]["fix"]
    assert by["nvml"]["status"] == "ok" and "no NVIDIA GPU" in by["nvml"]["evidence"]
    assert out["gpu_usable"] is False and not [c for c in out["checks"] if c["status"] == "problem"]
    expect = run_cli("doctor", "--expect-gpu", "--no-torch")
    assert expect.returncode == EXIT_NO_GPU, expect.stdout + expect.stderr
    assert "exit 4" in expect.stdout


# -- PyTorch build and driver --------------------------------------------------------------------------

def test_cpu_torch_on_a_gpu_machine_names_the_wheel_for_the_driver(tmp_path, write_fake):
    write_fake([gpu(0, driver_version="550.54.14", cuda_driver_version="12.4")])
    checks, report = run(tmp_path, torch=CPU_TORCH)
    c = checks["pytorch_build"]
    assert c.status == "problem" and "CPU-only build" in c.evidence and "1 NVIDIA GPU" in c.evidence
    # torch 2.13 ships cu126/cu130/cu132; none <= 12.4, so the 12.6 build through minor-version compatibility
    assert "pip install torch==2.13.0+cu126 --index-url https://download.pytorch.org/whl/cu126" in c.fix
    assert checks["pytorch_sees_gpus"].status == "problem"
    assert report.exit_code == EXIT_PROBLEM


@pytest.mark.parametrize("torch_version, driver_cuda, expected", [
    ("2.13.0+cpu", "13.1", "torch==2.13.0+cu130 --index-url https://download.pytorch.org/whl/cu130"),
    ("2.13.0+cpu", "12.9", "torch==2.13.0+cu126 --index-url https://download.pytorch.org/whl/cu126"),
    ("2.5.1", "12.2", "torch==2.5.1+cu121 --index-url https://download.pytorch.org/whl/cu121"),
    ("2.7.0", "12.8", "torch==2.7.0+cu128 --index-url https://download.pytorch.org/whl/cu128"),
    ("2.13.0", "11.4", "'torch>=2.7,<2.8' --index-url https://download.pytorch.org/whl/cu118"),  # newest with an 11.x build
])
def test_install_command_per_driver(torch_version, driver_cuda, expected):
    cmd, why = install_command(torch_version, driver_cuda)
    assert cmd == f"pip install {expected}", why


def test_no_wheel_for_a_very_old_driver():
    cmd, why = install_command("2.13.0", "10.2")
    assert cmd is None and "upgrade the driver" in why


@pytest.mark.parametrize("driver_cuda, status", [("12.4", "problem"), ("13.0", "ok"), ("13.2", "ok")])
def test_driver_older_than_the_cuda_runtime(tmp_path, write_fake, driver_cuda, status):
    write_fake([gpu(0, driver_version="550.54.14", cuda_driver_version=driver_cuda)])
    checks, _ = run(tmp_path, torch=CUDA_TORCH)  # built with CUDA 13.0
    c = checks["driver_cuda"]
    assert c.status == status, c.evidence
    if status == "problem":
        assert "older than the CUDA 13.0 runtime" in c.evidence and "580.65.06" in c.fix


def test_driver_one_minor_behind_is_a_warning(tmp_path, write_fake):
    write_fake([gpu(0, driver_version="575.51.03", cuda_driver_version="12.9")])
    torch = TorchFacts(installed=True, version="2.13.0+cu132", cuda="13.2", cuda_available=True, device_count=1)
    checks, _ = run(tmp_path, torch=torch)
    assert checks["driver_cuda"].status == "problem"  # 12.9 < 13.x: another major
    write_fake([gpu(0, driver_version="580.65.06", cuda_driver_version="13.0")])
    checks, _ = run(tmp_path, torch=torch)
    assert checks["driver_cuda"].status == "warning" and "minor-version compatibility" in checks["driver_cuda"].evidence


def test_cuda_says_driver_too_old(tmp_path, write_fake):
    write_fake([gpu(0)])  # the driver version not reported: CUDA's own warning is the evidence
    torch = TorchFacts(installed=True, version="2.13.0+cu130", cuda="13.0", warnings=(
        "CUDA initialization: The NVIDIA driver on your system is too old (found version 12040).",))
    checks, report = run(tmp_path, torch=torch)
    assert checks["driver_cuda"].status == "problem" and "found version 12040" in checks["driver_cuda"].evidence
    assert checks["pytorch_sees_gpus"].status == "problem"


def test_torch_missing(tmp_path, write_fake):
    write_fake([gpu(0)])
    checks, _ = run(tmp_path, torch=TorchFacts(installed=False, error="ModuleNotFoundError: No module named 'torch'"))
    assert checks["pytorch_build"].status == "problem" and "cannot be imported" in checks["pytorch_build"].evidence


# -- driver, NVML, device files --------------------------------------------------------------------------

def test_nvml_missing_with_nvidia_hardware_is_a_problem(tmp_path, monkeypatch):
    from gpuwise.doctor import facts as facts_mod

    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    monkeypatch.setattr(facts_mod, "nvml_status", lambda: facts_mod.NvmlStatus(False, "NVML: NVML Shared Library Not Found", True))
    checks, _ = run(tmp_path, torch=CPU_TORCH, dev=(), pci=("0000:3b:00.0",))
    assert checks["nvml"].status == "problem" and "0000:3b:00.0" in checks["nvml"].evidence
    assert "install the NVIDIA driver" in checks["nvml"].fix
    assert checks["device_files"].status == "problem"  # the PCI bus has a GPU, /dev has nothing


def test_nvml_version_mismatch(tmp_path, monkeypatch):
    from gpuwise.doctor import facts as facts_mod

    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    monkeypatch.setattr(facts_mod, "nvml_status", lambda: facts_mod.NvmlStatus(False, "NVML: Driver/library version mismatch"))
    checks, _ = run(tmp_path, torch=CPU_TORCH, pci=("0000:3b:00.0",))
    assert checks["nvml"].status == "problem" and "reboot" in checks["nvml"].fix


def test_container_started_without_gpus(tmp_path, write_fake):
    write_fake([gpu(0)])
    (tmp_path / ".dockerenv").write_text("")
    checks, _ = run(tmp_path, dev=())
    c = checks["device_files"]
    assert c.status == "problem" and "inside a container" in c.evidence and "--gpus all" in c.fix


def test_missing_uvm_node(tmp_path, write_fake):
    write_fake([gpu(0)])
    checks, _ = run(tmp_path, dev=("nvidia0", "nvidiactl"))
    assert checks["device_files"].status == "problem" and "nvidia-modprobe -u" in checks["device_files"].fix


def test_pci_listing_reads_vendor_and_class(tmp_path):
    _, p = make_dirs(tmp_path, pci=("0000:18:00.0", "0000:86:00.0"))
    assert list_nvidia_pci(p) == ("0000:18:00.0", "0000:86:00.0")  # the Intel bridge is left out


# -- CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER --------------------------------------------------------

EIGHT = [gpu(i, "NVIDIA A100-SXM4-80GB") for i in range(4)] + [gpu(i, "NVIDIA H100 80GB HBM3") for i in range(4, 8)]


@pytest.mark.parametrize("value, status, words", [
    ("0,4", "ok", "cuda:0 = GPU 0, cuda:1 = GPU 4"),
    ("", "warning", "set but empty"),
    ("0,0", "problem", "repeated"),
    ("0,9", "problem", "'9' (entry 2) is not a GPU index (this machine has 8 GPUs: 0-7)"),
    ("1,GPU-00000002", "problem", "mixes indices and UUIDs"),
    ("GPU-00000002,GPU-00000005", "ok", "cuda:0 = GPU 2, cuda:1 = GPU 5"),
    ("GPU-0000000", "problem", "matches 8 GPUs' UUIDs"),
    ("gpu0", "problem", "neither an index nor a GPU-/MIG- UUID"),
])
def test_cuda_visible_devices(tmp_path, write_fake, value, status, words):
    write_fake(EIGHT)
    checks, _ = run(tmp_path, env={"CUDA_VISIBLE_DEVICES": value, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
                    dev=tuple(f"nvidia{i}" for i in range(8)) + ("nvidiactl", "nvidia-uvm"))
    c = checks["cuda_visible_devices"]
    assert c.status == status and words in c.evidence, c.evidence


def test_an_empty_value_is_fixed_with_the_recipe_that_fails_loudly(tmp_path, write_fake):
    """The empty value is what `export CUDA_VISIBLE_DEVICES=$(gpuwise pick)` leaves when pick fails: the fix
    must not suggest that pattern again."""
    write_fake(EIGHT)
    checks, _ = run(tmp_path, env={"CUDA_VISIBLE_DEVICES": ""}, dev=("nvidia0", "nvidiactl"))
    fix = checks["cuda_visible_devices"].fix
    assert "gpus=$(gpuwise pick) && export CUDA_VISIBLE_DEVICES=$gpus" in fix
    assert "`export CUDA_VISIBLE_DEVICES=$(gpuwise pick)`" not in fix


def test_the_seeds_0_4_mapping_without_pci_bus_id(tmp_path, write_fake):
    """Four A100s (8.0) at PCI 0-3, four H100s (9.0) at 4-7. FASTEST_FIRST puts the H100s first, so CUDA's
    "0,4" means the H100 at nvidia-smi 4 and the A100 at nvidia-smi 0; with PCI_BUS_ID it means 0 and 4."""
    write_fake(EIGHT)
    checks, _ = run(tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,4"})
    c = checks["cuda_device_order"]
    assert c.status == "warning" and "CUDA_DEVICE_ORDER unset" in c.evidence
    rows = c.details["mapping"]
    assert [(r["cuda_index"], r["with_pci_bus_id"]["index"], r["with_fastest_first"]["index"]) for r in rows] == \
        [(0, 0, 4), (1, 4, 0)]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in c.fix
    # the per-GPU checks look at the GPUs the job gets (here GPU 4 and GPU 0 under FASTEST_FIRST)
    checks, _ = run(tmp_path,
                    env={"CUDA_VISIBLE_DEVICES": "0,4", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert checks["cuda_device_order"].status == "ok"


def test_identical_gpus_keep_pci_order(tmp_path, write_fake):
    write_fake([gpu(i) for i in range(4)])
    checks, _ = run(tmp_path, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    c = checks["cuda_device_order"]
    assert c.status == "ok" and "cuda:0 = GPU 2" in c.evidence


# -- per-GPU health ------------------------------------------------------------------------------------

def one(tmp_path, write_fake, **fields):
    write_fake([gpu(0, **fields)])
    checks, report = run(tmp_path)
    return checks, report


def test_not_reported_is_skipped_not_ok(tmp_path, write_fake):
    checks, _ = one(tmp_path, write_fake)  # a fake GPU with none of the health fields
    for name in ("mig", "compute_mode", "persistence_mode", "ecc", "pcie_link", "clocks", "temperature"):
        assert checks[name].status == "skipped" and "not reported" in checks[name].evidence, name


def test_mig_on_without_instances_and_with(tmp_path, write_fake):
    checks, _ = one(tmp_path, write_fake, mig_enabled=True)
    assert checks["mig"].status == "problem" and "no instance" in checks["mig"].evidence
    write_fake([gpu(0, mig_enabled=True, mig_devices=[{"uuid": "MIG-1234", "name": "1g.10gb", "memory_total_mib": 9984}])])
    checks, _ = run(tmp_path)
    assert checks["mig"].status == "warning" and "MIG-1234" in checks["mig"].evidence
    assert "CUDA_VISIBLE_DEVICES=MIG-" in checks["mig"].fix


def test_exclusive_compute_mode_taken(tmp_path, write_fake):
    checks, report = one(tmp_path, write_fake, compute_mode="exclusive_process",
                         processes=[{"pid": 999999, "user": "bob", "used_mib": 500}], memory_used_mib=500)
    c = checks["compute_mode"]
    assert c.status == "problem" and "pid 999999 (bob)" in c.evidence and report.exit_code == EXIT_PROBLEM


def test_compute_mode_default_and_free_exclusive_are_ok(tmp_path, write_fake):
    checks, _ = one(tmp_path, write_fake, compute_mode="default")
    assert checks["compute_mode"].status == "ok"


def test_memory_held_by_others_and_by_a_zombie(tmp_path, write_fake, monkeypatch):
    checks, _ = one(tmp_path, write_fake, memory_used_mib=40000,
                    processes=[{"pid": 999999, "user": "alice", "used_mib": 40000}])
    c = checks["gpu_memory_held"]
    # 40000 of 81559 MiB held (49% > 10%); pid 999999 does not exist here
    assert c.status == "warning" and "pid 999999 (alice)" in c.evidence and "not in this PID namespace" in c.evidence
    from gpuwise.doctor import facts as facts_mod

    monkeypatch.setattr(facts_mod, "process_states", lambda pids: {p: "zombie" for p in pids})
    checks, _ = run(tmp_path)
    assert checks["gpu_memory_held"].status == "problem" and "zombie" in checks["gpu_memory_held"].evidence


def test_memory_used_without_any_process(tmp_path, write_fake):
    checks, _ = one(tmp_path, write_fake, memory_used_mib=20000)
    assert checks["gpu_memory_held"].status == "warning" and "no process listed" in checks["gpu_memory_held"].evidence


def test_persistence_mode_off(tmp_path, write_fake):
    checks, _ = one(tmp_path, write_fake, persistence_mode=False)
    assert checks["persistence_mode"].status == "warning" and "nvidia-smi -pm 1" in checks["persistence_mode"].fix


@pytest.mark.parametrize("fields, status, words", [
    ({"ecc_enabled": True, "ecc_uncorrected_volatile": 0, "retired_pages": 2, "retired_pages_pending": False}, "ok", "2 page(s) retired"),
    ({"ecc_enabled": True, "ecc_uncorrected_volatile": 3}, "problem", "3 uncorrectable"),
    ({"ecc_enabled": True, "retired_pages": 5, "retired_pages_pending": True}, "problem", "retired pages pending"),
    ({"ecc_enabled": False}, "ok", "ECC off"),
])
def test_ecc(tmp_path, write_fake, fields, status, words):
    checks, _ = one(tmp_path, write_fake, **fields)
    assert checks["ecc"].status == status and words in checks["ecc"].evidence


@pytest.mark.parametrize("fields, status, words", [
    # gen4 x16 = 1.969 GB/s * 16 = 31.5 GB/s; gen3 x16 = 0.985 * 16 = 15.8 GB/s; gen4 x8 = 15.8 GB/s
    ({"pcie_gen_current": 4, "pcie_gen_max": 4, "pcie_width_current": 16, "pcie_width_max": 16}, "ok", "gen4 x16 (31.5 GB/s)"),
    ({"pcie_gen_current": 4, "pcie_gen_max": 4, "pcie_width_current": 8, "pcie_width_max": 16}, "warning", "gen4 x8 (15.8 GB/s), below its x16"),
    ({"pcie_gen_current": 1, "pcie_gen_max": 4, "pcie_width_current": 16, "pcie_width_max": 16}, "ok", "at idle"),
    ({"pcie_gen_current": 3, "pcie_gen_max": 4, "pcie_width_current": 16, "pcie_width_max": 16, "utilization_pct": 95},
     "warning", "gen3 x16 (15.8 GB/s) while 95% busy"),
    ({"pcie_gen_current": 4, "pcie_gen_max": 4, "pcie_gen_gpu_max": 5, "pcie_width_current": 16, "pcie_width_max": 16},
     "warning", "supports gen5 but the slot/host only gen4"),
])
def test_pcie_link(tmp_path, write_fake, fields, status, words):
    checks, _ = one(tmp_path, write_fake, **fields)
    assert checks["pcie_link"].status == status and words in checks["pcie_link"].evidence, checks["pcie_link"].evidence


@pytest.mark.parametrize("reasons, util, status, words", [
    (["gpu_idle"], 0, "ok", "idle"),
    (["sw_power_cap"], 99, "warning", "power limit"),
    (["sw_power_cap"], 0, "ok", "power limit"),
    (["sw_thermal_slowdown"], 99, "warning", "temperature"),
    (["hw_slowdown", "hw_thermal_slowdown"], 99, "problem", "hardware"),
    (["applications_clocks_setting"], 99, "warning", "setting"),
    (0x44, 99, "problem", "hw_thermal_slowdown"),  # an NVML bitmask: 0x04 sw_power_cap | 0x40 hw_thermal_slowdown
])
def test_clock_reasons(tmp_path, write_fake, reasons, util, status, words):
    checks, _ = one(tmp_path, write_fake, clock_reasons=reasons, utilization_pct=util, sm_clock_mhz=1200, sm_clock_max_mhz=1980)
    c = checks["clocks"]
    assert c.status == status and words in c.evidence and "SM 1200 of 1980 MHz" in c.evidence, c.evidence


@pytest.mark.parametrize("temp, status, words", [
    (60, "ok", "60 °C (slowdown at 87 °C, shutdown at 92 °C)"),
    (83, "warning", "within 5 °C of slowdown"),   # 87 - 83 = 4 <= 5
    (88, "problem", "at the slowdown threshold"),
])
def test_temperature_against_slowdown(tmp_path, write_fake, temp, status, words):
    checks, _ = one(tmp_path, write_fake, temperature_c=temp, temperature_slowdown_c=87, temperature_shutdown_c=92)
    assert checks["temperature"].status == status and words in checks["temperature"].evidence


def test_temperature_against_the_users_limit(tmp_path, write_fake):
    write_fake([gpu(0, temperature_c=81, temperature_slowdown_c=90)])
    checks, _ = run(tmp_path, max_temperature_c=80)
    assert checks["temperature"].status == "warning" and "above your limit of 80 °C" in checks["temperature"].evidence


def test_bad_fake_health_field_is_one_line(write_fake, tmp_path):
    write_fake([gpu(0, compute_mode="shared")])
    assert cli.main(["doctor", "--no-torch"]) == 2


# -- exit codes through the CLI -------------------------------------------------------------------------

def test_cli_exit_codes_on_fake_gpus(write_fake, monkeypatch, capsys):
    healthy = gpu(0, pcie_gen_current=5, pcie_gen_max=5, pcie_width_current=16, pcie_width_max=16,
                  clock_reasons=["gpu_idle"], temperature_c=35, temperature_slowdown_c=87, compute_mode="default",
                  mig_enabled=False, ecc_enabled=True, ecc_uncorrected_volatile=0, retired_pages_pending=False,
                  persistence_mode=True, driver_version="580.65.06", cuda_driver_version="13.0")
    write_fake([healthy])
    monkeypatch.setattr(tp, "probe", lambda env=None: CUDA_TORCH)
    assert cli.main(["doctor", "--expect-gpu"]) == EXIT_OK
    capsys.readouterr()
    assert cli.main(["doctor", "--json"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert all(c["status"] == "ok" for c in out["checks"] if c["name"] != "cuda_device_order"), out
    write_fake([dict(healthy, ecc_uncorrected_volatile=1)])
    assert cli.main(["doctor"]) == EXIT_PROBLEM
    monkeypatch.setattr(tp, "probe", lambda env=None: CPU_TORCH)
    assert cli.main(["doctor", "--expect-gpu"]) == EXIT_NO_GPU  # 4 wins over 3
    assert "exit 4" in capsys.readouterr().out


def test_pytorchs_own_numbering_replaces_the_guess(tmp_path, write_fake):
    """When the probe reports each device's UUID (torch prints it without "GPU-") or PCI bus number, the
    table shows what PyTorch really did: here cuda:0 is GPU 5 (by UUID) and cuda:1 GPU 1 (bus 0x19)."""
    write_fake(EIGHT)
    torch = TorchFacts(installed=True, version="2.13.0+cu130", cuda="13.0", cuda_available=True, device_count=2,
                       devices=({"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "00000005-aaaa-bbbb-cccc-dddddddddddd"},
                                {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "pci_bus_id": 0x19}))
    checks, _ = run(tmp_path, torch=torch, env={"CUDA_VISIBLE_DEVICES": "0,4"})
    c = checks["cuda_device_order"]
    assert c.details["measured"] == [5, 1]
    assert [r["with_fastest_first"]["index"] for r in c.details["mapping"]] == [5, 1]
    assert c.status == "warning" and "Now (measured in PyTorch): cuda:0 = GPU 5" in c.evidence


def test_pytorch_sees_fewer_gpus_than_visible(tmp_path, write_fake):
    write_fake([gpu(0), gpu(1)])
    checks, report = run(tmp_path, torch=CUDA_TORCH, dev=("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"))
    c = checks["pytorch_sees_gpus"]  # CUDA_TORCH sees one device; two are visible
    assert c.status == "warning" and "device_count() = 1" in c.evidence and "2 GPUs should be visible" in c.evidence


def test_broken_visible_devices_on_a_cpu_machine_is_only_a_warning(tmp_path, monkeypatch):
    from gpuwise.doctor import facts as facts_mod

    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    monkeypatch.setattr(facts_mod, "nvml_status", lambda: facts_mod.NvmlStatus(False, "NVML: NVML Shared Library Not Found", True))
    checks, report = run(tmp_path, torch=CPU_TORCH, env={"CUDA_VISIBLE_DEVICES": "1,1"}, dev=(), pci=())
    c = checks["cuda_visible_devices"]
    assert c.status == "warning" and "repeated" in c.evidence and report.exit_code == EXIT_OK


def test_fake_torch_file_drives_the_real_command(tmp_path, write_fake):
    """GPUWISE_FAKE_TORCH pairs with GPUWISE_FAKE_GPUS: the whole command in a subprocess, real exit codes."""
    gpus = write_fake([gpu(0, driver_version="580.65.06", cuda_driver_version="13.0")])
    cuda = tmp_path / "torch.json"
    cuda.write_text(json.dumps({"version": "2.13.0+cu130", "cuda": "13.0", "device_count": 1,
                                "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]}))
    done = run_cli("doctor", "--expect-gpu", env={"GPUWISE_FAKE_GPUS": str(gpus), "GPUWISE_FAKE_TORCH": str(cuda)})
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"version": "2.13.0+cpu", "cuda": None}))
    done = run_cli("doctor", "--expect-gpu", "--json", env={"GPUWISE_FAKE_GPUS": str(gpus), "GPUWISE_FAKE_TORCH": str(cpu)})
    assert done.returncode == EXIT_NO_GPU
    fix = {c["name"]: c for c in json.loads(done.stdout)["checks"]}["pytorch_build"]["fix"]
    assert fix.startswith("pip install torch==2.13.0+cu130 --index-url https://download.pytorch.org/whl/cu130")
    cpu.write_text("[1, 2]")
    done = run_cli("doctor", env={"GPUWISE_FAKE_GPUS": str(gpus), "GPUWISE_FAKE_TORCH": str(cpu)})
    assert done.returncode == 2 and "GPUWISE_FAKE_TORCH" in done.stderr and len(done.stderr.splitlines()) == 1


def test_mig_instance_names_are_not_mapped(tmp_path, write_fake):
    write_fake([gpu(0, mig_enabled=True, mig_devices=[{"uuid": "MIG-aaaa"}]), gpu(1)])
    checks, _ = run(tmp_path, env={"CUDA_VISIBLE_DEVICES": "MIG-aaaa"}, dev=("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"))
    assert checks["cuda_device_order"].status == "skipped" and "MIG" in checks["cuda_device_order"].evidence
    assert checks["cuda_visible_devices"].status == "ok"
