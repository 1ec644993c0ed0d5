"""GPU checks through nvidia-smi (NVML), DCGM and a burn-in, on hosts with NVIDIA GPUs.

Where there is no NVIDIA GPU (no driver loaded), every check here skips with the reason
"no NVIDIA GPU": nothing about a GPU is concluded from a host without one.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from gpupool.gate import xid
from gpupool.gate.actions import Action, worst, xid_action
from gpupool.gate.expect import GpuExpect, NodeExpect
from gpupool.gate.nvidia import (
    QUERY_COMMAND,
    GpuState,
    mig_counts,
    parse_dcgm_diag,
    parse_dcgm_health,
    parse_gpu_instances,
    parse_mig_list,
    parse_nvlink_status,
    parse_query,
)
from gpupool.gate.plugin import Measure

DIAG_LEVEL = {"quick": 1, "standard": 2, "burn-in": 3}
MAX_TEMPERATURE_C = 85
# roles/dcgm's dcgm_health_result, and how old it may be: its timer runs every few minutes.
DCGM_HEALTH_RESULT = "/var/lib/gpupool/dcgm-health.json"
DCGM_HEALTH_MAX_AGE_S = 3600


def _driver_loaded(host) -> bool:  # type: ignore[no-untyped-def]
    # Some sandboxes hide /proc/driver/nvidia; a listing GPU proves the driver too.
    return bool(host.file("/proc/driver/nvidia/version").exists
                or host.run("nvidia-smi -L").rc == 0)


@pytest.mark.action(Action.REBOOT)
def test_driver_loaded(host, gpu_expect: GpuExpect, expect: NodeExpect,  # type: ignore[no-untyped-def]
                       measure: Measure) -> None:
    loaded = _driver_loaded(host)
    if not loaded and expect.lab:
        pytest.skip("no NVIDIA GPU (lab host: GPUs are not emulated)")
    # In production a GPU node without a loaded driver fails here, not by skipping.
    measure(loaded, True, loaded, "the NVIDIA kernel driver is not loaded")


@pytest.fixture(scope="module")
def gpus(host, gpu_expect: GpuExpect) -> list[GpuState]:  # type: ignore[no-untyped-def]
    if not _driver_loaded(host):
        pytest.skip("no NVIDIA GPU (no NVIDIA kernel driver loaded)")
    out = host.run(QUERY_COMMAND)
    if out.rc != 0:
        pytest.fail(f"nvidia-smi failed (exit {out.rc}): {out.stderr.strip()[:200]}")
    return parse_query(out.stdout)


@pytest.mark.action(Action.ISOLATE)
def test_gpu_count(gpus: list[GpuState], gpu_expect: GpuExpect, measure: Measure) -> None:
    measure(len(gpus), gpu_expect.count, len(gpus) == gpu_expect.count)


@pytest.mark.action(Action.ISOLATE)
def test_gpu_model(gpus: list[GpuState], gpu_expect: GpuExpect, measure: Measure) -> None:
    names = sorted({g.name for g in gpus})
    measure(names, [gpu_expect.product], names == [gpu_expect.product])


@pytest.mark.action(Action.ISOLATE)
def test_gpu_memory(gpus: list[GpuState], gpu_expect: GpuExpect, measure: Measure) -> None:
    # nvidia-smi reports usable memory: a little under the marketing size.
    floor = int(gpu_expect.memory_gib * 1024 * 0.97)
    low = {g.index: g.memory_mib for g in gpus if g.memory_mib < floor}
    measure(min(g.memory_mib for g in gpus), f">= {floor} MiB", not low, f"short: {low}")


@pytest.mark.action(Action.RECONFIGURE)
def test_driver_version(gpus: list[GpuState], expect: NodeExpect, measure: Measure) -> None:
    drivers = sorted({g.driver for g in gpus})
    want = expect.software["nvidia_driver"]
    measure(drivers, [want], drivers == [want])


@pytest.mark.action(Action.RESET)
def test_ecc_enabled(gpus: list[GpuState], measure: Measure) -> None:
    off = [g.index for g in gpus if g.ecc_enabled is False]
    measure(off, [], not off, f"ECC disabled on GPUs {off}")


@pytest.mark.action(Action.RESET)
def test_no_uncorrectable_ecc(gpus: list[GpuState], measure: Measure) -> None:
    bad = {g.index: g.uncorrected_ecc for g in gpus if g.uncorrected_ecc}
    measure(bad, {}, not bad, f"volatile uncorrectable ECC errors: {bad}")


@pytest.mark.tier("standard")
def test_row_remapping(gpus: list[GpuState], measure: Measure) -> None:
    failed = [g.index for g in gpus if g.remap_failed]
    pending = [g.index for g in gpus if g.remap_pending or g.retired_pending]
    action = Action.ISOLATE if failed else Action.RESET
    measure({"failed": failed, "pending": pending}, {"failed": [], "pending": []},
            not failed and not pending,
            f"remap failed on {failed}, pending on {pending}", action=action.value)


@pytest.mark.action(Action.RECONFIGURE)
def test_persistence_mode(gpus: list[GpuState], measure: Measure) -> None:
    off = [g.index for g in gpus if not g.persistence]
    measure(off, [], not off, f"persistence mode off on GPUs {off}")


@pytest.mark.tier("standard")
@pytest.mark.action(Action.ISOLATE)
def test_pcie_link_width(gpus: list[GpuState], measure: Measure) -> None:
    # Width does not drop with idle power saving (generation does), so it is checked
    # strictly: a narrow link is a seating or riser fault.
    narrow = {g.index: f"x{g.pcie_width}/x{g.pcie_width_max}" for g in gpus
              if g.pcie_width is not None and g.pcie_width != g.pcie_width_max}
    measure(narrow, {}, not narrow, f"PCIe links below maximum width: {narrow}")


@pytest.mark.tier("standard")
@pytest.mark.action(Action.RESET)
def test_nvlink_active(host, gpus: list[GpuState], gpu_expect: GpuExpect,  # type: ignore[no-untyped-def]
                       measure: Measure) -> None:
    if not gpu_expect.nvswitch:
        pytest.skip("node class has no NVLink/NVSwitch fabric")
    links = parse_nvlink_status(host.check_output("nvidia-smi nvlink --status"))
    down = {g: [lk for lk, up in ls.items() if not up] for g, ls in links.items()}
    down = {g: ls for g, ls in down.items() if ls or not links[g]}
    measure(down, {}, len(links) == len(gpus) and not down, f"inactive NVLinks: {down}")


@pytest.mark.action(Action.MONITOR)
def test_no_bad_throttling(gpus: list[GpuState], measure: Measure) -> None:
    bad = {g.index: g.bad_throttle for g in gpus if g.bad_throttle}
    measure(bad, {}, not bad, f"thermal or hardware slowdown: {bad}")


@pytest.mark.action(Action.MONITOR)
def test_temperature(gpus: list[GpuState], measure: Measure) -> None:
    temps = [g.temperature_c for g in gpus if g.temperature_c is not None]
    hottest = max(temps, default=0)
    measure(hottest, f"< {MAX_TEMPERATURE_C} C", hottest < MAX_TEMPERATURE_C)


def test_no_xid_errors(host, gpu_expect: GpuExpect, expect: NodeExpect,  # type: ignore[no-untyped-def]
                      measure: Measure) -> None:
    """XIDs since the node's last recorded GPU reset or admission (gpupool/gate/xid.py):
    earlier ones in this boot are history, so a reset (or a reboot) can return the node.
    Read whether or not nvidia-smi answers: a GPU fallen off the bus still names its XID."""
    log = host.run(xid.LAB_KERNEL_LOG if expect.lab else xid.KERNEL_LOG).stdout
    cursor = xid.load_cursor(host.run(xid.STAT).stdout, host.run(xid.READ).stdout)
    seen = xid.reading(log, host.run(f"cat {xid.BOOT_ID}").stdout, cursor)
    if not seen.counted and not _driver_loaded(host):
        pytest.skip(f"no NVIDIA GPU (no NVIDIA kernel driver loaded; {seen.summary})")
    xids = [(e.pci, e.code) for e in seen.counted]
    advised = worst([xid_action(code) for _, code in xids])
    measure(sorted({c for _, c in xids}), [], advised in (None, Action.MONITOR),
            f"XID errors {seen.basis}: {xids}"[:600], action=(advised or Action.MONITOR).value)


@pytest.mark.action(Action.RESET)
def test_dcgm_diag(host, gpus: list[GpuState], request: pytest.FixtureRequest,  # type: ignore[no-untyped-def]
                   measure: Measure) -> None:
    level = DIAG_LEVEL[request.config.getoption("--gate-tier")]
    if not host.exists("dcgmi"):
        measure("dcgmi missing", "DCGM installed", False, "DCGM is not installed",
                action=Action.RECONFIGURE.value)
    out = host.run(f"dcgmi diag -r {level} -j")
    results = parse_dcgm_diag(out.stdout) if out.stdout.strip().startswith("{") else {}
    failed = sorted(t for t, r in results.items() if r == "Fail")
    measure({"level": level, "failed": failed}, {"level": level, "failed": []},
            bool(results) and not failed, f"dcgmi diag -r {level}: {failed or out.stderr[:200]}")


@pytest.mark.action(Action.RESET)
def test_dcgm_health_watches(host, gpus: list[GpuState], measure: Measure) -> None:  # type: ignore[no-untyped-def]
    """What DCGM's background watches saw between gates (roles/dcgm's timer records
    `dcgmi health --check`): a memory or PCIe fault that came and went still fails here."""
    record = host.file(DCGM_HEALTH_RESULT)
    if not record.exists:
        measure("no record", "a record", False, f"{DCGM_HEALTH_RESULT} is missing: the dcgm "
                "role's health timer has not run", action=Action.RECONFIGURE.value)
    try:
        health = parse_dcgm_health(record.content_string)
    except ValueError as exc:
        measure("unreadable", "a record", False, f"{DCGM_HEALTH_RESULT}: {exc}",
                action=Action.RECONFIGURE.value)
    now = int(host.run("date +%s").stdout.strip() or 0)
    age = now - int(health.checked_at.timestamp())
    if health.status == "error" or age > DCGM_HEALTH_MAX_AGE_S:
        measure({"status": health.status, "age_s": age}, "a recent DCGM answer", False,
                f"DCGM health not checked: {health.detail[-160:] or 'the record is stale'}",
                action=Action.RECONFIGURE.value)
    measure(health.status, "pass", health.status == "pass",
            f"DCGM health watches: {health.detail[-200:]}")


@pytest.mark.tier("burn-in")
@pytest.mark.action(Action.ISOLATE)
def test_burn_in(host, gpus: list[GpuState], gpu_expect: GpuExpect,  # type: ignore[no-untyped-def]
                 measure: Measure) -> None:
    script = resources.files("gpupool.onhost").joinpath("burn.py").read_text()
    out = host.run("python3 - <<'GPUPOOL_BURN'\n" + script + "\nGPUPOOL_BURN")
    data = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
    if "gpus" not in data:
        pytest.fail(f"burn-in could not run: {data.get('error') or out.stderr[-300:]}")
    slow = [g for g in data["gpus"] if g["bf16_tflops"] < gpu_expect.min_bf16_tflops
            or g["mem_bw_gbps"] < gpu_expect.min_mem_bw_gbps]
    measure(data["gpus"], {"bf16_tflops": f">= {gpu_expect.min_bf16_tflops}",
                           "mem_bw_gbps": f">= {gpu_expect.min_mem_bw_gbps}"},
            len(data["gpus"]) == gpu_expect.count and not slow, f"below floor: {slow}")


@pytest.mark.action(Action.RECONFIGURE)
def test_mig_instances_match_the_layout(host, gpus: list[GpuState],  # type: ignore[no-untyped-def]
                                        gpu_expect: GpuExpect, measure: Measure) -> None:
    """Every GPU exposes exactly the class's MIG instances: the MIG devices nvidia-smi -L
    lists and the GPU instances nvidia-smi mig -lgi lists, per profile (re-apply with the
    mig role when they differ). Skips where the class declares no MIG layout, and with the
    `gpus` fixture where there is no GPU."""
    if not gpu_expect.mig:
        pytest.skip(f"node class declares no MIG layout ({gpu_expect.model})")
    want = dict(gpu_expect.mig)
    listed = host.run("nvidia-smi -L")
    instances = host.run("nvidia-smi mig -lgi")
    if listed.rc != 0:
        pytest.fail(f"nvidia-smi -L failed (exit {listed.rc}): {listed.stderr.strip()[:200]}")
    devices = {i: mig_counts(d) for i, d in parse_mig_list(listed.stdout).items()}
    gis = ({i: mig_counts(d) for i, d in parse_gpu_instances(instances.stdout).items()}
           if instances.rc == 0 else {})
    wrong = sorted(i for i in devices if devices[i] != want or gis.get(i, {}) != want)
    ok = not wrong and len(devices) == gpu_expect.count
    measure(devices, {i: want for i in range(gpu_expect.count)}, ok,
            f"GPUs {wrong} differ from {want} (MIG devices {devices}, GPU instances {gis})")
