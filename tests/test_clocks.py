"""bench.clocks: nvidia-smi samples parsed, reasons decoded, windows summarized (no GPU)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest

from bench import clocks
from bench.report import ROOT

# Lines as nvidia-smi printed them on the H200 (bench/results/clocks/smi-20261130T1734Z-seed-sustained.csv).
IDLE = "2026/11/30 17:34:26.830, 1980, 121.36, 0x0000000000000000"
CAPPED = "2026/11/30 17:34:31.214, 1635, 642.10, 700.00, 0x0000000000000004"


def stamp(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y/%m/%d %H:%M:%S.%f").timestamp()


def test_a_capped_sample_is_parsed_field_by_field():
    s = clocks.parse_sample(CAPPED)
    assert s == clocks.Sample(stamp("2026/11/30 17:34:31.214"), 1635.0, 642.10, 700.0, 0x4)
    assert clocks.decode_reasons(s.reasons) == ("sw power cap",)


def test_a_sample_without_the_limit_column_keeps_what_it_has():
    s = clocks.parse_sample("2026/11/30 17:34:26.830, 1980, 121.36")
    assert (s.sm_mhz, s.watts, s.limit_w, s.reasons) == (1980.0, 121.36, None, None)


@pytest.mark.parametrize("line", ["timestamp, clocks.sm [MHz], power.draw [W]", "",
                                  'Field "clocks_event_reasons.active" is not a valid field to query.',
                                  "2026/11/30 17:34:26.830, [N/A], 121.36"])
def test_lines_that_are_not_samples_are_skipped(line):
    assert clocks.parse_sample(line) is None


def test_reason_bits_are_named_and_unknown_bits_kept():
    assert clocks.decode_reasons(0) == ()
    assert clocks.decode_reasons(0x4 | 0x40) == ("sw power cap", "hw thermal slowdown")
    assert clocks.decode_reasons(0x4 | 0x1000) == ("sw power cap", "0x1000")


def test_a_window_takes_only_its_settled_samples():
    t0 = 1000.0
    samples = [clocks.Sample(t0 + 0.1, 1980, 300, 700, 0),        # before the clock settled: left out
               clocks.Sample(t0 + 0.5, 1650, 640, 700, 0x4),
               clocks.Sample(t0 + 0.7, 1640, 650, 700, 0x4),
               clocks.Sample(t0 + 0.9, 1660, 630, 700, 0x8),
               clocks.Sample(t0 + 2.0, 1980, 100, 700, 0x1)]      # after the window: left out
    window = clocks.Window("flashgen", t0, t0 + 1.0, ms=0.0672, flops=34.36e9)
    row = clocks.summarize(window, samples)
    assert row["samples"] == 3
    assert (row["sm_mhz"], row["watts"], row["limit_w"]) == (1650, 640, 700)
    assert row["reasons"] == ["sw power cap", "hw slowdown"]
    assert row["energy_mj"] == pytest.approx(640 * 0.0672)
    assert row["tflops"] == pytest.approx(34.36e9 / 0.0672 / 1e9)
    assert "sw power cap, hw slowdown" in clocks.table([dict(row, round=0)])
    # the clock the previous load left (1980), and settled from the sample at 0.5 s
    assert (row["start_mhz"], row["settle_ms"]) == (1980, pytest.approx(500.0))


def test_settling_restarts_when_the_clock_leaves_the_band():
    t0 = 1000.0
    window = clocks.Window("fa4", t0, t0 + 1.0, ms=1.0, flops=1e12)
    mhz = [1665, 1605, 1650, 1605, 1590, 1605]  # in band of 1605 at 0.1, out at 0.2 and 0.4 (beyond 15 MHz)
    samples = [clocks.Sample(t0 + 0.1 * (i + 1), m, 700, 700, 0x4) for i, m in enumerate(mhz)]
    assert clocks.settle_ms(window, samples, 1605) == pytest.approx(400.0)
    assert clocks.settle_ms(window, samples[:3], 1605) is None  # ends outside the band: it never settled
    row = clocks.summarize(window, samples[:3], settle_s=0.0)  # median 1650: in band from 0.3 s
    assert (row["start_mhz"], row["settle_ms"]) == (1665, pytest.approx(300.0))
    assert "never" in clocks.table([dict(row, settle_ms=None, round=0)])


def test_a_window_without_samples_says_so():
    row = clocks.summarize(clocks.Window("cudnn", 0.0, 1.0, ms=0.07, flops=1e9), [])
    assert row["samples"] == 0 and "sm_mhz" not in row
    assert "(no samples)" in clocks.table([row])


def test_the_script_refuses_a_run_shorter_than_the_settling_time():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "clocks.py"), "--seconds", "0.2"], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
    assert proc.returncode == 2 and "--seconds must exceed" in proc.stderr


def test_gpu_check_sums_up_the_last_round_of_each_implementation(tmp_path, monkeypatch):
    """scripts/gpu_check.py's clock step: one line with each implementation's clock, power and energy per call
    from the last round (the first round's clock is still moving)."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    row = dict(samples=40, limit_w=700.0, reasons=["sw power cap"])
    rows = [dict(row, impl="cudnn", round=0, sm_mhz=1800.0, watts=600.0, energy_mj=42.6),
            dict(row, impl="flashgen", round=0, sm_mhz=1750.0, watts=610.0, energy_mj=41.0),
            dict(row, impl="cudnn", round=1, sm_mhz=1695.0, watts=636.0, energy_mj=45.2),
            dict(row, impl="flashgen", round=1, sm_mhz=1635.0, watts=642.0, energy_mj=43.1, reasons=[])]
    commands = []

    def fake_run(cmd, log, timeout):
        commands.append(cmd)
        (tmp_path / "clocks-1x1024x64x128-f16.json").write_text(json.dumps({"rows": rows}))
        return 0, "table", 12.0

    monkeypatch.setattr(gpu_check, "run", fake_run)
    name, status, detail, _ = gpu_check.clock_step("1,1024,64,128:f16", tmp_path)
    assert (name, status) == ("clocks 1,1024,64,128", "OK")
    assert detail == ("cudnn 1695 MHz 636 W 45.2 mJ/call (sw power cap); "
                      "flashgen 1635 MHz 642 W 43.1 mJ/call (no limit)")
    assert commands[0][1:6] == ["scripts/clocks.py", "--shape", "1,1024,64,128", "--dtype", "f16"]


FAKE_SMI = """#!/bin/sh
# A stand-in for nvidia-smi: no power.draw.instant field (an older driver), samples for the averaged one.
case "$1" in
  *power.draw.instant*) echo 'Field "power.draw.instant" is not a valid field to query.'; exit 2 ;;
esac
while true; do
  echo "$(date +'%Y/%m/%d %H:%M:%S.000'), 1650, 640.00, 700.00, 0x0000000000000004"
  sleep 0.02
done
"""


def test_the_sampler_falls_back_to_a_query_the_driver_takes(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with clocks.Sampler() as sampler:
        assert sampler.query == ("timestamp", "clocks.sm", "power.draw", "enforced.power.limit",
                                 "clocks_event_reasons.active")
    samples = sampler.samples()
    assert samples and {(s.sm_mhz, s.watts, s.limit_w, s.reasons) for s in samples} == {(1650.0, 640.0, 700.0, 0x4)}


def test_the_sampler_says_when_there_is_no_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="cannot run nvidia-smi"):
        with clocks.Sampler():
            pass
